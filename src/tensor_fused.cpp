// Tensor: the fused transformer ops (softmax_last_dim, layer_norm, rms_norm, rope,
// rope_interleaved). Each checks its inputs, then applies its CustomOp (src/fused/norm.h,
// src/fused/rope.h), whose fallback and gradient are written here with the public Tensor ops
// (rope's gradient with rope).

#include <algorithm>
#include <utility>

#include "fused/norm.h"
#include "fused/rope.h"
#include "fused_op.h"
#include "tensor_internal.h"

namespace wick {

using namespace detail;

namespace detail {

Tensor last_dim_contiguous(const Tensor& t) {
  if (t.rank() == 0 || t.dims().back() <= 1 || t.layout().strides().back() == 1) return t;
  return t.contiguous();
}

}  // namespace detail

namespace {

void check_fused_float(const char* op, const Tensor& t) {
  if (t.dtype() != DType::F32 && t.dtype() != DType::F16 && t.dtype() != DType::BF16 &&
      t.dtype() != DType::F64) {
    throw UnsupportedDType(
        str(op, ": unsupported dtype ", t.dtype(), " (float dtypes only), shape ", t.shape()));
  }
}

// A (d) parameter of a norm: defined, rank 1 of the last dim, same dtype (or, for rms_norm's
// weight of an f16/bf16 x, f32) and device as x.
void check_param(const char* op, const char* what, const Tensor& x, const Tensor& p,
                 bool f32_allowed = false) {
  impl_of(p, op);
  size_t d = x.dims().back();
  if (p.rank() != 1 || p.dims()[0] != d) {
    throw ShapeMismatch(str(op, ": ", what, " must have shape [", d, "] for input ", x.shape(),
                            ", got ", p.shape()));
  }
  if (!(f32_allowed && fused::f32_weight_of_half(x.dtype(), p.dtype()))) check_same_dtype(op, x, p);
  check_same_device(op, x, p);
}

size_t last(const Tensor& t) {
  return t.rank() - 1;
}

// Mean over the last dim, kept.
Tensor row_mean(const Tensor& t) {
  return t.mean_keepdim({last(t)});
}

// Sums a (rows..., d) gradient to a (d) parameter gradient.
Tensor sum_rows(const Tensor& t) {
  size_t d = t.dims().back();
  return t.reshape(Shape{t.elem_count() / std::max<size_t>(d, 1), d}).sum({0});
}

// f16/bf16 math in f32, rounded once at the end.
struct Widen {
  DType dt;
  bool on;
  explicit Widen(DType dt) : dt(dt), on(dt == DType::F16 || dt == DType::BF16) {}
  Tensor up(const Tensor& t) const { return on ? t.to_dtype(DType::F32) : t; }
  Tensor down(const Tensor& t) const { return on ? t.to_dtype(dt) : t; }
};

Tensor norm(bool rms, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  fused::NormOp op(rms, eps);
  impl_of(x, op.name());
  check_fused_float(op.name(), x);
  if (x.rank() == 0) {
    throw ShapeMismatch(str(op.name(), ": input must have rank >= 1, got a scalar"));
  }
  check_param(op.name(), "weight", x, weight, rms);
  if (bias.defined()) check_param(op.name(), "bias", x, bias);
  if (!(eps >= 0)) throw Error(str(op.name(), ": eps must be >= 0, got ", eps));
  TensorList inputs{x.contiguous(), weight.contiguous()};
  if (!rms) inputs.push_back(bias.defined() ? bias.contiguous() : Tensor());
  return std::move(wick::apply(op, inputs)[0]);
}

Tensor rope_impl(bool interleaved, const Tensor& x, const Tensor& cos, const Tensor& sin) {
  fused::RopeOp rope(interleaved);
  const char* op = rope.name();
  impl_of(x, op);
  impl_of(cos, op);
  impl_of(sin, op);
  check_fused_float(op, x);
  if (x.rank() != 4 || x.dims()[3] % 2 != 0) {
    throw ShapeMismatch(str(op, ": x must be (b, h, s, d) with d even, got ", x.shape()));
  }
  size_t s = x.dims()[2], half = x.dims()[3] / 2;
  Shape want{s, half};
  if (cos.shape() != want || sin.shape() != want) {
    throw ShapeMismatch(str(op, ": cos and sin must be ", want, " for x ", x.shape(), ", got cos ",
                            cos.shape(), ", sin ", sin.shape()));
  }
  check_same_dtype(op, x, cos);
  check_same_dtype(op, x, sin);
  check_same_device(op, x, cos);
  check_same_device(op, x, sin);
  return std::move(
      wick::apply(rope, {last_dim_contiguous(x), cos.contiguous(), sin.contiguous()})[0]);
}

// The two halves a rotation pairs: the first and second halves of the last dim, or its even and
// odd elements (interleaved).
std::pair<Tensor, Tensor> rope_halves(const Tensor& t, bool interleaved) {
  size_t half = t.dims()[3] / 2;
  if (!interleaved) return {t.narrow(3, 0, half), t.narrow(3, half, half)};
  Tensor p = t.reshape(Shape{t.dims()[0], t.dims()[1], t.dims()[2], half, 2});
  return {p.narrow(4, 0, 1).squeeze(4), p.narrow(4, 1, 1).squeeze(4)};
}

}  // namespace

Tensor Tensor::softmax_last_dim() const {
  impl_of(*this, "softmax_last_dim");
  if (rank() == 0) throw ShapeMismatch("softmax_last_dim: input must have rank >= 1, got a scalar");
  return softmax(rank() - 1);
}

Tensor Tensor::layer_norm(const Tensor& weight, const Tensor& bias, double eps) const {
  return norm(false, *this, weight, bias, eps);
}

Tensor Tensor::rms_norm(const Tensor& weight, double eps) const {
  return norm(true, *this, weight, Tensor(), eps);
}

Tensor Tensor::rope(const Tensor& cos, const Tensor& sin) const {
  return rope_impl(false, *this, cos, sin);
}

Tensor Tensor::rope_interleaved(const Tensor& cos, const Tensor& sin) const {
  return rope_impl(true, *this, cos, sin);
}

}  // namespace wick

