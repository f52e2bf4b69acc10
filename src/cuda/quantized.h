#pragma once
// The CUDA entry points of the GGML-block ops (fused::QMatmulOp, fused::DequantizeOp, whose
// kernels src/cuda/fused_ops.cpp registers) and of the staged upload of file bytes
// (CudaDevice::upload).

#include <cstddef>

#include "backend.h"
#include "wick/quantized.h"

namespace wick::cuda {

/// qmatmul.cu: y (m, n) in `dtype` (F32, F16 or BF16) = x (m, k) of `dtype`, contiguous from
/// element `x_offset` of `x`, times the transposed w (n, k): GGML blocks from byte `w_offset` of
/// `w` (a U8 buffer on the same device). Enqueued on the device's queue, one launch per
/// kQmatmulMaxRows rows.
StoragePtr qmatmul(GgmlType type, const BackendStorage& w, size_t w_offset, size_t n, size_t k,
                   const BackendStorage& x, size_t x_offset, size_t m, DType dtype);

/// The most rows one launch of qmatmul's kernels takes.
inline constexpr size_t kQmatmulMaxRows = 8;

/// dequant.cu: F32 values of `n` elements of `type` dequantised on the device from the raw
/// blocks at the start of `raw` (a U8 buffer on that device). One kernel per type, enqueued on
/// the device's queue.
StoragePtr dequantize(GgmlType type, const BackendStorage& raw, size_t n);

/// dequant.cu: a new buffer on cuda:`ordinal` holding `count` elements copied from host memory
/// at `src` (any pageable memory, e.g. a file mapping), through pinned staging buffers: the host
/// copies chunk i + 1 while the GPU copies chunk i. Returns when the data is on the device.
StoragePtr upload_staged(int ordinal, const void* src, size_t count, DType dtype);

}  // namespace wick::cuda
