#pragma once
// The KV-cache write of a decode step whose position lives in device memory, so that the step can
// be captured once as a CUDA graph and replayed for every position.

#include "wick/tensor.h"

namespace wick::models::detail {

/// k_cache[:, :, p + i, :] = k[:, :, i, :] and the same for v, with p = position's one U32
/// element, read where the work runs (on the GPU for CUDA tensors: no host round trip; one kernel
/// for both). Caches: (b, h, max_len, d) row-major; k, v: (b, h, s, d), any strides; one dtype
/// and device. An out-of-range position writes nothing (CUDA) or throws IndexOutOfRange (CPU).
void write_at_position(const Tensor& k_cache, const Tensor& k, const Tensor& v_cache,
                       const Tensor& v, const Tensor& position);

/// The decode step's attention input in one kernel (CUDA): qkv (b, s, (h + 2 h_kv) * d)
/// row-major, the projection's output, plus `bias` ((h + 2 h_kv) * d) when defined; the q and k
/// heads are rotated (rotate-half rope) by rows p + i of the (max_len, d / 2) cos/sin tables, the
/// keys and values are written into the caches (b, h_kv, max_len, d) at rows p + i (p = position's
/// one U32, read on the device), and q is returned as (b, h, s, d) row-major. Same rules as
/// write_at_position for the position.
Tensor rope_write_at_position(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                              const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& position);

/// The CUDA half of rope_write_at_position (src/cuda/decoder_ops.cpp; a stub without CUDA).
Tensor cuda_rope_write_at_position(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                                   const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& position);

/// The CUDA half of write_at_position (src/cuda/kv_write.cpp; a stub without CUDA).
void cuda_write_at_position(const Tensor& k_cache, const Tensor& k, const Tensor& v_cache,
                            const Tensor& v, const Tensor& position);

}  // namespace wick::models::detail
