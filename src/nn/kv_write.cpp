// The KV-cache writes and the position-bounded attention of a decode step: checks, then their
// CustomOps (src/fused/kv_write.h), whose fallbacks are defined here.

#include "nn/kv_write.h"

#include "fused/kv_write.h"
#include "util.h"
#include "wick/error.h"

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

Tensor position_mask(const models::KvCache& cache, const Tensor& position, size_t len) {
  Tensor later = cache.positions().narrow(0, 0, len).gt(position.reshape({1}).broadcast_as({len}));
  return later.where_cond(cache.mask_fill().narrow(0, 0, 1), cache.mask_fill().narrow(0, 1, 1))
      .reshape({1, len});
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

Tensor rope_write_at_position(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                              const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                              const Tensor& v_cache, const Tensor& position) {
  size_t heads = h + 2 * h_kv;
  if (qkv.rank() != 3 || k_cache.rank() != 4 || qkv.dims()[2] != heads * k_cache.dims()[3] ||
      k_cache.dims()[1] != h_kv || cos.rank() != 2 || cos.shape() != sin.shape() ||
      cos.dims()[1] * 2 != k_cache.dims()[3] || cos.dims()[0] < k_cache.dims()[2] ||
      (bias.defined() && bias.shape() != Shape{qkv.dims()[2]})) {
    throw ShapeMismatch(str("rope write: qkv ", qkv.shape(), " for ", h, " + 2 x ", h_kv,
                            " heads, cache ", k_cache.shape(), ", tables ", cos.shape(), " ",
                            sin.shape(), bias.defined() ? str(", bias ", bias.shape()) : ""));
  }
  if (cos.dtype() != qkv.dtype() || sin.dtype() != qkv.dtype() ||
      (bias.defined() && bias.dtype() != qkv.dtype())) {
    throw DTypeMismatch(str("rope write: qkv ", qkv.dtype(), ", tables ", cos.dtype(), " ",
                            sin.dtype(), bias.defined() ? str(", bias ", bias.dtype()) : ""));
  }
  size_t b = qkv.dims()[0], s = qkv.dims()[1];
  if (k_cache.shape() != v_cache.shape() || !k_cache.is_contiguous() || !v_cache.is_contiguous() ||
      k_cache.dims()[0] != b || s > k_cache.dims()[2]) {
    throw ShapeMismatch(str("rope write: caches ", k_cache.shape(), " ", v_cache.shape(),
                            " (row-major) for rows of qkv ", qkv.shape()));
  }
  for (const Tensor* t : {&qkv, &cos, &sin, &v_cache, &position}) {
    if (t->device() != k_cache.device()) {
      throw DeviceMismatch(
          str("rope write: cache on ", k_cache.device(), ", an input on ", t->device()));
    }
  }
  if (bias.defined() && bias.device() != k_cache.device()) {
    throw DeviceMismatch(
        str("rope write: cache on ", k_cache.device(), ", bias on ", bias.device()));
  }
  if (k_cache.dtype() != qkv.dtype() || v_cache.dtype() != qkv.dtype()) {
    throw DTypeMismatch(str("rope write: caches ", k_cache.dtype(), ", qkv ", qkv.dtype()));
  }
  if (position.elem_count() != 1 || position.dtype() != DType::U32) {
    throw DTypeMismatch(
        str("rope write: position must be one u32, got ", position.shape(), " ", position.dtype()));
  }
  // contiguous() hands back the tensor itself when it already is (no copy in the step).
  return wick::apply(fused::RopeWriteOp(h, h_kv),
                     {qkv.contiguous(), bias.defined() ? bias.contiguous() : bias, cos.contiguous(),
                      sin.contiguous(), k_cache, v_cache, position})[0];
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
  const Tensor &k_cache = in[4], &v_cache = in[5], &position = in[6];
  size_t b = qkv.dims()[0], s = qkv.dims()[1], d = k_cache.dims()[3];
  Tensor x = bias.defined() ? qkv.broadcast_add(bias) : qkv;
  Tensor qk_rows = x.narrow(2, 0, (h + h_kv) * d).reshape({b, s, h + h_kv, d}).transpose(1, 2);
  Tensor v = x.narrow(2, (h + h_kv) * d, h_kv * d).reshape({b, s, h_kv, d}).transpose(1, 2);
  size_t p = position.flatten_all().to_vec1<uint32_t>()[0];
  if (p + s > cos.dims()[0]) {
    throw IndexOutOfRange(
        str("rope write: position ", p, " + ", s, " rows past the tables' ", cos.dims()[0]));
  }
  Tensor qk = qk_rows.rope(cos.narrow(0, p, s), sin.narrow(0, p, s));
  nn::detail::write_at_position(k_cache, qk.narrow(1, h, h_kv), v_cache, v, position);
  return {qk.narrow(1, 0, h).contiguous()};
}

}  // namespace wick::fused
