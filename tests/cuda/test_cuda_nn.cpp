// The fused ops on CUDA against the f64 compositions on the CPU (tests/nn_reference.h): every
// float dtype, contiguous / transposed / broadcast inputs, the tensor-core attention paths
// (f16/bf16: d 128 without a mask by the wgmma kernel on compute capability 9.0, else mma.sync;
// CTest runs the attention tests again with WICK_FLASH_WGMMA=0) and the split-KV path (f32,
// other head dims, decode), gradients.

#include <limits>
#include <string>

#include "cuda/gpu_tolerance.h"
#include "cuda/tuning_from_env.h"
#include "nn_reference.h"
#include "test_util.h"

namespace wick {
namespace {

using namespace wick::testing;

const Device cpu = Device::cpu();

Device gpu() {
  return Device::cuda(0);
}

std::vector<DType> gpu_dtypes() {
  return {DType::BF16, DType::F16, DType::F32};
}

// Attention sums s_kv products in f32 and rounds p to the dtype for P V (tensor cores).
double attn_tol(DType dt) {
  return dt == DType::F32 ? 2e-5 : 3 * tolerance(dt);
}

TEST(CudaNn, NormsMatchCompositionOnEveryRowLength) {
  WICK_REQUIRE_GPU();
  // 1024 and below: a warp per row; up to 512 16-byte vectors (2000, and 4096 for f16/bf16):
  // a warp per row in registers; 8192 and below: a block in registers; above: the looping kernel.
  for (DType dt : gpu_dtypes()) {
    for (size_t d : {64, 100, 1024, 2000, 4096, 5000, 9000}) {
      Tensor x = random_tensor({3, d}, dt), w = random_tensor({d}, dt), b = random_tensor({d}, dt);
      Tensor ln = x.to_device(gpu()).layer_norm(w.to_device(gpu()), b.to_device(gpu()), 1e-5);
      EXPECT_TRUE(close_to(ln, layer_norm_ref(f64(x), f64(w), f64(b), 1e-5), 2 * tolerance(dt)))
          << "layer_norm " << dt << " d " << d;
      Tensor rn = x.to_device(gpu()).rms_norm(w.to_device(gpu()), 1e-6);
      EXPECT_TRUE(close_to(rn, rms_norm_ref(f64(x), f64(w), 1e-6), 2 * tolerance(dt)))
          << "rms_norm " << dt << " d " << d;
      if (dt == DType::BF16 || dt == DType::F16) {
        // An f32 weight (Gemma's): in f32, rounded once, as the CPU computes it.
        Tensor wf = random_tensor({d}, DType::F32);
        Tensor got = x.to_device(gpu()).rms_norm(wf.to_device(gpu()), 1e-6);
        EXPECT_EQ(got.dtype(), dt);
        EXPECT_TRUE(close_to(got, f64(x.rms_norm(wf, 1e-6)), tolerance(dt)))
            << "rms_norm f32 weight " << dt << " d " << d;
      }
      // Probabilities shrink as 1/d (below close_to's ~0 guard for long rows): compare d * p.
      Tensor sm = x.to_device(gpu()).softmax_last_dim().to_device(cpu).to_dtype(DType::F64);
      Tensor e = f64(x).broadcast_sub(f64(x).max_keepdim(1)).exp();
      double n = static_cast<double>(d);
      EXPECT_TRUE(close_to(sm.affine(n, 0), e.broadcast_div(e.sum_keepdim({1})).affine(n, 0),
                           2 * tolerance(dt)))
          << "softmax " << dt << " d " << d;
    }
  }
}

TEST(CudaNn, SoftmaxOnManyLongRows) {
  WICK_REQUIRE_GPU();
  // f16/bf16 rows above 4 KB, two rows a multiprocessor and more (132 on the H200): the
  // bulk-copy kernel (rows staged in shared memory; f32 too under WICK_ROW_KERNEL=bulk), counts
  // no grid divides. 8 KB and 16 KB rows (4 and 8 vectors a thread), and rows of 3000 (vectors
  // not a multiple of the 128 threads sharing a row) more than the grid's stages hold (4 rows a
  // group, 8 groups a multiprocessor), so the rings of stages wrap. A masked element (-inf), a
  // row with a NaN and a row of -inf: NaN throughout those two, as the reference.
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    DType dt;
    size_t rows, d;
  };
  const size_t some = 2 * 132 + 7;
  for (const Case& c : {Case{DType::BF16, some, 4096}, Case{DType::F16, some, 4096},
                        Case{DType::BF16, some, 8192}, Case{DType::BF16, 5 * 8 * 132 + 7, 3000},
                        Case{DType::F32, some, 2048}, Case{DType::F32, some, 4096}}) {
    std::vector<double> v = random_values(c.rows * c.d, -6, 6);
    v[5] = -inf;
    v[c.d + 7] = std::numeric_limits<double>::quiet_NaN();
    for (size_t i = 0; i < c.d; ++i) v[2 * c.d + i] = -inf;
    Tensor x = tensor_from(v, {c.rows, c.d}, c.dt);
    Tensor sm = x.to_device(gpu()).softmax_last_dim().to_device(cpu).to_dtype(DType::F64);
    Tensor e = f64(x).broadcast_sub(f64(x).max_keepdim(1)).exp();
    double n = static_cast<double>(c.d);
    EXPECT_TRUE(close_to(sm.affine(n, 0), e.broadcast_div(e.sum_keepdim({1})).affine(n, 0),
                         2 * tolerance(c.dt)))
        << "softmax " << c.dt << " rows " << c.rows << " d " << c.d;
  }
}

TEST(CudaNn, NormsOnStridedAndBroadcastInputs) {
  WICK_REQUIRE_GPU();
  for (DType dt : gpu_dtypes()) {
    for (auto& [name, x] : layout_variants({3, 5, 67}, dt)) {
      Tensor w = random_tensor({67}, dt), b = random_tensor({67}, dt);
      Tensor got = x.to_device(gpu());
      // to_device copies the view row-major; the strided case on the GPU is below.
      EXPECT_TRUE(close_to(got.layer_norm(w.to_device(gpu()), b.to_device(gpu()), 1e-5),
                           layer_norm_ref(f64(x), f64(w), f64(b), 1e-5), 2 * tolerance(dt)))
          << name << " " << dt;
    }
    Tensor base = random_tensor({67, 4}, dt);
    Tensor w = random_tensor({67}, dt);
    EXPECT_TRUE(close_to(base.to_device(gpu()).t().rms_norm(w.to_device(gpu()), 1e-5),
                         rms_norm_ref(f64(base).t(), f64(w), 1e-5), 2 * tolerance(dt)))
        << "transposed " << dt;
  }
}

TEST(CudaNn, RopeMatchesComposition) {
  WICK_REQUIRE_GPU();
  for (DType dt : gpu_dtypes()) {
    for (bool inter : {false, true}) {
      Tensor c = random_tensor({6, 8}, dt), s = random_tensor({6, 8}, dt);
      Tensor base = random_tensor({2, 6, 3, 16}, dt);
      Tensor xg = base.to_device(gpu()).transpose(1, 2);  // strided heads, contiguous last dim
      Tensor xc = base.transpose(1, 2);
      Tensor cg = c.to_device(gpu()), sg = s.to_device(gpu());
      Tensor got = inter ? xg.rope_interleaved(cg, sg) : xg.rope(cg, sg);
      EXPECT_TRUE(close_to(got, rope_ref(f64(xc), f64(c), f64(s), inter), 2 * tolerance(dt)))
          << dt << " " << inter;
    }
  }
}

struct Case {
  std::string name;
  size_t b, h, hk, s, skv, d;
  bool causal, mask;
};

std::vector<Case> attention_cases() {
  return {
      // Tensor-core path for f16/bf16 (d 64/128, s >= 16); split path for f32.
      {"square", 1, 2, 2, 64, 64, 64, false, false},
      {"causal-ragged", 2, 4, 4, 100, 100, 128, true, false},
      {"gqa-causal-end-aligned", 1, 8, 2, 37, 150, 64, true, false},
      {"masked", 1, 2, 1, 20, 77, 128, false, true},
      // d 128 without a mask (the wgmma kernel on sm_90): several 128-query blocks and 128-key
      // tiles, ragged ends, groups 1/2/4, s_kv above, below and equal to s.
      {"causal-three-tiles", 2, 4, 4, 300, 300, 128, true, false},
      {"gqa-causal-end-aligned-d128", 1, 8, 2, 200, 457, 128, true, false},
      {"gqa-full-fewer-keys", 2, 6, 3, 260, 130, 128, false, false},
      {"causal-whole-tiles", 1, 2, 2, 256, 384, 128, true, false},
      {"full-short", 3, 2, 1, 16, 20, 128, false, false},
      // Split path for every dtype: decode against a long cache, odd head dims.
      {"decode-gqa", 2, 8, 2, 1, 1000, 128, true, false},
      {"decode-masked", 1, 4, 4, 1, 300, 64, false, true},
      {"short-queries", 1, 4, 1, 3, 200, 64, true, false},
      {"head-dim-96", 1, 2, 2, 40, 70, 96, true, false},
      {"head-dim-40", 1, 2, 1, 5, 33, 40, false, true},
      // 12 query heads per k/v head: two head chunks per block row.
      {"decode-group-12", 1, 24, 2, 1, 500, 64, false, false},
      {"prefill-group-12", 1, 24, 2, 20, 20, 64, true, false},
      // The decode kernel (f16/bf16): groups 1/2/8, d 64, one or many splits, a ragged last one.
      {"decode-mha-long", 1, 4, 4, 1, 4100, 128, true, false},
      {"decode-group-2-two-splits", 3, 4, 2, 1, 65, 128, false, false},
      {"decode-group-8-d64", 2, 16, 2, 1, 777, 64, true, false},
      // Groups of 3 (SmolLM2) and 7 (Qwen2-0.5B, masked); 20 heads: chunks of 16 and 4 rows.
      {"decode-group-3", 1, 9, 3, 1, 700, 64, false, false},
      {"decode-group-7-masked", 2, 14, 2, 1, 333, 64, false, true},
      {"decode-group-20-chunks", 1, 20, 1, 1, 300, 128, true, false},
      {"decode-short-cache", 1, 8, 2, 1, 5, 128, false, false},
      // The other head dims of the decode kernel: 16, 32, 96, and 256 (4 warps a block; Gemma's
      // 4 query heads of one k/v head).
      {"decode-d16", 1, 8, 2, 1, 48, 16, false, false},
      {"decode-d32-masked", 2, 8, 2, 1, 130, 32, false, true},
      {"decode-d96", 1, 8, 2, 1, 200, 96, true, false},
      {"decode-d256", 2, 4, 1, 1, 300, 256, false, false},
      {"decode-d256-masked", 1, 8, 2, 1, 77, 256, false, true},
  };
}

TEST(CudaNn, AttentionMatchesPlainSoftmaxQkv) {
  WICK_REQUIRE_GPU();
  for (DType dt : gpu_dtypes()) {
    for (const Case& c : attention_cases()) {
      Tensor q = random_tensor({c.b, c.h, c.s, c.d}, dt);
      Tensor k = random_tensor({c.b, c.hk, c.skv, c.d}, dt);
      Tensor v = random_tensor({c.b, c.skv, c.hk, c.d}, dt);  // used as (b, hk, skv, d) view
      nn::AttentionOptions o{c.causal, 0, std::nullopt};
      nn::AttentionOptions og{c.causal, 0, std::nullopt};
      if (c.mask) {
        Tensor m = random_tensor({c.b, 1, c.s, c.skv}, dt);
        o.mask = m;
        og.mask = m.to_device(gpu());
      }
      Tensor got = nn::scaled_dot_product_attention(q.to_device(gpu()), k.to_device(gpu()),
                                                    v.to_device(gpu()).transpose(1, 2), og);
      Tensor ref = attention_ref(f64(q), f64(k), f64(v).transpose(1, 2), o);
      EXPECT_TRUE(close_to(got, ref, attn_tol(dt))) << c.name << " " << dt;
    }
  }
}

TEST(CudaNn, DecodeAttentionSkipsMaskedKeys) {
  WICK_REQUIRE_GPU();
  const double inf = std::numeric_limits<double>::infinity();
  const size_t b = 2, h = 8, hk = 2, skv = 1000;
  for (DType dt : {DType::BF16, DType::F16}) {
    for (size_t d : {64, 128, 256}) {
      Tensor q = random_tensor({b, h, 1, d}, dt), k = random_tensor({b, hk, skv, d}, dt),
             v = random_tensor({b, hk, skv, d}, dt);
      Tensor qg = q.to_device(gpu()), kg = k.to_device(gpu()), vg = v.to_device(gpu());
      auto check = [&](const Tensor& mask, const std::string& what) {
        Tensor got =
            nn::scaled_dot_product_attention(qg, kg, vg, {false, 0, mask.to_device(gpu())});
        Tensor ref = attention_ref(f64(q), f64(k), f64(v), {false, 0, mask});
        EXPECT_TRUE(close_to(got, ref, attn_tol(dt))) << what << " " << dt << " d " << d;
      };
      // The graph-captured Llama step: one mask row for every head, 0 up to the position and
      // -inf after (inside a tile, on a tile's edges, the first and the last key).
      for (size_t pos : {0, 5, 15, 16, 500, 999}) {
        std::vector<double> m(skv);
        for (size_t j = 0; j < skv; ++j) m[j] = j <= pos ? 0.0 : -inf;
        check(tensor_from(m, {1, skv}, dt), "position " + std::to_string(pos));
      }
      // A mask per batch and head: head i sees keys [37 i, 37 i + 300) with random values there,
      // so whole tiles are hidden from some heads and not from others.
      std::vector<double> vals = random_values(b * h * skv), m(b * h * skv);
      for (size_t bh = 0; bh < b * h; ++bh) {
        size_t lo = 37 * (bh % h);
        for (size_t j = 0; j < skv; ++j) {
          size_t i = bh * skv + j;
          m[i] = j >= lo && j < lo + 300 ? vals[i] : -inf;
        }
      }
      check(tensor_from(m, {b, h, 1, skv}, dt), "per-head windows");
    }
  }
}

TEST(CudaNn, AttentionOnUnalignedViews) {
  WICK_REQUIRE_GPU();
  // Odd element offsets: the tensor-core and vector paths do not apply; the element path does.
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor qb = random_tensor({1, 2, 40, 65}, dt), kb = random_tensor({1, 2, 50, 65}, dt),
           vb = random_tensor({1, 2, 50, 65}, dt);
    auto view = [](const Tensor& t) { return t.narrow(3, 1, 64); };
    Tensor got =
        nn::scaled_dot_product_attention(view(qb.to_device(gpu())), view(kb.to_device(gpu())),
                                         view(vb.to_device(gpu())), {true, 0, std::nullopt});
    Tensor ref =
        attention_ref(f64(view(qb)), f64(view(kb)), f64(view(vb)), {true, 0, std::nullopt});
    EXPECT_TRUE(close_to(got, ref, attn_tol(dt))) << dt;
  }
}

