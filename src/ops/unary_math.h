#pragma once
// The math of every element-wise unary op, written once: UnaryMath<K> is a functor on the compute
// type (float for f16/bf16/f32, double for f64, the integer type itself) that the CPU loops and
// the CUDA kernels both call, so the two backends cannot drift apart. Each op's body is its entry
// in wick/unary_ops.def; this file provides the functions those bodies call (namespace math).

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops.h"

#if defined(__CUDACC__)
#define WICK_HD __host__ __device__ __forceinline__
#else
#define WICK_HD inline
#endif

namespace wick::ops {

// Float functions of the compute type: CUDA's single-precision versions in device code, the
// standard library's overloads on the host.
namespace math {
#if !defined(__CUDA_ARCH__)
/// c ? a : b for floats, as bit masks (vectorisable).
inline float select_bits(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}

/// exp for float, written branch-free so that CPU loops calling it vectorise (libm's expf does
/// not). Within 2 ulp of the exact result over the whole range, with IEEE results at the edges:
/// inf above ~88.72, 0 below ~-103.97 (subnormals in between), NaN for NaN.
inline float vec_expf(float x) {
  // x = n ln2 + r with |r| <= ln2/2; e^x = 2^n e^r. The clamp keeps n in [-150, 128]; NaN fails
  // both tests and passes through. The selects are bit masks: GCC does not if-convert float
  // selects under -ftrapping-math, and the loop would not vectorise.
  x = select_bits(x < -104.0f, -104.0f, x);
  x = select_bits(x > 89.0f, 89.0f, x);
  constexpr float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float t = x * 1.44269504088896341f + magic;
  float n = t - magic;
  int32_t ni = static_cast<int32_t>(std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(magic));
  float r = x - n * 0.693359375f;  // ln2 split in two (Cody-Waite) so n * hi is exact
  r = r + n * 2.12194440e-4f;
  // Cephes' minimax polynomial for e^r on [-ln2/2, ln2/2].
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n as two factors so that neither overflows nor goes subnormal on its own.
  int32_t n1 = ni / 2, n2 = ni - n1;
  float s1 = std::bit_cast<float>(static_cast<uint32_t>(n1 + 127) << 23);
  float s2 = std::bit_cast<float>(static_cast<uint32_t>(n2 + 127) << 23);
  return p * s1 * s2;
}

/// erf for float, written branch-free so that CPU loops calling it vectorise (libm's erff does
/// not, and was 12% of a BERT forward through the exact GELU). Both halves are computed and one
/// is selected, so a vector of 8 or 16 lanes pays for both: ~20 FMAs and one exp.
///   |x| < 1.25: erf(x) = x P(x^2), P a degree-7 minimax fit of erf(x)/x (relative error 1e-9);
///   |x| >= 1.25: erf(x) = sign(x) (1 - e^Q(|x|)), Q a degree-6 fit of log(erfc) in |x| - 2.625
///                on [1.25, 4] (absolute error of erfc 3e-10); past 4, erfc < 2e-8 rounds away
///                against 1.
/// Within 2 ulp of the exact erf (at most 1.74 over every non-negative float;
/// tests/test_elementwise.cpp sweeps it against double erf); NaN gives NaN, +-inf gives +-1,
/// the sign of zero is kept.
inline float vec_erff(float x) {
  const float a = std::fabs(x);
  // Small |a|: a c0 + a (z P(z)) with z = a^2, c0 = 2 / sqrt(pi) split in two so that its
  // float rounding goes into the small correction term; the leading term is rounded once.
  const float z = a * a;
  float p = -7.740968613e-06f;
  p = std::fma(p, z, 1.048905760e-04f);
  p = std::fma(p, z, -8.360946085e-04f);
  p = std::fma(p, z, 5.211428273e-03f);
  p = std::fma(p, z, -2.686167322e-02f);
  p = std::fma(p, z, 1.128371656e-01f);
  p = std::fma(p, z, -3.761263490e-01f);
  p = std::fma(p, z, -5.863538344e-08f);  // 2 / sqrt(pi) - c0_hi
  const float small = std::fma(a, 1.128379226e+00f, a * p);
  // Large |a|: 1 - erfc with erfc = e^Q. NaN fails `4 < a` and flows through to the result.
  const float t = (4.0f < a ? 4.0f : a) - 2.625f;
  float q = 1.595284994e-04f;
  q = std::fma(q, t, -1.479791681e-04f);
  q = std::fma(q, t, 2.151187276e-03f);
  q = std::fma(q, t, -9.733328596e-03f);
  q = std::fma(q, t, -9.477661848e-01f);
  q = std::fma(q, t, -5.589156628e+00f);
  q = std::fma(q, t, -8.490671158e+00f);
  const float large = 1.0f - vec_expf(q);
  return std::copysign(a < 1.25f ? small : large, x);
}
#endif

#if defined(__CUDA_ARCH__)
#define WICK_MATH_1(name)                   \
  template <class C>                        \
  WICK_HD C name(C x) {                     \
    if constexpr (std::is_same_v<C, float>) \
      return ::name##f(x);                  \
    else                                    \
      return ::name(x);                     \
  }
#else
#define WICK_MATH_1(name) \
  template <class C>      \
  WICK_HD C name(C x) {   \
    return std::name(x);  \
  }
#endif
// libm's one-argument functions, for the table's math bodies.
WICK_MATH_1(log)
WICK_MATH_1(log2)
WICK_MATH_1(log10)
WICK_MATH_1(log1p)
WICK_MATH_1(exp2)
WICK_MATH_1(expm1)
WICK_MATH_1(sqrt)
WICK_MATH_1(cbrt)
WICK_MATH_1(sin)
WICK_MATH_1(cos)
WICK_MATH_1(tan)
WICK_MATH_1(asin)
WICK_MATH_1(acos)
WICK_MATH_1(atan)
WICK_MATH_1(sinh)
WICK_MATH_1(cosh)
WICK_MATH_1(tanh)
WICK_MATH_1(asinh)
WICK_MATH_1(acosh)
WICK_MATH_1(atanh)
WICK_MATH_1(erfc)
WICK_MATH_1(fabs)
WICK_MATH_1(floor)
WICK_MATH_1(ceil)
WICK_MATH_1(round)
WICK_MATH_1(trunc)
WICK_MATH_1(rint)
#undef WICK_MATH_1

/// e^x; float on the host through vec_expf (vectorisable, within 2 ulp).
template <class C>
WICK_HD C exp(C x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>)
    return ::expf(x);
  else
    return ::exp(x);
#else
  if constexpr (std::is_same_v<C, float>)
    return vec_expf(x);
  else
    return std::exp(x);
#endif
}

/// erf; float on the host through vec_erff (vectorisable, within 2 ulp).
template <class C>
WICK_HD C erf(C x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>)
    return ::erff(x);
  else
    return ::erf(x);
#else
  if constexpr (std::is_same_v<C, float>)
    return vec_erff(x);
  else
    return std::erf(x);
#endif
}

