// f16/bf16 decoder ops on CUDA round where the CPU's do (and transformers', docs/NUMERICS.md
// "Half-precision rounding points"; the CPU side is pinned bit for bit by
// tests/test_half_rounding.cpp). Same inputs on both devices: element-wise ops must be bit-equal;
// ops with an f32 sum or rsqrt may differ by one unit in the last place where an f32 difference
// flips a rounding, rarely.

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "test_util.h"
#include "wick/nn/attention.h"
#include "wick/nn/decoder_ops.h"

namespace wick {
namespace {

using namespace wick::testing;

Device gpu() {
  return Device::cuda(0);
}

// Multiples of 1/8 in [-2, 2]: short f32 sums of their products are exact.
Tensor coarse(const Shape& shape, DType dt) {
  std::vector<double> v = random_values(shape.elem_count(), -16.0, 16.0);
  for (double& x : v) x = std::round(x) * 0.125;
  return tensor_from(v, shape, dt);
}

// got (CUDA) against want (CPU): at most `max_differ` of the elements differ, each by at most
// one step of the dtype (8 significant bits for bf16, 11 for f16) at the larger of the value's
// magnitude and `floor` (a sum that cancels to near zero keeps the f32 order difference of its
// terms' magnitude).
void expect_nearly_bit_equal(const Tensor& got, const Tensor& want, double max_differ,
                             const std::string& what, double floor = 1e-30) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<double> g = got.to_device(Device::cpu()).to_vec_f64(), w = want.to_vec_f64();
  int bits = got.dtype() == DType::BF16 ? 8 : 11;
  size_t differ = 0, far = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == w[i]) continue;
    ++differ;
    double step = std::ldexp(1.0, std::ilogb(std::max(std::abs(w[i]), floor)) - (bits - 1));
    far += std::abs(g[i] - w[i]) > step;
  }
  EXPECT_EQ(far, 0u) << what << ": " << far << " elements differ by more than one step";
  EXPECT_LE(static_cast<double>(differ), max_differ * static_cast<double>(g.size()))
      << what << ": " << differ << " of " << g.size() << " differ";
}

const std::vector<DType> kHalves = {DType::BF16, DType::F16};

TEST(CudaHalfRounding, ElementwiseOpsEqualTheCpuBitForBit) {
  WICK_REQUIRE_GPU();
  for (DType dt : kHalves) {
    std::string name = dtype_name(dt);
    Tensor gu = random_tensor({5, 2 * 96}, dt);
    expect_nearly_bit_equal(nn::silu_mul(gu.to_device(gpu())), nn::silu_mul(gu), 0,
                            name + " silu_mul");
    Tensor x = random_tensor({1, 3, 5, 16}, dt);
    Tensor cos = random_tensor({5, 8}, dt), sin = random_tensor({5, 8}, dt);
    expect_nearly_bit_equal(x.to_device(gpu()).rope(cos.to_device(gpu()), sin.to_device(gpu())),
                            x.rope(cos, sin), 0, name + " rope");
  }
}

TEST(CudaHalfRounding, NormsEqualTheCpu) {
  WICK_REQUIRE_GPU();
  for (DType dt : kHalves) {
    std::string name = dtype_name(dt);
    for (size_t d : {size_t{64}, size_t{896}, size_t{2048}}) {
      Tensor x = coarse({4, d}, dt), delta = coarse({4, d}, dt), w = random_tensor({d}, dt);
      // rsqrt differs between the devices by an f32 ulp at most: a rare flipped rounding.
      expect_nearly_bit_equal(x.to_device(gpu()).rms_norm(w.to_device(gpu()), 1e-5),
                              x.rms_norm(w, 1e-5), 0.01, name + " rms_norm " + std::to_string(d));
      nn::ResidualNorm g =
          nn::add_rms_norm(x.to_device(gpu()), delta.to_device(gpu()), w.to_device(gpu()), 1e-5);
      nn::ResidualNorm c = nn::add_rms_norm(x, delta, w, 1e-5);
      expect_nearly_bit_equal(g.residual, c.residual, 0, name + " add_rms_norm sum");
      expect_nearly_bit_equal(g.normed, c.normed, 0.01, name + " add_rms_norm");
    }
  }
}

TEST(CudaHalfRounding, ShortAttentionEqualsTheCpu) {
  WICK_REQUIRE_GPU();
  // CUDA rounds attention as the CPU does only with WICK_ATTENTION_ROUNDING=transformers (the
  // ctest cuda_test_cuda_half_rounding_attention sets it).
  const char* rounding = std::getenv("WICK_ATTENTION_ROUNDING");
  if (rounding == nullptr || std::string(rounding) != "transformers") {
    GTEST_SKIP() << "needs WICK_ATTENTION_ROUNDING=transformers";
  }
  for (DType dt : kHalves) {
    for (bool causal : {false, true}) {
      for (size_t s : {size_t{1}, size_t{7}}) {
        // 8 query heads over 2 k/v heads, d 64: the decode step and a short prompt.
        Tensor q = coarse({1, 8, s, 64}, dt), k = coarse({1, 2, 90, 64}, dt);
        Tensor v = random_tensor({1, 2, 90, 64}, dt);
        nn::AttentionOptions opts;
        opts.causal = causal;
        Tensor want = nn::scaled_dot_product_attention(q, k, v, opts);
        Tensor got = nn::scaled_dot_product_attention(q.to_device(gpu()), k.to_device(gpu()),
                                                      v.to_device(gpu()), opts);
        // P V sums in another order on the GPU: where the sum cancels (v in [-2, 2]), the f32
        // order difference (90 terms up to 2, 2^-24 each: about 1e-5) stays below an f16 step
        // at 1/32 (3e-5).
        expect_nearly_bit_equal(
            got, want, 0.05,
            std::string(dtype_name(dt)) + (causal ? " causal s " : " s ") + std::to_string(s),
            1.0 / 32);
      }
    }
  }
}

}  // namespace
}  // namespace wick
