// The KV-cache writes and the position-bounded attention of a decode step: checks, then their
// CustomOps (src/fused/kv_write.h), whose fallbacks are defined here.

#include "nn/kv_write.h"

#include "fused/kv_write.h"
#include "fused/norm.h"
#include "util.h"
#include "wick/error.h"
#include "wick/nn/paged_attention.h"

namespace wick::nn::detail {

namespace {

void check_pair(const Tensor& cache, const Tensor& src, const Tensor& position) {
  if (cache.rank() != 4 || src.rank() != 4 || src.dims()[0] != cache.dims()[0] ||
      src.dims()[1] != cache.dims()[1] || src.dims()[3] != cache.dims()[3] ||
      src.dims()[2] > cache.dims()[2] || !cache.is_contiguous()) {
    throw ShapeMismatch(str("kv write: cache ", cache.shape(), " (row-major) and rows ",
                            src.shape(), " do not match"));
  }
  if (src.dtype() != cache.dtype()) {
    throw DTypeMismatch(str("kv write: cache ", cache.dtype(), ", rows ", src.dtype()));
  }
  if (position.elem_count() != 1 || position.dtype() != DType::U32) {
    throw DTypeMismatch(
        str("kv write: position must be one u32, got ", position.shape(), " ", position.dtype()));
  }
  if (src.device() != cache.device() || position.device() != cache.device()) {
    throw DeviceMismatch(str("kv write: cache on ", cache.device(), ", rows on ", src.device(),
                             ", position on ", position.device()));
  }
}

}  // namespace

Tensor project_qkv(const Tensor& in, const QLinear& w, const Tensor& bias, Tensor* bias_left) {
  *bias_left = Tensor();
  if (!bias.defined() || in.dtype() == DType::F32 || w.quantized()) {
    *bias_left = bias;
    return w.forward(in);
  }
  size_t b = in.dims()[0], s = in.dims()[1], n = w.dense().dims()[0];
  return in.reshape({b * s, in.dims()[2]})
      .to_dtype(DType::F32)
      .matmul(w.dense().to_dtype(DType::F32).t())
      .broadcast_add(bias.to_dtype(DType::F32))
      .to_dtype(in.dtype())
      .reshape({b, s, n});
}

Tensor position_mask(const models::KvCache& cache, const Tensor& position, size_t len,
                     size_t window) {
  const Tensor rows = cache.positions().narrow(0, 0, len);
  const Tensor at = position.reshape({1}).broadcast_as({len});
  const Tensor hidden = cache.mask_fill().narrow(0, 0, 1),
               shown = cache.mask_fill().narrow(0, 1, 1);
  Tensor mask = rows.gt(at).where_cond(hidden, shown);
  // Keys j with j + window > position are the window's.
  if (window > 0)
    mask = rows.affine(1, static_cast<double>(window)).gt(at).where_cond(mask, hidden);
  return mask.reshape({1, len});
}

void write_at_position(const Tensor& k_cache, const Tensor& k, const Tensor& v_cache,
                       const Tensor& v, const Tensor& position) {
  check_pair(k_cache, k, position);
  check_pair(v_cache, v, position);
  if (k.shape() != v.shape() || k_cache.shape() != v_cache.shape() || k.dtype() != v.dtype() ||
      k.device() != v.device()) {
    throw ShapeMismatch(str("kv write: keys ", k.shape(), " ", k.dtype(), " into ", k_cache.shape(),
                            ", values ", v.shape(), " ", v.dtype(), " into ", v_cache.shape()));
  }
  wick::apply(fused::KvWriteOp(), {k_cache, k, v_cache, v, position});
}

namespace {

// The checks rope_write_at_position and rope_write_paged share: qkv's last dim of h + 2 h_kv
// heads of the caches' width, tables of at most half that width (partial rotary: the first
// 2 x width dims of each head rotate), bias and norms, dtypes and devices.
void check_rope_write(const char* op, const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                      const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                      const Tensor& v_cache, const HeadNorms& norms) {
  const size_t heads = h + 2 * h_kv;
  const size_t d = k_cache.rank() == 4 ? k_cache.dims()[3] : 0;
  auto bad_norm = [&](const Tensor& w) { return w.defined() && w.shape() != Shape{d}; };
  if (qkv.rank() == 0 || k_cache.rank() != 4 || qkv.dims().back() != heads * d ||
      k_cache.dims()[1] != h_kv || cos.rank() != 2 || cos.shape() != sin.shape() ||
      cos.dims()[1] == 0 || cos.dims()[1] * 2 > d ||
      (bias.defined() && bias.shape() != Shape{heads * d}) || bad_norm(norms.q) ||
      bad_norm(norms.k)) {
    throw ShapeMismatch(str(op, ": qkv ", qkv.shape(), " for ", h, " + 2 x ", h_kv,
                            " heads, cache ", k_cache.shape(), ", tables ", cos.shape(), " ",
                            sin.shape(), bias.defined() ? str(", bias ", bias.shape()) : "",
                            norms.q.defined() ? str(", q norm ", norms.q.shape()) : "",
                            norms.k.defined() ? str(", k norm ", norms.k.shape()) : ""));
  }
  if (k_cache.shape() != v_cache.shape() || !k_cache.is_contiguous() || !v_cache.is_contiguous()) {
    throw ShapeMismatch(str(op, ": caches ", k_cache.shape(), " ", v_cache.shape(),
                            " must be row-major and of one shape"));
  }
  for (const Tensor* t : {&cos, &sin, &bias, &k_cache, &v_cache}) {
    if (t->defined() && t->dtype() != qkv.dtype()) {
      throw DTypeMismatch(
          str(op, ": qkv ", qkv.dtype(), ", an input (tables, bias or caches) ", t->dtype()));
    }
  }
  // The head norms: one dtype, qkv's or (for f16/bf16 qkv) f32.
  auto norm_dtype_ok = [&](const Tensor& w) {
    return !w.defined() || fused::rms_norm_weight_fits(qkv.dtype(), w.dtype());
  };
  if (!norm_dtype_ok(norms.q) || !norm_dtype_ok(norms.k) ||
      (norms.q.defined() && norms.k.defined() && norms.q.dtype() != norms.k.dtype())) {
    throw DTypeMismatch(str(op, ": head norms ",
                            norms.q.defined() ? dtype_name(norms.q.dtype()) : "none", " and ",
                            norms.k.defined() ? dtype_name(norms.k.dtype()) : "none", " for qkv ",
                            qkv.dtype(), " (one dtype: qkv's, or f32 for f16/bf16)"));
  }
  for (const Tensor* t : {&qkv, &cos, &sin, &bias, &norms.q, &norms.k, &v_cache}) {
    if (t->defined() && t->device() != k_cache.device()) {
      throw DeviceMismatch(str(op, ": cache on ", k_cache.device(), ", an input on ", t->device()));
    }
  }
}

Tensor contiguous_or_none(const Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

}  // namespace

Tensor rope_write_at_position(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                              const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& position,
                              const HeadNorms& norms) {
  check_rope_write("rope write", qkv, bias, h, h_kv, cos, sin, k_cache, v_cache, norms);
  if (qkv.rank() != 3 || cos.dims()[0] < k_cache.dims()[2] || k_cache.dims()[0] != qkv.dims()[0] ||
      qkv.dims()[1] > k_cache.dims()[2]) {
    throw ShapeMismatch(str("rope write: qkv ", qkv.shape(), " (b, s, n) for caches ",
                            k_cache.shape(), " and tables ", cos.shape()));
  }
  if (position.elem_count() != 1 || position.dtype() != DType::U32) {
    throw DTypeMismatch(
        str("rope write: position must be one u32, got ", position.shape(), " ", position.dtype()));
  }
  if (position.device() != k_cache.device()) {
    throw DeviceMismatch(
        str("rope write: cache on ", k_cache.device(), ", position on ", position.device()));
  }
  // contiguous() hands back the tensor itself when it already is (no copy in the step).
  return wick::apply(
      fused::RopeWriteOp(h, h_kv, norms.eps),
      {qkv.contiguous(), contiguous_or_none(bias), cos.contiguous(), sin.contiguous(), k_cache,
       v_cache, position, Tensor(), contiguous_or_none(norms.q), contiguous_or_none(norms.k)})[0];
}

Tensor rope_write_paged(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                        const Tensor& cos, const Tensor& sin, const Tensor& k_pages,
                        const Tensor& v_pages, const Tensor& positions, const Tensor& slots,
                        const HeadNorms& norms) {
  check_rope_write("rope write paged", qkv, bias, h, h_kv, cos, sin, k_pages, v_pages, norms);
  const size_t t = qkv.rank() == 2 ? qkv.dims()[0] : 0;
  if (t == 0 || positions.shape() != Shape{t} || slots.shape() != Shape{t}) {
    throw ShapeMismatch(str("rope write paged: qkv ", qkv.shape(), " (T, n), positions ",
                            positions.shape(), " and slots ", slots.shape(), " (T)"));
  }
  if (positions.dtype() != DType::U32 || slots.dtype() != DType::U32) {
    throw DTypeMismatch(str("rope write paged: positions ", positions.dtype(), " and slots ",
                            slots.dtype(), " must be u32"));
  }
  if (positions.device() != k_pages.device() || slots.device() != k_pages.device()) {
    throw DeviceMismatch(str("rope write paged: pools on ", k_pages.device(), ", positions on ",
                             positions.device(), ", slots on ", slots.device()));
  }
  return wick::apply(
      fused::RopeWriteOp(h, h_kv, norms.eps),
      {qkv.contiguous(), contiguous_or_none(bias), cos.contiguous(), sin.contiguous(), k_pages,
       v_pages, positions.contiguous(), slots.contiguous(), contiguous_or_none(norms.q),
       contiguous_or_none(norms.k)})[0];
}

bool attend_to_position(const Tensor& q, const Tensor& keys, const Tensor& values,
                        const Tensor& position, Tensor* out, bool launch_next_early) {
  if (q.rank() != 4 || keys.rank() != 4 || values.shape() != keys.shape() || q.dims()[2] != 1 ||
      q.dims()[0] != keys.dims()[0] || q.dims()[3] != keys.dims()[3] || keys.dims()[1] == 0 ||
      q.dims()[1] % keys.dims()[1] != 0 || keys.dims()[2] == 0) {
    throw ShapeMismatch(str("attend to position: q ", q.shape(), ", keys ", keys.shape(),
                            ", values ", values.shape()));
  }
  if (position.elem_count() != 1 || position.dtype() != DType::U32) {
    throw DTypeMismatch(str("attend to position: position must be one u32, got ", position.shape(),
                            " ", position.dtype()));
  }
  if (keys.dtype() != q.dtype() || values.dtype() != q.dtype()) {
    throw DTypeMismatch(str("attend to position: q ", q.dtype(), ", keys ", keys.dtype(),
                            ", values ", values.dtype()));
  }
  for (const Tensor* t : {&keys, &values, &position}) {
    if (t->device() != q.device()) {
      throw DeviceMismatch(
          str("attend to position: q on ", q.device(), ", an input on ", t->device()));
    }
  }
  TensorList r =
      wick::apply(fused::AttendToPositionOp(launch_next_early), {q, keys, values, position});
  if (r.empty()) return false;
  *out = r[0];
  return true;
}

}  // namespace wick::nn::detail

namespace wick::fused {

TensorList KvWriteOp::fallback(const TensorList& in) const {
  const Tensor &k_cache = in[0], &k = in[1], &v_cache = in[2], &v = in[3];
  size_t p = in[4].flatten_all().to_vec1<uint32_t>()[0];
  size_t s = k.dims()[2];
  if (p + s > k_cache.dims()[2]) {
    throw IndexOutOfRange(
        str("kv write: position ", p, " + ", s, " rows past the cache's ", k_cache.dims()[2]));
  }
  k_cache.narrow(2, p, s).assign(k);
  v_cache.narrow(2, p, s).assign(v);
  return {};
}

TensorList RopeWriteOp::fallback(const TensorList& in) const {
  const Tensor &qkv = in[0], &bias = in[1], &cos = in[2], &sin = in[3];
  const Tensor &k_cache = in[4], &v_cache = in[5], &position = in[6], &slots = in[7];
  const Tensor &q_norm = in[8], &k_norm = in[9];
  const size_t d = k_cache.dims()[3];
  const bool paged = slots.defined();
  // (b, s, heads, d): a paged step's T tokens are one row of s = T.
  const size_t b = paged ? 1 : qkv.dims()[0], s = paged ? qkv.dims()[0] : qkv.dims()[1];
  Tensor x = (bias.defined() ? qkv.broadcast_add(bias) : qkv).reshape({b, s, h + 2 * h_kv, d});
  Tensor q = x.narrow(2, 0, h), k = x.narrow(2, h, h_kv), v = x.narrow(2, h + h_kv, h_kv);
  if (q_norm.defined()) q = q.rms_norm(q_norm, eps);  // an f32 weight: in f32 (HeadNorms)
  if (k_norm.defined()) k = k.rms_norm(k_norm, eps);
  Tensor c, sn;  // (s, rotated / 2): each row's table rows
  if (paged) {
    c = cos.index_select(position, 0);
    sn = sin.index_select(position, 0);
  } else {
    size_t p = position.flatten_all().to_vec1<uint32_t>()[0];
    if (p + s > cos.dims()[0]) {
      throw IndexOutOfRange(
          str("rope write: position ", p, " + ", s, " rows past the tables' ", cos.dims()[0]));
    }
    c = cos.narrow(0, p, s);
    sn = sin.narrow(0, p, s);
  }
  // The first 2 x the tables' width dims of each head rotate, the others pass through.
  const size_t rotated = c.dims()[1] * 2;
  auto rope = [&](const Tensor& x) {  // (b, s, heads, d) -> (b, heads, s, d)
    Tensor t = x.transpose(1, 2);
    if (rotated == d) return t.rope(c, sn);
    return Tensor::cat({t.narrow(3, 0, rotated).rope(c, sn), t.narrow(3, rotated, d - rotated)}, 3);
  };
  q = rope(q);
  k = rope(k);
  if (paged) {
    nn::paged_kv_write(k_cache, v_cache, k.squeeze(0).transpose(0, 1), v.squeeze(0), slots);
    return {q.squeeze(0).transpose(0, 1).contiguous()};
  }
  nn::detail::write_at_position(k_cache, k, v_cache, v.transpose(1, 2), position);
  return {q.contiguous()};
}

}  // namespace wick::fused
