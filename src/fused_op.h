#pragma once
// Helpers of the fused ops (CustomOps, include/wick/custom_op.h) shared by their front ends and
// their kernels: operands as storages and layouts, and the layouts the kernels take.

#include <vector>

#include "backend.h"
#include "tensor_impl.h"
#include "wick/custom_op.h"
#include "wick/tensor.h"

namespace wick::detail {

/// The tensor itself when its last dim has stride 1 (or size <= 1), else a contiguous copy.
Tensor last_dim_contiguous(const Tensor& t);

/// The storage locks a kernel holds while it reads its inputs' storages directly: shared, or
/// exclusive for op.written_inputs(); each distinct storage once. A kernel holding them calls no
/// Tensor op on its inputs (the locks do not nest).
StorageLocks lock_inputs(const CustomOp& op, const TensorList& inputs);

/// A tensor's storage and layout for a kernel (a null storage for an empty handle).
inline KernelOperand kernel_operand(const Tensor& t) {
  if (!t.defined()) return {};
  return {&t.impl()->storage->backend(), t.impl()->layout};
}

}  // namespace wick::detail
