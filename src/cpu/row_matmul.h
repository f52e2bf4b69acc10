#pragma once
// y = x w^T with each row's result independent of the other rows (src/cpu/row_matmul.cpp): the
// batch-invariant projections of the serving engine's paged forward.

#include "wick/tensor.h"

namespace wick::cpu {

/// x (m, k) f32 and w (n, k) f32, f16 or bf16, both contiguous on the CPU: (m, n) f32, each
/// element one dot product in a fixed order (the same bits for any m). ShapeMismatch or
/// UnsupportedDType otherwise.
Tensor row_matmul(const Tensor& x, const Tensor& w);

}  // namespace wick::cpu
