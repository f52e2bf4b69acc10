#pragma once
// Launchers for the fused transformer kernels (src/cuda/fused.cu, src/cuda/attention.cu). Plain
// C++ signatures, like kernels.h; each enqueues on `stream` and returns at once.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels.h"
#include "wick/dtype.h"

namespace wick::cuda {

/// layer_norm (rms = false; bias may be null) or rms_norm over contiguous rows x cols. With a
/// residual (rows x cols, x's dtype), y = residual + the norm's output, rounded once more.
void launch_norm(DType dtype, bool rms, const void* x, const void* weight, const void* bias,
                 void* y, size_t rows, size_t cols, double eps, cudaStream_t s,
                 const void* residual = nullptr);

/// rms_norm of contiguous f16/bf16 rows x cols by an f32 weight: in f32, rounded once; plus the
/// residual, as launch_norm's, when given.
void launch_rms_norm_f32_weight(DType dtype, const void* x, const float* weight, void* y,
                                size_t rows, size_t cols, double eps, cudaStream_t s,
                                const void* residual = nullptr);

/// softmax over contiguous rows x cols by the vector row kernel (rows 16-byte aligned and up to
/// 32768 bf16 / 16384 f32 long); false, with nothing launched, when it does not apply.
bool launch_softmax_rows_vec(DType dtype, const void* src, void* dst, size_t rows, size_t cols,
                             cudaStream_t s);

/// Rotary embedding. x (b, h, s, d) at element strides x_strides (the last dim contiguous);
/// cos/sin (s, d / 2) contiguous; y (b, h, s, d) contiguous.
void launch_rope(DType dtype, bool interleaved, const void* x, const int64_t x_strides[3],
                 const size_t dims[4], const void* cos, const void* sin, void* y, cudaStream_t s);

/// Scaled dot-product attention (fused::AttentionOp, src/fused/attention.h). Element strides of
/// dims (b, h, s) for q, (b, h_kv, s_kv) for k and v (their last dim contiguous), (b, h, s, s_kv)
/// for mask (null when absent); out (b, h, s, d) contiguous.
struct AttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* mask = nullptr;
  void* out = nullptr;
  int64_t q_strides[3] = {};
  int64_t k_strides[3] = {};
  int64_t v_strides[3] = {};
  int64_t mask_strides[4] = {};
  int b = 0, h = 0, h_kv = 0, s = 0, s_kv = 0, d = 0;
  float scale = 1;
  bool causal = false;
  // s = 1 only: keys after *last_key (a device U32, clamped to s_kv - 1) are hidden, as the
  // graph-captured decode step's cache rows past its position. The caller promises that
  // *last_key and the k/v rows before it were written before the kernel preceding this one on
  // the stream: without a mask they are read before that kernel has finished (programmatic
  // dependent launch), only q and the row of the last key after.
  const uint32_t* last_key = nullptr;
  // With last_key: the kernel after this one on the stream may launch as this one starts
  // (programmatic launch), on the multiprocessors it leaves free, for a next kernel that only
  // loads weights before it waits (a plain-weight decode projection, GemvArgs::prefetch_rows).
  bool launch_next_early = false;
};

/// Whether launch_attention takes `a` with last_key set (the decode kernel applies).
bool attention_last_key_fits(DType dtype, const AttentionArgs& a);

/// The name of the kernel launch_attention runs for `a` now (benchmarks, traces).
const char* attention_kernel_name(DType dtype, const AttentionArgs& a);

void launch_attention(DType dtype, const AttentionArgs& args, const TempAlloc& temp,
                      cudaStream_t s);

}  // namespace wick::cuda