TEST(CudaNn, CausalAttentionGivesZerosToQueriesWithoutKeys) {
  WICK_REQUIRE_GPU();
  // s > s_kv, causal: query i sees keys j <= i - 143, so the first 143 queries (a whole 128-query
  // block and part of the next) see none and get zeros; the rest are a square causal attention.
  const size_t b = 2, h = 4, hk = 2, s = 333, skv = 190, d = 128, blind = s - skv;
  for (DType dt : {DType::BF16, DType::F16}) {
    Tensor q = random_tensor({b, h, s, d}, dt), k = random_tensor({b, hk, skv, d}, dt),
           v = random_tensor({b, hk, skv, d}, dt);
    testing::poison_allocations(b * h * s * d, dt, gpu());
    Tensor got = nn::scaled_dot_product_attention(q.to_device(gpu()), k.to_device(gpu()),
                                                  v.to_device(gpu()), {true, 0, std::nullopt});
    for (double x : got.narrow(2, 0, blind).to_vec_f64()) ASSERT_EQ(x, 0.0) << dt;
    Tensor ref =
        attention_ref(f64(q.narrow(2, blind, skv)), f64(k), f64(v), {true, 0, std::nullopt});
    EXPECT_TRUE(close_to(got.narrow(2, blind, skv), ref, attn_tol(dt))) << dt;
  }
}

