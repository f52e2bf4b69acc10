// The CUDA halves of nn::paged_attention and nn::paged_kv_write (checked by their callers).

#include "cuda/paged_attention.h"

#include <cmath>
#include <memory>
#include <mutex>

#include "cuda/cuda_storage.h"
#include "fused/paged_attention.h"
#include "tensor_internal.h"

namespace wick::detail {

namespace {

const void* ptr_of(const Tensor& t) {
  const TensorImpl& i = *t.impl();
  return cuda::as_cuda(i.storage->backend()).data_at(i.layout.start_offset());
}

void* mutable_ptr_of(const Tensor& t) {
  return const_cast<void*>(ptr_of(t));
}

cuda::CudaDevice& device_of(const Tensor& t) {
  return cuda::as_cuda(t.impl()->storage->backend()).cuda_device();
}

Tensor cuda_paged_attention(const fused::PagedAttentionOp& op, const Tensor& q,
                            const Tensor& k_pages, const Tensor& v_pages, const Tensor& page_table,
                            const Tensor& token_seq, const Tensor& token_pos) {
  const size_t tokens = q.dims()[0], h = q.dims()[1], d = q.dims()[2];
  cuda::CudaDevice& dev = device_of(q);
  auto out = std::make_unique<cuda::CudaStorage>(dev, tokens * h * d, q.dtype());
  cuda::PagedAttentionArgs a{};
  a.q = ptr_of(q);
  a.k = ptr_of(k_pages);
  a.v = ptr_of(v_pages);
  a.out = out->data();
  a.table = static_cast<const uint32_t*>(ptr_of(page_table));
  a.seq = static_cast<const uint32_t*>(ptr_of(token_seq));
  a.pos = static_cast<const uint32_t*>(ptr_of(token_pos));
  a.tokens = static_cast<int64_t>(tokens);
  a.h = static_cast<int64_t>(h);
  a.h_kv = static_cast<int64_t>(k_pages.dims()[1]);
  a.d = static_cast<int64_t>(d);
  a.pages = static_cast<int64_t>(k_pages.dims()[0]);
  a.page_size = static_cast<int64_t>(k_pages.dims()[2]);
  a.n_seqs = static_cast<int64_t>(page_table.dims()[0]);
  a.width = static_cast<int64_t>(page_table.dims()[1]);
  a.window = static_cast<int64_t>(op.window);
  a.scale = static_cast<float>(op.scale);
  a.softcap = static_cast<float>(op.softcap);
  a.launch_next_early = op.launch_next_early;
  a.indices_ready = op.indices_ready;
  auto locks = read_locks({&q, &k_pages, &v_pages, &page_table, &token_seq, &token_pos});
  cuda::TempBuffers temps(dev);
  dev.queue().enqueue("paged_attention", q.dtype(), [&](cudaStream_t s) {
    cuda::launch_paged_attention(q.dtype(), a, temps.alloc(), s);
  });
  return from_storage(std::move(out), q.shape());
}

void cuda_paged_kv_write(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k,
                         const Tensor& v, const Tensor& slots) {
  cuda::CudaDevice& dev = device_of(k_pages);
  const size_t elem = size_in_bytes(k_pages.dtype());
  StorageLocks locks(
      {k.impl()->storage.get(), v.impl()->storage.get(), slots.impl()->storage.get()},
      {k_pages.impl()->storage.get(), v_pages.impl()->storage.get()});
  dev.queue().enqueue("paged_kv_write", k_pages.dtype(), [&](cudaStream_t s) {
    cuda::launch_paged_kv_write(
        elem, mutable_ptr_of(k_pages), mutable_ptr_of(v_pages), ptr_of(k), ptr_of(v),
        static_cast<const uint32_t*>(ptr_of(slots)), static_cast<int64_t>(k.dims()[0]),
        static_cast<int64_t>(k.dims()[1]), static_cast<int64_t>(k.dims()[2]),
        static_cast<int64_t>(k_pages.dims()[0]), static_cast<int64_t>(k_pages.dims()[2]), s);
  });
  k_pages.impl()->storage->bump_version();
  v_pages.impl()->storage->bump_version();
}

}  // namespace

}  // namespace wick::detail

namespace wick::fused {

std::optional<TensorList> PagedAttentionOp::cuda_kernel(const PagedAttentionOp& op,
                                                        const TensorList& in) {
  return TensorList{detail::cuda_paged_attention(op, in[0], in[1], in[2], in[3], in[4], in[5])};
}

std::optional<TensorList> PagedKvWriteOp::cuda_kernel(const PagedKvWriteOp&, const TensorList& in) {
  detail::cuda_paged_kv_write(in[0], in[1], in[2], in[3], in[4]);
  return TensorList{};
}

}  // namespace wick::fused
