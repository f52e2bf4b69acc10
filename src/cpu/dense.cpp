// The CPU kernel of fused::DenseOp: bf16 weights through the bf16 GEMM (src/cpu/gemm_amx.cpp),
// bias and activation applied as each output block is written. f32 weights, and bf16 ones on a
// CPU without the GEMM, take the fallback (OpenBLAS's sgemm).

#include "fused/dense.h"

#include <memory>

#include "cpu/cpu_storage.h"
#include "cpu/gemm_bf16.h"
#include "fused_op.h"
#include "tensor_internal.h"

namespace wick::fused {

namespace {

// Rows of t (rank 2) with unit column stride: the row stride, or 0 when the layout is otherwise.
size_t row_stride(const Tensor& t) {
  const auto& l = t.impl()->layout;
  if (t.dim(1) > 1 && l.strides()[1] != 1) return 0;
  return t.dim(0) > 1 ? l.strides()[0] : t.dim(1);
}

template <class T>
const T* data_of(const Tensor& t) {
  return cpu::as_cpu(detail::backend_of(t)).as<T>() + t.impl()->layout.start_offset();
}

}  // namespace

std::optional<TensorList> DenseOp::cpu(const TensorList& in) const {
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  if (x.dtype() != DType::F32 || w.dtype() != DType::BF16 || *cpu::bf16_gemm_kernel() == '\0') {
    return std::nullopt;
  }
  const size_t lda = row_stride(x), ldw = row_stride(w);
  if (lda == 0 || ldw == 0 || (b.dim(0) > 1 && b.impl()->layout.strides()[0] != 1)) {
    return std::nullopt;
  }
  auto locks = detail::lock_inputs(*this, in);
  const size_t m = x.dim(0), n = w.dim(0), k = x.dim(1);
  auto out = std::make_unique<cpu::CpuStorage>(m * n, DType::F32);
  cpu::gemm_bf16(m, n, k, data_of<float>(x), lda, data_of<bf16>(w), ldw, data_of<float>(b), gelu,
                 out->as<float>(), n);
  return TensorList{detail::from_storage(std::move(out), Shape{m, n})};
}

}  // namespace wick::fused
