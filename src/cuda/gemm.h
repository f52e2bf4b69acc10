#pragma once
// wick's own precompiled GEMM: serves matmuls that arrive before cuBLASLt has finished warming
// up (its first GEMM in a process is slow), and any layout cuBLASLt refuses.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "wick/dtype.h"

namespace wick::cuda {

/// One operand: element (batch, row, col) is at ptr[batch * bs + row * rs + col * cs] (elements;
/// any strides, 0 included).
struct GemmOperand {
  const void* ptr;
  int64_t rs, cs, bs;
};

/// c[batch][m][n] (row-major, contiguous) = a[batch] (m x k) * b[batch] (k x n) for each batch;
/// float dtypes, accumulating in fp32 (fp64 for f64). Enqueued on `s`.
void launch_gemm(DType dtype, size_t batch, size_t m, size_t n, size_t k, const GemmOperand& a,
                 const GemmOperand& b, void* c, cudaStream_t s);

/// Loads every GEMM kernel now, so that the first matmul pays no module loading.
void preload_gemm_kernels();

}  // namespace wick::cuda
