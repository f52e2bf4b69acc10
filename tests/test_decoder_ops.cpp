// nn::add_rms_norm, nn::silu_mul and the decode step's rope + KV-cache write on the CPU against
// their compositions in f64, on every float dtype and layout; errors; gradients through the
// composed path.

#include <cmath>
#include <vector>

#include "nn/kv_write.h"
#include "nn_reference.h"
#include "test_util.h"
#include "wick/nn/decoder_ops.h"

namespace wick {
namespace {

using namespace wick::testing;

const Device cpu = Device::cpu();

std::vector<DType> float_dtypes() {
  return {DType::BF16, DType::F16, DType::F32, DType::F64};
}

TEST(DecoderOps, AddRmsNormMatchesComposition) {
  for (DType dt : float_dtypes()) {
    for (auto& [name, x] : layout_variants({2, 7, 130}, dt)) {
      Tensor delta = random_tensor({2, 7, 130}, dt), w = random_tensor({130}, dt);
      nn::ResidualNorm r = nn::add_rms_norm(x, delta, w, 1e-5);
      // The norm reads the sum rounded to dt: the reference does too.
      Tensor sum = f64(x).add(f64(delta));
      EXPECT_TRUE(close_to(r.residual, sum, tolerance(dt))) << name << " " << dt;
      Tensor ref = rms_norm_ref(f64(sum.to_dtype(dt)), f64(w), 1e-5);
      EXPECT_TRUE(close_to(r.normed, ref, 2 * tolerance(dt))) << name << " " << dt;
      EXPECT_EQ(r.normed.shape(), x.shape());
    }
  }
}

TEST(DecoderOps, AddRmsNormErrorsAndGradients) {
  Tensor x = random_tensor({3, 8}, DType::F32), w = random_tensor({8}, DType::F32);
  EXPECT_THROW(nn::add_rms_norm(x, random_tensor({3, 7}, DType::F32), w, 1e-5), ShapeMismatch);
  EXPECT_THROW(nn::add_rms_norm(x, x, random_tensor({7}, DType::F32), 1e-5), ShapeMismatch);
  EXPECT_THROW(nn::add_rms_norm(x, x.to_dtype(DType::F64), w, 1e-5), DTypeMismatch);
  EXPECT_THROW(nn::add_rms_norm(x.to_dtype(DType::U32), x.to_dtype(DType::U32),
                                w.to_dtype(DType::U32), 1e-5),
               UnsupportedDType);
  // Tracked inputs: the composition records, the gradient equals the composed op's.
  Tensor x64 = random_tensor({3, 8}, DType::F64), d64 = random_tensor({3, 8}, DType::F64);
  Tensor w64 = random_tensor({8}, DType::F64);
  Tensor xa = x64.requires_grad(), xb = x64.requires_grad();
  GradStore g = nn::add_rms_norm(xa, d64, w64, 1e-5).normed.sqr().sum_all().backward();
  GradStore gr = xb.add(d64).rms_norm(w64, 1e-5).sqr().sum_all().backward();
  ASSERT_TRUE(g.get(xa) && gr.get(xb));
  EXPECT_TRUE(all_close(g.get(xa)->to_vec_f64(), gr.get(xb)->to_vec_f64(), 1e-12, 1e-12));
}

TEST(DecoderOps, SiluMulMatchesComposition) {
  for (DType dt : float_dtypes()) {
    for (auto& [name, gu] : layout_variants({3, 4, 2 * 37}, dt)) {
      Tensor g = f64(gu).narrow(2, 0, 37), u = f64(gu).narrow(2, 37, 37);
      Tensor ref = g.mul(g.neg().exp().affine(1, 1).recip()).mul(u);
      Tensor got = nn::silu_mul(gu);
      EXPECT_EQ(got.shape(), Shape({3, 4, 37}));
      EXPECT_TRUE(close_to(got, ref, 2 * tolerance(dt))) << name << " " << dt;
    }
  }
  EXPECT_THROW(nn::silu_mul(random_tensor({2, 5}, DType::F32)), ShapeMismatch);
  EXPECT_THROW(nn::silu_mul(Tensor::zeros({2, 4}, DType::U32, cpu)), UnsupportedDType);
}

// The rope + cache write against rope_ref and a plain copy, at a position inside the cache.
TEST(DecoderOps, RopeWriteAtPositionMatchesComposition) {
  size_t b = 2, s = 3, h = 4, hkv = 2, d = 8, max_len = 10, p = 5;
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    Tensor qkv = random_tensor({b, s, (h + 2 * hkv) * d}, dt);
    Tensor bias = random_tensor({(h + 2 * hkv) * d}, dt);
    Tensor cos = random_tensor({max_len, d / 2}, dt), sin = random_tensor({max_len, d / 2}, dt);
    Tensor kc = Tensor::zeros({b, hkv, max_len, d}, dt, cpu);
    Tensor vc = Tensor::zeros({b, hkv, max_len, d}, dt, cpu);
    Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, cpu);
    Tensor q = nn::detail::rope_write_at_position(qkv, bias, h, hkv, cos, sin, kc, vc, pos);
    Tensor x = f64(qkv.broadcast_add(bias));
    auto heads = [&](size_t from, size_t n) {
      return x.narrow(2, from * d, n * d).reshape({b, s, n, d}).transpose(1, 2);
    };
    Tensor c = f64(cos).narrow(0, p, s), sn = f64(sin).narrow(0, p, s);
    EXPECT_TRUE(close_to(q, rope_ref(heads(0, h), c, sn, false), 2 * tolerance(dt))) << dt;
    EXPECT_TRUE(
        close_to(kc.narrow(2, p, s), rope_ref(heads(h, hkv), c, sn, false), 2 * tolerance(dt)))
        << dt;
    EXPECT_TRUE(close_to(vc.narrow(2, p, s), heads(h + hkv, hkv), tolerance(dt))) << dt;
    EXPECT_EQ(kc.narrow(2, 0, p).abs().sum_all().to_dtype(DType::F64).to_scalar<double>(), 0.0);
    Tensor far = Tensor::from_vec(std::vector<uint32_t>{8}, {1}, cpu);
    EXPECT_THROW(nn::detail::rope_write_at_position(qkv, bias, h, hkv, cos, sin, kc, vc, far),
                 IndexOutOfRange);
    EXPECT_THROW(nn::detail::rope_write_at_position(qkv, bias, h + 1, hkv, cos, sin, kc, vc, pos),
                 ShapeMismatch);
  }
}

}  // namespace
}  // namespace wick
