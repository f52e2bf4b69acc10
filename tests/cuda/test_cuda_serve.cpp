// The serving engine's CUDA kernels: nn::paged_attention against a float64 reference and the
// same bits in any batch (windows and soft-caps too), nn::paged_kv_write against the CPU's, and
// the batched forward_paged of Llama and the decoder families on the GPU, and their one-token steps
// (the decode plan's), against transformers' logits (tests/data/llama, tests/data/families).

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "nn_reference.h"
#include "test_util.h"
#include "wick/formats.h"
#include "wick/models.h"
#include "wick/nn/paged_attention.h"
#include "wick/numerics.h"

namespace wick {
namespace {

using namespace wick::testing;

const Device cpu = Device::cpu();

Device gpu() {
  return Device::cuda(0);
}

Tensor u32(const std::vector<uint32_t>& v, const Shape& s, const Device& d) {
  return Tensor::from_vec(v, s, d);
}

TEST(CudaPagedAttention, EachTokenWithinItsBoundAndTheSameBitsInAnyBatch) {
  WICK_REQUIRE_GPU();
  const size_t h = 8, h_kv = 2, d = 64, ps = 16, pages = 12;
  // Sequence 0: pages 5, 2, 9 (40 positions); sequence 1: pages 0, 11 (20 positions).
  std::vector<uint32_t> table = {5, 2, 9, 0, 11, 0};
  std::vector<uint32_t> seq = {0, 0, 1, 1, 1}, pos = {30, 39, 0, 7, 19};
  const size_t t = seq.size();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const double q_range = dt == DType::BF16 ? 0.25 : 2.0;
    Tensor q = random_tensor({t, h, d}, dt, cpu, -q_range, q_range);
    // Values of one sign: the outputs (weighted means of ~30 values) stay away from zero, where
    // a bf16 bound would accept zero.
    Tensor k = random_tensor({pages, h_kv, ps, d}, dt);
    Tensor v = random_tensor({pages, h_kv, ps, d}, dt, cpu, 0.5, 1.5);
    Tensor out =
        nn::paged_attention(q.to_device(gpu()), k.to_device(gpu()), v.to_device(gpu()),
                            u32(table, {2, 3}, gpu()), u32(seq, {t}, gpu()), u32(pos, {t}, gpu()))
            .to_device(cpu);
    for (size_t i = 0; i < t; ++i) {
      std::vector<Tensor> kr, vr;
      for (size_t p = 0; p <= pos[i]; ++p) {
        kr.push_back(k.get(table[seq[i] * 3 + p / ps]).narrow(1, p % ps, 1));
        vr.push_back(v.get(table[seq[i] * 3 + p / ps]).narrow(1, p % ps, 1));
      }
      Tensor ki = Tensor::cat(kr, 1).unsqueeze(0), vi = Tensor::cat(vr, 1).unsqueeze(0);
      EXPECT_TRUE(attention_within(out.get(i).unsqueeze(1).unsqueeze(0),
                                   q.get(i).unsqueeze(1).unsqueeze(0), ki, vi,
                                   nn::AttentionOptions{}))
          << "token " << i << " " << dt;
    }
    // Token 3 alone gives the same bits.
    Tensor alone = nn::paged_attention(q.narrow(0, 3, 1).to_device(gpu()), k.to_device(gpu()),
                                       v.to_device(gpu()), u32(table, {2, 3}, gpu()),
                                       u32({1}, {1}, gpu()), u32({7}, {1}, gpu()))
                       .to_device(cpu);
    EXPECT_EQ(alone.to_vec_f64(), out.narrow(0, 3, 1).to_vec_f64()) << dt;
  }
}

TEST(CudaPagedAttention, KvWriteLandsWhereTheCpusDoes) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    Tensor k = random_tensor({3, 2, 8}, dt), v = random_tensor({3, 2, 8}, dt);
    std::vector<uint32_t> slots = {13, 2, 7};
    Tensor kc = Tensor::zeros({4, 2, 4, 8}, dt, cpu), vc = Tensor::zeros({4, 2, 4, 8}, dt, cpu);
    nn::paged_kv_write(kc, vc, k, v, u32(slots, {3}, cpu));
    Tensor kg = Tensor::zeros({4, 2, 4, 8}, dt, gpu()), vg = Tensor::zeros({4, 2, 4, 8}, dt, gpu());
    nn::paged_kv_write(kg, vg, k.to_device(gpu()), v.to_device(gpu()), u32(slots, {3}, gpu()));
    EXPECT_EQ(kg.to_device(cpu).to_vec_f64(), kc.to_vec_f64()) << dt;
    EXPECT_EQ(vg.to_device(cpu).to_vec_f64(), vc.to_vec_f64()) << dt;
  }
}

