// f16/bf16 decoder ops round where transformers' (PyTorch's) ops do (docs/NUMERICS.md,
// "Half-precision rounding points"): each fused op against its composition from wick's own
// one-rounding ops, bit for bit. Inputs are small multiples of a power of two, so that every
// f32 sum in them is exact and the order of summation cannot matter.

#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"
#include "wick/nn/attention.h"
#include "wick/nn/decoder_ops.h"

namespace wick {
namespace {

using namespace wick::testing;

// Values k / 8 for integers k in [-16, 16]: exact in f16 and bf16, products and short sums
// exact in f32.
Tensor coarse(const Shape& shape, DType dt, double step = 0.125) {
  std::vector<double> v = random_values(shape.elem_count(), -16.0, 16.0);
  for (double& x : v) x = std::round(x) * step;
  return tensor_from(v, shape, dt);
}

void expect_bits_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<double> g = got.to_vec_f64(), w = want.to_vec_f64();
  size_t differ = 0;
  for (size_t i = 0; i < g.size(); ++i) differ += g[i] != w[i];
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << g.size() << " differ";
}

const std::vector<DType> kHalves = {DType::BF16, DType::F16};

TEST(HalfRounding, SiluMulRoundsSiluThenTheProduct) {
  for (DType dt : kHalves) {
    Tensor gu = random_tensor({5, 2 * 96}, dt);
    Tensor want = gu.narrow(1, 0, 96).silu().mul(gu.narrow(1, 96, 96));  // two roundings
    expect_bits_equal(nn::silu_mul(gu), want, std::string(dtype_name(dt)));
  }
}

TEST(HalfRounding, RopeRoundsEachProductThenTheSum) {
  for (DType dt : kHalves) {
    Tensor x = random_tensor({1, 3, 5, 16}, dt);
    Tensor cos = random_tensor({5, 8}, dt), sin = random_tensor({5, 8}, dt);
    // transformers: q * cat(cos, cos) + rotate_half(q) * cat(sin, sin), each op in dt.
    Tensor c2 = Tensor::cat({cos, cos}, 1), s2 = Tensor::cat({sin, sin}, 1);
    Tensor rot = Tensor::cat({x.narrow(3, 8, 8).neg(), x.narrow(3, 0, 8)}, 3);
    Tensor want = x.broadcast_mul(c2).add(rot.broadcast_mul(s2));
    expect_bits_equal(x.rope(cos, sin), want, std::string(dtype_name(dt)));
  }
}

TEST(HalfRounding, RmsNormRoundsTheNormalisedRowBeforeTheWeight) {
  for (DType dt : kHalves) {
    const size_t d = 64;
    Tensor x = coarse({4, d}, dt), w = random_tensor({d}, dt), delta = coarse({4, d}, dt);
    // The sums of squares are exact (multiples of 1/64 well inside f32): rstd as the kernel and
    // PyTorch compute it, then the two roundings of transformers' LlamaRMSNorm.
    auto reference = [&](const Tensor& in) {
      std::vector<double> xv = in.to_vec_f64(), wv = w.to_vec_f64(), out(xv.size());
      for (size_t r = 0; r < 4; ++r) {
        float sq = 0;
        for (size_t c = 0; c < d; ++c) sq += static_cast<float>(xv[r * d + c] * xv[r * d + c]);
        float rstd = 1.0f / std::sqrt(sq / static_cast<float>(d) + 1e-5f);
        for (size_t c = 0; c < d; ++c) {
          float normed = static_cast<float>(
              tensor_from({static_cast<float>(xv[r * d + c]) * rstd}, {1}, dt).to_vec_f64()[0]);
          out[r * d + c] = static_cast<float>(wv[c]) * normed;
        }
      }
      return tensor_from(out, in.shape(), DType::F64).to_dtype(dt);
    };
    expect_bits_equal(x.rms_norm(w, 1e-5), reference(x), std::string(dtype_name(dt)) + " rms_norm");
    nn::ResidualNorm r = nn::add_rms_norm(x, delta, w, 1e-5);
    expect_bits_equal(r.residual, x.add(delta), std::string(dtype_name(dt)) + " add_rms_norm sum");
    expect_bits_equal(r.normed, reference(r.residual),
                      std::string(dtype_name(dt)) + " add_rms_norm");
  }
}

// transformers' eager attention in dt: round(round(q k^T) * scale) (+ mask), softmax in f32 of
// the whole row, probabilities rounded to dt, P V summed in f32 and rounded once.
Tensor eager_reference(const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal,
                       DType dt) {
  size_t h = q.dims()[1], s = q.dims()[2], d = q.dims()[3], s_kv = k.dims()[2];
  size_t group = h / k.dims()[1];
  std::vector<double> qv = q.to_vec_f64(), kv = k.to_vec_f64(), vv = v.to_vec_f64();
  std::vector<double> out(h * s * d);
  auto round_dt = [&](float x) {
    return static_cast<float>(tensor_from({x}, {1}, dt).to_vec_f64()[0]);
  };
  for (size_t hi = 0; hi < h; ++hi) {
    size_t hk = hi / group;
    for (size_t qi = 0; qi < s; ++qi) {
      size_t visible = causal ? qi + s_kv - s + 1 : s_kv;
      std::vector<float> p(visible);
      float mx = -std::numeric_limits<float>::infinity();
      for (size_t j = 0; j < visible; ++j) {
        float dot = 0;
        for (size_t t = 0; t < d; ++t) {
          dot += static_cast<float>(qv[(hi * s + qi) * d + t] * kv[(hk * s_kv + j) * d + t]);
        }
        p[j] = round_dt(round_dt(dot) * static_cast<float>(scale));
        mx = std::max(mx, p[j]);
      }
      float sum = 0;
      for (float& e : p) {
        e = std::exp(e - mx);
        sum += e;
      }
      for (float& e : p) e = round_dt(e / sum);
      for (size_t t = 0; t < d; ++t) {
        float acc = 0;
        for (size_t j = 0; j < visible; ++j) {
          acc += p[j] * static_cast<float>(vv[(hk * s_kv + j) * d + t]);
        }
        out[(hi * s + qi) * d + t] = acc;
      }
    }
  }
  return tensor_from(out, q.shape(), DType::F64).to_dtype(dt);
}

TEST(HalfRounding, AttentionRoundsLikeEagerAttention) {
  for (DType dt : kHalves) {
    for (bool causal : {false, true}) {
      // 4 query heads over 2 k/v heads; 70 keys cross a 64-key tile.
      Tensor q = coarse({1, 4, 3, 16}, dt), k = coarse({1, 2, 70, 16}, dt);
      Tensor v = random_tensor({1, 2, 70, 16}, dt);
      nn::AttentionOptions opts;
      opts.causal = causal;
      Tensor got = nn::scaled_dot_product_attention(q, k, v, opts);
      expect_bits_equal(got, eager_reference(q, k, v, 0.25, causal, dt),
                        std::string(dtype_name(dt)) + (causal ? " causal" : ""));
    }
  }
}

}  // namespace
}  // namespace wick
