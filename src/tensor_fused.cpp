// Tensor: the fused transformer ops (softmax_last_dim, layer_norm, rms_norm, rope,
// rope_interleaved). Each checks its inputs, then goes through run_fused: one backend kernel,
// one recorded op whose gradient is written with the public Tensor ops (rope's with rope).

#include <algorithm>

#include "fused_op.h"
#include "tensor_internal.h"

namespace wick {

using namespace detail;

const char* fused_name(FusedKind kind) {
  switch (kind) {
    case FusedKind::LayerNorm:
      return "layer_norm";
    case FusedKind::RmsNorm:
      return "rms_norm";
    case FusedKind::Rope:
      return "rope";
    case FusedKind::RopeInterleaved:
      return "rope_interleaved";
  }
  return "fused";
}

namespace detail {

Tensor run_fused(const FusedParams& params, const std::vector<Tensor>& operands,
                 const Shape& out_shape, FusedGrad grad) {
  // The present operands go through run_op; the backend sees every slot (absent ones empty).
  std::vector<KernelOperand> slots(operands.size());
  std::vector<const Tensor*> present;
  present.reserve(operands.size());
  for (size_t i = 0; i < operands.size(); ++i) {
    if (!operands[i].defined()) continue;
    slots[i] = {&backend_of(operands[i]), operands[i].layout()};
    present.push_back(&operands[i]);
  }
  return run_op(
      present, out_shape, [&] { return backend_of(operands[0]).fused(params, slots); },
      [&] {
        // Absent operands are recorded as untracked placeholders so that indices stay aligned.
        std::vector<Tensor> inputs;
        for (const Tensor& t : operands) {
          inputs.push_back(
              t.defined() ? t : Tensor::zeros(Shape{}, operands[0].dtype(), operands[0].device()));
        }
        BackpropOp rec{OpKind::Fused, std::move(inputs)};
        rec.fused_grad = std::move(grad);
        return rec;
      });
}

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

// A (d) parameter of a norm: defined, rank 1 of the last dim, same dtype and device as x.
void check_param(const char* op, const char* what, const Tensor& x, const Tensor& p) {
  impl_of(p, op);
  size_t d = x.dims().back();
  if (p.rank() != 1 || p.dims()[0] != d) {
    throw ShapeMismatch(str(op, ": ", what, " must have shape [", d, "] for input ", x.shape(),
                            ", got ", p.shape()));
  }
  check_same_dtype(op, x, p);
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

Tensor norm(FusedKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = fused_name(kind);
  impl_of(x, op);
  check_fused_float(op, x);
  if (x.rank() == 0) throw ShapeMismatch(str(op, ": input must have rank >= 1, got a scalar"));
  check_param(op, "weight", x, weight);
  if (bias.defined()) check_param(op, "bias", x, bias);
  if (!(eps >= 0)) throw Error(str(op, ": eps must be >= 0, got ", eps));
  FusedParams params{kind};
  params.eps = eps;
  bool layer = kind == FusedKind::LayerNorm;
  FusedGrad grad = [eps, layer](const Tensor&, const std::vector<Tensor>& in, const Tensor& g_in,
                                const std::vector<bool>& need) {
    // f16/bf16 gradients are computed in f32 and rounded once.
    DType dt = in[0].dtype();
    bool widen = dt == DType::F16 || dt == DType::BF16;
    auto up = [&](const Tensor& t) { return widen ? t.to_dtype(DType::F32) : t; };
    auto down = [&](const Tensor& t) { return widen ? t.to_dtype(dt) : t; };
    Tensor x = up(in[0]), w = up(in[1]), g = up(g_in);
    // xhat = (x - mean) * rstd (layer) or x * rstd (rms); y = xhat * w (+ b).
    Tensor xc = layer ? x.broadcast_sub(row_mean(x)) : x;
    Tensor rstd = row_mean(xc.sqr()).affine(1, eps).sqrt().recip();
    Tensor xhat = xc.broadcast_mul(rstd);
    std::vector<Tensor> out(in.size());
    if (need[0]) {
      Tensor gx = g.broadcast_mul(w);
      Tensor inner = gx.broadcast_sub(xhat.broadcast_mul(row_mean(gx.mul(xhat))));
      if (layer) inner = inner.broadcast_sub(row_mean(gx));
      out[0] = down(inner.broadcast_mul(rstd));
    }
    if (need[1]) out[1] = down(sum_rows(g.mul(xhat)));
    if (in.size() > 2 && need[2]) out[2] = down(sum_rows(g));
    return out;
  };
  std::vector<Tensor> operands{x.contiguous(), weight.contiguous()};
  if (layer) operands.push_back(bias.defined() ? bias.contiguous() : Tensor());
  return run_fused(params, operands, x.shape(), std::move(grad));
}

Tensor rope_impl(FusedKind kind, const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const char* op = fused_name(kind);
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
  bool interleaved = kind == FusedKind::RopeInterleaved;
  FusedGrad grad = [interleaved](const Tensor&, const std::vector<Tensor>& in, const Tensor& g,
                                 const std::vector<bool>& need) {
    const Tensor& x = in[0];
    const Tensor& c = in[1];
    const Tensor& sn = in[2];
    std::vector<Tensor> out(3);
    // The rotation's transpose is the rotation by -angle.
    if (need[0]) out[0] = interleaved ? g.rope_interleaved(c, sn.neg()) : g.rope(c, sn.neg());
    if (need[1] || need[2]) {
      size_t half = x.dims()[3] / 2;
      auto halves = [&](const Tensor& t) -> std::pair<Tensor, Tensor> {
        if (!interleaved) return {t.narrow(3, 0, half), t.narrow(3, half, half)};
        Tensor p = t.reshape(Shape{t.dims()[0], t.dims()[1], t.dims()[2], half, 2});
        return {p.narrow(4, 0, 1).squeeze(4), p.narrow(4, 1, 1).squeeze(4)};
      };
      auto [a, b] = halves(x);
      auto [ga, gb] = halves(g);
      // out_a = a c - b s, out_b = b c + a s
      if (need[1]) out[1] = ga.mul(a).add(gb.mul(b)).sum({0, 1});
      if (need[2]) out[2] = gb.mul(a).sub(ga.mul(b)).sum({0, 1});
    }
    return out;
  };
  return run_fused(FusedParams{kind}, {last_dim_contiguous(x), cos.contiguous(), sin.contiguous()},
                   x.shape(), std::move(grad));
}

}  // namespace

Tensor Tensor::softmax_last_dim() const {
  impl_of(*this, "softmax_last_dim");
  if (rank() == 0) throw ShapeMismatch("softmax_last_dim: input must have rank >= 1, got a scalar");
  return softmax(rank() - 1);
}

Tensor Tensor::layer_norm(const Tensor& weight, const Tensor& bias, double eps) const {
  return norm(FusedKind::LayerNorm, *this, weight, bias, eps);
}

Tensor Tensor::rms_norm(const Tensor& weight, double eps) const {
  return norm(FusedKind::RmsNorm, *this, weight, Tensor(), eps);
}

Tensor Tensor::rope(const Tensor& cos, const Tensor& sin) const {
  return rope_impl(FusedKind::Rope, *this, cos, sin);
}

Tensor Tensor::rope_interleaved(const Tensor& cos, const Tensor& sin) const {
  return rope_impl(FusedKind::RopeInterleaved, *this, cos, sin);
}

}  // namespace wick
