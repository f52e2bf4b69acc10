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

// One row on CUDA, row-major operands of one float dtype.
bool usable(const Tensor& x, const Tensor& w) {
  if (!decode_gemv_enabled() || !x.device().is_cuda() || w.device() != x.device()) return false;
  if (x.dtype() != w.dtype() || w.rank() != 2 || !w.is_contiguous() || !x.is_contiguous()) {
    return false;
  }
  return x.elem_count() == w.dims()[1];
}

cuda::GemvArgs base_args(cuda::GemvEpilogue e, const Tensor& x, const Tensor& w) {
  cuda::GemvArgs a{};
  a.epilogue = e;
  a.w = ptr_of(w);
  a.x = ptr_of(x);
  a.n = static_cast<int64_t>(w.dims()[0]);
  a.k = static_cast<int64_t>(w.dims()[1]);
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

bool fused_qkv_rope(const Tensor& x, const Tensor& wqkv, const Tensor& bias, size_t h, size_t h_kv,
                    const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                    const Tensor& v_cache, const Tensor& position, Tensor* q) {
  if (!usable(x, wqkv) || k_cache.dims()[0] != 1 || !k_cache.is_contiguous() ||
      !v_cache.is_contiguous() || !cos.is_contiguous() || !sin.is_contiguous() ||
      (bias.defined() && !bias.is_contiguous())) {
    return false;
  }
  size_t d = k_cache.dims()[3];
  cuda::GemvArgs a = base_args(cuda::GemvEpilogue::QkvRope, x, wqkv);
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
                     ? wick::detail::read_locks({&x, &wqkv, &bias, &cos, &sin, &position})
                     : wick::detail::read_locks({&x, &wqkv, &cos, &sin, &position});
    std::lock_guard write_k(k_cache.impl()->storage->mutex());
    std::lock_guard write_v(v_cache.impl()->storage->mutex());
    dev.queue().enqueue("qkv_rope_gemv", dt, [&](cudaStream_t s) { cuda::launch_gemv(dt, a, s); });
  }
  *q = wick::detail::from_storage(std::move(out), Shape{1, h, 1, d});
  return true;
}

bool fused_gate_up_silu(const Tensor& x, const Tensor& w_gate_up, Tensor* act) {
  if (!usable(x, w_gate_up)) return false;
  cuda::GemvArgs a = base_args(cuda::GemvEpilogue::SiluMul, x, w_gate_up);
  DType dt = x.dtype();
  if (!cuda::gemv_fits(dt, a)) return false;
  size_t n = w_gate_up.dims()[0] / 2;
  cuda::CudaDevice& dev = device_of(x);
  auto out = std::make_unique<cuda::CudaStorage>(dev, n, dt);
  a.out = out->data();
  {
    auto locks = wick::detail::read_locks({&x, &w_gate_up});
    dev.queue().enqueue("gate_up_silu_gemv", dt,
                        [&](cudaStream_t s) { cuda::launch_gemv(dt, a, s); });
  }
  *act = wick::detail::from_storage(std::move(out), Shape{1, 1, n});
  return true;
}

bool fused_project_add_norm(const Tensor& x, const Tensor& w, const Tensor& residual,
                            const Tensor& norm_weight, double eps, const Tensor& counter,
                            nn::ResidualNorm* out) {
  if (!usable(x, w) || residual.elem_count() != w.dims()[0] || !residual.is_contiguous() ||
      residual.dtype() != x.dtype() || !norm_weight.is_contiguous() ||
      norm_weight.dtype() != x.dtype() || !counter.defined() || counter.dtype() != DType::U32 ||
      counter.device() != x.device()) {
    return false;
  }
  cuda::GemvArgs a = base_args(cuda::GemvEpilogue::AddNorm, x, w);
  a.residual = ptr_of(residual);
  a.norm_weight = ptr_of(norm_weight);
  a.eps = eps;
  a.counter = static_cast<unsigned*>(ptr_of(counter));
  DType dt = x.dtype();
  if (!cuda::gemv_fits(dt, a)) return false;
  size_t n = w.dims()[0];
  cuda::CudaDevice& dev = device_of(x);
  auto sum = std::make_unique<cuda::CudaStorage>(dev, n, dt);
  auto normed = std::make_unique<cuda::CudaStorage>(dev, n, dt);
  a.sum = sum->data();
  a.normed = normed->data();
  {
    auto locks = wick::detail::read_locks({&x, &w, &residual, &norm_weight});
    std::lock_guard write_counter(counter.impl()->storage->mutex());
    dev.queue().enqueue("project_add_norm_gemv", dt,
                        [&](cudaStream_t s) { cuda::launch_gemv(dt, a, s); });
  }
  out->residual = wick::detail::from_storage(std::move(sum), residual.shape());
  out->normed = wick::detail::from_storage(std::move(normed), residual.shape());
  return true;
}

}  // namespace wick::models::detail
