// nn::paged_attention and nn::paged_kv_write: checks, then the backend's kernel.

#include "wick/nn/paged_attention.h"

#include "nn/paged_attention_backend.h"
#include "tensor_internal.h"
#include "util.h"
#include "wick/error.h"

namespace wick::nn {

using namespace wick::detail;

namespace {

void check_pools(const char* op, const Tensor& k_pages, const Tensor& v_pages) {
  impl_of(k_pages, op);
  impl_of(v_pages, op);
  if (k_pages.rank() != 4 || v_pages.shape() != k_pages.shape() || k_pages.dims()[1] == 0 ||
      k_pages.dims()[2] == 0) {
    throw ShapeMismatch(str(op, ": pools must be (pages, h_kv, page_size, d), got ",
                            k_pages.shape(), " and ", v_pages.shape()));
  }
  DType d = k_pages.dtype();
  if (d != DType::F32 && d != DType::F16 && d != DType::BF16 && d != DType::F64) {
    throw UnsupportedDType(str(op, ": float dtypes only, got ", d));
  }
  if (v_pages.dtype() != d) {
    throw DTypeMismatch(str(op, ": pools ", k_pages.dtype(), " and ", v_pages.dtype()));
  }
  if (!k_pages.is_contiguous() || !v_pages.is_contiguous()) {
    throw ShapeMismatch(str(op, ": the pools must be contiguous"));
  }
  if (v_pages.device() != k_pages.device()) {
    throw DeviceMismatch(str(op, ": pools on ", k_pages.device(), " and ", v_pages.device()));
  }
}

void check_index(const char* op, const char* name, const Tensor& t, size_t rank,
                 const Device& device) {
  impl_of(t, op);
  if (t.rank() != rank) {
    throw ShapeMismatch(str(op, ": ", name, " must have rank ", rank, ", got ", t.shape()));
  }
  if (t.dtype() != DType::U32) {
    throw DTypeMismatch(str(op, ": ", name, " must be u32, got ", t.dtype()));
  }
  if (t.device() != device) {
    throw DeviceMismatch(str(op, ": ", name, " on ", t.device(), ", pools on ", device));
  }
}

}  // namespace

Tensor paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                       const Tensor& page_table, const Tensor& token_seq, const Tensor& token_pos,
                       double scale) {
  constexpr const char* kOp = "paged_attention";
  check_pools(kOp, k_pages, v_pages);
  impl_of(q, kOp);
  const Device dev = k_pages.device();
  if (q.rank() != 3 || q.dims()[2] != k_pages.dims()[3] || q.dims()[1] == 0 ||
      q.dims()[1] % k_pages.dims()[1] != 0) {
    throw ShapeMismatch(str(kOp, ": q ", q.shape(), " must be (T, h, d) with h a multiple of ",
                            "h_kv, for pools ", k_pages.shape()));
  }
  if (q.dtype() != k_pages.dtype()) {
    throw DTypeMismatch(str(kOp, ": q ", q.dtype(), ", pools ", k_pages.dtype()));
  }
  if (q.device() != dev) throw DeviceMismatch(str(kOp, ": q on ", q.device(), ", pools on ", dev));
  check_index(kOp, "page_table", page_table, 2, dev);
  check_index(kOp, "token_seq", token_seq, 1, dev);
  check_index(kOp, "token_pos", token_pos, 1, dev);
  const size_t t = q.dims()[0];
  if (token_seq.dims()[0] != t || token_pos.dims()[0] != t) {
    throw ShapeMismatch(str(kOp, ": token_seq ", token_seq.shape(), " and token_pos ",
                            token_pos.shape(), " for q ", q.shape()));
  }
  if (t == 0) return Tensor::zeros(q.shape(), q.dtype(), dev);
  if (dev.is_cuda()) {
    return cuda_paged_attention(q.contiguous(), k_pages, v_pages, page_table.contiguous(),
                                token_seq.contiguous(), token_pos.contiguous(), scale);
  }
  return cpu_paged_attention(q.contiguous(), k_pages, v_pages, page_table.contiguous(),
                             token_seq.contiguous(), token_pos.contiguous(), scale);
}

void paged_kv_write(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k, const Tensor& v,
                    const Tensor& slots) {
  constexpr const char* kOp = "paged_kv_write";
  check_pools(kOp, k_pages, v_pages);
  impl_of(k, kOp);
  impl_of(v, kOp);
  const Device dev = k_pages.device();
  if (k.rank() != 3 || v.shape() != k.shape() || k.dims()[1] != k_pages.dims()[1] ||
      k.dims()[2] != k_pages.dims()[3]) {
    throw ShapeMismatch(str(kOp, ": k ", k.shape(), " and v ", v.shape(),
                            " must be (T, h_kv, d) for pools ", k_pages.shape()));
  }
  if (k.dtype() != k_pages.dtype() || v.dtype() != k_pages.dtype()) {
    throw DTypeMismatch(
        str(kOp, ": k ", k.dtype(), ", v ", v.dtype(), ", pools ", k_pages.dtype()));
  }
  if (k.device() != dev || v.device() != dev) {
    throw DeviceMismatch(
        str(kOp, ": k on ", k.device(), ", v on ", v.device(), ", pools on ", dev));
  }
  check_index(kOp, "slots", slots, 1, dev);
  if (slots.dims()[0] != k.dims()[0]) {
    throw ShapeMismatch(str(kOp, ": slots ", slots.shape(), " for k ", k.shape()));
  }
  if (k.dims()[0] == 0) return;
  if (dev.is_cuda()) {
    cuda_paged_kv_write(k_pages, v_pages, k.contiguous(), v.contiguous(), slots.contiguous());
  } else {
    cpu_paged_kv_write(k_pages, v_pages, k.contiguous(), v.contiguous(), slots.contiguous());
  }
}

}  // namespace wick::nn
