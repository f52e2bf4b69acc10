#pragma once
// The GGML-block ops as CustomOps: qmatmul over quantized weights (front end and fallback:
// src/qmatmul.cpp; kernels: src/cpu/qmatmul.cpp, src/cuda/fused_ops.cpp over qmatmul.cu) and
// dequantisation (front end: src/formats/quantized.cpp; kernels: src/cpu/dequant.cpp,
// src/cuda/fused_ops.cpp over dequant.cu).

#include <memory>
#include <mutex>

#include "wick/custom_op.h"
#include "wick/quantized.h"

namespace wick::cpu {
struct QPacked;
}

namespace wick::detail {

/// What a QTensor keeps for qmatmul: its blocks packed for the CPU tile kernels, made once.
struct QCache {
  std::once_flag cpu_once;
  std::shared_ptr<const cpu::QPacked> cpu_packed;
};

}  // namespace wick::detail

namespace wick::fused {

/// Inputs: raw, the U8 blocks of w (n, k) of `type` (row-major, contiguous), and x (m, k)
/// contiguous (f32 on the CPU; f32, f16 or bf16 on CUDA). Output: x w^T (m, n) in x's dtype.
/// The CPU kernel packs the blocks once per weight into `cache`.
class QMatmulOp final : public CustomOp {
 public:
  QMatmulOp(GgmlType type, size_t n, size_t k, std::shared_ptr<detail::QCache> cache)
      : type(type), n(n), k(k), cache(std::move(cache)) {}
  const char* name() const override { return "qmatmul"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  static std::optional<TensorList> cuda_kernel(const QMatmulOp& op, const TensorList& inputs);

  GgmlType type;
  size_t n, k;
  std::shared_ptr<detail::QCache> cache;
};

/// Input: raw, the U8 blocks of `n` values of `type` (contiguous). Output: (n) f32. Every
/// device has a kernel; the fallback throws BackendError.
class DequantizeOp final : public CustomOp {
 public:
  DequantizeOp(GgmlType type, size_t n) : type(type), n(n) {}
  const char* name() const override { return "dequantize"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  static std::optional<TensorList> cuda_kernel(const DequantizeOp& op, const TensorList& inputs);

  GgmlType type;
  size_t n;
};

}  // namespace wick::fused
