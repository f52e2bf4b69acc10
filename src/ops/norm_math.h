#pragma once
// The statistic of the norms, written once for the CPU and the CUDA kernels (as unary_math.h):
// rstd = 1 / sqrt(sum / n + eps), from a row's sum of squares (RMS norm) or of squared deviations
// (layer norm), in the compute type (float for f16/bf16/f32, double for f64). On the GPU by the
// rsqrt instruction (rsqrtf in f32), on the CPU by a division.

#include <cmath>
#include <type_traits>

#if defined(__CUDACC__)
#define WICK_NORM_HD __host__ __device__ __forceinline__
#else
#define WICK_NORM_HD inline
#endif

namespace wick::ops {

template <class C>
WICK_NORM_HD C norm_rstd(C sum, C n, C eps) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<C, float>) {
    return rsqrtf(sum / n + eps);
  } else {
    return rsqrt(sum / n + eps);
  }
#else
  return C(1) / std::sqrt(sum / n + eps);
#endif
}

}  // namespace wick::ops

#undef WICK_NORM_HD
