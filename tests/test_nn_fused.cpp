// The fused ops (softmax_last_dim, layer_norm, rms_norm, rope, rope_interleaved, attention) on
// the CPU: values on every float dtype and on contiguous, transposed and broadcast inputs against
// oracles written in long double loops (nn_reference.h) under the bounds of wick/numerics.h, and
// gradients against the backward pass of their compositions from element-wise ops in f64.

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "nn_reference.h"
#include "test_util.h"

namespace wick {
namespace {

using testing::random_tensor;

// Gradients of the fused ops against those of their f64 compositions: relative to the largest
// gradient (numerics.h bounds values, not backward passes).
double grad_tolerance(DType dt) {
  switch (dt) {
    case DType::BF16:
      return 5e-2;
    case DType::F16:
      return 1e-2;
    case DType::F32:
      return 2e-4;
    default:
      return 2e-11;
  }
}
using namespace wick::testing;

const Device cpu = Device::cpu();

std::vector<DType> fused_dtypes() {
  return {DType::BF16, DType::F16, DType::F32, DType::F64};
}

// ---- softmax_last_dim ----

TEST(NnFused, SoftmaxLastDimMatchesComposition) {
  for (DType dt : fused_dtypes()) {
    for (auto& [name, x] : testing::layout_variants({3, 4, 37}, dt)) {
      EXPECT_TRUE(softmax_last_within(x.softmax_last_dim(), x)) << name << " " << dt;
    }
  }
  EXPECT_THROW(Tensor::scalar(1.0f, cpu).softmax_last_dim(), ShapeMismatch);
}

// ---- norms ----

TEST(NnFused, LayerNormMatchesCompositionOnEveryLayout) {
  for (DType dt : fused_dtypes()) {
    for (auto& [name, x] : testing::layout_variants({3, 5, 67}, dt)) {
      Tensor w = random_tensor({67}, dt), b = random_tensor({67}, dt);
      EXPECT_TRUE(norm_within(x.layer_norm(w, b, 1e-5), x, w, b, 1e-5, false)) << name << " " << dt;
      EXPECT_TRUE(norm_within(x.layer_norm(w, Tensor(), 1e-5), x, w, Tensor(), 1e-5, false))
          << name << " " << dt;
    }
  }
}

// Enough rows (about 16k elements a block) that the threads share them out block by block.
TEST(NnFused, NormsOverManyRowBlocks) {
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor x = random_tensor({301, 257}, dt), w = random_tensor({257}, dt),
           b = random_tensor({257}, dt);
    EXPECT_TRUE(norm_within(x.rms_norm(w, 1e-6), x, w, Tensor(), 1e-6, true)) << dt;
    EXPECT_TRUE(norm_within(x.layer_norm(w, b, 1e-5), x, w, b, 1e-5, false)) << dt;
  }
}

// f32 outputs of 4 MB or more go out by non-temporal stores, from each row's first 32-byte
// boundary: rows of 1,027 floats start at every alignment.
TEST(NnFused, NormsWithStreamedOutputs) {
  Tensor x = random_tensor({1031, 1027}, DType::F32), w = random_tensor({1027}, DType::F32),
         b = random_tensor({1027}, DType::F32);
  EXPECT_TRUE(norm_within(x.rms_norm(w, 1e-6), x, w, Tensor(), 1e-6, true));
  EXPECT_TRUE(norm_within(x.layer_norm(w, b, 1e-5), x, w, b, 1e-5, false));
}

TEST(NnFused, RmsNormMatchesCompositionOnEveryLayout) {
  for (DType dt : fused_dtypes()) {
    for (auto& [name, x] : testing::layout_variants({2, 7, 130}, dt)) {
      // A strided weight (every other element of a longer vector).
      Tensor w = random_tensor({130, 2}, dt).narrow(1, 1, 1).squeeze(1);
      EXPECT_TRUE(norm_within(x.rms_norm(w, 1e-6), x, w, Tensor(), 1e-6, true))
          << name << " " << dt;
    }
  }
}

TEST(NnFused, NormsRejectBadParameters) {
  Tensor x = random_tensor({4, 8}, DType::F32);
  Tensor w = random_tensor({8}, DType::F32);
  EXPECT_THROW(x.layer_norm(random_tensor({7}, DType::F32), w, 1e-5), ShapeMismatch);
  EXPECT_THROW(x.layer_norm(w, random_tensor({2, 4}, DType::F32), 1e-5), ShapeMismatch);
  EXPECT_THROW(x.rms_norm(w.to_dtype(DType::F16), 1e-5), DTypeMismatch);
  EXPECT_THROW(x.to_dtype(DType::I64).rms_norm(w, 1e-5), UnsupportedDType);
  EXPECT_THROW(x.rms_norm(w, -1), Error);
  EXPECT_THROW(x.rms_norm(Tensor(), 1e-5), Error);
  try {
    x.rms_norm(random_tensor({9}, DType::F32), 1e-5);
    FAIL() << "no throw";
  } catch (const ShapeMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("[8]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[9]"), std::string::npos) << e.what();
  }
}

