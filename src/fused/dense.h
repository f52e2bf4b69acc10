#pragma once
// The dense projection of an encoder layer as one op, nn::detail::dense (front end and fallback:
// src/nn/dense.cpp; CPU kernel: src/cpu/dense.cpp over the bf16 GEMM of src/cpu/gemm_amx.cpp).
// Gradients: autograd through the fallback.

#include "wick/custom_op.h"

namespace wick::fused {

/// Inputs: x (rows, in), weight (out, in), bias (out), optionally residual (rows, out): one float
/// dtype, or x, bias and residual f32 with a bf16 weight. Output (rows, out) in x's dtype:
/// act(x' weight^T + bias) + residual, where x' is x rounded to the weight's dtype (the products of
/// two bf16 values are exact in f32, the sums f32) and act is the exact GELU when `gelu`.
class DenseOp final : public CustomOp {
 public:
  explicit DenseOp(bool gelu) : gelu(gelu) {}
  const char* name() const override { return "dense"; }
  void check(const TensorList& inputs) const override;
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;

  bool gelu;
};

}  // namespace wick::fused
