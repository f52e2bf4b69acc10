#pragma once
// y = x w^T with each row's result independent of the other rows: the batch-invariant
// projections of the serving engine's paged forward. The kernels (cpu/row_matmul_kernels.cpp)
// are compiled once per instruction set, like the other CPU kernels.

#include <cstddef>

#include "wick/half.h"
#include "wick/tensor.h"

namespace wick::cpu {

/// x (m, k) f32 and w (n, k) f32, f16 or bf16, both contiguous on the CPU: (m, n) f32, each
/// element one dot product in a fixed order (the same bits for any m, on one instruction set).
/// ShapeMismatch or UnsupportedDType otherwise.
Tensor row_matmul(const Tensor& x, const Tensor& w);

/// The kernels of one instruction set: y (m, n) = x (m, k) w^T, w (n, k) row-major.
struct RowMatmulKernels {
  const char* name;  // e.g. "avx512 16-lane"
  void (*f32)(const float* x, size_t m, const float* w, size_t n, size_t k, float* y);
  void (*f16)(const float* x, size_t m, const f16* w, size_t n, size_t k, float* y);
  void (*bf16)(const float* x, size_t m, const bf16* w, size_t n, size_t k, float* y);
};

extern const RowMatmulKernels kAvx2RowMatmul;
extern const RowMatmulKernels kAvx512RowMatmul;

/// The kernels of the CPU kernels' instruction set (wick::cpu_isa()).
const RowMatmulKernels& row_matmul_kernels();

}  // namespace wick::cpu
