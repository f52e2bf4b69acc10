// CudaStorage::fused: operands to launcher arguments, then one enqueue per op.

#include <vector>

#include "cuda/cuda_storage.h"
#include "cuda/fused_kernels.h"
#include "fused/attention.h"
#include "tensor_internal.h"
#include "util.h"

namespace wick::cuda {

namespace {

const void* ptr_of(const KernelOperand& op) {
  return as_cuda(*op.storage).data_at(op.layout.start_offset());
}

const void* ptr_of(const Tensor& t) {
  return as_cuda(detail::backend_of(t)).data_at(t.layout().start_offset());
}

void strides3(const Layout& l, int64_t out[3]) {
  for (int i = 0; i < 3; ++i) out[i] = static_cast<int64_t>(l.strides()[i]);
}

}  // namespace

StoragePtr CudaStorage::fused(const FusedParams& params,
                              const std::vector<KernelOperand>& operands) const {
  const Layout& xl = operands[0].layout;
  size_t n = xl.elem_count();
  auto out = std::make_unique<CudaStorage>(*dev_, n, dtype_);
  if (n == 0) return out;
  const char* name = fused_name(params.kind);
  switch (params.kind) {
    case FusedKind::LayerNorm:
    case FusedKind::RmsNorm: {
      bool rms = params.kind == FusedKind::RmsNorm;
      size_t cols = xl.dims().back();
      const void* bias =
          !rms && operands.size() > 2 && operands[2].storage ? ptr_of(operands[2]) : nullptr;
      dev_->queue().enqueue(name, dtype_, [&](cudaStream_t s) {
        launch_norm(dtype_, rms, ptr_of(operands[0]), ptr_of(operands[1]), bias, out->data(),
                    n / cols, cols, params.eps, s);
      });
      return out;
    }
    case FusedKind::Rope:
    case FusedKind::RopeInterleaved: {
      int64_t strides[3];
      strides3(xl, strides);
      size_t dims[4] = {xl.dims()[0], xl.dims()[1], xl.dims()[2], xl.dims()[3]};
      dev_->queue().enqueue(name, dtype_, [&](cudaStream_t s) {
        launch_rope(dtype_, params.kind == FusedKind::RopeInterleaved, ptr_of(operands[0]), strides,
                    dims, ptr_of(operands[1]), ptr_of(operands[2]), out->data(), s);
      });
      return out;
    }
  }
  throw BackendError(str("cuda fused: unknown op ", name));
}

}  // namespace wick::cuda

namespace wick::fused {

namespace {

// The most score bytes the f32 composition (the fallback) may hold at once.
constexpr size_t kComposedScoreBytes = size_t{1} << 30;

}  // namespace

std::optional<TensorList> AttentionOp::cuda_kernel(const AttentionOp& op, const TensorList& in) {
  // The CUDA kernels have no window or soft-cap yet: the composition (fallback) runs those.
  if (op.window > 0 || op.softcap > 0) return std::nullopt;
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

}  // namespace wick::fused
