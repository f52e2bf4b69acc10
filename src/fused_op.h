#pragma once
// The call path of the fused ops (tensor_fused.cpp, nn/attention.cpp): run_op (tensor_internal.h)
// over the present operands, calling the backend's fused family and recording its gradient.

#include <vector>

#include "backend.h"
#include "backprop.h"
#include "wick/tensor.h"

namespace wick::detail {

/// Runs `params` on `operands` (operands[0] the main input; an empty handle is an absent
/// operand) giving a row-major tensor of `out_shape`; records `grad` over the defined operands
/// when one is tracked (gradient entries follow the operand order, absent ones included).
Tensor run_fused(const FusedParams& params, const std::vector<Tensor>& operands,
                 const Shape& out_shape, FusedGrad grad);

/// The tensor itself when its last dim has stride 1 (or size <= 1), else a contiguous copy.
Tensor last_dim_contiguous(const Tensor& t);

}  // namespace wick::detail