TEST(CudaNn, AttentionOnHeadInterleavedViews) {
  WICK_REQUIRE_GPU();
  // q, k, v as a model's projections give them: (b, s, h, d) viewed as (b, h, s, d), rows of one
  // head h * d apart; an explicit scale.
  const size_t b = 2, h = 8, hk = 2, s = 150, d = 128;
  for (DType dt : {DType::BF16, DType::F16}) {
    for (bool causal : {true, false}) {
      Tensor q = random_tensor({b, s, h, d}, dt), k = random_tensor({b, s, hk, d}, dt),
             v = random_tensor({b, s, hk, d}, dt);
      nn::AttentionOptions o{causal, 0.05, std::nullopt};
      Tensor got = nn::scaled_dot_product_attention(q.to_device(gpu()).transpose(1, 2),
                                                    k.to_device(gpu()).transpose(1, 2),
                                                    v.to_device(gpu()).transpose(1, 2), o);
      Tensor ref =
          attention_ref(f64(q).transpose(1, 2), f64(k).transpose(1, 2), f64(v).transpose(1, 2), o);
      EXPECT_TRUE(close_to(got, ref, attn_tol(dt))) << dt << " causal " << causal;
    }
  }
}

TEST(CudaNn, AttentionOnAKvCacheView) {
  WICK_REQUIRE_GPU();
  // A preallocated cache (b, h_kv, max_len, d) narrowed to the filled length.
  for (DType dt : {DType::BF16, DType::F32}) {
    Tensor cache_k = random_tensor({1, 2, 512, 128}, dt),
           cache_v = random_tensor({1, 2, 512, 128}, dt);
    Tensor q = random_tensor({1, 8, 1, 128}, dt);
    Tensor k = cache_k.narrow(2, 0, 333), v = cache_v.narrow(2, 0, 333);
    Tensor got = nn::scaled_dot_product_attention(
        q.to_device(gpu()), cache_k.to_device(gpu()).narrow(2, 0, 333),
        cache_v.to_device(gpu()).narrow(2, 0, 333), {true, 0, std::nullopt});
    EXPECT_TRUE(
        close_to(got, attention_ref(f64(q), f64(k), f64(v), {true, 0, std::nullopt}), attn_tol(dt)))
        << dt;
  }
}

