// wick::qmatmul: checks, then fused::QMatmulOp (src/fused/quantized.h), whose fallback
// (dequantise, then matmul) is defined here.

#include "cpu/qmatmul.h"

#include <mutex>
#include <string>

#include "fused/quantized.h"
#include "tensor_internal.h"
#include "wick/quantized.h"

namespace wick {

namespace detail {

std::shared_ptr<QCache> make_qcache() {
  return std::make_shared<QCache>();
}

QCache& qcache_of(const QTensor& w) {
  return *w.cache_;
}

}  // namespace detail

bool qmatmul_supports(GgmlType type) {
  return ggml_can_dequantize(type);  // rows of any type it can dequantise, kernels or not
}

int qmatmul_cpu_activation_bits(GgmlType type) {
  if (!cpu::q_tiled(type)) return 0;
  switch (cpu::q_activations()) {
    case cpu::QActivations::Int8:
      return 8;
    case cpu::QActivations::Int16:
      return 16;
    default:
      return 0;
  }
}

Tensor qmatmul(const Tensor& x, const QTensor& w) {
  if (!x.defined() || !w.data().defined()) throw Error("qmatmul: empty operand");
  if (w.shape().rank() != 2) {
    throw ShapeMismatch(str("qmatmul: weights must be (n, k), got ", w.shape()));
  }
  const size_t n = w.shape()[0], k = w.shape()[1];
  if (x.rank() == 0 || x.dims().back() != k) {
    throw ShapeMismatch(str("qmatmul: shape mismatch, x ", x.shape(), ", w ", w.shape(), " (",
                            ggml_type_name(w.type()), ")"));
  }
  if (x.device() != w.device()) {
    throw DeviceMismatch(str("qmatmul: x on ", x.device(), ", w on ", w.device()));
  }
  if (!qmatmul_supports(w.type())) {
    throw UnsupportedDType(
        str("qmatmul: weights of type ", ggml_type_name(w.type()), " are not supported"));
  }
  const bool on_cpu = x.device().is_cpu();
  if (on_cpu ? x.dtype() != DType::F32
             : (x.dtype() != DType::F32 && x.dtype() != DType::F16 && x.dtype() != DType::BF16)) {
    throw UnsupportedDType(str("qmatmul: x must be f32", on_cpu ? "" : ", f16 or bf16", " on ",
                               x.device(), ", got ", x.dtype()));
  }
  std::vector<size_t> out_dims = x.dims();
  out_dims.back() = n;
  const size_t m = x.elem_count() / k;
  const GgmlType type = w.type();
  if (type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16) {
    Tensor wf = w.dequantize().to_dtype(x.dtype());
    return x.reshape(Shape{m, k}).matmul(wf.t()).reshape(Shape(out_dims));
  }
  Tensor xc = x.is_contiguous() ? x : x.contiguous();
  Tensor raw = w.data().is_contiguous() ? w.data() : w.data().contiguous();
  detail::check_output_bytes("qmatmul", Shape(out_dims), x.dtype(), x.device());
  // The CUDA kernels read x with 16-byte loads (f32) and the blocks 2 bytes at a time.
  if (xc.layout().start_offset() % 4 != 0) xc = xc.copy();
  if (raw.layout().start_offset() % 2 != 0) raw = raw.copy();
  return wick::apply(fused::QMatmulOp(type, n, k, w.cache_), {raw, xc.reshape(Shape{m, k})})[0]
      .reshape(Shape(out_dims));
}

}  // namespace wick

namespace wick::fused {

TensorList QMatmulOp::fallback(const TensorList& in) const {
  const Tensor& x = in[1];
  Tensor wf = QTensor(type, Shape{n, k}, in[0]).dequantize();
  if (wf.dtype() != x.dtype()) wf = wf.to_dtype(x.dtype());
  return {x.matmul(wf.t())};
}

}  // namespace wick::fused
