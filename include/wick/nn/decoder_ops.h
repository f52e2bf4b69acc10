#pragma once
// Fused steps of a decoder block, one kernel each where a composition of Tensor ops takes two or
// three: the residual add with the next RMSNorm, the residual add of a normalised output (Gemma's
// post-norms), and SwiGLU's silu(gate) * up read from the fused gate/up projection. Used by
// models::Llama and the CUDA decode plan; inference only (when an input is tracked by autograd
// they run as the equivalent composition, so gradients still flow).

#include "wick/tensor.h"

namespace wick::nn {

struct ResidualNorm {
  Tensor residual;  // x + delta, rounded to the dtype
  Tensor normed;    // rms_norm(residual, weight, eps)
};

/// residual = x + delta and normed = rms_norm(residual) * weight, both (..., d) in x's dtype, from
/// one read of x and delta. x and delta: same shape, dtype (float) and device; weight (d). The
/// norm reads the rounded sum, as x.add(delta).rms_norm(weight, eps) does; statistics in f32 (f64
/// for f64).
ResidualNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps);

/// x + rms_norm(delta) * weight, (..., d) in x's dtype, in one pass: a residual add of a normalised
/// output (Gemma's post-norms). The bits of x.add(delta.rms_norm(weight, eps)): the norm rounded
/// to the dtype, then the add rounded once. x and delta: same shape, dtype (float) and device;
/// weight (d) of x's dtype, or f32 for f16/bf16 x (as rms_norm takes it).
Tensor add_rms_normed(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps);

/// gate_up (..., 2n) holding gate then up: silu(gate) * up, (..., n), computed in f32 (f64 for
/// f64) and rounded once.
Tensor silu_mul(const Tensor& gate_up);

}  // namespace wick::nn
