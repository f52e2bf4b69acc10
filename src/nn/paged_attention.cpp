// nn::paged_attention and nn::paged_kv_write: checks, then the CustomOps of
// src/fused/paged_attention.h, whose composed fallbacks are here.

#include "wick/nn/paged_attention.h"

#include <cmath>

#include "fused/paged_attention.h"
#include "nn/kv_write.h"
#include "tensor_internal.h"
#include "util.h"
#include "wick/error.h"
#include "wick/nn/attention.h"

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
                       double scale, size_t window, double softcap) {
  return detail::paged_attention(q, k_pages, v_pages, page_table, token_seq, token_pos, scale,
                                 window, softcap, false, false);
}

Tensor detail::paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                               const Tensor& page_table, const Tensor& token_seq,
                               const Tensor& token_pos, double scale, size_t window, double softcap,
                               bool launch_next_early, bool indices_ready) {
  constexpr const char* kOp = "paged_attention";
  check_pools(kOp, k_pages, v_pages);
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    throw Error(str(kOp, ": softcap must be finite and >= 0, got ", softcap));
  }
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
  const double resolved =
      scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(k_pages.dims()[3]));
  return wick::apply(
      fused::PagedAttentionOp(resolved, window, softcap, launch_next_early, indices_ready),
      {q.contiguous(), k_pages, v_pages, page_table.contiguous(), token_seq.contiguous(),
       token_pos.contiguous()})[0];
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
  wick::apply(fused::PagedKvWriteOp(),
              {k_pages, v_pages, k.contiguous(), v.contiguous(), slots.contiguous()});
}

}  // namespace wick::nn

namespace wick::fused {

// Each token's keys (those of its window) gathered from its pages, then plain attention over them.
TensorList PagedAttentionOp::fallback(const TensorList& in) const {
  const Tensor &q = in[0], &k_pages = in[1], &v_pages = in[2];
  const size_t tokens = q.dims()[0], h = q.dims()[1], d = q.dims()[2];
  const size_t pages = k_pages.dims()[0], h_kv = k_pages.dims()[1], ps = k_pages.dims()[2];
  const size_t n_seqs = in[3].dims()[0], width = in[3].dims()[1];
  const std::vector<uint32_t> table = in[3].flatten_all().to_vec1<uint32_t>();
  const std::vector<uint32_t> seq = in[4].to_vec1<uint32_t>(), pos = in[5].to_vec1<uint32_t>();
  std::vector<Tensor> rows;
  for (size_t t = 0; t < tokens; ++t) {
    const size_t n = size_t{pos[t]} + 1, used = (n + ps - 1) / ps, first = first_key(pos[t]);
    if (seq[t] >= n_seqs || used > width) {
      throw IndexOutOfRange(str("paged_attention: token ", t, " at position ", pos[t],
                                " of sequence ", seq[t], " is outside the page table ",
                                in[3].shape(), " of pages of ", ps));
    }
    std::vector<uint32_t> ids(table.begin() + seq[t] * width,
                              table.begin() + seq[t] * width + used);
    for (uint32_t p : ids) {
      if (p >= pages) {
        throw IndexOutOfRange(str("paged_attention: page ", p, " of sequence ", seq[t],
                                  " is outside the pool of ", pages));
      }
    }
    Tensor idx = Tensor::from_vec(ids, {used}, q.device());
    auto gather = [&](const Tensor& pool) {
      return pool.index_select(idx, 0)
          .transpose(0, 1)
          .reshape({1, h_kv, used * ps, d})
          .narrow(2, first, n - first);
    };
    nn::AttentionOptions o;
    o.scale = scale;
    o.softcap = softcap;
    rows.push_back(nn::scaled_dot_product_attention(q.narrow(0, t, 1).reshape({1, h, 1, d}),
                                                    gather(k_pages), gather(v_pages), o)
                       .reshape({1, h, d}));
  }
  return {Tensor::cat(rows, 0)};
}

TensorList PagedKvWriteOp::fallback(const TensorList& in) const {
  const Tensor &k_pages = in[0], &v_pages = in[1], &k = in[2], &v = in[3];
  const size_t tokens = k.dims()[0], h_kv = k.dims()[1], d = k.dims()[2];
  const size_t pages = k_pages.dims()[0], ps = k_pages.dims()[2];
  const std::vector<uint32_t> slots = in[4].to_vec1<uint32_t>();
  for (size_t t = 0; t < tokens; ++t) {
    const size_t page = slots[t] / ps, row = slots[t] % ps;
    if (page >= pages) {
      throw IndexOutOfRange(str("paged_kv_write: slot ", slots[t], " of token ", t,
                                " is outside the pool of ", pages, " pages of ", ps));
    }
    k_pages.narrow(0, page, 1).narrow(2, row, 1).assign(k.narrow(0, t, 1).reshape({1, h_kv, 1, d}));
    v_pages.narrow(0, page, 1).narrow(2, row, 1).assign(v.narrow(0, t, 1).reshape({1, h_kv, 1, d}));
  }
  return {};
}

}  // namespace wick::fused
