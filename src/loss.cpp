// Tensor::log_softmax and the losses of wick/loss.h, composed of recorded Tensor ops (their
// gradients are those of the composition).

#include "wick/loss.h"

#include "tensor_internal.h"
#include "util.h"

namespace wick {

using namespace detail;

Tensor Tensor::log_softmax(size_t dim) const {
  impl_of(*this, "log_softmax");
  check_dim("log_softmax", *this, dim);
  if (!is_float(dtype())) {
    throw UnsupportedDType(
        str("log_softmax: unsupported dtype ", dtype(), " (float dtypes only), shape ", shape()));
  }
  if (dims()[dim] == 0 || elem_count() == 0) return affine(1, 0);  // nothing to normalise
  // Halves would lose the sum's precision: the work runs in f32, the result is rounded once.
  const bool half = dtype() == DType::F16 || dtype() == DType::BF16;
  Tensor x = half ? to_dtype(DType::F32) : *this;
  // Shifted by the row's maximum, every exp is at most 1 and the largest is exactly 1: the sum
  // neither overflows nor underflows to 0. The shift cancels in the value and in the gradient,
  // so it is a constant (detached).
  Tensor shifted = x.broadcast_sub(x.max_keepdim(dim).detach());
  Tensor out = shifted.broadcast_sub(shifted.exp().sum_keepdim(dim).log());
  return half ? out.to_dtype(dtype()) : out;
}

namespace loss {

namespace {

// Checks scores (..., c) against targets (...) and returns the row count.
size_t check_scores(const char* op, const Tensor& scores, const Tensor& targets) {
  impl_of(scores, op);
  impl_of(targets, op);
  if (!is_float(scores.dtype())) {
    throw UnsupportedDType(str(op, ": scores must be a float dtype, got ", scores.dtype(),
                               ", shape ", scores.shape()));
  }
  if (targets.dtype() != DType::U32 && targets.dtype() != DType::I64) {
    throw UnsupportedDType(str(op, ": targets must be class ids (u32 or i64), got ",
                               targets.dtype(), ", shape ", targets.shape()));
  }
  check_same_device(op, scores, targets);
  const auto& d = scores.dims();
  if (d.empty() || targets.dims() != std::vector<size_t>(d.begin(), d.end() - 1)) {
    throw ShapeMismatch(str(op, ": targets ", targets.shape(), " do not fit scores ",
                            scores.shape(),
                            " (targets: the scores' shape without the last dim, "
                            "the classes)"));
  }
  return targets.elem_count();
}

Tensor nll_rows(const char* op, const Tensor& log_probs, const Tensor& targets, size_t rows) {
  size_t classes = log_probs.dims().back();
  Tensor picked;
  try {
    picked = log_probs.reshape({rows, classes}).gather(targets.reshape({rows, 1}), 1);
  } catch (const IndexOutOfRange& e) {
    throw IndexOutOfRange(
        str(op, ": a target is not a class id below ", classes, " (", e.what(), ")"));
  }
  return picked.mean_all().neg();
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  size_t rows = check_scores("cross_entropy", logits, targets);
  return nll_rows("cross_entropy", logits.log_softmax(logits.rank() - 1), targets, rows);
}

Tensor nll(const Tensor& log_probs, const Tensor& targets) {
  size_t rows = check_scores("nll", log_probs, targets);
  return nll_rows("nll", log_probs, targets, rows);
}

Tensor mse(const Tensor& a, const Tensor& b) {
  impl_of(a, "mse");
  impl_of(b, "mse");
  if (a.shape() != b.shape()) {
    throw ShapeMismatch(str("mse: shapes differ, a ", a.shape(), ", b ", b.shape()));
  }
  if (!is_float(a.dtype())) {
    throw UnsupportedDType(
        str("mse: unsupported dtype ", a.dtype(), " (float dtypes only), shape ", a.shape()));
  }
  check_same_dtype("mse", a, b);
  check_same_device("mse", a, b);
  return a.sub(b).sqr().mean_all();
}

}  // namespace loss
}  // namespace wick
