#include "nn/qlinear.h"

#include "util.h"
#include "wick/error.h"

namespace wick::nn {

QLinear::QLinear(const std::vector<QTensor>& parts) {
  for (const QTensor& p : parts) {
    if (p.shape().rank() != 2) throw ShapeMismatch(str("QLinear: part of shape ", p.shape()));
    if (!parts_.empty() && parts_.back().type() == p.type() &&
        parts_.back().shape()[1] == p.shape()[1] && parts_.back().device() == p.device()) {
      // Same type: the rows' blocks simply follow each other.
      const QTensor& prev = parts_.back();
      Tensor bytes = Tensor::cat({prev.data(), p.data()}, 0);
      parts_.back() =
          QTensor(p.type(), {prev.shape()[0] + p.shape()[0], p.shape()[1]}, std::move(bytes));
    } else {
      parts_.push_back(p);
    }
  }
}

size_t QLinear::bytes() const {
  if (dense_.defined()) return dense_.elem_count() * size_in_bytes(dense_.dtype());
  size_t n = 0;
  for (const QTensor& p : parts_) n += p.data().elem_count();
  return n;
}

Tensor QLinear::forward(const Tensor& x, const Tensor& bias) const {
  std::vector<size_t> dims = x.dims();
  size_t rows = x.elem_count() / dims.back();
  Tensor x2 = x.reshape(Shape{rows, dims.back()});
  Tensor y;
  if (dense_.defined()) {
    y = x2.matmul(dense_.t());
  } else {
    // The CPU kernels take f32 activations; CUDA takes f32, f16 and bf16.
    Tensor xq = x2.device().is_cpu() && x2.dtype() != DType::F32 ? x2.to_dtype(DType::F32) : x2;
    std::vector<Tensor> outs;
    for (const QTensor& p : parts_) outs.push_back(qmatmul(xq, p));
    y = outs.size() == 1 ? outs[0] : Tensor::cat(outs, 1);
    if (y.dtype() != x.dtype()) y = y.to_dtype(x.dtype());
  }
  if (bias.defined()) y = y.broadcast_add(bias);
  dims.back() = y.dims()[1];
  return y.reshape(Shape(dims));
}

}  // namespace wick::nn
