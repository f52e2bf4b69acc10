#pragma once
// The CPU fused transformer ops (src/cpu/fused.cpp, src/cpu/attention.cpp) and the helpers they
// share.

#include <vector>

#include "backend.h"
#include "dispatch.h"

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

/// One row of rms_norm as fused::NormOp's CPU kernel computes it (its sum of squares and output,
/// lane_sum_sq_dev and rms_out; for an f32 weight its fallback's arithmetic), for
/// nn::add_rms_normed, so that both give the same bits: v (d) the row widened, w (d) the weight
/// widened; y = w * round(v * rstd) rounded to T, or with `f32_weight` (an f32 weight of
/// f16/bf16 rows) round(w * (v * rstd)). Defined for float, double, f16 and bf16.
template <class T>
void rms_norm_row(const compute_t<T>* v, const compute_t<T>* w, compute_t<T> eps, size_t d,
                  bool f32_weight, T* y);

}  // namespace wick::cpu
