#pragma once
// Overflow-checked size arithmetic and defined float-to-integer conversion. Every element count,
// byte size, offset and concatenated length computed from user input goes through these: a wrapped
// size would allocate too little and let a kernel write out of bounds.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "util.h"
#include "wick/dtype.h"
#include "wick/error.h"

namespace wick {

/// a * b, or ShapeMismatch naming `op` and both operands when the product does not fit size_t.
inline size_t checked_mul(size_t a, size_t b, std::string_view op) {
  size_t out;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw ShapeMismatch(str(op, ": size overflow, ", a, " * ", b, " does not fit in 64 bits"));
  }
  return out;
}

/// a + b, or ShapeMismatch naming `op` and both operands when the sum does not fit size_t.
inline size_t checked_add(size_t a, size_t b, std::string_view op) {
  size_t out;
  if (__builtin_add_overflow(a, b, &out)) {
    throw ShapeMismatch(str(op, ": size overflow, ", a, " + ", b, " does not fit in 64 bits"));
  }
  return out;
}

/// Bytes of `count` elements of `dtype`, checked.
inline size_t checked_bytes(size_t count, DType dtype, std::string_view op) {
  return checked_mul(count, size_in_bytes(dtype), op);
}

/// Float to integer, defined everywhere (the CPU and CUDA backends' float_to_int, and Rust's
/// `as`): truncation toward zero, NaN gives 0, values outside the range saturate.
template <class To>
inline To saturate_to_int(double d) {
  static_assert(std::is_integral_v<To>);
  if (std::isnan(d)) return To(0);
  constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
  // One past the largest value: 2^digits, exactly representable.
  constexpr double hi_excl = static_cast<double>(uint64_t{1} << std::numeric_limits<To>::digits);
  d = std::trunc(d);
  if (d <= lo) return std::numeric_limits<To>::min();
  if (d >= hi_excl) return std::numeric_limits<To>::max();
  return static_cast<To>(d);
}

}  // namespace wick