// The reference prompt in chunks of 3 beside another sequence, on the GPU: each chunk's last
// logits within transformers' (f32, no TF32).
TEST(CudaPagedForward, RaggedBatchGivesTransformersLogits) {
  WICK_REQUIRE_GPU();
  const std::string dir = std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_qwen2";
  auto model = models::load_causal_lm(dir, gpu());
  std::vector<uint32_t> prompt;
  for (double x : npy::load(dir + "/prompt.npy", cpu).to_vec_f64()) {
    prompt.push_back(static_cast<uint32_t>(x));
  }
  Tensor ref = npy::load(dir + "/logits.npy", cpu);
  const double range = range_of(ref.to_vec_f64());
  models::PagedKvCache cache = model->make_paged_cache(16, 4);
  std::vector<uint32_t> pages_a = {7, 3, 12, 1, 9, 0}, pages_b = {2, 4, 5, 6, 8, 10};
  for (size_t at = 0; at < prompt.size(); at += 3) {
    const size_t n = std::min<size_t>(3, prompt.size() - at);
    std::vector<models::PagedSequence> batch = {
        {std::vector<uint32_t>{static_cast<uint32_t>(at % 50 + 1)}, at, pages_b},
        {std::vector<uint32_t>(prompt.begin() + at, prompt.begin() + at + n), at, pages_a}};
    Tensor logits = model->forward_paged(batch, cache).to_device(cpu);
    EXPECT_LE(max_abs_diff(logits.get(1).to_vec_f64(), ref.get(at + n - 1).to_vec_f64()),
              1e-5 * range)
        << "position " << at + n - 1;
  }
}

// Windows shorter and longer than the positions and soft-caps, against the CPU's kernel run in
// float64 on the same values. Values of one sign keep the outputs away from zero.
TEST(CudaPagedAttention, WindowsAndSoftCapsWithinTheirBoundOfFloat64) {
  WICK_REQUIRE_GPU();
  const size_t h = 8, h_kv = 2, d = 64, ps = 16, pages = 12;
  std::vector<uint32_t> table = {5, 2, 9, 0, 11, 0};
  std::vector<uint32_t> seq = {0, 0, 1, 1, 1}, pos = {30, 39, 0, 7, 19};
  const size_t t = seq.size();
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    Tensor q = random_tensor({t, h, d}, dt, cpu, -0.5, 0.5);
    Tensor k = random_tensor({pages, h_kv, ps, d}, dt);
    Tensor v = random_tensor({pages, h_kv, ps, d}, dt, cpu, 0.5, 1.5);
    for (size_t window : {size_t{0}, size_t{1}, size_t{7}, size_t{100}}) {
      for (double cap : {0.0, 0.3, 5.0}) {
        SCOPED_TRACE(::testing::Message() << dt << " window " << window << " cap " << cap);
        Tensor want = nn::paged_attention(q.to_dtype(DType::F64), k.to_dtype(DType::F64),
                                          v.to_dtype(DType::F64), u32(table, {2, 3}, cpu),
                                          u32(seq, {t}, cpu), u32(pos, {t}, cpu), 0, window, cap);
        Tensor got = nn::paged_attention(q.to_device(gpu()), k.to_device(gpu()), v.to_device(gpu()),
                                         u32(table, {2, 3}, gpu()), u32(seq, {t}, gpu()),
                                         u32(pos, {t}, gpu()), 0, window, cap)
                         .to_device(cpu);
        ASSERT_EQ(got.dtype(), dt);
        // Scores from f32 dot products of |q k| <= 0.5 summed over d (errors moving the
        // probabilities twice as much relative), a 40-long sum in f32, the output's rounding.
        const double uc = numerics::compute_roundoff(dt), u = numerics::unit_roundoff(dt);
        const double bound = 2 * (2 * std::sqrt(double(d)) * uc * 0.5 * d * scale + 5 * uc * 4) +
                             2 * std::sqrt(40.0) * uc * 1.5 + 2 * u * 1.5;
        EXPECT_LE(max_abs_diff(got.to_vec_f64(), want.to_vec_f64()), bound);
      }
    }
  }
}