namespace wick::fused {

TensorList NormOp::fallback(const TensorList& in) const {
  if (rms && fused::f32_weight_of_half(in[0].dtype(), in[1].dtype())) {
    return {in[0].to_dtype(DType::F32).rms_norm(in[1], eps).to_dtype(in[0].dtype())};
  }
  Widen w(in[0].dtype());
  Tensor x = w.up(in[0]);
  Tensor xc = rms ? x : x.broadcast_sub(row_mean(x));
  Tensor xhat = xc.broadcast_mul(row_mean(xc.sqr()).affine(1, eps).sqrt().recip());
  if (rms) return {w.down(xhat).broadcast_mul(in[1])};
  Tensor y = xhat.broadcast_mul(w.up(in[1]));
  if (in.size() > 2 && in[2].defined()) y = y.broadcast_add(w.up(in[2]));
  return {w.down(y)};
}

TensorList NormOp::backward(const TensorList& in, const TensorList&, const TensorList& grads,
                            const std::vector<bool>& need) const {
  Widen wd(in[0].dtype());
  Tensor x = wd.up(in[0]), w = wd.up(in[1]), g = wd.up(grads[0]);
  // xhat = (x - mean) * rstd (layer) or x * rstd (rms); y = xhat * w (+ b).
  Tensor xc = rms ? x : x.broadcast_sub(row_mean(x));
  Tensor rstd = row_mean(xc.sqr()).affine(1, eps).sqrt().recip();
  Tensor xhat = xc.broadcast_mul(rstd);
  TensorList out(in.size());
  if (need[0]) {
    Tensor gx = g.broadcast_mul(w);
    Tensor inner = gx.broadcast_sub(xhat.broadcast_mul(row_mean(gx.mul(xhat))));
    if (!rms) inner = inner.broadcast_sub(row_mean(gx));
    out[0] = wd.down(inner.broadcast_mul(rstd));
  }
  if (need[1]) {
    Tensor gw = sum_rows(g.mul(xhat));
    out[1] = in[1].dtype() == DType::F32 ? gw : wd.down(gw);  // in the weight's dtype
  }
  if (in.size() > 2 && need[2]) out[2] = wd.down(sum_rows(g));
  return out;
}

TensorList RopeOp::fallback(const TensorList& in) const {
  const Tensor& x = in[0];
  Shape row{1, 1, x.dims()[2], x.dims()[3] / 2};
  Tensor c = in[1].reshape(row), sn = in[2].reshape(row);
  auto [a, b] = rope_halves(x, interleaved);
  Tensor lo = a.broadcast_mul(c).sub(b.broadcast_mul(sn));
  Tensor hi = b.broadcast_mul(c).add(a.broadcast_mul(sn));
  if (!interleaved) return {Tensor::cat({lo, hi}, 3)};
  return {Tensor::stack({lo, hi}, 4).reshape(x.shape())};
}

TensorList RopeOp::backward(const TensorList& in, const TensorList&, const TensorList& grads,
                            const std::vector<bool>& need) const {
  const Tensor& x = in[0];
  const Tensor& c = in[1];
  const Tensor& sn = in[2];
  const Tensor& g = grads[0];
  TensorList out(3);
  // The rotation's transpose is the rotation by -angle.
  if (need[0]) out[0] = interleaved ? g.rope_interleaved(c, sn.neg()) : g.rope(c, sn.neg());
  if (need[1] || need[2]) {
    auto [a, b] = rope_halves(x, interleaved);
    auto [ga, gb] = rope_halves(g, interleaved);
    // out_a = a c - b s, out_b = b c + a s
    if (need[1]) out[1] = ga.mul(a).add(gb.mul(b)).sum({0, 1});
    if (need[2]) out[2] = gb.mul(a).sub(ga.mul(b)).sum({0, 1});
  }
  return out;
}

}  // namespace wick::fused
