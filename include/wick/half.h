#pragma once
// Two-byte float types: IEEE binary16 (f16) and bfloat16 (bf16). Both convert from float with
// round-to-nearest-even; arithmetic happens in float.

#include <cstdint>
#include <cstring>
#include <ostream>
#include <type_traits>

namespace wick {

namespace detail {

// The conversions are plain integer code, the same whatever the compiler flags (so a library and
// a program built with different -m flags agree), and branch-free so that loops over them
// vectorise. They give the same bits as the x86 F16C instructions, NaN payloads included.

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
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  // Normal halves: rebias the exponent (-112 << 23) and round to nearest even at bit 13.
  const uint32_t normal = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal halves (and zero): adding 0.5 aligns the value to units of 2^-24 and rounds to
  // nearest even in the float adder; the low bits of the sum are the half's mantissa.
  const uint32_t subnormal = float_bits(bits_float(abs) + 0.5f) - 0x3f000000u;
  const uint32_t nan = 0x7e00u | ((abs >> 13) & 0x3ffu);  // quiet, top of the payload kept
  uint32_t h = abs < 0x38800000u ? subnormal : normal;
  h = abs >= 0x477ff000u ? 0x7c00u : h;  // rounds to infinity
  h = abs > 0x7f800000u ? nan : h;
  return static_cast<uint16_t>(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa
  const uint32_t normal = em + (112u << 23);
  // Subnormal halves: the mantissa read as a float of exponent 2^-14, minus the implicit one.
  const uint32_t subnormal = float_bits(bits_float(em + (113u << 23)) - bits_float(113u << 23));
  uint32_t f = em < 0x00800000u ? subnormal : normal;
  f = em >= 0x0f800000u ? em + (224u << 23) : f;  // infinity and NaN
  f = em > 0x0f800000u ? f | 0x00400000u : f;     // NaN: quiet
  return bits_float(sign | f);
}

inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // nearest even
  const uint32_t nan = (x >> 16) | 0x40u;                           // quiet
  return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
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