// Positions past one pass of the block's warps (4 warps of 32 keys: 128 keys), with windows that
// start inside a tile, head dims of 64, 128 and 256 (the kernels compiled for them) and 40 (element
// loads), against the CPU's kernel in float64, and the same bits alone as in the batch. The pools'
// page 0, in no table, holds NaN: a tile's missing keys must add nothing of it.
TEST(CudaPagedAttention, LongSequencesOverSeveralTilesWithinTheirBound) {
  WICK_REQUIRE_GPU();
  const size_t h = 4, h_kv = 2, ps = 16, pages = 24, width = 20;
  std::vector<uint32_t> table(width);
  for (size_t i = 0; i < width; ++i) {
    table[i] = static_cast<uint32_t>(1 + (7 * i + 3) % (pages - 1));
  }
  std::vector<uint32_t> seq = {0, 0, 0, 0}, pos = {127, 128, 257, 319};
  const size_t t = seq.size();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (size_t d : {size_t{64}, size_t{128}, size_t{256}, size_t{40}}) {
      const double scale = 1 / std::sqrt(static_cast<double>(d));
      Tensor q = random_tensor({t, h, d}, dt, cpu, -0.5, 0.5);
      Tensor nan_page = Tensor::full(nan, {1, h_kv, ps, d}, cpu).to_dtype(dt);
      Tensor k = Tensor::cat({nan_page, random_tensor({pages - 1, h_kv, ps, d}, dt)}, 0);
      Tensor v =
          Tensor::cat({nan_page, random_tensor({pages - 1, h_kv, ps, d}, dt, cpu, 0.5, 1.5)}, 0);
      for (size_t window : {size_t{0}, size_t{200}}) {
        SCOPED_TRACE(::testing::Message() << dt << " d " << d << " window " << window);
        Tensor want = nn::paged_attention(q.to_dtype(DType::F64), k.to_dtype(DType::F64),
                                          v.to_dtype(DType::F64), u32(table, {1, width}, cpu),
                                          u32(seq, {t}, cpu), u32(pos, {t}, cpu), 0, window);
        auto on_gpu = [&](const Tensor& qs, const std::vector<uint32_t>& ss,
                          const std::vector<uint32_t>& ps_) {
          return nn::paged_attention(qs.to_device(gpu()), k.to_device(gpu()), v.to_device(gpu()),
                                     u32(table, {1, width}, gpu()), u32(ss, {ss.size()}, gpu()),
                                     u32(ps_, {ps_.size()}, gpu()), 0, window)
              .to_device(cpu);
        };
        Tensor got = on_gpu(q, seq, pos);
        // As the windows test's bound, for sums over up to 320 keys.
        const double uc = numerics::compute_roundoff(dt), u = numerics::unit_roundoff(dt);
        const double bound = 2 * (2 * std::sqrt(double(d)) * uc * 0.5 * d * scale + 5 * uc * 4) +
                             2 * std::sqrt(320.0) * uc * 1.5 + 2 * u * 1.5;
        EXPECT_LE(max_abs_diff(got.to_vec_f64(), want.to_vec_f64()), bound);
        EXPECT_EQ(on_gpu(q.narrow(0, 2, 1), {0}, {257}).to_vec_f64(),
                  got.narrow(0, 2, 1).to_vec_f64());
      }
    }
  }
}