template <class C>
WICK_HD C pow(C x, C e) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>)
    return ::powf(x, e);
  else
    return ::pow(x, e);
#else
  return std::pow(x, e);
#endif
}

/// Float to integer as Rust's `as` (Candle's semantics): truncation, NaN gives 0, values out of
/// range saturate.
template <class To>
WICK_HD To float_to_int(double d) {
  if (d != d) return To(0);
  constexpr double lo = std::is_signed_v<To> ? -9223372036854775808.0 : 0.0;
  constexpr double hi_excl =
      static_cast<double>(uint64_t{1} << (sizeof(To) * 8 - (std::is_signed_v<To> ? 1 : 0)));
#if defined(__CUDA_ARCH__)
  d = ::trunc(d);
#else
  d = std::trunc(d);
#endif
  if (d <= lo) return std::is_signed_v<To> ? static_cast<To>(INT64_MIN) : To(0);
  if (d >= hi_excl) return static_cast<To>(std::is_signed_v<To> ? INT64_MAX : ~To(0));
  return static_cast<To>(d);
}

/// 1 / (1 + e^-x) without overflowing e^-x for very negative x (which would lose the tiny, even
/// subnormal, results): with e = e^-|x| in (0, 1], x >= 0 gives 1 / (1 + e), x < 0 gives e / (1 +
/// e).
template <class C>
WICK_HD C sigmoid(C x) {
  C e = exp(-fabs(x));
  C r = C(1) / (C(1) + e);
#if !defined(__CUDA_ARCH__)
  // The same select as bit masks, so that CPU loops over floats vectorise.
  if constexpr (std::is_same_v<C, float>) return select_bits(x >= 0.0f, r, e * r);
#endif
  return x >= C(0) ? r : e * r;
}

/// Two's-complement wrap-around for integers, without undefined overflow.
template <class C>
WICK_HD C wrap_neg(C x) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(U(0) - static_cast<U>(x));
}
template <class C>
WICK_HD C wrap_mul(C a, C b) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}
}  // namespace math

/// The parameters of a unary op (affine's mul and add, powf's exponent, clamp's bounds).
struct UnaryParams {
  double p0 = 0, p1 = 0;
};

template <UnaryKind K>
struct UnaryMath;

// UnaryMath<K> of every entry of wick/unary_ops.def: its math body on `x` (compute type C) and `p`.
#define WICK_UNARY_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, math, grad) \
  template <>                                                                                \
  struct UnaryMath<UnaryKind::K> {                                                           \
    template <class C>                                                                       \
    WICK_HD C operator()(C x, const UnaryParams& p) const {                                  \
      (void)p;                                                                               \
      WICK_UNPAREN math                                                                      \
    }                                                                                        \
  };
#include "wick/unary_ops.def"

}  // namespace wick::ops
