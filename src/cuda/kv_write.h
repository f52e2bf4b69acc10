#pragma once
// The KV-cache write of a graph-captured decode step (models/kv_write.h): the position is read
// by the kernel from device memory, so one recorded launch serves every position.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace wick::cuda {

/// Rows (b, h, s, d) of `src` with element strides `src_strides` into the row-major cache
/// (b, h, max_len, d) at rows *position + i; elements of `elem_bytes` (2 or 4) bytes. Rows that
/// would land past max_len are skipped.
void launch_kv_write(size_t elem_bytes, void* cache, const void* src, const int64_t dims[4],
                     const int64_t src_strides[4], int64_t max_len, const uint32_t* position,
                     cudaStream_t s);

}  // namespace wick::cuda
