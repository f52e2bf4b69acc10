#pragma once
// Helpers of the fused ops (CustomOps, include/wick/custom_op.h) shared by their front ends and
// their kernels: operands as storages and layouts, and the layouts the kernels take.

#include <vector>

#include "backend.h"
#include "backprop.h"
#include "tensor_impl.h"
#include "wick/tensor.h"

namespace wick::detail {

/// Runs `params` on `operands` (operands[0] the main input; an empty handle is an absent
/// operand) giving a row-major tensor of `out_shape`; records `grad` over the defined operands
/// when one is tracked (gradient entries follow the operand order, absent ones included).
Tensor run_fused(const FusedParams& params, const std::vector<Tensor>& operands,
                 const Shape& out_shape, FusedGrad grad);

/// The tensor itself when its last dim has stride 1 (or size <= 1), else a contiguous copy.
Tensor last_dim_contiguous(const Tensor& t);

/// A tensor's storage and layout for a kernel (a null storage for an empty handle).
inline KernelOperand kernel_operand(const Tensor& t) {
  if (!t.defined()) return {};
  return {&t.impl()->storage->backend(), t.impl()->layout};
}

}  // namespace wick::detail
