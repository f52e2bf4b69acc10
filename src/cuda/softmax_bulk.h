#pragma once
// The bulk-copy softmax (softmax_bulk.cu), which fused.cu's row dispatch offers f16/bf16 rows of
// 4-16 KB (and f32 rows when asked).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace wick::cuda {

/// Softmax over `rows` rows of `nvec` 16-byte vectors of T (float, __half or __nv_bfloat16)
/// through softmax_bulk_kernel; false (nothing launched) when a row is longer than 16 KB (8
/// vectors a thread) or the GPU's shared memory holds fewer than two stages a group.
template <class T>
bool try_softmax_bulk(const T* x, T* y, size_t rows, size_t nvec, cudaStream_t s);

}  // namespace wick::cuda
