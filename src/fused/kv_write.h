#pragma once
// The KV-cache ops of a decode step whose position lives in device memory (front ends, checks
// and fallbacks: src/nn/kv_write.cpp; CUDA kernels: src/cuda/kv_write.cpp,
// src/cuda/decoder_ops.cpp; the CPU's rope write: src/cpu/kv_write.cpp, the rest runs the
// fallbacks). No gradients: the caches are state.

#include "wick/custom_op.h"

namespace wick::fused {

/// Inputs: k_cache, k, v_cache, v, position (one U32), as nn::detail::write_at_position. No
/// output; the caches are written.
class KvWriteOp final : public CustomOp {
 public:
  const char* name() const override { return "kv_write"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  std::vector<size_t> written_inputs() const override { return {0, 2}; }
  static std::optional<TensorList> cuda_kernel(const KvWriteOp& op, const TensorList& inputs);
};

/// Inputs: qkv (row-major), bias or absent, cos, sin (row-major), k_cache, v_cache, position,
/// slots or absent, q_norm or absent, k_norm or absent: nn::detail::rope_write_at_position
/// (slots absent; q (b, h, s, d) row-major) or nn::detail::rope_write_paged (slots given; q (T,
/// h, d)). The caches are written.
class RopeWriteOp final : public CustomOp {
 public:
  RopeWriteOp(size_t h, size_t h_kv, double eps) : h(h), h_kv(h_kv), eps(eps) {}
  const char* name() const override { return "rope_write"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;  // src/cpu/kv_write.cpp
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  std::vector<size_t> written_inputs() const override { return {4, 5}; }
  static std::optional<TensorList> cuda_kernel(const RopeWriteOp& op, const TensorList& inputs);

  size_t h, h_kv;
  double eps;  // of the head norms
};

/// Inputs: q, keys, values, position, as nn::detail::attend_to_position. Output: the attention
/// (b, h, 1, d) where a kernel takes the inputs; the fallback gives no output (the caller masks
/// with its cache's mask).
class AttendToPositionOp final : public CustomOp {
 public:
  explicit AttendToPositionOp(bool launch_next_early) : launch_next_early(launch_next_early) {}
  const char* name() const override { return "attend_to_position"; }
  TensorList fallback(const TensorList&) const override { return {}; }
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  static std::optional<TensorList> cuda_kernel(const AttendToPositionOp& op,
                                               const TensorList& inputs);

  bool launch_next_early;
};

}  // namespace wick::fused
