// nn::add_rms_norm, nn::add_rms_normed, nn::silu_mul and the decode step's rope + KV-cache write
// on the CPU against references written here in long double (and the oracles of nn_reference.h),
// under the bounds of wick/numerics.h, on every float dtype and layout; add_rms_normed also bit
// for bit against its composition; errors; the gradient through the composed path against its
// closed form.

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "nn/kv_write.h"
#include "nn_reference.h"
#include "test_util.h"
#include "wick/kv_cache.h"
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
      std::vector<double> xv = x.to_vec_f64(), dv = delta.to_vec_f64(), sum(xv.size());
      for (size_t i = 0; i < sum.size(); ++i) {
        sum[i] = static_cast<double>(static_cast<long double>(xv[i]) + dv[i]);
      }
      EXPECT_TRUE(within_bounds(r.residual.to_vec_f64(), sum,
                                [&](size_t, double e) {
                                  return numerics::elementwise_bound("add", dt,
                                                                     numerics::Backend::Cpu, e);
                                }))
          << name << " " << dt;
      // The norm reads the sum rounded to dt: the reference does too.
      Tensor rounded = tensor_from(sum, x.shape(), dt);
      EXPECT_TRUE(norm_within(r.normed, rounded, w, Tensor(), 1e-5, true)) << name << " " << dt;
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
  // Tracked inputs: the composition records. L = sum y^2 with y = w s r, s = x + d,
  // r = (mean(s^2) + eps)^-1/2 per row: dL/dx_j = 2 y_j w_j r - (2 r^3 s_j / n) sum_i y_i w_i s_i.
  const size_t rows = 3, n = 8;
  const double eps = 1e-5;
  Tensor x64 = random_tensor({rows, n}, DType::F64), d64 = random_tensor({rows, n}, DType::F64);
  Tensor w64 = random_tensor({n}, DType::F64);
  Tensor xa = x64.requires_grad();
  GradStore g = nn::add_rms_norm(xa, d64, w64, eps).normed.sqr().sum_all().backward();
  ASSERT_TRUE(g.get(xa).has_value());
  std::vector<double> xv = x64.to_vec_f64(), dv = d64.to_vec_f64(), wv = w64.to_vec_f64();
  std::vector<double> want(rows * n);
  for (size_t row = 0; row < rows; ++row) {
    long double ms = 0, ywsum = 0;
    std::vector<long double> sv(n), y(n);
    for (size_t j = 0; j < n; ++j) {
      sv[j] = static_cast<long double>(xv[row * n + j]) + dv[row * n + j];
      ms += sv[j] * sv[j] / n;
    }
    long double r = 1 / std::sqrt(ms + eps);
    for (size_t j = 0; j < n; ++j) {
      y[j] = wv[j] * sv[j] * r;
      ywsum += y[j] * wv[j] * sv[j];
    }
    for (size_t j = 0; j < n; ++j) {
      want[row * n + j] =
          static_cast<double>(2 * y[j] * wv[j] * r - 2 * r * r * r * sv[j] / n * ywsum);
    }
  }
  double scale = max_abs(want);
  EXPECT_TRUE(
      within_bounds(g.get(xa)->to_vec_f64(), want, [&](size_t, double) { return 1e-12 * scale; }));
}

// Equal doubles and signs: the same value bit for bit (no NaNs here).
::testing::AssertionResult bits_equal(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure()
           << got.shape() << " " << got.dtype() << " vs " << want.shape() << " " << want.dtype();
  }
  std::vector<double> g = got.to_vec_f64(), w = want.to_vec_f64();
  size_t differ = 0, first = g.size();
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] != w[i] || std::signbit(g[i]) != std::signbit(w[i])) {
      if (differ++ == 0) first = i;
    }
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ << " of " << g.size() << " differ, first at "
                                       << first << ": " << g[first] << " vs " << w[first];
}

// The weights rms_norm takes for x of dt: dt's own, and f32 for f16/bf16 (Gemma's 1 + w).
std::vector<DType> norm_weight_dtypes(DType dt) {
  if (dt == DType::F16 || dt == DType::BF16) return {dt, DType::F32};
  return {dt};
}

