#pragma once
// rope and rope_interleaved as one CustomOp (front end, fallback and gradient:
// src/tensor_fused.cpp; kernels: src/cpu/fused.cpp, src/cuda/fused_ops.cpp over rope.cu).

#include "wick/custom_op.h"

namespace wick::fused {

/// Inputs: x (b, h, s, d) with the last dim contiguous (other strides free), cos and sin
/// (s, d / 2) row-major, one dtype. Output: (b, h, s, d) row-major, each pair (a, b) of a head's
/// row (halves, or neighbours when interleaved) rotated: (a c - b s, b c + a s); f16/bf16 round
/// each product, as transformers' q * cos + rotate_half(q) * sin.
class RopeOp final : public CustomOp {
 public:
  explicit RopeOp(bool interleaved) : interleaved(interleaved) {}
  const char* name() const override { return interleaved ? "rope_interleaved" : "rope"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  bool has_backward() const override { return true; }
  TensorList backward(const TensorList& inputs, const TensorList& outputs, const TensorList& grads,
                      const std::vector<bool>& need) const override;
  static std::optional<TensorList> cuda_kernel(const RopeOp& op, const TensorList& inputs);

  bool interleaved;
};

}  // namespace wick::fused
