// nn::scaled_dot_product_attention: checks, then one fused backend kernel. The gradient is the
// composed path (recomputes softmax(q k^T * scale + mask) with matmuls), summed over the query
// heads that share a k/v head.

#include "wick/nn/attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "fused_op.h"
#include "tensor_internal.h"

namespace wick::nn {

using namespace wick::detail;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// The most score bytes the f32 CUDA composition below may hold at once.
constexpr size_t kComposedScoreBytes = size_t{1} << 30;

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

// 0 where query i sees key j, -inf elsewhere: (s, s_kv) on `like`'s device and dtype.
Tensor causal_mask(size_t s, size_t s_kv, const Tensor& like) {
  std::vector<float> m(s * s_kv);
  long shift = static_cast<long>(s_kv) - static_cast<long>(s);
  for (size_t i = 0; i < s; ++i) {
    for (size_t j = 0; j < s_kv; ++j) {
      m[i * s_kv + j] = static_cast<long>(j) <= static_cast<long>(i) + shift
                            ? 0.0f
                            : -std::numeric_limits<float>::infinity();
    }
  }
  return Tensor::from_vec(m, Shape{s, s_kv}, Device::cpu())
      .to_dtype(like.dtype())
      .to_device(like.device());
}

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
  size_t b = q.dims()[0], h = q.dims()[1], s = q.dims()[2], d = q.dims()[3];
  size_t h_kv = k.dims()[1], s_kv = k.dims()[2];
  Shape scores{b, h, s, s_kv};
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
  size_t group = h / h_kv;
  // f32 on CUDA has no tensor-core kernel (TF32 would break f32 accuracy): when the scores fit a
  // bounded temporary, cuBLAS's f32 GEMMs around one softmax pass beat the fused kernel's
  // CUDA-core path (docs/perf/prefill-attention.md). Decode-length queries keep the fused kernel.
  if (q.dtype() == DType::F32 && q.device().is_cuda() && s >= 16 && s_kv > 0 && group == 1 &&
      scores.elem_count() * sizeof(float) <= kComposedScoreBytes) {
    Tensor sc = q.affine(scale, 0).matmul(k.t());
    if (mask.defined()) sc = sc.add(mask);
    if (options.causal) sc = sc.broadcast_add(causal_mask(s, s_kv, q));
    return sc.softmax_last_dim().matmul(v);
  }
  FusedParams params{FusedKind::Attention};
  params.scale = scale;
  params.causal = options.causal;
  bool causal = options.causal;
  FusedGrad grad = [scale, causal, group](const Tensor&, const std::vector<Tensor>& in,
                                          const Tensor& g_in, const std::vector<bool>& need) {
    // f16/bf16 gradients are computed in f32 and rounded once.
    DType dt = in[0].dtype();
    bool widen = dt == DType::F16 || dt == DType::BF16;
    auto up = [&](const Tensor& t) { return widen ? t.to_dtype(DType::F32) : t; };
    auto down = [&](const Tensor& t) { return widen ? t.to_dtype(dt) : t; };
    Tensor q = up(in[0]), g = up(g_in);
    Tensor k = repeat_heads(up(in[1]), group), v = repeat_heads(up(in[2]), group);
    size_t s = q.dims()[2], s_kv = k.dims()[2];
    Tensor sc = q.matmul(k.t()).affine(scale, 0);
    if (in.size() > 3 && in[3].rank() == 4) sc = sc.add(up(in[3]));
    if (causal) sc = sc.broadcast_add(causal_mask(s, s_kv, q));
    Tensor p = sc.softmax_last_dim();
    std::vector<Tensor> out(in.size());
    if (need[2]) out[2] = down(sum_heads(p.t().matmul(g), group));
    if (need[0] || need[1] || (in.size() > 3 && need[3])) {
      Tensor dp = g.matmul(v.t());
      Tensor ds = p.mul(dp.broadcast_sub(dp.mul(p).sum_keepdim({3})));
      if (need[0]) out[0] = down(ds.matmul(k).affine(scale, 0));
      if (need[1]) out[1] = down(sum_heads(ds.t().matmul(q).affine(scale, 0), group));
      if (in.size() > 3 && need[3]) out[3] = down(ds);
    }
    return out;
  };
  return run_fused(params,
                   {last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v), mask},
                   Shape{b, h, s, d}, std::move(grad));
}

}  // namespace wick::nn