TEST(DecoderOps, AddRmsNormedMatchesReference) {
  const double eps = 1e-6;
  for (DType dt : float_dtypes()) {
    for (DType wt : norm_weight_dtypes(dt)) {
      for (auto& [name, x] : layout_variants({2, 7, 130}, dt)) {
        Tensor delta = random_tensor({2, 7, 130}, dt), w = random_tensor({130}, wt);
        Tensor got = nn::add_rms_normed(x, delta, w, eps);
        // x + w * delta / rms(delta) in long double; the norm's error (one rounding of
        // delta * rstd to dt for a weight of dt, as rms_norm) then the add's.
        const size_t n = 130, rows = 14;
        std::vector<double> xv = x.to_vec_f64(), dv = delta.to_vec_f64(), wv = w.to_vec_f64();
        std::vector<double> want(xv.size()), z(xv.size()), normed(xv.size()), m(rows);
        for (size_t r = 0; r < rows; ++r) {
          long double ms = 0, mean_abs = 0;
          for (size_t i = 0; i < n; ++i) {
            long double v = dv[r * n + i];
            ms += v * v;
            mean_abs += std::fabs(v);
          }
          long double sigma = std::sqrt(ms / n + eps);
          m[r] = static_cast<double>(mean_abs / n / sigma);
          for (size_t i = 0; i < n; ++i) {
            long double zi = dv[r * n + i] / sigma;
            z[r * n + i] = static_cast<double>(zi);
            normed[r * n + i] = static_cast<double>(zi * wv[i]);
            want[r * n + i] = static_cast<double>(xv[r * n + i] + zi * wv[i]);
          }
        }
        const int t_roundings = wt == dt && (dt == DType::F16 || dt == DType::BF16) ? 1 : 0;
        EXPECT_TRUE(within_bounds(got.to_vec_f64(), want,
                                  [&](size_t i, double e) {
                                    return numerics::norm_bound(dt, n, normed[i], z[i], wv[i % n],
                                                                m[i / n], t_roundings) +
                                           numerics::elementwise_bound("add", dt,
                                                                       numerics::Backend::Cpu, e);
                                  }))
            << name << " " << dt << " weight " << wt;
        EXPECT_TRUE(bits_equal(got, x.add(delta.rms_norm(w, eps))))
            << name << " " << dt << " weight " << wt;
      }
    }
  }
}

// The fused op keeps the composition's bits: rms_norm's sum order and both roundings.
TEST(DecoderOps, AddRmsNormedEqualsCompositionBitForBit) {
  for (DType dt : float_dtypes()) {
    for (DType wt : norm_weight_dtypes(dt)) {
      for (size_t d : {size_t{1152}, size_t{2560}, size_t{64}, size_t{40}, size_t{3}}) {
        for (size_t rows : {size_t{1}, size_t{5}, size_t{33}}) {
          Tensor x = random_tensor({rows, d}, dt), delta = random_tensor({rows, d}, dt);
          Tensor w = random_tensor({d}, wt);
          EXPECT_TRUE(
              bits_equal(nn::add_rms_normed(x, delta, w, 1e-6), x.add(delta.rms_norm(w, 1e-6))))
              << dt << " weight " << wt << " rows " << rows << " d " << d;
        }
      }
    }
  }
}

