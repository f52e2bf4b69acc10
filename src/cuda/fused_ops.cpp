// The CUDA kernels of the fused ops (src/fused/): operands to launcher arguments (fused.cu,
// rope.cu, attention*.cu), then one enqueue per op.

#include <vector>

#include "cuda/cuda_storage.h"
#include "cuda/fused_kernels.h"
#include "cuda/quantized.h"
#include "fused/attention.h"
#include "fused/norm.h"
#include "fused/quantized.h"
#include "fused/rope.h"
#include "fused_op.h"
#include "settings.h"
#include "tensor_internal.h"
#include "util.h"

namespace wick::cuda {

namespace {

const void* ptr_of(const Tensor& t) {
  return as_cuda(detail::backend_of(t)).data_at(t.layout().start_offset());
}

void strides3(const Layout& l, int64_t out[3]) {
  for (int i = 0; i < 3; ++i) out[i] = static_cast<int64_t>(l.strides()[i]);
}

}  // namespace

}  // namespace wick::cuda

namespace wick::fused {

namespace {

// A fresh row-major output of `in[0]`'s element count and dtype on its device.
std::unique_ptr<cuda::CudaStorage> output_like(const Tensor& t) {
  return std::make_unique<cuda::CudaStorage>(cuda::as_cuda(detail::backend_of(t)).cuda_device(),
                                             t.elem_count(), t.dtype());
}

// The most score bytes the f32 composition (the fallback) may hold at once.
constexpr size_t kComposedScoreBytes = size_t{1} << 30;

}  // namespace

std::optional<TensorList> AttentionOp::cuda_kernel(const AttentionOp& op, const TensorList& in) {
  // The CUDA kernels have no window or soft-cap yet: the composition (fallback) runs those.
  if (op.window > 0 || op.softcap > 0) return std::nullopt;
  auto locks = wick::detail::lock_inputs(op, in);
  const Layout& ql = in[0].layout();
  const Layout& kl = in[1].layout();
  size_t n = ql.elem_count();
  // f32 has no tensor-core kernel (TF32 would break f32 accuracy): when the scores fit a bounded
  // temporary, cuBLAS's f32 GEMMs around one softmax pass (the fallback) beat the kernel's
  // CUDA-core path (docs/perf/prefill-attention.md). Decode-length queries keep the kernel.
  size_t scores = ql.dims()[0] * ql.dims()[1] * ql.dims()[2] * kl.dims()[2];
  if (in[0].dtype() == DType::F32 && ql.dims()[2] >= 16 && kl.dims()[2] > 0 &&
      ql.dims()[1] == kl.dims()[1] && scores * sizeof(float) <= kComposedScoreBytes) {
    return std::nullopt;
  }
  cuda::CudaDevice& dev = cuda::as_cuda(detail::backend_of(in[0])).cuda_device();
  DType dtype = in[0].dtype();
  auto out = std::make_unique<cuda::CudaStorage>(dev, n, dtype);
  if (n > 0) {
    cuda::AttentionArgs a;
    a.q = cuda::ptr_of(in[0]);
    a.k = cuda::ptr_of(in[1]);
    a.v = cuda::ptr_of(in[2]);
    a.out = out->data();
    cuda::strides3(ql, a.q_strides);
    cuda::strides3(kl, a.k_strides);
    cuda::strides3(in[2].layout(), a.v_strides);
    if (in.size() > 3 && in[3].defined()) {
      a.mask = cuda::ptr_of(in[3]);
      for (int i = 0; i < 4; ++i)
        a.mask_strides[i] = static_cast<int64_t>(in[3].layout().strides()[i]);
    }
    a.b = static_cast<int>(ql.dims()[0]);
    a.h = static_cast<int>(ql.dims()[1]);
    a.s = static_cast<int>(ql.dims()[2]);
    a.d = static_cast<int>(ql.dims()[3]);
    a.h_kv = static_cast<int>(kl.dims()[1]);
    a.s_kv = static_cast<int>(kl.dims()[2]);
    a.scale = static_cast<float>(op.scale);
    a.causal = op.causal;
    cuda::TempBuffers temps(dev);
    double work = 4.0 * a.b * a.h * a.s * double(a.s_kv) * a.d;
    dev.queue().enqueue(
        op.name(), dtype,
        [&](cudaStream_t s) { cuda::launch_attention(dtype, a, temps.alloc(), s); }, work);
  }
  return TensorList{detail::from_storage(std::move(out), in[0].shape())};
}

std::optional<TensorList> NormOp::cuda_kernel(const NormOp& op, const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor& x = in[0];
  auto out = output_like(x);
  size_t n = x.elem_count();
  if (n > 0) {
    size_t cols = x.dims().back();
    const void* bias = !op.rms && in.size() > 2 && in[2].defined() ? cuda::ptr_of(in[2]) : nullptr;
    DType dtype = x.dtype();
    const bool f32_weight = in[1].dtype() != dtype;  // rms_norm's f32 weight of an f16/bf16 x
    out->cuda_device().queue().enqueue(op.name(), dtype, [&](cudaStream_t s) {
      if (f32_weight) {
        cuda::launch_rms_norm_f32_weight(dtype, cuda::ptr_of(x),
                                         static_cast<const float*>(cuda::ptr_of(in[1])),
                                         out->data(), n / cols, cols, op.eps, s);
      } else {
        cuda::launch_norm(dtype, op.rms, cuda::ptr_of(x), cuda::ptr_of(in[1]), bias, out->data(),
                          n / cols, cols, op.eps, s);
      }
    });
  }
  return TensorList{detail::from_storage(std::move(out), x.shape())};
}

std::optional<TensorList> RopeOp::cuda_kernel(const RopeOp& op, const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor& x = in[0];
  auto out = output_like(x);
  if (x.elem_count() > 0) {
    const Layout& xl = x.layout();
    int64_t strides[3];
    cuda::strides3(xl, strides);
    size_t dims[4] = {xl.dims()[0], xl.dims()[1], xl.dims()[2], xl.dims()[3]};
    DType dtype = x.dtype();
    out->cuda_device().queue().enqueue(op.name(), dtype, [&](cudaStream_t s) {
      cuda::launch_rope(dtype, op.interleaved, cuda::ptr_of(x), strides, dims, cuda::ptr_of(in[1]),
                        cuda::ptr_of(in[2]), out->data(), s);
    });
  }
  return TensorList{detail::from_storage(std::move(out), x.shape())};
}

std::optional<TensorList> QMatmulOp::cuda_kernel(const QMatmulOp& op, const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor &raw = in[0], &x = in[1];
  const size_t m = x.dims()[0];
  // Prefill: the fallback dequantises once, then the matmul; under batch invariance the kernel
  // takes every row count, so that a row's bits never depend on how many rows came with it.
  if (m > cuda::kQmatmulMaxRows && !settings::batch_invariant()) return std::nullopt;
  return TensorList{detail::from_storage(
      cuda::qmatmul(op.type, detail::backend_of(raw), raw.layout().start_offset(), op.n, op.k,
                    detail::backend_of(x), x.layout().start_offset(), m, x.dtype()),
      Shape{m, op.n})};
}

std::optional<TensorList> DequantizeOp::cuda_kernel(const DequantizeOp& op, const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  if (in[0].layout().start_offset() != 0) return std::nullopt;
  return TensorList{detail::from_storage(cuda::dequantize(op.type, detail::backend_of(in[0]), op.n),
                                         Shape{op.n})};
}

}  // namespace wick::fused
