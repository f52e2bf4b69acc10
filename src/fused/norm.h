#pragma once
// layer_norm and rms_norm as one CustomOp (front end, fallback and gradient: src/tensor_fused.cpp;
// kernels: src/cpu/fused.cpp, src/cuda/fused_ops.cpp over fused.cu).

#include "wick/custom_op.h"

namespace wick::fused {

/// rms_norm of f16/bf16 x by an f32 weight: in f32, rounded once (Gemma's 1 + w).
inline bool f32_weight_of_half(DType x, DType w) {
  return w == DType::F32 && (x == DType::F16 || x == DType::BF16);
}

/// The weights rms_norm takes for x, and every RMS norm fused into another op with it: x's
/// dtype, or f32 for f16/bf16 x.
inline bool rms_norm_weight_fits(DType x, DType w) {
  return w == x || f32_weight_of_half(x, w);
}

/// Inputs: x (rows, d) row-major, weight (d), and for layer_norm bias (d) or absent; one dtype,
/// but for rms_norm's weight of an f16/bf16 x, which may be f32. Output: x's shape and dtype.
/// layer_norm: (x - mean) * rstd * w + b, rounded once; rms_norm: w * round(x * rstd), as
/// transformers' RMSNorm (f16/bf16 round twice), or with an f32 weight round(w * (x * rstd)), as
/// Gemma's (all in f32, rounded once). f16/bf16 compute in f32.
class NormOp final : public CustomOp {
 public:
  NormOp(bool rms, double eps) : rms(rms), eps(eps) {}
  const char* name() const override { return rms ? "rms_norm" : "layer_norm"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  bool has_backward() const override { return true; }
  TensorList backward(const TensorList& inputs, const TensorList& outputs, const TensorList& grads,
                      const std::vector<bool>& need) const override;
  static std::optional<TensorList> cuda_kernel(const NormOp& op, const TensorList& inputs);

  bool rms;
  double eps;
};

}  // namespace wick::fused