TEST(DecoderOps, AddRmsNormedErrorsAndGradients) {
  Tensor x = random_tensor({3, 8}, DType::BF16), w = random_tensor({8}, DType::F32);
  EXPECT_THROW(nn::add_rms_normed(x, random_tensor({3, 7}, DType::BF16), w, 1e-5), ShapeMismatch);
  EXPECT_THROW(nn::add_rms_normed(x, x, random_tensor({7}, DType::F32), 1e-5), ShapeMismatch);
  EXPECT_THROW(nn::add_rms_normed(x, x, random_tensor({3, 8}, DType::F32), 1e-5), ShapeMismatch);
  EXPECT_THROW(nn::add_rms_normed(x, x.to_dtype(DType::F16), w, 1e-5), DTypeMismatch);
  EXPECT_THROW(nn::add_rms_normed(x, x, w.to_dtype(DType::F64), 1e-5), DTypeMismatch);
  Tensor x64 = x.to_dtype(DType::F64);
  EXPECT_THROW(nn::add_rms_normed(x64, x64, w, 1e-5), DTypeMismatch);  // f32 weight, f64 x
  EXPECT_THROW(nn::add_rms_normed(x.to_dtype(DType::U32), x.to_dtype(DType::U32),
                                  w.to_dtype(DType::U32), 1e-5),
               UnsupportedDType);
  EXPECT_THROW(nn::add_rms_normed(x, x, w, -1), Error);
  EXPECT_THROW(nn::add_rms_normed(x, Tensor(), w, 1e-5), Error);
  try {
    nn::add_rms_normed(x, x, w.to_dtype(DType::F64), 1e-5);
  } catch (const DTypeMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("add_rms_normed: x bf16, delta bf16, weight f64"),
              std::string::npos)
        << e.what();
  }
  // Tracked inputs run the composition: the same gradients as the composition's.
  Tensor a = random_tensor({3, 8}, DType::F64), d = random_tensor({3, 8}, DType::F64);
  Tensor w64 = random_tensor({8}, DType::F64);
  Tensor aa = a.requires_grad(), da = d.requires_grad(), wa = w64.requires_grad();
  GradStore g = nn::add_rms_normed(aa, da, wa, 1e-5).sqr().sum_all().backward();
  Tensor ab = a.requires_grad(), db = d.requires_grad(), wb = w64.requires_grad();
  GradStore want = ab.add(db.rms_norm(wb, 1e-5)).sqr().sum_all().backward();
  for (auto [got_t, want_t] : {std::pair{aa, ab}, std::pair{da, db}, std::pair{wa, wb}}) {
    ASSERT_TRUE(g.get(got_t).has_value());
    EXPECT_TRUE(bits_equal(*g.get(got_t), *want.get(want_t)));
  }
}

TEST(DecoderOps, SiluMulMatchesComposition) {
  for (DType dt : float_dtypes()) {
    for (auto& [name, gu] : layout_variants({3, 4, 2 * 37}, dt)) {
      // silu(gate) * up in long double; f16/bf16 round silu(gate) first (docs/NUMERICS.md).
      std::vector<double> v = gu.to_vec_f64(), want(v.size() / 2), silu(want.size()),
                          up(want.size());
      for (size_t r = 0; r < 3 * 4; ++r) {
        for (size_t i = 0; i < 37; ++i) {
          long double g = v[r * 74 + i], u = v[r * 74 + 37 + i];
          long double sg = g / (1 + std::exp(-g));
          silu[r * 37 + i] = static_cast<double>(sg);
          up[r * 37 + i] = static_cast<double>(u);
          want[r * 37 + i] = static_cast<double>(sg * u);
        }
      }
      Tensor got = nn::silu_mul(gu);
      EXPECT_EQ(got.shape(), Shape({3, 4, 37}));
      using numerics::Backend;
      EXPECT_TRUE(within_bounds(got.to_vec_f64(), want,
                                [&](size_t i, double e) {
                                  return numerics::elementwise_bound("silu", dt, Backend::Cpu,
                                                                     silu[i], 2) *
                                             std::abs(up[i]) +
                                         numerics::elementwise_bound("mul", dt, Backend::Cpu, e);
                                }))
          << name << " " << dt;
    }
  }
  EXPECT_THROW(nn::silu_mul(random_tensor({2, 5}, DType::F32)), ShapeMismatch);
  EXPECT_THROW(nn::silu_mul(Tensor::zeros({2, 4}, DType::U32, cpu)), UnsupportedDType);
}

