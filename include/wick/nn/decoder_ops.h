#pragma once
// Fused steps of a pre-norm decoder block, one kernel each where a composition of Tensor ops
// takes two or three: the residual add with the next RMSNorm, and SwiGLU's silu(gate) * up read
// from the fused gate/up projection. Used by models::Llama; inference only (when an input is
// tracked by autograd they run as the equivalent composition, so gradients still flow).

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

/// gate_up (..., 2n) holding gate then up: silu(gate) * up, (..., n), computed in f32 (f64 for
/// f64) and rounded once.
Tensor silu_mul(const Tensor& gate_up);

}  // namespace wick::nn
