#pragma once
// Backend entry points of the file formats: dequantisation of GGML blocks (src/cpu/dequant.cpp,
// src/cuda/dequant.cu) and the staged upload of file bytes to a GPU (src/cuda/dequant.cu; both
// answer "built without CUDA" from src/cuda_formats_stub.cpp when CUDA is off).

#include <cstddef>
#include <cstdint>

#include "backend.h"
#include "wick/quantized.h"

namespace wick::cpu {
/// Dequantises `n` values (a whole number of blocks) of `type` at `src` into `dst`.
/// `type` is one of the types ggml_can_dequantize() accepts.
void dequantize(GgmlType type, const uint8_t* src, float* dst, size_t n);
}  // namespace wick::cpu

namespace wick::cuda {
/// A new buffer on cuda:`ordinal` holding `count` elements copied from host memory at `src`
/// (any pageable memory, e.g. a file mapping), through pinned staging buffers: the host copies
/// chunk i + 1 while the GPU copies chunk i. Returns when the data is on the device.
StoragePtr upload_staged(int ordinal, const void* src, size_t count, DType dtype);
/// F32 values of `n` elements of `type` dequantised on the device from the raw blocks in `raw`
/// (a U8 buffer on that device). One kernel per type, enqueued on the device's queue.
StoragePtr dequantize(GgmlType type, const BackendStorage& raw, size_t n);
}  // namespace wick::cuda