// A decode step's additive mask: 0 for the keys up to the position (the last `window` of them
// with a window), -inf for the others, in the cache's dtype.
TEST(DecoderOps, PositionMaskShowsTheKeysUpToThePositionWithinTheWindow) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const size_t max_len = 12;
    models::KvCache cache = models::KvCache::allocate(1, 1, 1, max_len, 4, dt, cpu,
                                                      Tensor::zeros({max_len, 2}, dt, cpu),
                                                      Tensor::zeros({max_len, 2}, dt, cpu));
    for (size_t p : {size_t{0}, size_t{3}, size_t{9}}) {
      for (size_t window : {size_t{0}, size_t{1}, size_t{4}, size_t{20}}) {
        Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, cpu);
        Tensor mask = nn::detail::position_mask(cache, pos, 10, window);
        ASSERT_EQ(mask.shape(), (Shape{1, 10}));
        EXPECT_EQ(mask.dtype(), dt);
        const std::vector<double> v = mask.to_vec_f64();
        for (size_t j = 0; j < 10; ++j) {
          const bool shown = j <= p && (window == 0 || j + window > p);
          EXPECT_EQ(v[j], shown ? 0.0 : -INFINITY)
              << "key " << j << ", position " << p << ", window " << window;
        }
      }
    }
  }
}

// The rope + cache write against rope_ref and a plain copy, at a position inside the cache.
TEST(DecoderOps, RopeWriteAtPositionMatchesComposition) {
  size_t b = 2, s = 3, h = 4, hkv = 2, d = 8, max_len = 10, p = 5;
  // f32 with and without the bias (the CPU's kernel), f64 and bf16 (the composed fallback).
  const std::pair<DType, bool> runs[] = {
      {DType::F32, true}, {DType::F64, true}, {DType::BF16, true}, {DType::F32, false}};
  for (const auto& run : runs) {
    const DType dt = run.first;
    const bool with_bias = run.second;
    Tensor qkv = random_tensor({b, s, (h + 2 * hkv) * d}, dt);
    Tensor bias = with_bias ? random_tensor({(h + 2 * hkv) * d}, dt)
                            : Tensor::zeros({(h + 2 * hkv) * d}, dt, cpu);
    Tensor cos = random_tensor({max_len, d / 2}, dt), sin = random_tensor({max_len, d / 2}, dt);
    Tensor kc = Tensor::zeros({b, hkv, max_len, d}, dt, cpu);
    Tensor vc = Tensor::zeros({b, hkv, max_len, d}, dt, cpu);
    Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, cpu);
    Tensor q = nn::detail::rope_write_at_position(qkv, with_bias ? bias : Tensor(), h, hkv, cos,
                                                  sin, kc, vc, pos);
    // qkv + bias in long double, rounded to dt as the op reads it (one rounding: the linear's).
    std::vector<double> qv = qkv.to_vec_f64(), bv = bias.to_vec_f64(), xv(qv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      xv[i] = static_cast<double>(static_cast<long double>(qv[i]) + bv[i % bv.size()]);
    }
    Tensor x = tensor_from(xv, qkv.shape(), dt);
    auto heads = [&](size_t from, size_t n) {
      return x.narrow(2, from * d, n * d).reshape({b, s, n, d}).transpose(1, 2);
    };
    Tensor c = cos.narrow(0, p, s), sn = sin.narrow(0, p, s);
    EXPECT_TRUE(rope_within(q, heads(0, h), c, sn, false)) << dt;
    EXPECT_TRUE(rope_within(kc.narrow(2, p, s), heads(h, hkv), c, sn, false)) << dt;
    std::vector<double> v_want = heads(h + hkv, hkv).to_vec_f64();
    EXPECT_TRUE(within_bounds(vc.narrow(2, p, s).to_vec_f64(), v_want,
                              [&](size_t, double e) { return numerics::convert_bound(dt, e); }))
        << dt << (with_bias ? " with bias" : "");
    EXPECT_EQ(kc.narrow(2, 0, p).abs().sum_all().to_dtype(DType::F64).to_scalar<double>(), 0.0);
    EXPECT_EQ(vc.narrow(2, p + s, max_len - p - s)
                  .abs()
                  .sum_all()
                  .to_dtype(DType::F64)
                  .to_scalar<double>(),
              0.0);
    Tensor far = Tensor::from_vec(std::vector<uint32_t>{8}, {1}, cpu);
    EXPECT_THROW(nn::detail::rope_write_at_position(qkv, bias, h, hkv, cos, sin, kc, vc, far),
                 IndexOutOfRange);
    EXPECT_THROW(nn::detail::rope_write_at_position(qkv, bias, h + 1, hkv, cos, sin, kc, vc, pos),
                 ShapeMismatch);
  }
}

