#pragma once
// Launchers of the fused decoder-block kernels (decoder_ops.cu): nn::add_rms_norm, nn::silu_mul,
// the decode step's rope + KV-cache write (nn/kv_write.h) and the step's end
// (token_mailbox.h). Row-major operands.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "wick/dtype.h"

namespace wick::cuda {

void launch_add_rms_norm(DType dtype, const void* x, const void* delta, const void* weight,
                         void* sum, void* normed, size_t rows, size_t cols, double eps,
                         cudaStream_t s);

void launch_silu_mul(DType dtype, const void* gate_up, void* out, size_t rows, size_t n,
                     cudaStream_t s);

/// qkv (b, s, (h + 2 h_kv) * d) plus `bias` ((h + 2 h_kv) * d, may be null): q and k heads
/// rotated (rotate-half) by rows *position + i of cos/sin (max_len, d / 2); q to (b, h, s, d),
/// keys and values into the caches (b, h_kv, max_len, d) at rows *position + i (rows past
/// max_len are skipped).
struct RopeWriteArgs {
  const void* qkv;
  const void* bias;
  const void* cos;
  const void* sin;
  void* q;
  void* k_cache;
  void* v_cache;
  const uint32_t* position;
  int64_t b, s, h, h_kv, d, max_len;
};
void launch_rope_write(DType dtype, const RopeWriteArgs& a, cudaStream_t s);

/// The end of the graph-captured greedy decode step (token_mailbox.h): input (token,
/// position) becomes (*next, position + 1), and mailbox[(position + 1) % slots], pinned host
/// memory, gets (position + 1) << 32 | *next.
void launch_advance_decode(const uint32_t* next, uint32_t* input, uint64_t* mailbox, int slots,
                           cudaStream_t s);

}  // namespace wick::cuda
