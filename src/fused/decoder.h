#pragma once
// The decoder block's fused ops, nn::add_rms_norm, nn::add_rms_normed and nn::silu_mul (front
// ends and fallbacks: src/nn/decoder_ops.cpp; kernels: src/cpu/decoder_ops.cpp,
// src/cuda/decoder_ops.cpp over decoder_ops.cu and fused.cu). Gradients: autograd through the
// fallbacks.

#include "wick/custom_op.h"

namespace wick::fused {

/// Inputs: x and delta (rows, d) row-major, weight (d), one dtype. Outputs: x + delta (rounded to
/// the dtype) and its rms_norm by weight.
class AddRmsNormOp final : public CustomOp {
 public:
  explicit AddRmsNormOp(double eps) : eps(eps) {}
  const char* name() const override { return "add_rms_norm"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  static std::optional<TensorList> cuda_kernel(const AddRmsNormOp& op, const TensorList& inputs);

  double eps;
};

/// Inputs: x and delta (rows, d) row-major, one dtype; weight (d) of that dtype, or f32 for
/// f16/bf16 (as rms_norm takes). Output: x + rms_norm(delta) by weight, the norm rounded to the
/// dtype first: the bits of x.add(delta.rms_norm(weight, eps)) (the CUDA kernel is rms_norm's,
/// adding x).
class AddRmsNormedOp final : public CustomOp {
 public:
  explicit AddRmsNormedOp(double eps) : eps(eps) {}
  const char* name() const override { return "add_rms_normed"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  static std::optional<TensorList> cuda_kernel(const AddRmsNormedOp& op, const TensorList& inputs);

  double eps;
};

/// Input: gate_up (rows, 2n) row-major, the gate then the up projection. Output: (rows, n),
/// silu(gate) rounded to the dtype, times up.
class SiluMulOp final : public CustomOp {
 public:
  const char* name() const override { return "silu_mul"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  static std::optional<TensorList> cuda_kernel(const SiluMulOp& op, const TensorList& inputs);
};

}  // namespace wick::fused
