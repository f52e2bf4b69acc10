#pragma once
// The math of every element-wise unary op, written once: UnaryMath<K> is a functor on the compute
// type (float for f16/bf16/f32, double for f64, the integer type itself) that the CPU loops and
// the CUDA kernels both call, so the two backends cannot drift apart. The list of ops, their
// names and dtypes is WICK_UNARY_OPS in ops.h.

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
/// exp for float, written branch-free so that CPU loops calling it vectorise (libm's expf does
/// not). Within 2 ulp of the exact result over the whole range, with IEEE results at the edges:
/// inf above ~88.72, 0 below ~-103.97 (subnormals in between), NaN for NaN.
inline float vec_expf(float x) {
  // x = n ln2 + r with |r| <= ln2/2; e^x = 2^n e^r. The clamp keeps n in [-150, 128].
  x = x < -104.0f ? -104.0f : x;  // NaN fails both tests and passes through
  x = x > 89.0f ? 89.0f : x;
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
WICK_MATH_1(log)
WICK_MATH_1(sqrt)
WICK_MATH_1(tanh)
WICK_MATH_1(sin)
WICK_MATH_1(cos)
WICK_MATH_1(erf)
WICK_MATH_1(fabs)
WICK_MATH_1(floor)
WICK_MATH_1(ceil)
WICK_MATH_1(round)
WICK_MATH_1(log1p)
WICK_MATH_1(expm1)
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

/// Declares UnaryMath<K>: the body (after K) computes the result from `x` (compute type C)
/// and `p`.
#define WICK_UNARY_MATH(K, ...)                             \
  template <>                                               \
  struct UnaryMath<UnaryKind::K> {                          \
    template <class C>                                      \
    WICK_HD C operator()(C x, const UnaryParams& p) const { \
      (void)p;                                              \
      __VA_ARGS__                                           \
    }                                                       \
  };

WICK_UNARY_MATH(Neg, {
  if constexpr (std::is_integral_v<C>)
    return math::wrap_neg(x);
  else
    return -x;
})
WICK_UNARY_MATH(Abs, {
  if constexpr (std::is_unsigned_v<C>)
    return x;
  else if constexpr (std::is_integral_v<C>)
    return x < 0 ? math::wrap_neg(x) : x;
  else
    return math::fabs(x);
})
WICK_UNARY_MATH(Exp, { return math::exp(x); })
WICK_UNARY_MATH(Log, { return math::log(x); })
WICK_UNARY_MATH(Sqrt, { return math::sqrt(x); })
WICK_UNARY_MATH(Sqr, {
  // Integers wrap (u8 is promoted to int and truncated on the store).
  if constexpr (std::is_integral_v<C> && sizeof(C) >= 4)
    return math::wrap_mul(x, x);
  else
    return static_cast<C>(x * x);
})
WICK_UNARY_MATH(Recip, { return C(1) / x; })
WICK_UNARY_MATH(Tanh, { return math::tanh(x); })
WICK_UNARY_MATH(Sin, { return math::sin(x); })
WICK_UNARY_MATH(Cos, { return math::cos(x); })
WICK_UNARY_MATH(Relu, { return x > C(0) ? x : C(0); })
WICK_UNARY_MATH(Silu, { return x * math::sigmoid(x); })
WICK_UNARY_MATH(Sigmoid, { return math::sigmoid(x); })
WICK_UNARY_MATH(Gelu, {
  // Candle's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
  const C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
  return C(0.5) * x * (C(1) + math::tanh(k * x * (C(1) + static_cast<C>(0.044715) * x * x)));
})
WICK_UNARY_MATH(GeluErf,
                { return C(0.5) * x * (C(1) + math::erf(x * static_cast<C>(0.7071067811865476))); })
WICK_UNARY_MATH(Affine, {
  // Integers: in double, then back with saturation, as Candle's `(v as f64 * mul + add) as T`.
  if constexpr (std::is_integral_v<C>) {
    return math::float_to_int<C>(static_cast<double>(x) * p.p0 + p.p1);
  } else {
    return x * static_cast<C>(p.p0) + static_cast<C>(p.p1);
  }
})
WICK_UNARY_MATH(Powf, { return math::pow(x, static_cast<C>(p.p0)); })
WICK_UNARY_MATH(Clamp, {
  // min(max(x, lo), hi) with NaN kept; integer bounds converted to T first (truncated,
  // saturated), as Candle's clamp.
  C lo, hi;
  if constexpr (std::is_integral_v<C>) {
    lo = math::float_to_int<C>(p.p0);
    hi = math::float_to_int<C>(p.p1);
  } else {
    lo = static_cast<C>(p.p0);
    hi = static_cast<C>(p.p1);
  }
  C m = x < lo ? lo : x;
  return hi < m ? hi : m;
})

WICK_UNARY_MATH(Erf, { return math::erf(x); })
WICK_UNARY_MATH(Floor, { return math::floor(x); })
WICK_UNARY_MATH(Ceil, { return math::ceil(x); })
WICK_UNARY_MATH(Round, { return math::round(x); })
WICK_UNARY_MATH(Sign, {
  // NaN and signed zeros pass through.
  return x > C(0) ? C(1) : (x < C(0) ? C(-1) : x);
})
WICK_UNARY_MATH(Softplus, {
  // log(1 + e^x) = max(x, 0) + log1p(e^-|x|): e^x never overflows.
  return (x > C(0) ? x : C(0)) + math::log1p(math::exp(-math::fabs(x)));
})
WICK_UNARY_MATH(Log1p, { return math::log1p(x); })
WICK_UNARY_MATH(Expm1, { return math::expm1(x); })
WICK_UNARY_MATH(Elu, { return x > C(0) ? x : static_cast<C>(p.p0) * math::expm1(x); })

#undef WICK_UNARY_MATH

}  // namespace wick::ops
