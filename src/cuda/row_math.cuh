#pragma once
// Device pieces of the CUDA row kernels (fused.cu, softmax_bulk.cu): warp and block sums, the
// normalised value of layer and RMS norms, and the exponential and NaN-propagating max of
// softmax rows. Statistics in f32 (f64 for f64).

#include "cuda/kernel_utils.cuh"

namespace wick::cuda::row_math {

template <class C>
__device__ __forceinline__ C warp_sum(C x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += shfl_xor(x, m);
  return x;
}

/// The block's sum, on every thread (scratch: one C per warp).
template <class C>
__device__ __forceinline__ C block_sum(C x, C* scratch) {
  x = warp_sum(x);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  C r = 0;
  for (unsigned w = 0; w < blockDim.x / 32; ++w) r += scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

// One normalised output before its rounding: layer norm (v - mean) * rstd * w (+ b, by the
// caller), rounded once; RMS norm w * round(v * rstd), as transformers' RMSNorm casts the
// normalised row back to the dtype before the weight multiplies it (f16/bf16 round twice).
template <class T, bool kRms>
__device__ __forceinline__ compute_t<T> norm_value(compute_t<T> v, compute_t<T> mean,
                                                   compute_t<T> rstd, compute_t<T> w) {
  if constexpr (kRms) {
    return w * to_compute(convert<T>(v * rstd));
  } else {
    return (v - mean) * rstd * w;
  }
}

template <class C>
__device__ __forceinline__ C exp_fast(C x) {
  if constexpr (std::is_same_v<C, float>) {
    float r;  // 2^(x log2 e) by the special-function unit alone (x <= 0 here)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x * 1.4426950408889634f));
    return r;
  } else {
    return exp(x);
  }
}

template <class C>
__device__ __forceinline__ C warp_max_nan(C x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    C o = shfl_xor(x, m);
    x = (o > x || o != o) ? o : x;  // NaN wins
  }
  return x;
}

}  // namespace wick::cuda::row_math