// Partial rotary (Phi-4-mini): tables of r / 2 < d / 2 rotate the first r dims of each q and k
// head (rope_ref over those dims) and pass the others through unchanged, at a position (the CPU
// kernel in f32, the composition in f64 and bf16) and into a paged cache's slots; tables wider
// than half a head are refused.
TEST(DecoderOps, RopeWritePartialRotatesTheFirstDimsOnly) {
  const size_t s = 3, h = 4, hkv = 2, d = 12, rows = 10, p = 4;
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    for (size_t r : {size_t{4}, size_t{8}}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " rotating " + std::to_string(r) + " of 12");
      Tensor qkv = random_tensor({1, s, (h + 2 * hkv) * d}, dt);
      Tensor cos = random_tensor({rows, r / 2}, dt), sin = random_tensor({rows, r / 2}, dt);
      auto heads = [&](size_t from, size_t n) {  // (1, n, s, d)
        return qkv.narrow(2, from * d, n * d).reshape({1, s, n, d}).transpose(1, 2);
      };
      // got (1, n, s, d) against the heads of qkv from `from` at table rows c, sn.
      auto check = [&](const Tensor& got, size_t from, size_t n, const Tensor& c,
                       const Tensor& sn) {
        Tensor x = heads(from, n);
        EXPECT_TRUE(rope_within(got.narrow(3, 0, r).contiguous(), x.narrow(3, 0, r).contiguous(), c,
                                sn, false));
        EXPECT_EQ(got.narrow(3, r, d - r).to_vec_f64(), x.narrow(3, r, d - r).to_vec_f64());
      };
      Tensor kc = Tensor::zeros({1, hkv, rows, d}, dt, cpu),
             vc = Tensor::zeros(kc.shape(), dt, cpu);
      Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, cpu);
      Tensor q = nn::detail::rope_write_at_position(qkv, Tensor(), h, hkv, cos, sin, kc, vc, pos);
      check(q, 0, h, cos.narrow(0, p, s), sin.narrow(0, p, s));
      check(kc.narrow(2, p, s), h, hkv, cos.narrow(0, p, s), sin.narrow(0, p, s));
      EXPECT_EQ(vc.narrow(2, p, s).to_vec_f64(), heads(h + hkv, hkv).to_vec_f64());
      // Paged: token t at positions[t], its keys at slots[t] of pools (pages, hkv, 4, d).
      std::vector<uint32_t> positions = {7, 0, 3}, slots = {9, 2, 6};
      Tensor pos_t = Tensor::from_vec(positions, {s}, cpu);
      Tensor kp = Tensor::zeros({3, hkv, 4, d}, dt, cpu), vp = Tensor::zeros(kp.shape(), dt, cpu);
      Tensor q_paged =
          nn::detail::rope_write_paged(qkv.reshape({s, (h + 2 * hkv) * d}), Tensor(), h, hkv, cos,
                                       sin, kp, vp, pos_t, Tensor::from_vec(slots, {s}, cpu));
      Tensor c = cos.index_select(pos_t, 0), sn = sin.index_select(pos_t, 0);
      check(q_paged.transpose(0, 1).unsqueeze(0), 0, h, c, sn);
      std::vector<Tensor> keys;
      for (size_t t = 0; t < s; ++t) {
        keys.push_back(kp.get(slots[t] / 4).narrow(1, slots[t] % 4, 1));  // (hkv, 1, d)
      }
      check(Tensor::cat(keys, 1).unsqueeze(0), h, hkv, c, sn);
    }
    Tensor qkv = random_tensor({1, 1, (h + 2 * hkv) * d}, dt);
    Tensor wide = random_tensor({rows, d / 2 + 1}, dt);
    Tensor kc = Tensor::zeros({1, hkv, rows, d}, dt, cpu), vc = Tensor::zeros(kc.shape(), dt, cpu);
    Tensor pos = Tensor::from_vec(std::vector<uint32_t>{0}, {1}, cpu);
    EXPECT_THROW(nn::detail::rope_write_at_position(qkv, Tensor(), h, hkv, wide, wide, kc, vc, pos),
                 ShapeMismatch);
  }
}

