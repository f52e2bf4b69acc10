#pragma once
// Projections of a ragged batch (CausalLM::forward_paged) whose rows do not depend on the batch:
// a sequence's logits are the same bits whatever other sequences share its step (issue 52).

#include "nn/qlinear.h"
#include "wick/tensor.h"

namespace wick::nn::detail {

/// Whether dense CPU projections of forward_paged run through the fixed-order kernel
/// (WICK_BATCH_INVARIANT: "1" on, "0" off; on by default). Quantized weights are batch-invariant
/// either way (qmatmul quantizes and sums each row alone); CUDA's are not.
bool batch_invariant();

/// w.forward(x) (x (..., in)) with rows independent of each other where batch_invariant() and the
/// weight is dense on the CPU: computed in f32 and rounded once to x's dtype.
Tensor batch_linear(const QLinear& w, const Tensor& x);

/// project_qkv (nn/kv_write.h) through batch_linear: the bias inside the f32 product for f16/bf16
/// dense weights, otherwise left in *bias_left.
Tensor batch_project_qkv(const Tensor& in, const QLinear& w, const Tensor& bias, Tensor* bias_left);

}  // namespace wick::nn::detail
