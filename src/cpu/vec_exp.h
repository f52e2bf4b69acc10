#pragma once
// exp for x <= 0 (softmax and attention after subtracting the max), shared by the kernels compiled
// once per instruction set (reduce.cpp) and those compiled once (attention.cpp). It lives in the
// includer's ISA namespace and is compiled for its instruction set (WICK_ISA_TARGET): GCC does
// not inline a baseline function into an AVX-512 one, and a loop that calls it per element is
// several times slower.

#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu/isa_ns.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

/// exp(x) for x <= 0 or NaN, in a form the compiler vectorises: 2^n * p(r) with x = n ln2 + r,
/// |r| <= ln2 / 2, and a degree-7 polynomial (relative error ~1e-7). Below -87 (where exp
/// underflows f32) it returns 0. The selects are bit masks because GCC will not if-convert float
/// selects under -ftrapping-math.
WICK_ISA_TARGET inline float exp_nonpositive(float x) {
  uint32_t small = 0u - static_cast<uint32_t>(x < -87.0f);  // all ones where x < -87
  float xc = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & ~small) |
                                  (std::bit_cast<uint32_t>(-87.0f) & small));
  // Round x / ln2 to an integer with the 1.5 * 2^23 trick; its low bits are n.
  float t = xc * 1.44269504088896341f + 12582912.0f;
  float n = t - 12582912.0f;
  float r = xc - n * 0.693145751953125f - n * 1.42860682030941723e-06f;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n + 127 is the biased exponent of 2^n (n >= -126 here).
  float scale = std::bit_cast<float>((std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p * scale) & ~small);
}

/// exp(x) for x <= 0 in the compute type C: exp_nonpositive for float, std::exp for double.
template <class C>
WICK_ISA_TARGET inline C exp_le0(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return exp_nonpositive(x);
  } else {
    return std::exp(x);
  }
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
