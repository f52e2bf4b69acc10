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

/// qkv (b, s, (h + 2 h_kv) * d) plus `bias` ((h + 2 h_kv) * d, may be null): the q and k heads
/// normalised by q_norm and k_norm (d each; RMS norms over a head, when not null; see
/// nn::detail::HeadNorms), then rotated
/// (rotate-half) by row p of cos/sin (rows, rot_half): the first 2 rot_half dims of each head
/// (all d, or fewer: partial rotary), the others passing through; q out, keys and values into
/// the caches.
///   slots null: p = *position + i for row i of each sequence; q (b, h, s, d); caches (b, h_kv,
///     max_len, d) written at row p (rows past max_len are skipped).
///   slots set (a paged step, b = 1): p = position[i]; q (s, h, d); caches are pools (pages, h_kv,
///     max_len, d) of pages max_len rows long, token i's row at slot slots[i].
/// The kernel reads position and slots before it waits for the kernel before it (a programmatic
/// launch): they must come from an upload or an earlier kernel, never from the kernel right
/// before (the decode steps upload them, or the step before advances them).
struct RopeWriteArgs {
  const void* qkv;
  const void* bias;
  const void* q_norm;
  const void* k_norm;
  bool norms_f32;  // the norm weights are f32 (normalised in f32, rounded once), else the dtype
  double eps;
  const void* cos;
  const void* sin;
  void* q;
  void* k_cache;
  void* v_cache;
  const uint32_t* position;
  const uint32_t* slots;
  int64_t b, s, h, h_kv, d, max_len;
  int64_t rot_half;  // the tables' width: half the rotated dims of a head
};
/// Whether the kernel takes heads of a.d (even, at most 256) rotating 2 a.rot_half (> 0) dims.
bool rope_write_fits(const RopeWriteArgs& a);
void launch_rope_write(DType dtype, const RopeWriteArgs& a, cudaStream_t s);

/// The end of the graph-captured greedy decode step (token_mailbox.h): input (token,
/// position) becomes (*next, position + 1), and mailbox[(position + 1) % slots], pinned host
/// memory, gets (position + 1) << 32 | *next.
void launch_advance_decode(const uint32_t* next, uint32_t* input, uint64_t* mailbox, int slots,
                           cudaStream_t s);

}  // namespace wick::cuda
