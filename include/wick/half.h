#pragma once
// Two-byte float types: IEEE binary16 (f16) and bfloat16 (bf16). Both convert from float with
// round-to-nearest-even; arithmetic happens in float.

#include <cstdint>
#include <cstring>
#include <ostream>
#include <type_traits>

#if defined(__F16C__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

namespace wick {

namespace detail {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_half_bits(float f) {
#if defined(__F16C__) && !defined(__CUDACC__)
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal half (or zero): align to 2^-24 units and round
    float scaled = bits_float(abs) * 16777216.0f;  // exact: multiply by 2^24
    // nearbyint semantics (round-half-even) via the float magic-number trick
    float r = (scaled + 8388608.0f) - 8388608.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
#endif
}

inline float half_bits_to_float(uint16_t h) {
#if defined(__F16C__) && !defined(__CUDACC__)
  return _cvtsh_ss(h);
#else
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
#endif
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_bits_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE 754 binary16.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f) : bits(detail::float_to_half_bits(f)) {}
  /// From any arithmetic value, through float.
  template <class T, class = std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, float>>>
  explicit f16(T v) : f16(static_cast<float>(v)) {}
  static f16 from_bits(uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }
  operator float() const { return detail::half_bits_to_float(bits); }
};

/// bfloat16: the top half of an IEEE float.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  template <class T, class = std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, float>>>
  explicit bf16(T v) : bf16(static_cast<float>(v)) {}
  static bf16 from_bits(uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
  operator float() const { return detail::bf16_bits_to_float(bits); }
};

inline std::ostream& operator<<(std::ostream& os, f16 h) {
  return os << static_cast<float>(h);
}
inline std::ostream& operator<<(std::ostream& os, bf16 h) {
  return os << static_cast<float>(h);
}

}  // namespace wick