// Per-head norms before rope: with tables of cos 1 and sin 0 (rope the identity) the q heads
// and the keys written are each head of qkv + bias normalised (norm_within), the values copied;
// at a position and into a paged cache's slots alike.
TEST(DecoderOps, RopeWriteNormsEachQAndKHead) {
  const size_t b = 1, s = 3, h = 4, hkv = 2, d = 16, rows = 8, p = 2;
  const double eps = 1e-6;
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    Tensor qkv = random_tensor({b, s, (h + 2 * hkv) * d}, dt);
    Tensor bias = random_tensor({(h + 2 * hkv) * d}, dt);
    nn::detail::HeadNorms norms{random_tensor({d}, dt), random_tensor({d}, dt), eps};
    Tensor cos = Tensor::ones({rows, d / 2}, dt, cpu), sin = Tensor::zeros({rows, d / 2}, dt, cpu);
    Tensor x = qkv.broadcast_add(bias);        // rounded as the op reads it
    auto heads = [&](size_t from, size_t n) {  // (s, n, d)
      return x.narrow(2, from * d, n * d).reshape({s, n, d});
    };
    // At a position: q (1, h, s, d), the caches' rows p..p+s.
    Tensor kc = Tensor::zeros({b, hkv, rows, d}, dt, cpu), vc = Tensor::zeros(kc.shape(), dt, cpu);
    Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(p)}, {1}, cpu);
    Tensor q = nn::detail::rope_write_at_position(qkv, bias, h, hkv, cos, sin, kc, vc, pos, norms);
    EXPECT_TRUE(
        norm_within(q.squeeze(0).transpose(0, 1), heads(0, h), norms.q, Tensor(), eps, true))
        << dt;
    EXPECT_TRUE(norm_within(kc.narrow(2, p, s).squeeze(0).transpose(0, 1), heads(h, hkv), norms.k,
                            Tensor(), eps, true))
        << dt;
    EXPECT_EQ(vc.narrow(2, p, s).squeeze(0).transpose(0, 1).to_vec_f64(),
              heads(h + hkv, hkv).to_vec_f64());
    // Paged: q (s, h, d), each token's keys at its slot of pools (pages, hkv, 4, d).
    Tensor kp = Tensor::zeros({3, hkv, 4, d}, dt, cpu), vp = Tensor::zeros(kp.shape(), dt, cpu);
    std::vector<uint32_t> slots = {9, 2, 7};
    Tensor q_paged = nn::detail::rope_write_paged(
        qkv.reshape({s, (h + 2 * hkv) * d}), bias, h, hkv, cos, sin, kp, vp,
        Tensor::from_vec(std::vector<uint32_t>{5, 0, 3}, {s}, cpu),
        Tensor::from_vec(slots, {s}, cpu), norms);
    EXPECT_TRUE(norm_within(q_paged, heads(0, h), norms.q, Tensor(), eps, true)) << dt;
    for (size_t t = 0; t < s; ++t) {
      auto at_slot = [&](const Tensor& pool) {
        return pool.get(slots[t] / 4).narrow(1, slots[t] % 4, 1).squeeze(1);  // (hkv, d)
      };
      EXPECT_TRUE(norm_within(at_slot(kp), heads(h, hkv).get(t), norms.k, Tensor(), eps, true))
          << dt << " token " << t;
      EXPECT_EQ(at_slot(vp).to_vec_f64(), heads(h + hkv, hkv).get(t).to_vec_f64());
    }
    EXPECT_THROW(nn::detail::rope_write_at_position(
                     qkv, bias, h, hkv, cos, sin, kc, vc, pos,
                     nn::detail::HeadNorms{random_tensor({d + 1}, dt), Tensor(), eps}),
                 ShapeMismatch);
  }
}

