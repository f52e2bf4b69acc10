// nn::add_rms_norm and nn::silu_mul: checks, then the backend's one-kernel version (or the
// composition when autograd records).

#include "wick/nn/decoder_ops.h"

#include "decoder_ops_backend.h"
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

}  // namespace

ResidualNorm add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight, double eps) {
  constexpr const char* kOp = "add_rms_norm";
  impl_of(x, kOp);
  impl_of(delta, kOp);
  impl_of(weight, kOp);
  check_float(kOp, x);
  if (x.rank() == 0 || x.shape() != delta.shape() || weight.rank() != 1 ||
      weight.dims()[0] != x.dims().back()) {
    throw ShapeMismatch(str(kOp, ": x ", x.shape(), ", delta ", delta.shape(), " and weight ",
                            weight.shape(), " must be (..., d), (..., d) and (d)"));
  }
  if (delta.dtype() != x.dtype() || weight.dtype() != x.dtype()) {
    throw DTypeMismatch(
        str(kOp, ": x ", x.dtype(), ", delta ", delta.dtype(), ", weight ", weight.dtype()));
  }
  if (delta.device() != x.device() || weight.device() != x.device()) {
    throw DeviceMismatch(str(kOp, ": x on ", x.device(), ", delta on ", delta.device(),
                             ", weight on ", weight.device()));
  }
  if (should_record({&x, &delta, &weight}) || x.elem_count() == 0) {
    Tensor sum = x.add(delta);
    return {sum, sum.rms_norm(weight, eps)};
  }
  size_t d = x.dims().back(), rows = x.elem_count() / d;
  Tensor x2 = x.contiguous().reshape({rows, d}), d2 = delta.contiguous().reshape({rows, d});
  Tensor w = weight.contiguous();
  ResidualNorm r =
      x.device().is_cuda() ? cuda_add_rms_norm(x2, d2, w, eps) : cpu_add_rms_norm(x2, d2, w, eps);
  return {r.residual.reshape(x.shape()), r.normed.reshape(x.shape())};
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
  if (should_record({&gate_up}) || gate_up.elem_count() == 0) {
    size_t last = dims.size() - 1;
    return gate_up.narrow(last, 0, n).silu().mul(gate_up.narrow(last, n, n));
  }
  size_t rows = gate_up.elem_count() / (2 * n);
  Tensor g = gate_up.contiguous().reshape({rows, 2 * n});
  Tensor out = gate_up.device().is_cuda() ? cuda_silu_mul(g) : cpu_silu_mul(g);
  dims.back() = n;
  return out.reshape(Shape(dims));
}

}  // namespace wick::nn
