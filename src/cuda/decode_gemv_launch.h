#pragma once
// Host side of the decode projections shared by their files (decode_gemv.cu picks the kernel;
// decode_gemv_plain.cu, decode_gemv_ggml.cu, decode_gemv_stream.cu and decode_gemv_pairs.cu
// launch it): row sizes, alignment, occupancy, the dtype dispatch and each file's launcher.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "cuda/decode_gemv.h"
#include "wick/dtype.h"
#include "wick/error.h"

namespace wick::cuda::gemv {

inline bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Bytes of a row of k values; 0 when k does not suit the format.
inline int64_t row_bytes_of(DType dtype, GemvWeights weights, int64_t k) {
  switch (weights) {
    case GemvWeights::Dense: {
      const int64_t size = static_cast<int64_t>(size_in_bytes(dtype));
      return k % (16 / size) == 0 ? k * size : 0;
    }
    case GemvWeights::Q4_0:
      return k % 32 == 0 ? k / 32 * 18 : 0;
    case GemvWeights::Q4_1:
      return k % 32 == 0 ? k / 32 * 20 : 0;
    case GemvWeights::Q5_0:
      return k % 32 == 0 ? k / 32 * 22 : 0;
    case GemvWeights::Q5_1:
      return k % 32 == 0 ? k / 32 * 24 : 0;
    case GemvWeights::Q8_0:
      return k % 32 == 0 ? k / 32 * 34 : 0;
    case GemvWeights::IQ4_NL:
      return k % 32 == 0 ? k / 32 * 18 : 0;
    case GemvWeights::Q2_K:
      return k % 256 == 0 ? k / 256 * 84 : 0;
    case GemvWeights::Q3_K:
      return k % 256 == 0 ? k / 256 * 110 : 0;
    case GemvWeights::Q4_K:
      return k % 256 == 0 ? k / 256 * 144 : 0;
    case GemvWeights::Q5_K:
      return k % 256 == 0 ? k / 256 * 176 : 0;
    case GemvWeights::Q6_K:
      return k % 256 == 0 ? k / 256 * 210 : 0;
    case GemvWeights::IQ4_XS:
      return k % 256 == 0 ? k / 256 * 136 : 0;
  }
  return 0;
}

// The widest cp.async (16, 8 or 4 bytes) that every row of w allows; 0 when none does.
inline int staged_copy_bytes(const void* w, int64_t row_bytes) {
  for (int n : {16, 8, 4}) {
    if (aligned(w, n) && row_bytes % n == 0) return n;
  }
  return 0;
}

inline constexpr int64_t kMaxStagedBytes = 48 * 1024;  // shared memory without an opt-in attribute

// Bytes between the rows' copies in shared memory.
__host__ __device__ constexpr int64_t staged_stride(int64_t row_bytes) {
  return (row_bytes + 15) / 16 * 16;
}

// Blocks of kGemvThreads threads that a multiprocessor holds of `kernel` with `smem` bytes of
// dynamic shared memory (1 when the query fails), asked once per kernel and size: a model's
// projections share a few sizes.
inline int blocks_per_sm(const void* kernel, size_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, added] = known.try_emplace({kernel, smem}, 0);
  if (added && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, kGemvThreads,
                                                             smem) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the launch check
    it->second = 1;
  }
  return std::max(it->second, 1);
}

// f(T) for the element type of dtype (f32, f16 or bf16: gemv_fits' dtypes).
template <class F>
void by_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      return f.template operator()<float>();
    case DType::F16:
      return f.template operator()<__half>();
    case DType::BF16:
      return f.template operator()<__nv_bfloat16>();
    default:
      throw UnsupportedDType("decode gemv: f32, f16 or bf16");
  }
}

/// decode_gemv_plain.cu: plain rows, `rows` a block (2, 4 or 8), and the greedy argmax's pick.
void launch_plain_rows(DType dtype, const GemvArgs& a, int64_t row_bytes, int rows, cudaStream_t s);
void launch_argmax_pick(uint32_t* argmax, bool launch_next, cudaStream_t s);

/// decode_gemv_ggml.cu: GGML rows copied to shared memory, `rows` a block (2, 4 or 8).
void launch_ggml_rows(DType dtype, const GemvArgs& a, int64_t row_bytes, int rows, cudaStream_t s);

/// decode_gemv_stream.cu: GGML rows streamed through fewer blocks.
bool ggml_stream_fits(const GemvArgs& a);
void launch_ggml_stream(DType dtype, const GemvArgs& a, int64_t row_bytes, cudaStream_t s);

/// decode_gemv_pairs.cu: GGML rows in warp-owned pairs, k a multiple of 2048.
bool ggml_pairs_fit(const GemvArgs& a, int64_t row_bytes);
void launch_ggml_pairs(DType dtype, const GemvArgs& a, int64_t row_bytes, cudaStream_t s);

}  // namespace wick::cuda::gemv
