// nn::add_rms_norm, nn::add_rms_normed and nn::silu_mul: checks, then their CustomOps
// (src/fused/decoder.h), whose fallbacks (the compositions autograd records) are defined here.

#include "wick/nn/decoder_ops.h"

#include "fused/decoder.h"
#include "fused/norm.h"
#include "tensor_internal.h"
#include "wick/error.h"

namespace wick::nn {

using namespace wick::detail;

namespace {

void check_float(const char* op, const Tensor& t) {
  DType d = t.dtype();
  if (d != DType::F32 && d != DType::F16 && d != DType::BF16 && d != DType::F64) {
    throw UnsupportedDType(str(op, ": float dtypes only, got ", d));
  }
}

// x and delta (..., d) of a float dtype, weight (d): the residual ops' operands.
void check_residual_shapes(const char* op, const Tensor& x, const Tensor& delta,
                           const Tensor& weight) {
  impl_of(x, op);
  impl_of(delta, op);
  impl_of(weight, op);
  check_float(op, x);
  if (x.rank() == 0 || x.shape() != delta.shape() || weight.rank() != 1 ||
      weight.dims()[0] != x.dims().back()) {
    throw ShapeMismatch(str(op, ": x ", x.shape(), ", delta ", delta.shape(), " and weight ",
                            weight.shape(), " must be (..., d), (..., d) and (d)"));
  }
}

void check_residual_devices(const char* op, const Tensor& x, const Tensor& delta,
                            const Tensor& weight) {
  if (delta.device() != x.device() || weight.device() != x.device()) {
    throw DeviceMismatch(str(op, ": x on ", x.device(), ", delta on ", delta.device(),
                             ", weight on ", weight.device()));
  }
}

}  // namespace

ResidualNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps) {
  constexpr const char* kOp = "add_rms_norm";
  check_residual_shapes(kOp, x, delta, weight);
  if (delta.dtype() != x.dtype() || weight.dtype() != x.dtype()) {
    throw DTypeMismatch(
        str(kOp, ": x ", x.dtype(), ", delta ", delta.dtype(), ", weight ", weight.dtype()));
  }
  check_residual_devices(kOp, x, delta, weight);
  fused::AddRmsNormOp op(eps);
  if (x.elem_count() == 0) {
    TensorList r = op.fallback({x, delta, weight});
    return {r[0], r[1]};
  }
  size_t d = x.dims().back(), rows = x.elem_count() / d;
  Tensor x2 = x.contiguous().reshape({rows, d}), d2 = delta.contiguous().reshape({rows, d});
  TensorList r = wick::apply(op, {x2, d2, weight.contiguous()});
  return {r[0].reshape(x.shape()), r[1].reshape(x.shape())};
}

Tensor add_rms_normed(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps) {
  constexpr const char* kOp = "add_rms_normed";
  check_residual_shapes(kOp, x, delta, weight);
  if (delta.dtype() != x.dtype() || !fused::rms_norm_weight_fits(x.dtype(), weight.dtype())) {
    throw DTypeMismatch(str(kOp, ": x ", x.dtype(), ", delta ", delta.dtype(), ", weight ",
                            weight.dtype(), " (delta of x's dtype; weight of it, or f32 for ",
                            "f16/bf16 x)"));
  }
  check_residual_devices(kOp, x, delta, weight);
  if (!(eps >= 0)) throw Error(str(kOp, ": eps must be >= 0, got ", eps));
  fused::AddRmsNormedOp op(eps);
  if (x.elem_count() == 0) return op.fallback({x, delta, weight})[0];
  size_t d = x.dims().back(), rows = x.elem_count() / d;
  Tensor x2 = x.contiguous().reshape({rows, d}), d2 = delta.contiguous().reshape({rows, d});
  return wick::apply(op, {x2, d2, weight.contiguous()})[0].reshape(x.shape());
}

Tensor silu_mul(const Tensor& gate_up) {
  constexpr const char* kOp = "silu_mul";
  impl_of(gate_up, kOp);
  check_float(kOp, gate_up);
  if (gate_up.rank() == 0 || gate_up.dims().back() % 2 != 0) {
    throw ShapeMismatch(
        str(kOp, ": gate_up must be (..., 2n) (gate, then up), got ", gate_up.shape()));
  }
  std::vector<size_t> dims = gate_up.dims();
  size_t n = dims.back() / 2;
  if (gate_up.elem_count() == 0) return fused::SiluMulOp().fallback({gate_up})[0];
  size_t rows = gate_up.elem_count() / (2 * n);
  Tensor out = wick::apply(fused::SiluMulOp(), {gate_up.contiguous().reshape({rows, 2 * n})})[0];
  dims.back() = n;
  return out.reshape(Shape(dims));
}

}  // namespace wick::nn

namespace wick::fused {

TensorList AddRmsNormOp::fallback(const TensorList& in) const {
  Tensor sum = in[0].add(in[1]);
  return {sum, sum.rms_norm(in[2], eps)};
}

TensorList AddRmsNormedOp::fallback(const TensorList& in) const {
  return {in[0].add(in[1].rms_norm(in[2], eps))};
}

TensorList SiluMulOp::fallback(const TensorList& in) const {
  size_t last = in[0].rank() - 1, n = in[0].dims()[last] / 2;
  return {in[0].narrow(last, 0, n).silu().mul(in[0].narrow(last, n, n))};
}

}  // namespace wick::fused
