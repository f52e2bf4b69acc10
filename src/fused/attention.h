#pragma once
// Scaled dot-product attention as a CustomOp (front end: nn::scaled_dot_product_attention in
// src/nn/attention.cpp, which also holds the fallback and the gradient; kernels:
// src/cpu/attention.cpp, src/cuda/fused_ops.cpp over attention*.cu).

#include "wick/custom_op.h"

namespace wick::fused {

/// Inputs: q (b, h, s, d), k and v (b, h_kv, s_kv, d), each with the last dim contiguous (other
/// strides free), h a multiple of h_kv; mask (b, h, s, s_kv) with any strides (stride 0 for
/// broadcast dims) or absent. Output: (b, h, s, d) row-major in q's dtype; f16/bf16 accumulate
/// in f32. scale is resolved (never 0); causal aligns the last query with the last key; window
/// (> 0) keeps only keys j > i + s_kv - s - window; softcap (> 0) maps each scaled score x to
/// softcap tanh(x / softcap) before the mask is added.
class AttentionOp final : public CustomOp {
 public:
  AttentionOp(double scale, bool causal, size_t window = 0, double softcap = 0)
      : scale(scale), causal(causal), window(window), softcap(softcap) {}
  const char* name() const override { return "scaled_dot_product_attention"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  bool has_backward() const override { return true; }
  TensorList backward(const TensorList& inputs, const TensorList& outputs, const TensorList& grads,
                      const std::vector<bool>& need) const override;
  /// Defined with the CUDA kernels, registered by src/cuda/custom_kernels.cpp.
  static std::optional<TensorList> cuda_kernel(const AttentionOp& op, const TensorList& inputs);

  double scale;
  bool causal;
  size_t window;
  double softcap;
};

}  // namespace wick::fused