// A paged step's tokens at their own positions (not consecutive), rotated by their own rows of
// the tables (rope_ref), their keys and values at their slots and nowhere else.
TEST(DecoderOps, RopeWritePagedRotatesEachTokenAtItsPosition) {
  const size_t t = 4, h = 4, hkv = 2, d = 8, ps = 4, pages = 5, rows = 12;
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    Tensor qkv = random_tensor({t, (h + 2 * hkv) * d}, dt);
    Tensor cos = random_tensor({rows, d / 2}, dt), sin = random_tensor({rows, d / 2}, dt);
    Tensor kp = Tensor::zeros({pages, hkv, ps, d}, dt, cpu),
           vp = Tensor::zeros(kp.shape(), dt, cpu);
    std::vector<uint32_t> positions = {11, 0, 4, 7}, slots = {17, 1, 6, 12};
    Tensor pos_t = Tensor::from_vec(positions, {t}, cpu),
           slot_t = Tensor::from_vec(slots, {t}, cpu);
    Tensor q = nn::detail::rope_write_paged(qkv, Tensor(), h, hkv, cos, sin, kp, vp, pos_t, slot_t);
    ASSERT_EQ(q.shape(), Shape({t, h, d}));
    auto heads = [&](size_t from, size_t n) {  // (1, n, t, d)
      return qkv.narrow(1, from * d, n * d).reshape({t, n, d}).transpose(0, 1).unsqueeze(0);
    };
    Tensor c = cos.index_select(pos_t, 0), sn = sin.index_select(pos_t, 0);
    EXPECT_TRUE(rope_within(q.transpose(0, 1).unsqueeze(0), heads(0, h), c, sn, false)) << dt;
    std::vector<Tensor> keys, values;
    for (size_t i = 0; i < t; ++i) {
      keys.push_back(kp.get(slots[i] / ps).narrow(1, slots[i] % ps, 1));  // (hkv, 1, d)
      values.push_back(vp.get(slots[i] / ps).narrow(1, slots[i] % ps, 1));
    }
    EXPECT_TRUE(rope_within(Tensor::cat(keys, 1).unsqueeze(0), heads(h, hkv), c, sn, false)) << dt;
    EXPECT_EQ(Tensor::cat(values, 1).unsqueeze(0).to_vec_f64(), heads(h + hkv, hkv).to_vec_f64());
    // Nothing else written: zeros once the t tokens' rows are cleared.
    for (const Tensor& pool : {kp, vp}) {
      Tensor rest = pool.to_dtype(DType::F64);  // a copy
      for (uint32_t slot : slots) {
        rest.narrow(0, slot / ps, 1)
            .narrow(2, slot % ps, 1)
            .assign(Tensor::zeros({1, hkv, 1, d}, DType::F64, cpu));
      }
      EXPECT_EQ(rest.abs().sum_all().to_scalar<double>(), 0.0) << dt;
    }
    Tensor past = Tensor::from_vec(std::vector<uint32_t>{17, 1, 6, 20}, {t}, cpu);
    EXPECT_THROW(nn::detail::rope_write_paged(qkv, Tensor(), h, hkv, cos, sin, kp, vp, pos_t, past),
                 IndexOutOfRange);
    Tensor far = Tensor::from_vec(std::vector<uint32_t>{11, 0, 12, 7}, {t}, cpu);
    EXPECT_THROW(nn::detail::rope_write_paged(qkv, Tensor(), h, hkv, cos, sin, kp, vp, far, slot_t),
                 IndexOutOfRange);
    EXPECT_THROW(nn::detail::rope_write_paged(qkv, Tensor(), h, hkv, cos, sin, kp, vp,
                                              pos_t.narrow(0, 0, 3), slot_t),
                 ShapeMismatch);
    EXPECT_THROW(nn::detail::rope_write_paged(qkv, Tensor(), h, hkv, cos, sin, kp, vp,
                                              pos_t.to_dtype(DType::I64), slot_t),
                 DTypeMismatch);
  }
}

}  // namespace
}  // namespace wick