// The tensor-core paged mode (f16/bf16) over pages of 32 positions: head dims of every shape its
// tile loads take (16, 32, 96, 128, and 256 with 4 warps a block), a group of 6 query heads a k/v
// head, positions whose keys need 1 to 3 splits, windows that start inside a tile and past several
// tiles, a sequence's first page missing from the pool (its keys add nothing), and a padding token
// of no sequence (zeros); against the CPU's kernel in float64, and the same bits alone.
TEST(CudaPagedAttention, TensorCoreModeAcrossHeadDimsSplitsAndWindows) {
  WICK_REQUIRE_GPU();
  const size_t h = 6, h_kv = 1, ps = 32, pages = 30, width = 24;
  std::vector<uint32_t> table(2 * width);
  for (size_t i = 0; i < table.size(); ++i) {
    table[i] = static_cast<uint32_t>(1 + (11 * i + 5) % (pages - 1));
  }
  std::vector<uint32_t> seq = {0, 1, 0, 1, 0, 2}, pos = {5, 250, 520, 700, 767, 3};
  const size_t t = seq.size();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::F16, DType::BF16}) {
    for (size_t d : {size_t{16}, size_t{32}, size_t{96}, size_t{128}, size_t{256}}) {
      const double scale = 1 / std::sqrt(static_cast<double>(d));
      Tensor q = random_tensor({t, h, d}, dt, cpu, -0.5, 0.5);
      Tensor nan_page = Tensor::full(nan, {1, h_kv, ps, d}, cpu).to_dtype(dt);
      Tensor k = Tensor::cat({nan_page, random_tensor({pages - 1, h_kv, ps, d}, dt)}, 0);
      Tensor v =
          Tensor::cat({nan_page, random_tensor({pages - 1, h_kv, ps, d}, dt, cpu, 0.5, 1.5)}, 0);
      for (size_t window : {size_t{0}, size_t{20}, size_t{300}}) {
        SCOPED_TRACE(::testing::Message() << dt << " d " << d << " window " << window);
        // The float64 reference of the tokens of sequences 0 and 1 (the CPU refuses a missing
        // page and a padding token; they are checked apart below).
        const size_t real = 5;
        Tensor want =
            nn::paged_attention(q.narrow(0, 0, real).to_dtype(DType::F64), k.to_dtype(DType::F64),
                                v.to_dtype(DType::F64), u32(table, {2, width}, cpu),
                                u32({seq.begin(), seq.begin() + real}, {real}, cpu),
                                u32({pos.begin(), pos.begin() + real}, {real}, cpu), 0, window);
        auto on_gpu = [&](const Tensor& qs, const std::vector<uint32_t>& tab,
                          const std::vector<uint32_t>& ss, const std::vector<uint32_t>& ps_) {
          return nn::paged_attention(qs.to_device(gpu()), k.to_device(gpu()), v.to_device(gpu()),
                                     u32(tab, {2, width}, gpu()), u32(ss, {ss.size()}, gpu()),
                                     u32(ps_, {ps_.size()}, gpu()), 0, window)
              .to_device(cpu);
        };
        Tensor got = on_gpu(q, table, seq, pos);
        ASSERT_EQ(got.dtype(), dt);
        const double uc = numerics::compute_roundoff(dt), u = numerics::unit_roundoff(dt);
        const double bound = 2 * (2 * std::sqrt(double(d)) * uc * 0.5 * d * scale + 5 * uc * 4) +
                             2 * std::sqrt(768.0) * uc * 1.5 + 2 * u * 1.5;
        EXPECT_LE(max_abs_diff(got.narrow(0, 0, real).to_vec_f64(), want.to_vec_f64()), bound);
        for (double x : got.get(real).to_vec_f64()) ASSERT_EQ(x, 0.0) << "the padding token";
        for (size_t i : {size_t{1}, size_t{3}}) {
          EXPECT_EQ(on_gpu(q.narrow(0, i, 1), table, {seq[i]}, {pos[i]}).to_vec_f64(),
                    got.narrow(0, i, 1).to_vec_f64())
              << "token " << i << " alone";
        }
        // Sequence 1 with its first page outside the pool: its keys 0-31 add nothing, as a
        // window that starts at key 32 would.
        if (window == 0) {
          std::vector<uint32_t> holed = table;
          holed[width] = static_cast<uint32_t>(pages + 7);
          Tensor hole = on_gpu(q.narrow(0, 1, 1), holed, {1}, {250});
          Tensor after =
              nn::paged_attention(q.narrow(0, 1, 1).to_dtype(DType::F64), k.to_dtype(DType::F64),
                                  v.to_dtype(DType::F64), u32(table, {2, width}, cpu),
                                  u32({1}, {1}, cpu), u32({250}, {1}, cpu), 0, 250 - 32 + 1);
          EXPECT_LE(max_abs_diff(hole.to_vec_f64(), after.to_vec_f64()), bound);
        }
      }
    }
  }
}

