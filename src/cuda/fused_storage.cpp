// CudaStorage::fused: operands to launcher arguments, then one enqueue per op.

#include <vector>

#include "cuda/cuda_storage.h"
#include "cuda/fused_kernels.h"
#include "util.h"

namespace wick::cuda {

namespace {

const void* ptr_of(const FusedOperand& op) {
  return as_cuda(*op.storage).data_at(op.layout.start_offset());
}

void strides3(const Layout& l, int64_t out[3]) {
  for (int i = 0; i < 3; ++i) out[i] = static_cast<int64_t>(l.strides()[i]);
}

}  // namespace

StoragePtr CudaStorage::fused(const FusedParams& params,
                              const std::vector<FusedOperand>& operands) const {
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
    case FusedKind::Attention: {
      AttentionArgs a;
      a.q = ptr_of(operands[0]);
      a.k = ptr_of(operands[1]);
      a.v = ptr_of(operands[2]);
      a.out = out->data();
      strides3(operands[0].layout, a.q_strides);
      strides3(operands[1].layout, a.k_strides);
      strides3(operands[2].layout, a.v_strides);
      if (operands.size() > 3 && operands[3].storage) {
        a.mask = ptr_of(operands[3]);
        for (int i = 0; i < 4; ++i) {
          a.mask_strides[i] = static_cast<int64_t>(operands[3].layout.strides()[i]);
        }
      }
      a.b = static_cast<int>(xl.dims()[0]);
      a.h = static_cast<int>(xl.dims()[1]);
      a.s = static_cast<int>(xl.dims()[2]);
      a.d = static_cast<int>(xl.dims()[3]);
      a.h_kv = static_cast<int>(operands[1].layout.dims()[1]);
      a.s_kv = static_cast<int>(operands[1].layout.dims()[2]);
      a.scale = static_cast<float>(params.scale);
      a.causal = params.causal;
      TempBuffers temps(*dev_);
      double work = 4.0 * a.b * a.h * a.s * double(a.s_kv) * a.d;
      dev_->queue().enqueue(
          name, dtype_, [&](cudaStream_t s) { launch_attention(dtype_, a, temps.alloc(), s); },
          work);
      return out;
    }
  }
  throw BackendError(str("cuda fused: unknown op ", name));
}

}  // namespace wick::cuda
