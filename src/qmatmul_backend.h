#pragma once
// The CUDA entry point of qmatmul (src/cuda/qmatmul.cu; src/cuda_qmatmul_stub.cpp answers
// "built without CUDA" when CUDA is off). The CPU one is in src/cpu/qmatmul.h.

#include <cstddef>

#include "backend.h"
#include "wick/quantized.h"

namespace wick::cuda {
/// y (m, n) in `dtype` (F32, F16 or BF16) = x (m, k) of `dtype`, contiguous from element
/// `x_offset` of `x`, times the transposed w (n, k): GGML blocks from byte `w_offset` of `w`
/// (a U8 buffer on the same device). Enqueued on the device's queue.
StoragePtr qmatmul(GgmlType type, const BackendStorage& w, size_t w_offset, size_t n, size_t k,
                   const BackendStorage& x, size_t x_offset, size_t m, DType dtype);
}  // namespace wick::cuda
