#pragma once
// Dense projections with f32 activations and f32 or bf16 weights (fused::DenseOp).

#include "wick/tensor.h"

namespace wick::nn::detail {

/// act(x' weight^T + bias) + residual for x (..., in), weight (out, in), bias (out) and residual
/// (..., out) (optional: an empty tensor adds nothing) of one float dtype, or x, bias and residual
/// f32 with a bf16 weight: x' is x rounded to the weight's dtype, act the exact GELU when `gelu`.
/// Result (..., out) in x's dtype. On
/// the CPU, bf16 weights run the bf16 GEMM where the CPU has one (cpu::bf16_gemm_kernel()).
/// ShapeMismatch or DTypeMismatch naming "dense" for other operands.
Tensor dense(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu = false,
             const Tensor& residual = {});

}  // namespace wick::nn::detail
