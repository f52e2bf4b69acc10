// Tensor: computing ops (matmul, element-wise, comparisons, reductions, indexing). Each checks its
// inputs, takes the storages' read locks, makes one backend call and records itself for autograd.

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>

#include "checked.h"
#include "dispatch.h"
#include "tensor_internal.h"
#include "wick/tensor.h"

namespace wick {

using namespace detail;

namespace {

void check_float(const char* op, const Tensor& t) {
  if (!is_float(t.dtype())) {
    throw UnsupportedDType(
        str(op, ": unsupported dtype ", t.dtype(), " (float dtypes only), shape ", t.shape()));
  }
}

void check_ids(const char* op, const Tensor& ids) {
  if (ids.dtype() != DType::U32 && ids.dtype() != DType::I64) {
    throw UnsupportedDType(str(op, ": ids must be u32 or i64, got ", ids.dtype()));
  }
}

// Shape work shared by matmul and broadcast_matmul, after the batch dims are made equal.
Tensor matmul_impl(const char* op, const Tensor& lhs, const Tensor& rhs) {
  size_t rank = lhs.rank();
  size_t m = lhs.dims()[rank - 2], k = lhs.dims()[rank - 1], n = rhs.dims()[rank - 1];
  std::vector<size_t> out_dims(lhs.dims().begin(), lhs.dims().end() - 2);
  size_t b = Shape(out_dims).elem_count();
  out_dims.push_back(m);
  out_dims.push_back(n);
  Shape out_shape(out_dims);  // checked: the output count cannot wrap
  check_output_bytes(op, out_shape, lhs.dtype(), lhs.device());
  if (out_shape.elem_count() == 0 || k == 0) {
    // Recorded all the same, so that the operands get (zero) gradients.
    Tensor zeros = Tensor::zeros(out_shape, lhs.dtype(), lhs.device());
    if (!should_record({&lhs, &rhs})) return zeros;
    return record(zeros, BackpropOp{OpKind::Matmul, {lhs, rhs}});
  }
  // Device and dtype were checked by check_matmul_operands: straight to the backend.
  return run_op(
      {&lhs, &rhs}, out_shape,
      [&] {
        return backend_of(lhs).matmul(backend_of(rhs), MatmulDims{b, m, n, k}, lhs.layout(),
                                      rhs.layout());
      },
      [&] {
        return BackpropOp{OpKind::Matmul, {lhs, rhs}};
      });
}

void check_matmul_operands(const char* op, const Tensor& lhs, const Tensor& rhs) {
  impl_of(lhs, op);
  impl_of(rhs, op);
  size_t rank = lhs.rank();
  if (rank < 2 || rhs.rank() < 2 || (rhs.rank() != rank && std::string(op) == "matmul") ||
      lhs.dims()[rank - 1] != rhs.dims()[rhs.rank() - 2]) {
    throw ShapeMismatch(str(op, ": shape mismatch, lhs: ", lhs.shape(), ", rhs: ", rhs.shape()));
  }
  check_same_device(op, lhs, rhs);
  check_same_dtype(op, lhs, rhs);
  check_float(op, lhs);
}

}  // namespace

// ---- matmul ----

Tensor Tensor::matmul(const Tensor& rhs) const {
  check_matmul_operands("matmul", *this, rhs);
  // Each batch dim must match, not only their product.
  if (!std::equal(dims().begin(), dims().end() - 2, rhs.dims().begin())) {
    throw ShapeMismatch(str("matmul: shape mismatch, lhs: ", shape(), ", rhs: ", rhs.shape()));
  }
  return matmul_impl("matmul", *this, rhs);
}

Tensor Tensor::broadcast_matmul(const Tensor& rhs) const {
  check_matmul_operands("broadcast_matmul", *this, rhs);
  Shape lhs_batch(std::vector<size_t>(dims().begin(), dims().end() - 2));
  Shape rhs_batch(std::vector<size_t>(rhs.dims().begin(), rhs.dims().end() - 2));
  std::vector<size_t> batch;
  try {
    batch = broadcast_shape("broadcast_matmul", lhs_batch, rhs_batch).dims();
  } catch (const ShapeMismatch& e) {
    throw ShapeMismatch(str("broadcast_matmul: shape mismatch, lhs: ", shape(),
                            ", rhs: ", rhs.shape(), " (", e.what(), ")"));
  }
  auto with_batch = [&](const Tensor& t) {
    std::vector<size_t> d = batch;
    d.push_back(t.dims()[t.rank() - 2]);
    d.push_back(t.dims()[t.rank() - 1]);
    return t.broadcast_as(Shape(d));  // stride-0 batches: nothing is copied
  };
  return matmul_impl("broadcast_matmul", with_batch(*this), with_batch(rhs));
}

// ---- element-wise binary ----

namespace {

Tensor binary_op(BinaryKind kind, const Tensor& lhs, const Tensor& rhs) {
  const char* op = binary_name(kind);
  impl_of(lhs, op);
  impl_of(rhs, op);
  if (lhs.shape() != rhs.shape()) {
    throw ShapeMismatch(str(op, ": shape mismatch, lhs ", lhs.shape(), ", rhs ", rhs.shape(),
                            " (use broadcast_", op, " to broadcast)"));
  }
  check_same_dtype(op, lhs, rhs);
  check_same_device(op, lhs, rhs);
  check_output_bytes(op, lhs.shape(), lhs.dtype(), lhs.device());
  return run_op(
      {&lhs, &rhs}, lhs.shape(),
      [&] { return backend_of(lhs).binary(kind, lhs.layout(), backend_of(rhs), rhs.layout()); },
      [&] {
        BackpropOp rec{OpKind::Binary, {lhs, rhs}};
        rec.binary = kind;
        return rec;
      });
}

Tensor broadcast_binary_op(BinaryKind kind, const Tensor& lhs, const Tensor& rhs) {
  const char* op = broadcast_binary_name(kind);
  impl_of(lhs, op);
  impl_of(rhs, op);
  if (lhs.shape() == rhs.shape()) return binary_op(kind, lhs, rhs);  // no views to build
  Shape shape = broadcast_shape(op, lhs.shape(), rhs.shape());
  return binary_op(kind, lhs.broadcast_as(shape), rhs.broadcast_as(shape));
}

Tensor unary_op(const UnaryOp& u, const Tensor& t) {
  const char* op = unary_name(u.kind);
  impl_of(t, op);
  if (!unary_supports(u.kind, t.dtype())) {
    throw UnsupportedDType(str(op, ": unsupported dtype ", t.dtype(), ", shape ", t.shape()));
  }
  check_output_bytes(op, t.shape(), t.dtype(), t.device());
  return run_op(
      {&t}, t.shape(), [&] { return backend_of(t).unary(u, t.layout()); },
      [&] {
        BackpropOp rec{OpKind::Unary, {t}};
        rec.unary = u;
        return rec;
      });
}

Tensor cmp_same_shape(CmpKind kind, const Tensor& l, const Tensor& r) {
  const char* op = cmp_name(kind);
  check_output_bytes(op, l.shape(), DType::U8, l.device());
  // Not differentiable: nothing recorded.
  return run_op({&l, &r}, l.shape(),
                [&] { return backend_of(l).cmp(kind, l.layout(), backend_of(r), r.layout()); });
}

Tensor cmp_op(CmpKind kind, const Tensor& lhs, const Tensor& rhs) {
  const char* op = cmp_name(kind);
  impl_of(lhs, op);
  impl_of(rhs, op);
  check_same_dtype(op, lhs, rhs);
  check_same_device(op, lhs, rhs);
  if (lhs.shape() == rhs.shape()) return cmp_same_shape(kind, lhs, rhs);
  Shape shape = broadcast_shape(op, lhs.shape(), rhs.shape());
  return cmp_same_shape(kind, lhs.broadcast_as(shape), rhs.broadcast_as(shape));
}

// A rank-0 tensor holding `value` in `like`'s dtype and on its device, the scalar operand of
// `op`. For an integer dtype a NaN or a value outside the dtype's range throws (as numpy 2 and
// PyTorch refuse such a scalar): saturating it and then wrapping would give a silently wrong sum;
// a value inside the range is truncated toward zero, as to_dtype does.
Tensor scalar_like(double value, const Tensor& like, const char* op) {
  impl_of(like, op);
  return dispatch(like.dtype(), [&]<class T>() {
    if constexpr (std::is_integral_v<T>) {
      constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
      constexpr double hi_excl = static_cast<double>(uint64_t{1} << std::numeric_limits<T>::digits);
      double t = std::trunc(value);
      if (!(t >= lo && t < hi_excl)) {
        std::ostringstream v;
        v.precision(17);
        v << value;
        throw Error(str(op, ": the scalar ", v.str(), " is out of range of ", like.dtype(), " [",
                        +std::numeric_limits<T>::min(), ", ", +std::numeric_limits<T>::max(),
                        "]; convert the tensor (to_dtype) first"));
      }
      return Tensor::scalar(saturate_to_int<T>(value), like.device());
    } else {
      return Tensor::scalar(static_cast<T>(value), like.device());
    }
  });
}

}  // namespace

Tensor Tensor::add(const Tensor& rhs) const {
  return binary_op(BinaryKind::Add, *this, rhs);
}
Tensor Tensor::sub(const Tensor& rhs) const {
  return binary_op(BinaryKind::Sub, *this, rhs);
}
Tensor Tensor::mul(const Tensor& rhs) const {
  return binary_op(BinaryKind::Mul, *this, rhs);
}
Tensor Tensor::div(const Tensor& rhs) const {
  return binary_op(BinaryKind::Div, *this, rhs);
}
Tensor Tensor::maximum(const Tensor& rhs) const {
  return binary_op(BinaryKind::Maximum, *this, rhs);
}
Tensor Tensor::minimum(const Tensor& rhs) const {
  return binary_op(BinaryKind::Minimum, *this, rhs);
}
Tensor Tensor::broadcast_add(const Tensor& rhs) const {
  return broadcast_binary_op(BinaryKind::Add, *this, rhs);
}
Tensor Tensor::broadcast_sub(const Tensor& rhs) const {
  return broadcast_binary_op(BinaryKind::Sub, *this, rhs);
}
Tensor Tensor::broadcast_mul(const Tensor& rhs) const {
  return broadcast_binary_op(BinaryKind::Mul, *this, rhs);
}
Tensor Tensor::broadcast_div(const Tensor& rhs) const {
  return broadcast_binary_op(BinaryKind::Div, *this, rhs);
}
Tensor Tensor::broadcast_maximum(const Tensor& rhs) const {
  return broadcast_binary_op(BinaryKind::Maximum, *this, rhs);
}
Tensor Tensor::broadcast_minimum(const Tensor& rhs) const {
  return broadcast_binary_op(BinaryKind::Minimum, *this, rhs);
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return a.broadcast_add(b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return a.broadcast_sub(b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return a.broadcast_mul(b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return a.broadcast_div(b);
}
Tensor operator+(const Tensor& a, double b) {
  return a + scalar_like(b, a, "operator+");
}
Tensor operator-(const Tensor& a, double b) {
  return a - scalar_like(b, a, "operator-");
}
Tensor operator*(const Tensor& a, double b) {
  return a * scalar_like(b, a, "operator*");
}
Tensor operator/(const Tensor& a, double b) {
  return a / scalar_like(b, a, "operator/");
}
Tensor operator+(double a, const Tensor& b) {
  return scalar_like(a, b, "operator+") + b;
}
Tensor operator-(double a, const Tensor& b) {
  return scalar_like(a, b, "operator-") - b;
}
Tensor operator*(double a, const Tensor& b) {
  return scalar_like(a, b, "operator*") * b;
}
Tensor operator/(double a, const Tensor& b) {
  return scalar_like(a, b, "operator/") / b;
}
Tensor operator-(const Tensor& a) {
  return a.neg();
}

// ---- element-wise unary ----

// The ops without parameters: one method per entry of wick/unary_ops.def.
#define WICK_UNARY_OP(K, name, ...)         \
  Tensor Tensor::name() const {             \
    return unary_op({UnaryKind::K}, *this); \
  }
#define WICK_UNARY_PARAM_OP(...)
#include "wick/unary_ops.def"

Tensor Tensor::affine(double mul, double add) const {
  return unary_op({UnaryKind::Affine, mul, add}, *this);
}
Tensor Tensor::powf(double e) const {
  return unary_op({UnaryKind::Powf, e}, *this);
}
Tensor Tensor::clamp(double lo, double hi) const {
  if (!(lo <= hi)) throw Error(str("clamp: lo ", lo, " is greater than hi ", hi));
  return unary_op({UnaryKind::Clamp, lo, hi}, *this);
}
Tensor Tensor::elu(double alpha) const {
  return unary_op({UnaryKind::Elu, alpha}, *this);
}

// ---- comparisons and selection ----

Tensor Tensor::eq(const Tensor& rhs) const {
  return cmp_op(CmpKind::Eq, *this, rhs);
}
Tensor Tensor::ne(const Tensor& rhs) const {
  return cmp_op(CmpKind::Ne, *this, rhs);
}
Tensor Tensor::lt(const Tensor& rhs) const {
  return cmp_op(CmpKind::Lt, *this, rhs);
}
Tensor Tensor::le(const Tensor& rhs) const {
  return cmp_op(CmpKind::Le, *this, rhs);
}
Tensor Tensor::gt(const Tensor& rhs) const {
  return cmp_op(CmpKind::Gt, *this, rhs);
}
Tensor Tensor::ge(const Tensor& rhs) const {
  return cmp_op(CmpKind::Ge, *this, rhs);
}

Tensor Tensor::where_cond(const Tensor& on_true, const Tensor& on_false) const {
  impl_of(*this, "where_cond");
  impl_of(on_true, "where_cond");
  impl_of(on_false, "where_cond");
  if (dtype() != DType::U8) {
    throw DTypeMismatch(str("where_cond: condition must be u8, got ", dtype()));
  }
  check_same_dtype("where_cond", on_true, on_false);
  check_same_device("where_cond", *this, on_true);
  check_same_device("where_cond", *this, on_false);
  Shape shape =
      broadcast_shape("where_cond", broadcast_shape("where_cond", this->shape(), on_true.shape()),
                      on_false.shape());
  Tensor c = broadcast_as(shape), t = on_true.broadcast_as(shape), f = on_false.broadcast_as(shape);
  check_output_bytes("where_cond", shape, t.dtype(), device());
  return run_op(
      {&c, &t, &f}, shape,
      [&] {
        return backend_of(c).where_cond(c.layout(), backend_of(t), t.layout(), backend_of(f),
                                        f.layout());
      },
      [&] {
        return BackpropOp{OpKind::WhereCond, {c, t, f}};
      });
}

// ---- reductions ----

namespace {

// Sorted, unique, in range; throws otherwise.
std::vector<size_t> reduce_dims(const char* op, const Tensor& t, std::vector<size_t> dims) {
  for (size_t d : dims) check_dim(op, t, d);
  std::vector<size_t> given = dims;
  std::sort(dims.begin(), dims.end());
  auto repeated = std::adjacent_find(dims.begin(), dims.end());
  if (repeated != dims.end()) {
    throw ShapeMismatch(str(op, ": dim ", *repeated, " appears more than once in ", vec_str(given),
                            " (shape ", t.shape(), ")"));
  }
  return dims;
}

// The reduction over `dims`, kept as size-1 dims; recorded as OpKind `rec_kind` unless it is
// not differentiable (argmax, argmin).
Tensor reduce_keepdim(ReduceKind kind, const Tensor& t, const std::vector<size_t>& dims,
                      std::optional<OpKind> rec_kind) {
  std::vector<size_t> out_dims = t.dims();
  for (size_t d : dims) out_dims[d] = 1;
  auto backend = [&] { return backend_of(t).reduce(kind, t.layout(), dims); };
  if (!rec_kind) return run_op({&t}, Shape(out_dims), backend);
  return run_op({&t}, Shape(out_dims), backend, [&] {
    BackpropOp rec{*rec_kind, {t}};
    rec.dims = dims;
    return rec;
  });
}

Tensor drop_dims(const Tensor& t, const std::vector<size_t>& dims) {
  std::vector<size_t> out;
  for (size_t i = 0; i < t.rank(); ++i) {
    if (!std::binary_search(dims.begin(), dims.end(), i)) out.push_back(t.dims()[i]);
  }
  return t.reshape(Shape(out));
}

// max, min, argmax, argmin over one non-empty dim.
Tensor reduce_one(ReduceKind kind, const Tensor& t, size_t dim) {
  const char* op = reduce_name(kind);
  check_dim(op, t, dim);
  if (t.dims()[dim] == 0) {
    throw ShapeMismatch(str(op, ": cannot reduce the empty dim ", dim, " of shape ", t.shape()));
  }
  std::optional<OpKind> rec_kind;
  if (kind == ReduceKind::Max) rec_kind = OpKind::Max;
  if (kind == ReduceKind::Min) rec_kind = OpKind::Min;
  return reduce_keepdim(kind, t, {dim}, rec_kind);
}

}  // namespace

Tensor Tensor::sum_keepdim(const std::vector<size_t>& dims) const {
  impl_of(*this, "sum");
  std::vector<size_t> d = reduce_dims("sum", *this, dims);
  if (d.empty()) return *this;
  return reduce_keepdim(ReduceKind::Sum, *this, d, OpKind::Sum);
}

Tensor Tensor::sum(const std::vector<size_t>& dims) const {
  return drop_dims(sum_keepdim(dims), reduce_dims("sum", *this, dims));
}

Tensor Tensor::mean_keepdim(const std::vector<size_t>& dims) const {
  impl_of(*this, "mean");
  check_float("mean", *this);
  std::vector<size_t> d = reduce_dims("mean", *this, dims);
  size_t count = 1;
  for (size_t i : d) count *= this->dims()[i];  // a sub-product of elem_count: cannot wrap
  // The mean of nothing is NaN (numpy, PyTorch): the empty sum 0 times NaN.
  double scale =
      count ? 1.0 / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
  return sum_keepdim(d).affine(scale, 0.0);
}

Tensor Tensor::mean(const std::vector<size_t>& dims) const {
  return drop_dims(mean_keepdim(dims), reduce_dims("mean", *this, dims));
}

Tensor Tensor::sum_all() const {
  std::vector<size_t> all(rank());
  std::iota(all.begin(), all.end(), 0);
  return sum(all);
}

Tensor Tensor::mean_all() const {
  std::vector<size_t> all(rank());
  std::iota(all.begin(), all.end(), 0);
  return mean(all);
}

Tensor Tensor::max_keepdim(size_t dim) const {
  return reduce_one(ReduceKind::Max, *this, dim);
}
Tensor Tensor::min_keepdim(size_t dim) const {
  return reduce_one(ReduceKind::Min, *this, dim);
}
Tensor Tensor::argmax_keepdim(size_t dim) const {
  return reduce_one(ReduceKind::ArgMax, *this, dim);
}
Tensor Tensor::argmin_keepdim(size_t dim) const {
  return reduce_one(ReduceKind::ArgMin, *this, dim);
}
Tensor Tensor::max(size_t dim) const {
  return max_keepdim(dim).squeeze(dim);
}
Tensor Tensor::min(size_t dim) const {
  return min_keepdim(dim).squeeze(dim);
}
Tensor Tensor::argmax(size_t dim) const {
  return argmax_keepdim(dim).squeeze(dim);
}
Tensor Tensor::argmin(size_t dim) const {
  return argmin_keepdim(dim).squeeze(dim);
}

Tensor Tensor::softmax(size_t dim) const {
  impl_of(*this, "softmax");
  check_dim("softmax", *this, dim);
  check_float("softmax", *this);
  size_t last = rank() - 1;
  if (dim != last) return transpose(dim, last).softmax(last).transpose(dim, last);
  Tensor x = contiguous();
  return run_op(
      {&x}, shape(), [&] { return backend_of(x).softmax_last_dim(x.layout()); },
      [&] {
        return BackpropOp{OpKind::Softmax, {x}};
      });
}

// ---- indexing ----

Tensor Tensor::index_select(const Tensor& ids, size_t dim) const {
  impl_of(*this, "index_select");
  impl_of(ids, "index_select");
  check_dim("index_select", *this, dim);
  check_ids("index_select", ids);
  check_same_device("index_select", *this, ids);
  if (ids.rank() != 1) {
    throw ShapeMismatch(str("index_select: ids must have rank 1, got shape ", ids.shape()));
  }
  std::vector<size_t> out_dims = dims();
  out_dims[dim] = ids.elem_count();
  check_output_bytes("index_select", Shape(out_dims), dtype(), device());
  return run_op(
      {this, &ids}, Shape(out_dims),
      [&] { return backend_of(*this).index_select(layout(), backend_of(ids), ids.layout(), dim); },
      [&] {
        BackpropOp rec{OpKind::IndexSelect, {*this, ids}};
        rec.dim = dim;
        return rec;
      });
}

Tensor Tensor::gather(const Tensor& ids, size_t dim) const {
  impl_of(*this, "gather");
  impl_of(ids, "gather");
  check_dim("gather", *this, dim);
  check_ids("gather", ids);
  check_same_device("gather", *this, ids);
  bool fits = ids.rank() == rank();
  for (size_t i = 0; fits && i < rank(); ++i) fits = i == dim || ids.dims()[i] == dims()[i];
  if (!fits) {
    throw ShapeMismatch(str("gather: ids shape ", ids.shape(), " does not fit shape ", shape(),
                            " outside dim ", dim));
  }
  return run_op(
      {this, &ids}, ids.shape(),
      [&] { return backend_of(*this).gather(layout(), backend_of(ids), ids.layout(), dim); },
      [&] {
        BackpropOp rec{OpKind::Gather, {*this, ids}};
        rec.dim = dim;
        return rec;
      });
}

Tensor Tensor::embedding(const Tensor& ids) const {
  impl_of(*this, "embedding");
  impl_of(ids, "embedding");
  if (rank() != 2) {
    throw ShapeMismatch(str("embedding: table must have rank 2, got shape ", shape()));
  }
  check_ids("embedding", ids);
  check_same_device("embedding", *this, ids);
  std::vector<size_t> out_dims = ids.dims();
  out_dims.push_back(dims()[1]);
  Shape out_shape(out_dims);
  check_output_bytes("embedding", out_shape, dtype(), device());
  Tensor rows;
  try {
    rows = index_select(ids.flatten_all(), 0);
  } catch (const IndexOutOfRange& e) {
    // The backend names the op it ran; the caller called embedding.
    std::string msg = e.what();
    if (msg.rfind("index_select", 0) == 0) msg.erase(0, std::string("index_select").size());
    throw IndexOutOfRange(str("embedding", msg, " (table ", shape(), ")"));
  }
  return rows.reshape(out_shape);
}

Tensor Tensor::index_add(const Tensor& ids, const Tensor& src, size_t dim) const {
  impl_of(*this, "index_add");
  impl_of(ids, "index_add");
  impl_of(src, "index_add");
  check_dim("index_add", *this, dim);
  check_ids("index_add", ids);
  check_same_dtype("index_add", *this, src);
  check_same_device("index_add", *this, ids);
  check_same_device("index_add", *this, src);
  std::vector<size_t> expected = dims();
  if (ids.rank() == 1) expected[dim] = ids.elem_count();
  if (ids.rank() != 1 || src.dims() != expected) {
    throw ShapeMismatch(str("index_add: ids ", ids.shape(), " and src ", src.shape(),
                            " do not fit shape ", shape(), " along dim ", dim));
  }
  return run_op(
      {this, &ids, &src}, shape(),
      [&] {
        return backend_of(*this).index_add(layout(), backend_of(ids), ids.layout(), backend_of(src),
                                           src.layout(), dim);
      },
      [&] {
        BackpropOp rec{OpKind::IndexAdd, {*this, ids, src}};
        rec.dim = dim;
        return rec;
      });
}

Tensor Tensor::scatter_add(const Tensor& ids, const Tensor& src, size_t dim) const {
  impl_of(*this, "scatter_add");
  impl_of(ids, "scatter_add");
  impl_of(src, "scatter_add");
  check_dim("scatter_add", *this, dim);
  check_ids("scatter_add", ids);
  check_same_dtype("scatter_add", *this, src);
  check_same_device("scatter_add", *this, ids);
  check_same_device("scatter_add", *this, src);
  bool fits = ids.shape() == src.shape() && ids.rank() == rank();
  for (size_t i = 0; fits && i < rank(); ++i) fits = i == dim || ids.dims()[i] == dims()[i];
  if (!fits) {
    throw ShapeMismatch(str("scatter_add: ids ", ids.shape(), " and src ", src.shape(),
                            " do not fit shape ", shape(), " along dim ", dim));
  }
  return run_op(
      {this, &ids, &src}, shape(),
      [&] {
        return backend_of(*this).scatter_add(layout(), backend_of(ids), ids.layout(),
                                             backend_of(src), src.layout(), dim);
      },
      [&] {
        BackpropOp rec{OpKind::ScatterAdd, {*this, ids, src}};
        rec.dim = dim;
        return rec;
      });
}

}  // namespace wick
