// The CUDA half of models::detail::write_at_position (checked by the caller).

#include "cuda/kv_write.h"

#include "cuda/cuda_storage.h"
#include "models/kv_write.h"
#include "tensor_impl.h"

namespace wick::models::detail {

void cuda_write_at_position(const Tensor& cache, const Tensor& src, const Tensor& position) {
  const TensorImpl& ci = *cache.impl();
  const TensorImpl& si = *src.impl();
  const TensorImpl& pi = *position.impl();
  auto& dst = cuda::as_cuda(ci.storage->backend());
  const auto& from = cuda::as_cuda(si.storage->backend());
  const auto& pos = cuda::as_cuda(pi.storage->backend());
  int64_t dims[4], strides[4];
  for (int i = 0; i < 4; ++i) {
    dims[i] = static_cast<int64_t>(src.dims()[i]);
    strides[i] = static_cast<int64_t>(si.layout.strides()[i]);
  }
  auto max_len = static_cast<int64_t>(cache.dims()[2]);
  void* cache_ptr = dst.data_at(ci.layout.start_offset());
  const void* src_ptr = from.data_at(si.layout.start_offset());
  auto* pos_ptr = static_cast<const uint32_t*>(pos.data_at(pi.layout.start_offset()));
  size_t elem = size_in_bytes(cache.dtype());
  // Writers of the cache wait for readers of its earlier rows: the storage's own lock order.
  std::lock_guard write(ci.storage->mutex());
  dst.cuda_device().enqueue("kv_write", cache.dtype(), [&](cudaStream_t s) {
    cuda::launch_kv_write(elem, cache_ptr, src_ptr, dims, strides, max_len, pos_ptr, s);
  });
}

}  // namespace wick::models::detail
