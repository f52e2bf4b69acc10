#pragma once
// The KV-cache write of a decode step whose position lives in device memory, so that the step can
// be captured once as a CUDA graph and replayed for every position.

#include "wick/tensor.h"

namespace wick::models::detail {

/// cache[:, :, p + i, :] = src[:, :, i, :] with p = position's one U32 element, read where the
/// work runs (on the GPU for CUDA tensors: no host round trip). cache: (b, h, max_len, d)
/// row-major; src: (b, h, s, d), any strides; same dtype and device. An out-of-range position
/// writes nothing (CUDA) or throws IndexOutOfRange (CPU).
void write_at_position(const Tensor& cache, const Tensor& src, const Tensor& position);

/// The CUDA half of write_at_position (src/cuda/kv_write.cu; a stub without CUDA).
void cuda_write_at_position(const Tensor& cache, const Tensor& src, const Tensor& position);

}  // namespace wick::models::detail
