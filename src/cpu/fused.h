#pragma once
// The CPU fused transformer ops (src/cpu/fused.cpp, src/cpu/attention.cpp) and the helpers they
// share.

#include <bit>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend.h"

namespace wick::cpu {

class CpuStorage;

/// x rounded to T and widened back to C: the points where PyTorch rounds an f16/bf16
/// intermediate (each op's result), so that wick's half-precision models round where
/// transformers' do (docs/NUMERICS.md, "Half-precision rounding points"). Identity for f32/f64.
template <class T, class C>
inline C round_as(C x) {
  if constexpr (std::is_same_v<T, C>) {
    return x;
  } else {
    return static_cast<C>(T(x));
  }
}

/// Online-softmax attention (see FusedParams::Attention); f16/bf16 compute in f32.
StoragePtr attention(const FusedParams& params, const std::vector<FusedOperand>& operands);

/// Eight floats as one vector (GCC/Clang vector extension: AVX with -mavx, SSE pairs without).
using v8f = float __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8f v) {
  __builtin_memcpy(p, &v, sizeof(v));
}
inline float hsum8(v8f v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

/// exp(x) for x <= 0 (or -inf), vectorisable: 2^n * p(r) with a degree-7 polynomial (relative
/// error ~1e-7); below -87 it returns 0. Selects are bit masks so GCC if-converts them.
inline float exp_nonpositive_f32(float x) {
  uint32_t small = 0u - static_cast<uint32_t>(x < -87.0f);
  float xc = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & ~small) |
                                  (std::bit_cast<uint32_t>(-87.0f) & small));
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
  float scale = std::bit_cast<float>((std::bit_cast<uint32_t>(t) - 0x4B400000u + 127u) << 23);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p * scale) & ~small);
}

}  // namespace wick::cpu
