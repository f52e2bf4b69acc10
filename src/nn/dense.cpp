#include "nn/dense.h"

#include "fused/dense.h"
#include "util.h"
#include "wick/error.h"
#include "wick/numerics.h"

namespace wick {

namespace fused {

void DenseOp::check(const TensorList& in) const {
  if (in.size() < 3 || in.size() > 4 || !in[0].defined() || !in[1].defined() || !in[2].defined()) {
    throw Error("dense: expected x, weight, bias and an optional residual");
  }
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  const bool same = w.dtype() == x.dtype();
  if (!numerics::is_float_dtype(x.dtype()) || b.dtype() != x.dtype() ||
      !(same || (x.dtype() == DType::F32 && w.dtype() == DType::BF16))) {
    throw DTypeMismatch(str("dense: expected x, weight and bias of one float dtype, or f32 x and ",
                            "bias with a bf16 weight, got x ", dtype_name(x.dtype()), " weight ",
                            dtype_name(w.dtype()), " bias ", dtype_name(b.dtype())));
  }
  if (x.rank() != 2 || w.rank() != 2 || b.rank() != 1 || x.dim(1) != w.dim(1) ||
      b.dim(0) != w.dim(0)) {
    throw ShapeMismatch("dense: expected x (rows, in), weight (out, in), bias (out), got x " +
                        x.shape().to_string() + " weight " + w.shape().to_string() + " bias " +
                        b.shape().to_string());
  }
  if (in.size() == 4 && in[3].defined()) {
    const Tensor& r = in[3];
    if (r.dtype() != x.dtype()) {
      throw DTypeMismatch(
          str("dense: residual ", dtype_name(r.dtype()), ", x ", dtype_name(x.dtype())));
    }
    if (r.shape() != Shape{x.dim(0), w.dim(0)}) {
      throw ShapeMismatch("dense: residual " + r.shape().to_string() + ", expected (" +
                          std::to_string(x.dim(0)) + ", " + std::to_string(w.dim(0)) + ")");
    }
  }
}

TensorList DenseOp::fallback(const TensorList& in) const {
  const Tensor &x = in[0], &w = in[1], &b = in[2];
  Tensor y = w.dtype() == x.dtype() ? x.matmul(w.t()).broadcast_add(b)
                                    : x.to_dtype(w.dtype())
                                          .to_dtype(x.dtype())
                                          .matmul(w.to_dtype(x.dtype()).t())
                                          .broadcast_add(b);
  if (gelu) y = y.gelu_erf();
  if (in.size() == 4 && in[3].defined()) y = y + in[3];
  return {y};
}

}  // namespace fused

namespace nn::detail {

Tensor dense(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu,
             const Tensor& residual) {
  if (x.rank() < 1) throw ShapeMismatch("dense: x must have at least one dim, got a scalar");
  auto dims = x.dims();
  const size_t in = dims.back(), rows = in == 0 ? 0 : x.elem_count() / in;
  dims.back() = weight.rank() == 2 ? weight.dim(0) : 0;
  TensorList inputs{x.reshape({rows, in}), weight, bias};
  if (residual.defined()) {
    if (residual.shape() != Shape(dims)) {
      throw ShapeMismatch("dense: residual " + residual.shape().to_string() + ", expected " +
                          Shape(dims).to_string());
    }
    inputs.push_back(residual.reshape({rows, dims.back()}));
  }
  auto y = wick::apply(fused::DenseOp(gelu), inputs)[0];
  return y.reshape(Shape(dims));
}

}  // namespace nn::detail

}  // namespace wick
