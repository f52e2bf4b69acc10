#pragma once
// The KV-cache write of a decode step whose position lives in device memory, so that the step can
// be captured once as a CUDA graph and replayed for every position.

#include "nn/qlinear.h"
#include "wick/kv_cache.h"
#include "wick/tensor.h"

namespace wick::nn::detail {

/// The q/k/v projection of `in` (b, s, d) by `w`: (b, s, n). Where transformers adds `bias` inside
/// the f16/bf16 product (plain weights, a dtype other than f32: one rounding), it is added here;
/// otherwise *bias_left is `bias`, for rope_write_at_position to add.
Tensor project_qkv(const Tensor& in, const QLinear& w, const Tensor& bias, Tensor* bias_left);

/// The additive mask (1, len) of a decode step at `position` (one U32 on the cache's device):
/// 0 for the keys up to the position (with `window` > 0, the last `window` of them only), -inf
/// for the others, in the cache's dtype.
Tensor position_mask(const models::KvCache& cache, const Tensor& position, size_t len,
                     size_t window = 0);

/// k_cache[:, :, p + i, :] = k[:, :, i, :] and the same for v, with p = position's one U32
/// element, read where the work runs (on the GPU for CUDA tensors: no host round trip; one kernel
/// for both). Caches: (b, h, max_len, d) row-major; k, v: (b, h, s, d), any strides; one dtype
/// and device. An out-of-range position writes nothing (CUDA) or throws IndexOutOfRange (CPU).
void write_at_position(const Tensor& k_cache, const Tensor& k, const Tensor& v_cache,
                       const Tensor& v, const Tensor& position);

/// Per-head RMS norms of q and k (Qwen3's and Gemma 3's q_norm and k_norm): each q head x becomes
/// rms_norm(x, q, eps) and each k head rms_norm(x, k, eps), after the bias and before rope: in
/// qkv's dtype for weights of that dtype; for f32 weights of f16/bf16 qkv (Gemma's 1 + w) in
/// f32, rounded to qkv's dtype once (Tensor::rms_norm). Undefined weights: no norm.
struct HeadNorms {
  Tensor q, k;  // (d) each, one dtype (qkv's, or f32 for f16/bf16), qkv's device
  double eps = 0;
};

/// The decode step's attention input in one kernel (CUDA): qkv (b, s, (h + 2 h_kv) * d)
/// row-major, the projection's output, plus `bias` ((h + 2 h_kv) * d) when defined; the q and k
/// heads are normalised by `norms` and rotated (rotate-half rope) by rows p + i of the
/// (max_len, r / 2) cos/sin tables (r = d, or fewer even dims: partial rotary, the first r dims
/// of each head rotate and the others pass through), the keys and values are written into the
/// caches (b, h_kv,
/// max_len, d) at rows p + i (p = position's one U32, read on the device), and q is returned as
/// (b, h, s, d) row-major. Same rules as write_at_position for the position.
Tensor rope_write_at_position(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                              const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& position,
                              const HeadNorms& norms = {});

/// The same for a paged step's T tokens (nn/paged_attention.h): qkv (T, (h + 2 h_kv) * d)
/// row-major plus `bias`, token t's q and k heads normalised and rotated by row positions[t] of
/// cos/sin (rows, r / 2, as above), its keys and values written into the pools (pages, h_kv,
/// page_size, d) at slots[t] (as nn::paged_kv_write); q returned as (T, h, d). positions and slots
/// (T) U32. A position past the tables or a slot past the pools is IndexOutOfRange on the CPU
/// (CUDA: the caller's checks, as for the paged batch).
Tensor rope_write_paged(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                        const Tensor& cos, const Tensor& sin, const Tensor& k_pages,
                        const Tensor& v_pages, const Tensor& positions, const Tensor& slots,
                        const HeadNorms& norms = {});

/// softmax(q k^T / sqrt(d)) v of q (b, h, 1, d) over the rows [0, p] of keys and values
/// (b, h_kv, len, d), p = position's one U32 read on the device (clamped to len - 1): the
/// graph-captured decode step's attention, whose cache rows past the position hold stale values,
/// without a mask built per step. The position and the rows before it must not be written by the
/// op just before this one (the kernel reads them while that op finishes); row p may be. Fills *out
/// with (b, h, 1, d) and returns true where one kernel does it (CUDA f16/bf16, the decode kernel's
/// head dims and alignments); otherwise does nothing and returns false, and the caller masks.
/// launch_next_early: the op after this one may launch as this kernel starts, for a next op that
/// only loads weights before it waits (AttentionArgs::launch_next_early).
bool attend_to_position(const Tensor& q, const Tensor& keys, const Tensor& values,
                        const Tensor& position, Tensor* out, bool launch_next_early = false);

/// nn::paged_attention, whose CUDA kernel with launch_next_early lets the op after it launch as
/// it starts (as attend_to_position's), and with indices_ready reads page_table, token_seq and
/// token_pos before the kernel before it has finished (fused::PagedAttentionOp::indices_ready:
/// the caller's promise that no kernel wrote them).
Tensor paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                       const Tensor& page_table, const Tensor& token_seq, const Tensor& token_pos,
                       double scale, size_t window, double softcap, bool launch_next_early,
                       bool indices_ready);

}  // namespace wick::nn::detail