// Gradients of sum(y * r) for the fused op and its f64 composition.
void expect_same_grads(const std::function<Tensor(const std::vector<Tensor>&)>& fused,
                       const std::function<Tensor(const std::vector<Tensor>&)>& ref,
                       const std::vector<Tensor>& inputs, double tol, const std::string& what) {
  std::vector<Tensor> a, b;
  for (const Tensor& t : inputs) {
    a.push_back(t.requires_grad());
    b.push_back(f64(t).requires_grad());
  }
  Tensor y = fused(a);
  Tensor r = random_tensor(y.shape(), y.dtype());
  auto ga = y.mul(r).sum_all().backward();
  auto gb = ref(b).mul(f64(r)).sum_all().backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto x = ga.get(a[i]);
    auto e = gb.get(b[i]);
    ASSERT_TRUE(x.has_value() && e.has_value()) << what << " input " << i;
    EXPECT_EQ(x->dtype(), inputs[i].dtype());
    EXPECT_TRUE(close_to(*x, *e, tol)) << what << " gradient of input " << i;
  }
}

TEST(NnFused, NormGradientsMatchComposition) {
  for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
    double tol = grad_tolerance(dt);
    Tensor x = random_tensor({3, 4, 33}, dt), w = random_tensor({33}, dt),
           b = random_tensor({33}, dt);
    expect_same_grads(
        [](const std::vector<Tensor>& t) { return t[0].layer_norm(t[1], t[2], 1e-5); },
        [](const std::vector<Tensor>& t) { return layer_norm_ref(t[0], t[1], t[2], 1e-5); },
        {x, w, b}, tol, "layer_norm");
    expect_same_grads([](const std::vector<Tensor>& t) { return t[0].rms_norm(t[1], 1e-5); },
                      [](const std::vector<Tensor>& t) { return rms_norm_ref(t[0], t[1], 1e-5); },
                      {x.transpose(0, 1), w}, tol, "rms_norm");
  }
}

// An f32 weight of an f16/bf16 x (Gemma's 1 + w): the norm in f32, rounded once -- within the
// bound of no intermediate rounding; its gradients, the weight's in f32.
TEST(NnFused, RmsNormOfHalfByF32WeightRoundsOnce) {
  for (DType dt : {DType::BF16, DType::F16}) {
    for (auto& [name, x] : testing::layout_variants({2, 7, 130}, dt)) {
      Tensor w = random_tensor({130}, DType::F32);
      Tensor y = x.rms_norm(w, 1e-6);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(norm_within(y, x, w, Tensor(), 1e-6, true, 0)) << name << " " << dt;
    }
    expect_same_grads([](const std::vector<Tensor>& t) { return t[0].rms_norm(t[1], 1e-5); },
                      [](const std::vector<Tensor>& t) { return rms_norm_ref(t[0], t[1], 1e-5); },
                      {random_tensor({3, 33}, dt), random_tensor({33}, DType::F32)},
                      grad_tolerance(dt), std::string("rms_norm f32 weight ") + dtype_name(dt));
  }
  Tensor x = random_tensor({4, 8}, DType::BF16);
  EXPECT_THROW(x.rms_norm(random_tensor({8}, DType::F16), 1e-5), DTypeMismatch);
  EXPECT_THROW(x.layer_norm(random_tensor({8}, DType::F32), Tensor(), 1e-5), DTypeMismatch);
  EXPECT_THROW(x.to_dtype(DType::F64).rms_norm(random_tensor({8}, DType::F32), 1e-5),
               DTypeMismatch);
}

