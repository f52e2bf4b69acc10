// wick::qmatmul: checks, then the CPU tile kernels (src/cpu/qmatmul.cpp) or the CUDA kernels
// (src/cuda/qmatmul.cu).

#include "cpu/qmatmul.h"

#include <mutex>
#include <string>

#include "cpu/cpu_storage.h"
#include "qmatmul_backend.h"
#include "tensor_internal.h"
#include "wick/quantized.h"

namespace wick {

namespace detail {

struct QCache {
  std::once_flag cpu_once;
  std::shared_ptr<const cpu::QPacked> cpu_packed;
};

std::shared_ptr<QCache> make_qcache() {
  return std::make_shared<QCache>();
}

}  // namespace detail

bool qmatmul_supports(GgmlType type) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
    case GgmlType::Q4_K:
    case GgmlType::Q6_K:
    case GgmlType::Q5_1:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q5_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
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
  if (on_cpu) {
    const auto* w_bytes = static_cast<const uint8_t*>(cpu::as_cpu(detail::backend_of(raw)).data()) +
                          raw.layout().start_offset();
    const cpu::QPacked* packed = nullptr;
    // The tiled types run the integer tile kernels over 16-bit activations (8-bit as llama.cpp,
    // or f32, through WICK_QMATMUL_ACTIVATIONS; docs/NUMERICS.md says why 16).
    const cpu::QActivations acts = cpu::q_activations();
    if (cpu::q_tiled(type) && acts != cpu::QActivations::F32) {
      detail::QCache& cache = *w.cache_;
      std::call_once(cache.cpu_once, [&] {
        auto locks = detail::read_locks({&raw});
        cache.cpu_packed = cpu::q_pack(type, w_bytes, n, k);
      });
      packed = cache.cpu_packed.get();
    }
    auto out = cpu::device().alloc(m * n, DType::F32);
    auto locks = detail::read_locks({&xc, &raw});
    const float* xp = cpu::as_cpu(detail::backend_of(xc)).as<float>() + xc.layout().start_offset();
    cpu::qmatmul(type, w_bytes, packed, n, k, xp, m, cpu::as_cpu(*out).as<float>(), acts);
    return detail::from_storage(std::move(out), Shape(out_dims));
  }
  if (m > 8) {
    // Prefill on CUDA: dequantise once, then cuBLAS (the mat-vec kernel takes up to 8 rows).
    Tensor wf = w.dequantize();
    if (wf.dtype() != x.dtype()) wf = wf.to_dtype(x.dtype());
    return xc.reshape(Shape{m, k}).matmul(wf.t()).reshape(Shape(out_dims));
  }
  // The kernel reads x with 16-byte loads (f32) and the blocks 2 bytes at a time.
  if (xc.layout().start_offset() % 4 != 0) xc = xc.copy();
  if (raw.layout().start_offset() % 2 != 0) raw = raw.copy();
  auto locks = detail::read_locks({&xc, &raw});
  return detail::from_storage(
      cuda::qmatmul(type, detail::backend_of(raw), raw.layout().start_offset(), n, k,
                    detail::backend_of(xc), xc.layout().start_offset(), m, x.dtype()),
      Shape(out_dims));
}

}  // namespace wick