TEST(CudaNn, GradientsMatchTheCpu) {
  WICK_REQUIRE_GPU();
  DType dt = DType::F32;
  Tensor x = random_tensor({4, 3, 16}, dt), w = random_tensor({16}, dt),
         b = random_tensor({16}, dt);
  Tensor q = random_tensor({1, 4, 5, 16}, dt), k = random_tensor({1, 2, 9, 16}, dt),
         v = random_tensor({1, 2, 9, 16}, dt);
  Tensor c = random_tensor({3, 8}, dt), s = random_tensor({3, 8}, dt);
  auto run = [&](const Device& dev) {
    std::vector<Tensor> in;
    for (const Tensor& t : {x, w, b, q, k, v}) in.push_back(t.to_device(dev).requires_grad());
    Tensor y1 = in[0].layer_norm(in[1], in[2], 1e-5).sum_all();
    Tensor y2 = in[0].rms_norm(in[1], 1e-5).sqr().sum_all();
    Tensor y3 = nn::scaled_dot_product_attention(in[3], in[4], in[5], {true, 0, std::nullopt})
                    .sqr()
                    .sum_all();
    Tensor y4 =
        in[0].reshape(Shape{1, 4, 3, 16}).rope(c.to_device(dev), s.to_device(dev)).sqr().sum_all();
    GradStore g = y1.add(y2).add(y3).add(y4).backward();
    std::vector<Tensor> out;
    for (const Tensor& t : in) out.push_back(g.get(t)->to_device(cpu));
    return out;
  };
  auto gc = run(cpu), gg = run(gpu());
  for (size_t i = 0; i < gc.size(); ++i) {
    EXPECT_TRUE(close_to(gg[i], f64(gc[i]), 1e-4)) << "input " << i;
  }
}

}  // namespace
}  // namespace wick