// The decoder families (q/k norms, windows, soft-caps, Gemma's norms and two ropes) batched on
// the GPU: both reference prompts in chunks of 5 beside each other, each chunk's last logits
// within transformers' (f32, no TF32).
TEST(CudaPagedForward, DecoderFamiliesGiveTransformersLogits) {
  WICK_REQUIRE_GPU();
  for (const char* family : {"qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "phi3_partial",
                             "phi3_partial_longrope"}) {
    SCOPED_TRACE(family);
    const std::string dir = std::string(WICK_TEST_DATA_DIR) + "/families/" + family;
    auto model = models::load_causal_lm(dir, gpu());
    Tensor prompts = npy::load(dir + "/prompt.npy", cpu);  // (2, 12)
    Tensor ref = npy::load(dir + "/logits.npy", cpu);      // (2, 12, vocab)
    const double bound = 256 * numerics::unit_roundoff(DType::F32) * range_of(ref.to_vec_f64());
    std::vector<std::vector<uint32_t>> prompt(2);
    for (size_t b = 0; b < 2; ++b) {
      for (double x : prompts.get(b).to_vec_f64()) prompt[b].push_back(static_cast<uint32_t>(x));
    }
    models::PagedKvCache cache = model->make_paged_cache(16, 4);
    std::vector<std::vector<uint32_t>> pages = {{7, 3, 12}, {2, 4, 5}};
    for (size_t at = 0; at < 12; at += 5) {
      const size_t n = std::min<size_t>(5, 12 - at);
      std::vector<models::PagedSequence> batch;
      for (size_t b = 0; b < 2; ++b) {
        batch.push_back({std::vector<uint32_t>(prompt[b].begin() + at, prompt[b].begin() + at + n),
                         at, pages[b]});
      }
      Tensor logits = model->forward_paged(batch, cache).to_device(cpu);
      for (size_t b = 0; b < 2; ++b) {
        EXPECT_LE(max_abs_diff(logits.get(b).to_vec_f64(), ref.get(b).get(at + n - 1).to_vec_f64()),
                  bound)
            << "prompt " << b << " position " << at + n - 1;
      }
    }
  }
}

// One sequence stepped a token at a time (the single stream's step, which the backend's decode
// plan runs over the pools): each step's logits within transformers' (f32, no TF32), for Llama's
// class (Qwen2, with q/k/v biases) and the families the plan takes (q/k norms, a window of 8 over
// 12 positions, Phi-3's fused weights, Gemma's post-norms, GELU gate, soft-caps, scaled
// embedding and local rope tables).
TEST(CudaPagedForward, OneTokenStepsGiveTransformersLogits) {
  WICK_REQUIRE_GPU();
  for (const char* name : {"llama/tiny_qwen2", "families/qwen3", "families/mistral",
                           "families/phi3", "families/gemma2", "families/gemma3_text"}) {
    SCOPED_TRACE(name);
    const std::string dir = std::string(WICK_TEST_DATA_DIR) + "/" + name;
    auto model = models::load_causal_lm(dir, gpu());
    Tensor prompts = npy::load(dir + "/prompt.npy", cpu);
    Tensor ref = npy::load(dir + "/logits.npy", cpu);
    if (prompts.rank() == 2) {  // the families' two prompts: the first
      prompts = prompts.get(0);
      ref = ref.get(0);
    }
    const double bound = 256 * numerics::unit_roundoff(DType::F32) * range_of(ref.to_vec_f64());
    models::PagedKvCache cache = model->make_paged_cache(16, 4);
    const std::vector<uint32_t> pages = {7, 3, 12, 1, 9, 0, 5, 11};
    std::vector<double> prompt = prompts.to_vec_f64();
    for (size_t at = 0; at < prompt.size() && at < pages.size() * 4; ++at) {
      std::vector<models::PagedSequence> batch = {
          {std::vector<uint32_t>{static_cast<uint32_t>(prompt[at])}, at, pages}};
      Tensor logits = model->forward_paged(batch, cache).to_device(cpu);
      ASSERT_EQ(logits.dims()[0], 1u);
      EXPECT_LE(max_abs_diff(logits.get(0).to_vec_f64(), ref.get(at).to_vec_f64()), bound)
          << "position " << at;
    }
  }
}

}  // namespace
}  // namespace wick