// ---- rope ----

TEST(NnFused, RopeMatchesCompositionOnEveryLayout) {
  for (DType dt : fused_dtypes()) {
    for (bool inter : {false, true}) {
      Tensor c = random_tensor({6, 8}, dt), s = random_tensor({6, 8}, dt);
      std::vector<std::pair<std::string, Tensor>> xs{
          {"contiguous", random_tensor({2, 3, 6, 16}, dt)},
          {"heads-transposed", random_tensor({2, 6, 3, 16}, dt).transpose(1, 2)},
          {"last-dim-strided", random_tensor({2, 3, 16, 6}, dt).transpose(2, 3)},
          {"broadcast", random_tensor({1, 3, 6, 16}, dt).broadcast_as({2, 3, 6, 16})}};
      for (auto& [name, x] : xs) {
        Tensor got = inter ? x.rope_interleaved(c, s) : x.rope(c, s);
        EXPECT_TRUE(rope_within(got, x, c, s, inter)) << name << " " << dt << " " << inter;
      }
    }
  }
  Tensor x = random_tensor({1, 2, 3, 8}, DType::F32);
  EXPECT_THROW(x.rope(random_tensor({3, 3}, DType::F32), random_tensor({3, 4}, DType::F32)),
               ShapeMismatch);
  EXPECT_THROW(random_tensor({2, 3, 8}, DType::F32)
                   .rope(random_tensor({3, 4}, DType::F32), random_tensor({3, 4}, DType::F32)),
               ShapeMismatch);
}

TEST(NnFused, RopeGradientsMatchComposition) {
  for (DType dt : {DType::F64, DType::F32}) {
    for (bool inter : {false, true}) {
      Tensor x = random_tensor({2, 3, 5, 8}, dt), c = random_tensor({5, 4}, dt),
             s = random_tensor({5, 4}, dt);
      expect_same_grads(
          [inter](const std::vector<Tensor>& t) {
            return inter ? t[0].rope_interleaved(t[1], t[2]) : t[0].rope(t[1], t[2]);
          },
          [inter](const std::vector<Tensor>& t) { return rope_ref(t[0], t[1], t[2], inter); },
          {x, c, s}, grad_tolerance(dt), inter ? "rope_interleaved" : "rope");
    }
  }
}

// ---- attention ----

struct AttnCase {
  std::string name;
  size_t b, h, hk, s, skv, d;
  bool causal;
  bool mask;
  double scale;
};

std::vector<AttnCase> attn_cases() {
  return {
      {"plain", 2, 4, 4, 5, 5, 8, false, false, 0},
      {"causal-square-past-tiles", 1, 2, 2, 70, 70, 16, true, false, 0},
      {"gqa-causal-aligned-to-end", 1, 4, 2, 3, 67, 8, true, false, 0},
      {"decode-s1-gqa", 2, 8, 2, 1, 130, 16, true, false, 0},
      {"masked-broadcast", 2, 2, 1, 9, 13, 8, false, true, 0.3},
      {"masked-causal", 1, 2, 2, 33, 65, 4, true, true, 0},
      // Tiles of 64 rows span two query heads of a group.
      {"gqa-causal-rows-span-heads", 1, 4, 2, 70, 75, 8, true, true, 0},
  };
}

