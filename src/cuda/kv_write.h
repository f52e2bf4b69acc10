#pragma once
// The KV-cache write of a graph-captured decode step (nn/kv_write.h): the position is read
// by the kernel from device memory, so one recorded launch serves every position.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace wick::cuda {

/// One KV-cache write: rows (b, h, s, d) of `src` with element strides `src_strides` go into the
/// row-major cache (b, h, max_len, d) at rows *position + i.
struct KvWrite {
  void* cache;
  const void* src;
  int64_t src_strides[4];
};

/// Both writes (keys and values: same dims) in one kernel; elements of `elem_bytes` (2, 4 or 8)
/// bytes. Rows that would land past max_len are skipped.
void launch_kv_write(size_t elem_bytes, const KvWrite& k, const KvWrite& v, const int64_t dims[4],
                     int64_t max_len, const uint32_t* position, cudaStream_t s);

}  // namespace wick::cuda
