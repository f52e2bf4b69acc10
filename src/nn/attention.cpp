// nn::scaled_dot_product_attention: checks, then fused::AttentionOp (src/fused/attention.h), whose
// fallback and gradient are defined here.

#include "wick/nn/attention.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "fused/attention.h"
#include "fused_op.h"
#include "tensor_internal.h"
#include "wick/custom_op.h"

namespace wick::nn {

using namespace wick::detail;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  impl_of(q, kOp);
  impl_of(k, kOp);
  impl_of(v, kOp);
  if (q.dtype() != DType::F32 && q.dtype() != DType::F16 && q.dtype() != DType::BF16 &&
      q.dtype() != DType::F64) {
    throw UnsupportedDType(str(kOp, ": unsupported dtype ", q.dtype(), " (float dtypes only)"));
  }
  check_same_dtype(kOp, q, k);
  check_same_dtype(kOp, q, v);
  check_same_device(kOp, q, k);
  check_same_device(kOp, q, v);
  if (q.rank() != 4 || k.rank() != 4 || k.shape() != v.shape() || q.dims()[0] != k.dims()[0] ||
      q.dims()[3] != k.dims()[3] || k.dims()[1] == 0 || q.dims()[1] % k.dims()[1] != 0) {
    throw ShapeMismatch(str(kOp, ": expected q (b, h, s, d) and k, v (b, h_kv, s_kv, d) with h a ",
                            "multiple of h_kv, got q ", q.shape(), ", k ", k.shape(), ", v ",
                            v.shape()));
  }
  size_t d = q.dims()[3];
  Shape scores{q.dims()[0], q.dims()[1], q.dims()[2], k.dims()[2]};
  Tensor mask;
  if (options.mask) {
    impl_of(*options.mask, kOp);
    check_same_dtype(kOp, q, *options.mask);
    check_same_device(kOp, q, *options.mask);
    try {
      mask = options.mask->broadcast_as(scores);
    } catch (const ShapeMismatch&) {
      throw ShapeMismatch(
          str(kOp, ": mask ", options.mask->shape(), " does not broadcast to the scores ", scores));
    }
  }
  double scale = options.scale != 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(d));
  if (!(std::isfinite(options.softcap) && options.softcap >= 0)) {
    throw Error(str(kOp, ": softcap ", options.softcap, " must be a non-negative finite number"));
  }
  return std::move(wick::apply(
      fused::AttentionOp(scale, options.causal, options.window, options.softcap),
      {last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v), mask})[0]);
}

}  // namespace wick::nn

namespace wick::fused {

namespace {

// (b, h_kv, n, d) -> (b, h, n, d), each k/v head repeated for its `group` query heads.
Tensor repeat_heads(const Tensor& t, size_t group) {
  if (group == 1) return t;
  size_t b = t.dims()[0], hk = t.dims()[1], n = t.dims()[2], d = t.dims()[3];
  return t.unsqueeze(2).broadcast_as(Shape{b, hk, group, n, d}).reshape(Shape{b, hk * group, n, d});
}

// (b, h, n, d) -> (b, h_kv, n, d), summing the `group` heads of each k/v head.
Tensor sum_heads(const Tensor& t, size_t group) {
  if (group == 1) return t;
  size_t b = t.dims()[0], h = t.dims()[1], n = t.dims()[2], d = t.dims()[3];
  return t.reshape(Shape{b, h / group, group, n, d}).sum({2});
}

// 0 where query i sees key j (j <= i + shift when causal, j > i + shift - window with a window),
// -inf elsewhere: (s, s_kv) on `like`'s device and dtype.
Tensor causal_mask(size_t s, size_t s_kv, bool causal, size_t window, const Tensor& like) {
  std::vector<float> m(s * s_kv);
  long shift = static_cast<long>(s_kv) - static_cast<long>(s);
  for (size_t i = 0; i < s; ++i) {
    long last = static_cast<long>(i) + shift;
    for (size_t j = 0; j < s_kv; ++j) {
      long jj = static_cast<long>(j);
      bool seen = (!causal || jj <= last) && (window == 0 || jj > last - static_cast<long>(window));
      m[i * s_kv + j] = seen ? 0.0f : -std::numeric_limits<float>::infinity();
    }
  }
  return Tensor::from_vec(m, Shape{s, s_kv}, Device::cpu())
      .to_dtype(like.dtype())
      .to_device(like.device());
}

}  // namespace

// The composition, as the CUDA backend runs it for f32 prefill (q scaled before its product).
TensorList AttentionOp::fallback(const TensorList& in) const {
  const Tensor& q = in[0];
  size_t group = q.dims()[1] / in[1].dims()[1];
  Tensor k = repeat_heads(in[1], group), v = repeat_heads(in[2], group);
  Tensor sc = q.affine(scale, 0).matmul(k.t());
  if (softcap > 0) sc = sc.affine(1 / softcap, 0).tanh().affine(softcap, 0);
  if (in.size() > 3 && in[3].defined()) sc = sc.add(in[3]);
  if (causal || window > 0) {
    sc = sc.broadcast_add(causal_mask(q.dims()[2], k.dims()[2], causal, window, q));
  }
  return {sc.softmax_last_dim().matmul(v)};
}

// Recomputes softmax(q k^T * scale + mask) with matmuls; k/v gradients are summed over the query
// heads that share a k/v head. f16/bf16 gradients are computed in f32 and rounded once.
TensorList AttentionOp::backward(const TensorList& in, const TensorList&, const TensorList& grads,
                                 const std::vector<bool>& need) const {
  DType dt = in[0].dtype();
  bool widen = dt == DType::F16 || dt == DType::BF16;
  auto up = [&](const Tensor& t) { return widen ? t.to_dtype(DType::F32) : t; };
  auto down = [&](const Tensor& t) { return widen ? t.to_dtype(dt) : t; };
  size_t group = in[0].dims()[1] / in[1].dims()[1];
  Tensor q = up(in[0]), g = up(grads[0]);
  Tensor k = repeat_heads(up(in[1]), group), v = repeat_heads(up(in[2]), group);
  size_t s = q.dims()[2], s_kv = k.dims()[2];
  bool has_mask = in.size() > 3 && in[3].defined();
  Tensor sc = q.matmul(k.t()).affine(scale, 0);
  Tensor capped;  // tanh(x / softcap), whose derivative scales the scores' gradient
  if (softcap > 0) {
    capped = sc.affine(1 / softcap, 0).tanh();
    sc = capped.affine(softcap, 0);
  }
  if (has_mask) sc = sc.add(up(in[3]));
  if (causal || window > 0) sc = sc.broadcast_add(causal_mask(s, s_kv, causal, window, q));
  Tensor p = sc.softmax_last_dim();
  TensorList out(in.size());
  if (need[2]) out[2] = down(sum_heads(p.t().matmul(g), group));
  if (need[0] || need[1] || (has_mask && need[3])) {
    Tensor dp = g.matmul(v.t());
    Tensor ds = p.mul(dp.broadcast_sub(dp.mul(p).sum_keepdim({3})));
    if (has_mask && need[3]) out[3] = down(ds);
    // d(softcap tanh(x / softcap)) / dx = 1 - tanh^2.
    if (softcap > 0) ds = ds.mul(capped.mul(capped).affine(-1, 1));
    if (need[0]) out[0] = down(ds.matmul(k).affine(scale, 0));
    if (need[1]) out[1] = down(sum_heads(ds.t().matmul(q).affine(scale, 0), group));
  }
  return out;
}

}  // namespace wick::fused
