#pragma once
// The math of the binary element-wise ops and comparisons, written once for the CPU loops and the
// CUDA kernels (as ops/unary_math.h for unary ops). Integer semantics, with no undefined
// behaviour: add, sub and mul wrap modulo 2^bits (two's complement for i64); division truncates
// toward zero, x / 0 gives 0 and i64 MIN / -1 gives MIN (the wrapped result). Float maximum and
// minimum propagate NaN. The lists are WICK_BINARY_OPS and WICK_CMP_OPS in ops.h.

#include <type_traits>

#include "ops.h"
#include "ops/unary_math.h"  // WICK_HD

namespace wick::ops {

template <BinaryKind K>
struct BinaryMath;

/// Declares BinaryMath<K>: the body (after K) computes the result from `a` and `b` (compute
/// type C). Signed integers go through unsigned to wrap; u8 is promoted to int by the language
/// and truncated on the store.
#define WICK_BINARY_MATH(K, ...)                                                         \
  template <>                                                                            \
  struct BinaryMath<BinaryKind::K> {                                                     \
    template <class C>                                                                   \
    WICK_HD C operator()(C a, C b) const {                                               \
      using U = std::make_unsigned_t<std::conditional_t<std::is_integral_v<C>, C, int>>; \
      (void)sizeof(U);                                                                   \
      __VA_ARGS__                                                                        \
    }                                                                                    \
  };

WICK_BINARY_MATH(Add, {
  if constexpr (std::is_integral_v<C> && std::is_signed_v<C>)
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  else
    return static_cast<C>(a + b);
})
WICK_BINARY_MATH(Sub, {
  if constexpr (std::is_integral_v<C> && std::is_signed_v<C>)
    return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
  else
    return static_cast<C>(a - b);
})
WICK_BINARY_MATH(Mul, {
  if constexpr (std::is_integral_v<C> && (std::is_signed_v<C> || sizeof(C) >= 4))
    return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  else
    return static_cast<C>(a * b);
})
WICK_BINARY_MATH(Div, {
  if constexpr (std::is_integral_v<C>) {
    if (b == 0) return C(0);
    if constexpr (std::is_signed_v<C>) {
      if (b == C(-1)) return static_cast<C>(U(0) - static_cast<U>(a));  // MIN / -1 wraps
    }
    return static_cast<C>(a / b);
  } else {
    return a / b;
  }
})
// a != a: NaN in a wins; NaN in b fails the compare and is returned.
WICK_BINARY_MATH(Maximum, { return (a > b || a != a) ? a : b; })
WICK_BINARY_MATH(Minimum, { return (a < b || a != a) ? a : b; })

#undef WICK_BINARY_MATH

/// Comparisons, 1 or 0 (NaN compares unequal to everything, as IEEE).
template <CmpKind K>
struct CmpMath {
  template <class C>
  WICK_HD bool operator()(C a, C b) const {
    if constexpr (K == CmpKind::Eq)
      return a == b;
    else if constexpr (K == CmpKind::Ne)
      return a != b;
    else if constexpr (K == CmpKind::Lt)
      return a < b;
    else if constexpr (K == CmpKind::Le)
      return a <= b;
    else if constexpr (K == CmpKind::Gt)
      return a > b;
    else
      return a >= b;
  }
};

}  // namespace wick::ops
