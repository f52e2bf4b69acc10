// The CUDA kernel of fused::KvWriteOp (src/fused/kv_write.h; checked by its front end).

#include "cuda/kv_write.h"

#include "cuda/cuda_storage.h"
#include "fused/kv_write.h"
#include "fused_op.h"
#include "tensor_impl.h"

namespace wick::fused {

namespace {

cuda::KvWrite kv_write_of(const Tensor& cache, const Tensor& src) {
  const TensorImpl& ci = *cache.impl();
  const TensorImpl& si = *src.impl();
  cuda::KvWrite w{};
  w.cache = cuda::as_cuda(ci.storage->backend()).data_at(ci.layout.start_offset());
  w.src = cuda::as_cuda(si.storage->backend()).data_at(si.layout.start_offset());
  for (int i = 0; i < 4; ++i) w.src_strides[i] = static_cast<int64_t>(si.layout.strides()[i]);
  return w;
}

}  // namespace

std::optional<TensorList> KvWriteOp::cuda_kernel(const KvWriteOp& op, const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor &k_cache = in[0], &k = in[1], &v_cache = in[2], &v = in[3], &position = in[4];
  cuda::KvWrite kw = kv_write_of(k_cache, k), vw = kv_write_of(v_cache, v);
  const TensorImpl& pi = *position.impl();
  const auto& pos = cuda::as_cuda(pi.storage->backend());
  auto* pos_ptr = static_cast<const uint32_t*>(pos.data_at(pi.layout.start_offset()));
  int64_t dims[4];
  for (int i = 0; i < 4; ++i) dims[i] = static_cast<int64_t>(k.dims()[i]);
  auto max_len = static_cast<int64_t>(k_cache.dims()[2]);
  size_t elem = size_in_bytes(k_cache.dtype());
  auto& dev = cuda::as_cuda(k_cache.impl()->storage->backend()).cuda_device();
  dev.queue().enqueue(op.name(), k_cache.dtype(), [&](cudaStream_t s) {
    cuda::launch_kv_write(elem, kw, vw, dims, max_len, pos_ptr, s);
  });
  return TensorList{};
}

}  // namespace wick::fused
