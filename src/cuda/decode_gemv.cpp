// The CUDA side of models/decode_gemv.h: operands to GemvArgs, one enqueue each.

#include "cuda/decode_gemv.h"

#include <memory>
#include <mutex>

#include "cuda/cuda_storage.h"
#include "cuda_config.h"
#include "models/decode_gemv.h"
#include "tensor_internal.h"

namespace wick::models::detail {

namespace {

void* ptr_of(const Tensor& t) {
  const TensorImpl& i = *t.impl();
  return cuda::as_cuda(i.storage->backend()).data_at(i.layout.start_offset());
}

// The weight's bytes and format, when the kernel takes it: plain (x's dtype, row-major) or one
// part of Q4_0 / Q4_1 / Q8_0 blocks; x one contiguous row on the same CUDA device.
struct WeightView {
  const Tensor* bytes = nullptr;  // the tensor to lock and address
  cuda::GemvWeights format = cuda::GemvWeights::Dense;
  int64_t n = 0, k = 0;
};

bool usable(const Tensor& x, const QLinear& w, WeightView* view) {
  if (!decode_gemv_enabled() || !x.device().is_cuda() || !x.is_contiguous()) return false;
  if (!w.quantized()) {
    const Tensor& d = w.dense();
    if (d.device() != x.device() || x.dtype() != d.dtype() || d.rank() != 2 ||
        !d.is_contiguous()) {
      return false;
    }
    *view = {&d, cuda::GemvWeights::Dense, static_cast<int64_t>(d.dims()[0]),
             static_cast<int64_t>(d.dims()[1])};
  } else {
    if (w.parts().size() != 1) return false;
    const QTensor& q = w.parts()[0];
    if (q.device() != x.device() || !q.data().is_contiguous()) return false;
    cuda::GemvWeights format;
    switch (q.type()) {
      case GgmlType::Q4_0:
        format = cuda::GemvWeights::Q4_0;
        break;
      case GgmlType::Q4_1:
        format = cuda::GemvWeights::Q4_1;
        break;
      case GgmlType::Q8_0:
        format = cuda::GemvWeights::Q8_0;
        break;
      default:
        return false;
    }
    *view = {&q.data(), format, static_cast<int64_t>(q.shape()[0]),
             static_cast<int64_t>(q.shape()[1])};
  }
  return x.elem_count() == static_cast<size_t>(view->k);
}

cuda::GemvArgs base_args(cuda::GemvEpilogue e, const Tensor& x, const WeightView& w) {
  cuda::GemvArgs a{};
  a.epilogue = e;
  a.weights = w.format;
  a.w = ptr_of(*w.bytes);
  a.x = ptr_of(x);
  a.n = w.n;
  a.k = w.k;
  return a;
}

cuda::CudaDevice& device_of(const Tensor& t) {
  return cuda::as_cuda(t.impl()->storage->backend()).cuda_device();
}

}  // namespace

bool decode_gemv_enabled() {
  static const bool enabled = cuda::config().decode_gemv;
  return enabled;
}

bool fused_linear(const Tensor& x, const QLinear& w, Tensor* y) {
  WeightView wv;
  if (!usable(x, w, &wv)) return false;
  cuda::GemvArgs a = base_args(cuda::GemvEpilogue::Store, x, wv);
  DType dt = x.dtype();
  if (!cuda::gemv_fits(dt, a)) return false;
  cuda::CudaDevice& dev = device_of(x);
  auto out = std::make_unique<cuda::CudaStorage>(dev, static_cast<size_t>(wv.n), dt);
  a.out = out->data();
  {
    auto locks = wick::detail::read_locks({&x, wv.bytes});
    dev.queue().enqueue("linear_gemv", dt, [&](cudaStream_t s) { cuda::launch_gemv(dt, a, s); });
  }
  std::vector<size_t> dims = x.dims();
  dims.back() = static_cast<size_t>(wv.n);
  *y = wick::detail::from_storage(std::move(out), Shape(dims));
  return true;
}

bool fused_qkv_rope(const Tensor& x, const QLinear& wqkv, const Tensor& bias, size_t h,
                    size_t h_kv, const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                    const Tensor& v_cache, const Tensor& position, Tensor* q) {
  WeightView wv;
  if (!usable(x, wqkv, &wv) || (bias.defined() && bias.dtype() != x.dtype()) || k_cache.dims()[0] != 1 || !k_cache.is_contiguous() ||
      !v_cache.is_contiguous() || !cos.is_contiguous() || !sin.is_contiguous() ||
      (bias.defined() && !bias.is_contiguous())) {
    return false;
  }
  size_t d = k_cache.dims()[3];
  cuda::GemvArgs a = base_args(cuda::GemvEpilogue::QkvRope, x, wv);
  a.bias = bias.defined() ? ptr_of(bias) : nullptr;
  a.cos = ptr_of(cos);
  a.sin = ptr_of(sin);
  a.k_cache = ptr_of(k_cache);
  a.v_cache = ptr_of(v_cache);
  a.position = static_cast<const uint32_t*>(ptr_of(position));
  a.h = static_cast<int64_t>(h);
  a.h_kv = static_cast<int64_t>(h_kv);
  a.d = static_cast<int64_t>(d);
  a.max_len = static_cast<int64_t>(k_cache.dims()[2]);
  DType dt = x.dtype();
  if (!cuda::gemv_fits(dt, a)) return false;
  cuda::CudaDevice& dev = device_of(x);
  auto out = std::make_unique<cuda::CudaStorage>(dev, h * d, dt);
  a.q = out->data();
  {
    auto locks = bias.defined()
                     ? wick::detail::read_locks({&x, wv.bytes, &bias, &cos, &sin, &position})
                     : wick::detail::read_locks({&x, wv.bytes, &cos, &sin, &position});
    std::lock_guard write_k(k_cache.impl()->storage->mutex());
    std::lock_guard write_v(v_cache.impl()->storage->mutex());
    dev.queue().enqueue("qkv_rope_gemv", dt, [&](cudaStream_t s) { cuda::launch_gemv(dt, a, s); });
  }
  *q = wick::detail::from_storage(std::move(out), Shape{1, h, 1, d});
  return true;
}

bool fused_gate_up_silu(const Tensor& x, const QLinear& w_gate_up, Tensor* act) {
  WeightView wv;
  if (!usable(x, w_gate_up, &wv)) return false;
  cuda::GemvArgs a = base_args(cuda::GemvEpilogue::SiluMul, x, wv);
  DType dt = x.dtype();
  if (!cuda::gemv_fits(dt, a)) return false;
  size_t n = static_cast<size_t>(wv.n) / 2;
  cuda::CudaDevice& dev = device_of(x);
  auto out = std::make_unique<cuda::CudaStorage>(dev, n, dt);
  a.out = out->data();
  {
    auto locks = wick::detail::read_locks({&x, wv.bytes});
    dev.queue().enqueue("gate_up_silu_gemv", dt,
                        [&](cudaStream_t s) { cuda::launch_gemv(dt, a, s); });
  }
  *act = wick::detail::from_storage(std::move(out), Shape{1, 1, n});
  return true;
}

bool fused_project_add_norm(const Tensor& x, const QLinear& w, const Tensor& residual,
                            const Tensor& norm_weight, double eps, const Tensor& counter,
                            nn::ResidualNorm* out) {
  WeightView wv;
  if (!usable(x, w, &wv) || residual.elem_count() != static_cast<size_t>(wv.n) || !residual.is_contiguous() ||
      residual.dtype() != x.dtype() || !norm_weight.is_contiguous() ||
      norm_weight.dtype() != x.dtype() || !counter.defined() || counter.dtype() != DType::U32 ||
      counter.device() != x.device()) {
    return false;
  }
  cuda::GemvArgs a = base_args(cuda::GemvEpilogue::AddNorm, x, wv);
  a.residual = ptr_of(residual);
  a.norm_weight = ptr_of(norm_weight);
  a.eps = eps;
  a.counter = static_cast<unsigned*>(ptr_of(counter));
  DType dt = x.dtype();
  if (!cuda::gemv_fits(dt, a)) return false;
  size_t n = static_cast<size_t>(wv.n);
  cuda::CudaDevice& dev = device_of(x);
  auto sum = std::make_unique<cuda::CudaStorage>(dev, n, dt);
  auto normed = std::make_unique<cuda::CudaStorage>(dev, n, dt);
  a.sum = sum->data();
  a.normed = normed->data();
  {
    auto locks = wick::detail::read_locks({&x, wv.bytes, &residual, &norm_weight});
    std::lock_guard write_counter(counter.impl()->storage->mutex());
    dev.queue().enqueue("project_add_norm_gemv", dt,
                        [&](cudaStream_t s) { cuda::launch_gemv(dt, a, s); });
  }
  out->residual = wick::detail::from_storage(std::move(sum), residual.shape());
  out->normed = wick::detail::from_storage(std::move(normed), residual.shape());
  return true;
}

}  // namespace wick::models::detail