TEST(NnFused, AttentionMatchesPlainSoftmaxQkv) {
  for (DType dt : fused_dtypes()) {
    for (const AttnCase& c : attn_cases()) {
      Tensor q = random_tensor({c.b, c.h, c.s, c.d}, dt);
      Tensor k = random_tensor({c.b, c.hk, c.skv, c.d}, dt);
      // v as a transposed view (b, s_kv, h_kv, d) -> (b, h_kv, s_kv, d): read in place. bf16's
      // bound (its scores' roundings) accepts zero for outputs that average mixed signs to
      // near 0: positive values there, so that a zero output still fails.
      double v_lo = dt == DType::BF16 ? 0.25 : -2.0;
      Tensor v = random_tensor({c.b, c.skv, c.hk, c.d}, dt, cpu, v_lo, 2.0).transpose(1, 2);
      nn::AttentionOptions o{c.causal, c.scale, std::nullopt};
      if (c.mask) o.mask = random_tensor({c.b, 1, c.s, c.skv}, dt);
      Tensor got = nn::scaled_dot_product_attention(q, k, v, o);
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_TRUE(attention_within(got, q, k, v, o)) << c.name << " " << dt;
    }
  }
}

TEST(NnFused, AttentionF32HeadDimsAndRemainders) {
  // The f32 kernel's register blocks and transposes: head dims that are (64, 128) and are not
  // (80 = 64 + 16, 20 = 16 + 4) multiples of its vector blocks, query rows that leave a partial
  // tile or vector of rows, key counts that leave a partial key tile and key block, and a sharp
  // softmax (scale 1) whose running maxima change from tile to tile; items of few rows (decoding,
  // up to one vector of rows) take their own path. CTest runs this file again under each
  // instruction set (isa_*).
  struct Case {
    size_t h, hk, s, skv, d;
    bool causal, mask;
    double scale;
  };
  const Case cases[] = {
      {2, 2, 70, 131, 64, false, false, 0},
      {4, 2, 37, 67, 80, true, false, 0},
      {2, 1, 130, 130, 128, true, false, 1},
      {2, 2, 1, 200, 128, false, true, 0},
      {3, 3, 65, 97, 20, true, true, 0},
      {8, 2, 1, 129, 64, true, false, 0},
      {2, 2, 17, 5, 80, false, false, 1},
      {4, 1, 3, 50, 20, true, true, 0},
      {4, 1, 2, 70, 80, true, false, 1},
      // Decoding steps whose groups leave 3, 2 and 1 rows past a block of rows.
      {9, 3, 1, 190, 64, true, false, 1},
      {6, 3, 1, 77, 20, true, true, 0},
      {5, 1, 1, 33, 80, false, false, 1},
  };
  for (const Case& c : cases) {
    Tensor q = random_tensor({1, c.h, c.s, c.d}, DType::F32);
    Tensor k = random_tensor({1, c.hk, c.skv, c.d}, DType::F32);
    Tensor v = random_tensor({1, c.hk, c.skv, c.d}, DType::F32);
    nn::AttentionOptions o{c.causal, c.scale, std::nullopt};
    if (c.mask) o.mask = random_tensor({1, c.h, c.s, c.skv}, DType::F32);
    Tensor got = nn::scaled_dot_product_attention(q, k, v, o);
    EXPECT_TRUE(attention_within(got, q, k, v, o))
        << "h " << c.h << " h_kv " << c.hk << " s " << c.s << " s_kv " << c.skv << " d " << c.d
        << (c.causal ? " causal" : "") << (c.mask ? " masked" : "");
  }
}

