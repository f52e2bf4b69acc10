// row_matmul (cpu/row_matmul.h): checks its operands and runs the kernels of the CPU's
// instruction set (cpu/row_matmul_kernels.cpp).

#include "cpu/row_matmul.h"

#include <memory>
#include <string>

#include "cpu/cpu_storage.h"
#include "tensor_internal.h"
#include "util.h"
#include "wick/cpu.h"
#include "wick/error.h"
#include "wick/half.h"

namespace wick::cpu {

const RowMatmulKernels& row_matmul_kernels() {
  // Follows the CPU kernels' choice (WICK_CPU_ISA included), as gemm_f32() does.
  static const RowMatmulKernels& kernels = []() -> const RowMatmulKernels& {
    [[maybe_unused]] const std::string isa = wick::cpu_isa();
#if !defined(WICK_NO_AVX512_KERNELS)
    if (isa == "avx512") return kAvx512RowMatmul;
#endif
    return kAvx2RowMatmul;
  }();
  return kernels;
}

Tensor row_matmul(const Tensor& x, const Tensor& w) {
  using namespace wick::detail;
  if (x.rank() != 2 || w.rank() != 2 || x.dims()[1] != w.dims()[1] || x.dtype() != DType::F32 ||
      !x.is_contiguous() || !w.is_contiguous() || !x.device().is_cpu() || !w.device().is_cpu()) {
    throw ShapeMismatch(str("row_matmul: x ", x.shape(), " ", x.dtype(), " and w ", w.shape(), " ",
                            w.dtype(), " must be contiguous CPU (m, k) f32 and (n, k)"));
  }
  if (w.dtype() != DType::F32 && w.dtype() != DType::F16 && w.dtype() != DType::BF16) {
    throw UnsupportedDType(str("row_matmul: weight ", w.dtype(), " (f32, f16 or bf16)"));
  }
  const size_t m = x.dims()[0], k = x.dims()[1], n = w.dims()[0];
  auto out = std::make_unique<CpuStorage>(m * n, DType::F32);
  auto locks = read_locks({&x, &w});
  const float* xp = as_cpu(backend_of(x)).as<float>() + x.impl()->layout.start_offset();
  float* yp = out->as<float>();
  const size_t off = w.impl()->layout.start_offset();
  const RowMatmulKernels& kernels = row_matmul_kernels();
  if (w.dtype() == DType::F32) {
    kernels.f32(xp, m, as_cpu(backend_of(w)).as<float>() + off, n, k, yp);
  } else if (w.dtype() == DType::F16) {
    kernels.f16(xp, m, as_cpu(backend_of(w)).as<f16>() + off, n, k, yp);
  } else {
    kernels.bf16(xp, m, as_cpu(backend_of(w)).as<bf16>() + off, n, k, yp);
  }
  return from_storage(std::move(out), Shape{m, n});
}

}  // namespace wick::cpu
