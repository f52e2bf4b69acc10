#pragma once
// gemv_kernel, the block-of-rows projection (plain rows in decode_gemv_plain.cu, GGML rows in
// decode_gemv_ggml.cu), with the greedy argmax its blocks offer: each includer gets its own copy
// (an unnamed namespace), and its own argmax slots.

#include "cuda/decode_gemv_device.cuh"

namespace wick::cuda {
namespace {

using namespace gemv;

// GemvArgs::argmax without reading the logits again: each block offers its best row as one
// 64-bit atomic max (orderable value bits above the complemented index) to one of kArgmaxSlots
// words, a fire-and-forget reduction that the block does not wait for; argmax_pick_kernel, queued
// right after with the projection (nothing runs between them), takes the largest and sets the
// words back to zero.
constexpr int kArgmaxSlots = 64;
constexpr int kArgmaxStride = 16;  // words between slots: one slot a 128-byte line
__device__ unsigned long long g_argmax_slots[kArgmaxSlots * kArgmaxStride];

template <class T, int R>
__device__ __forceinline__ void post_argmax(const GemvArgs& a, const int64_t (&rows)[R],
                                            const float (&acc)[R]) {
  if (threadIdx.x != 0) return;
  unsigned long long best = 0;  // below every offer: the order bits of a value are never 0
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = round_to<T>(acc[r]) + 0.0f;  // the stored value; -0 as +0
    const uint32_t bits = __float_as_uint(v);
    const uint32_t order = v != v               ? 0xffffffffu  // NaN above everything
                           : (bits >> 31) != 0u ? ~bits
                                                : bits | 0x80000000u;
    const uint32_t index = static_cast<uint32_t>(rows[r]);
    best = max(best, static_cast<unsigned long long>(order) << 32 | (0xffffffffu - index));
  }
  atomicMax(&g_argmax_slots[(blockIdx.x % kArgmaxSlots) * kArgmaxStride], best);
}

// Blocks of N threads a multiprocessor should hold: for 4 plain rows a block, as many as 64
// registers a thread allow (more blocks than the compiler's own choice, without spills).
template <class T, class F, int R, int N>
inline constexpr int kGemvMinBlocks = (std::is_same_v<F, DenseRows<T>> && R == 4)
                                          ? 8 * kGemvThreads / N
                                          : 1;

// R rows (R / 2 output pairs) a block of N threads (plain rows: 64, 128 or 256; GGML rows 128).
template <class T, class F, int R, bool kPrefetchRows = false, int N = kGemvThreads>
__global__ void __launch_bounds__(N, (kGemvMinBlocks<T, F, R, N>))
    gemv_kernel(GemvArgs a, int64_t row_bytes, int copy) {
  WICK_TL_START();
  // Only plain rows take end asks: their code would cost the GGML kernels of 8 rows registers,
  // and a block a multiprocessor.
  constexpr bool kDense = std::is_same_v<F, DenseRows<T>>;
  prefetch_cache_rows<T>(a);
  if (!kDense || a.l2_next_end_blocks == 0) prefetch_next_share(a, blockIdx.x, gridDim.x);
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * (R / 2);
  int64_t rows[R];
  const uint8_t* row_ptr[R];
  group_rows<R>(a, p0, rows);
  row_starts<R>(a, row_bytes, rows, row_ptr);
  Input<T> in = input_of<T>(a);
  float acc[R];
  if constexpr (kDense) {
    dot_rows<T, F, R, kPrefetchRows, N>(row_ptr, in, a.k, a.eps, acc);
  } else {
    dot_rows_staged<T, F, R>(row_ptr, in, a.k, a.eps, row_bytes, copy, acc);
  }
  finish_pairs<T, R>(a, p0, rows, acc);
  if (a.argmax != nullptr) post_argmax<T, R>(a, rows, acc);
  if (kDense && a.l2_next_end_blocks > 0) {
    const int64_t n = min(static_cast<int64_t>(a.l2_next_end_blocks), int64_t{gridDim.x});
    const int64_t i = static_cast<int64_t>(blockIdx.x) - (gridDim.x - n);
    if (i >= 0) prefetch_next_share(a, i, n);
  }
  WICK_TL_END(1u << 28 | static_cast<uint32_t>(a.epilogue) << 24 | static_cast<uint32_t>(a.k));
}

}  // namespace
}  // namespace wick::cuda
