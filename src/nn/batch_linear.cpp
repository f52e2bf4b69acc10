#include "nn/batch_linear.h"

#include <cstdlib>
#include <string>

#include "cpu/row_matmul.h"
#include "nn/kv_write.h"
#include "util.h"
#include "wick/error.h"

namespace wick::nn::detail {

namespace {

bool read_batch_invariant() {
  const char* v = std::getenv("WICK_BATCH_INVARIANT");
  if (v == nullptr || *v == '\0') return true;
  const std::string s(v);
  if (s == "1") return true;
  if (s == "0") return false;
  throw Error(str("WICK_BATCH_INVARIANT must be 0 or 1, got \"", s, "\""));
}

bool fixed_order(const QLinear& w, const Tensor& x) {
  return !w.quantized() && x.device().is_cpu() && batch_invariant() &&
         (x.dtype() == DType::F32 || x.dtype() == DType::F16 || x.dtype() == DType::BF16);
}

// x (..., in) as f32 rows times w^T: (rows, out) f32.
Tensor rows_f32(const QLinear& w, const Tensor& x) {
  const size_t in = x.dims().back(), rows = x.elem_count() / in;
  return cpu::row_matmul(x.reshape({rows, in}).to_dtype(DType::F32).contiguous(),
                         w.dense().contiguous());
}

Tensor shaped_like(const Tensor& y, const Tensor& x) {
  std::vector<size_t> dims = x.dims();
  dims.back() = y.dims()[1];
  return y.reshape(Shape(dims));
}

}  // namespace

bool batch_invariant() {
  static const bool on = read_batch_invariant();
  return on;
}

Tensor batch_linear(const QLinear& w, const Tensor& x) {
  if (!fixed_order(w, x)) return w.forward(x);
  return shaped_like(rows_f32(w, x).to_dtype(x.dtype()), x);
}

Tensor batch_project_qkv(const Tensor& in, const QLinear& w, const Tensor& bias,
                         Tensor* bias_left) {
  if (!fixed_order(w, in)) return project_qkv(in, w, bias, bias_left);
  *bias_left = Tensor();
  if (!bias.defined() || in.dtype() == DType::F32) {
    *bias_left = bias;
    return shaped_like(rows_f32(w, in).to_dtype(in.dtype()), in);
  }
  return shaped_like(rows_f32(w, in).broadcast_add(bias.to_dtype(DType::F32)).to_dtype(in.dtype()),
                     in);
}

}  // namespace wick::nn::detail