TEST(NnFused, AttentionReadsStridedMasks) {
  // A mask whose key dim is not contiguous (a transposed view) and one broadcast over queries
  // (stride 0), with key counts that leave a short last tile.
  for (size_t skv : {7, 40, 83}) {
    Tensor q = random_tensor({2, 3, 6, 8}, DType::F32);
    Tensor k = random_tensor({2, 3, skv, 8}, DType::F32);
    Tensor v = random_tensor({2, 3, skv, 8}, DType::F32);
    Tensor transposed = random_tensor({2, 3, skv, 6}, DType::F32).transpose(2, 3);
    Tensor per_key = random_tensor({2, 1, 1, skv}, DType::F32).broadcast_as({2, 3, 6, skv});
    for (const Tensor& m : {transposed, per_key}) {
      nn::AttentionOptions o{false, 0, m};
      Tensor got = nn::scaled_dot_product_attention(q, k, v, o);
      EXPECT_TRUE(attention_within(got, q, k, v, o)) << "s_kv " << skv;
    }
  }
}

TEST(NnFused, AttentionQueriesThatSeeNoKeyGetZeros) {
  // causal with s > s_kv: the first s - s_kv queries see no key.
  Tensor q = random_tensor({1, 1, 4, 8}, DType::F32), k = random_tensor({1, 1, 2, 8}, DType::F32);
  auto out = nn::scaled_dot_product_attention(q, k, k, {true, 0, std::nullopt}).to_vec_f64();
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(out[i], 0.0) << i;
  EXPECT_NE(out[16], 0.0);
}

TEST(NnFused, AttentionGradientsMatchComposition) {
  for (DType dt : {DType::F64, DType::F32}) {
    for (const AttnCase& c : {attn_cases()[2], attn_cases()[4], attn_cases()[5]}) {
      Tensor q = random_tensor({c.b, c.h, c.s, c.d}, dt);
      Tensor k = random_tensor({c.b, c.hk, c.skv, c.d}, dt);
      Tensor v = random_tensor({c.b, c.hk, c.skv, c.d}, dt);
      std::vector<Tensor> in{q, k, v};
      if (c.mask) in.push_back(random_tensor({c.b, c.h, c.s, c.skv}, dt));
      auto opts = [c](const std::vector<Tensor>& t) {
        nn::AttentionOptions o{c.causal, c.scale, std::nullopt};
        if (t.size() > 3) o.mask = t[3];
        return o;
      };
      expect_same_grads(
          [&](const std::vector<Tensor>& t) {
            return nn::scaled_dot_product_attention(t[0], t[1], t[2], opts(t));
          },
          [&](const std::vector<Tensor>& t) { return attention_ref(t[0], t[1], t[2], opts(t)); },
          in, 2.5 * grad_tolerance(dt), c.name);
    }
  }
}

TEST(NnFused, AttentionRejectsBadShapes) {
  auto r = [](const Shape& s) { return random_tensor(s, DType::F32); };
  using nn::scaled_dot_product_attention;
  EXPECT_THROW(scaled_dot_product_attention(r({1, 3, 4, 8}), r({1, 2, 4, 8}), r({1, 2, 4, 8})),
               ShapeMismatch);  // 3 heads over 2 k/v heads
  EXPECT_THROW(scaled_dot_product_attention(r({1, 2, 4, 8}), r({1, 2, 4, 4}), r({1, 2, 4, 4})),
               ShapeMismatch);
  EXPECT_THROW(scaled_dot_product_attention(r({1, 2, 4, 8}), r({1, 2, 5, 8}), r({1, 2, 4, 8})),
               ShapeMismatch);
  EXPECT_THROW(scaled_dot_product_attention(r({2, 4, 8}), r({2, 4, 8}), r({2, 4, 8})),
               ShapeMismatch);
  EXPECT_THROW(scaled_dot_product_attention(r({1, 2, 4, 8}), r({1, 2, 4, 8}), r({1, 2, 4, 8}),
                                            {false, 0, r({3, 4})}),
               ShapeMismatch);
  EXPECT_THROW(scaled_dot_product_attention(r({1, 2, 4, 8}), r({1, 2, 4, 8}).to_dtype(DType::F16),
                                            r({1, 2, 4, 8})),
               DTypeMismatch);
}

}  // namespace
}  // namespace wick
