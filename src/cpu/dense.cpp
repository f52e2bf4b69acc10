// The CPU kernel of fused::DenseOp on f32 activations: bf16 weights through the bf16 GEMM
// (src/cpu/gemm_amx.cpp), bias, activation and residual applied as each output block is written;
// f32 weights through the matmul op (sgemm), then bias, activation and residual in one pass. Other
// dtypes, and bf16 weights on a CPU without the GEMM, take the fallback.

// The exact GELU's float compares (in vec_erff) only vectorise when GCC may assume they raise no
// visible FP exceptions, as in unary.cpp; nothing in wick reads the FP flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include "fused/dense.h"

#include <algorithm>
#include <memory>

#include "cpu/cpu_storage.h"
#include "cpu/gemm_bf16.h"
#include "cpu/parallel.h"
#include "fused_op.h"
#include "ops/unary_math.h"
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

// One row of finish_rows.
void finish_row(size_t n, const float* __restrict bias, bool gelu, const float* __restrict residual,
                float* __restrict row) {
  if (gelu) {
    for (size_t j = 0; j < n; ++j) {
      const float v = row[j] + bias[j];
      row[j] = 0.5f * v * (1.0f + ops::math::vec_erff(v * 0.7071067811865476f));
    }
  } else {
    for (size_t j = 0; j < n; ++j) row[j] += bias[j];
  }
  if (residual != nullptr) {
    for (size_t j = 0; j < n; ++j) row[j] += residual[j];
  }
}

// y (m x n, dense) = act(y + bias) + residual, row by row across the pool.
void finish_rows(size_t m, size_t n, const float* bias, bool gelu, const float* residual,
                 size_t ldr, float* y) {
  cpu::parallel_for(
      m, std::max<size_t>(1, 8192 / std::max<size_t>(n, 1)), [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i) {
          finish_row(n, bias, gelu, residual == nullptr ? nullptr : residual + i * ldr, y + i * n);
        }
      });
}

}  // namespace

std::optional<TensorList> DenseOp::cpu(const TensorList& in) const {
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  const Tensor* residual = in.size() == 4 && in[3].defined() ? &in[3] : nullptr;
  if (x.dtype() != DType::F32 || (b.dim(0) > 1 && b.impl()->layout.strides()[0] != 1)) {
    return std::nullopt;
  }
  const size_t ldr = residual == nullptr ? 0 : row_stride(*residual);
  if (residual != nullptr && ldr == 0) return std::nullopt;
  const size_t m = x.dim(0), n = w.dim(0), k = x.dim(1);
  if (w.dtype() == DType::F32) {
    // sgemm (the matmul op, batch-invariant under WICK_BATCH_INVARIANT=1), then bias, GELU and
    // residual in one pass over its fresh result.
    Tensor y = x.matmul(w.t());
    auto locks = detail::lock_inputs(*this, in);
    float* yp = cpu::as_cpu(detail::backend_of(y)).as<float>() + y.impl()->layout.start_offset();
    finish_rows(m, n, data_of<float>(b), gelu,
                residual == nullptr ? nullptr : data_of<float>(*residual), ldr, yp);
    return TensorList{y};
  }
  if (w.dtype() != DType::BF16 || *cpu::bf16_gemm_kernel() == '\0') return std::nullopt;
  const size_t lda = row_stride(x), ldw = row_stride(w);
  if (lda == 0 || ldw == 0) return std::nullopt;
  auto locks = detail::lock_inputs(*this, in);
  auto out = std::make_unique<cpu::CpuStorage>(m * n, DType::F32);
  cpu::gemm_bf16(m, n, k, data_of<float>(x), lda, data_of<bf16>(w), ldw, data_of<float>(b), gelu,
                 residual == nullptr ? nullptr : data_of<float>(*residual), ldr, out->as<float>(),
                 n);
  return TensorList{detail::from_storage(std::move(out), Shape{m, n})};
}

}  // namespace wick::fused
