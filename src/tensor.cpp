// Tensor: creation, inspection, read-back, views and copies. Each method checks its inputs, then
// makes one backend call (or none, for views).

#include "wick/tensor.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dispatch.h"
#include "tensor_internal.h"
#include "wick/autograd.h"

namespace wick {

namespace detail {

const TensorImpl& impl_of(const Tensor& t, const char* op) {
  if (!t.impl()) throw Error(str(op, ": called on an empty tensor handle"));
  return *t.impl();
}

Tensor from_storage(StoragePtr storage, const Shape& shape) {
  auto impl = std::make_shared<TensorImpl>(TensorImpl{TensorImpl::next_id(), nullptr,
                                                      Layout::contiguous(shape), storage->dtype(),
                                                      storage->device(), nullptr, false});
  impl->storage = std::make_shared<Storage>(std::move(storage));
  return Tensor(std::move(impl));
}

Tensor view_of(const Tensor& t, Layout layout) {
  const TensorImpl& src = *t.impl();
  return Tensor(
      std::make_shared<TensorImpl>(TensorImpl{TensorImpl::next_id(), src.storage, std::move(layout),
                                              src.dtype, src.device, nullptr, false}));
}

bool should_record(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t->is_tracked()) return true;
  }
  return false;
}

ReadLocks read_locks(std::initializer_list<const Tensor*> tensors) {
  std::vector<const Storage*> storages;
  for (const Tensor* t : tensors) storages.push_back(t->impl()->storage.get());
  return ReadLocks(std::move(storages));
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  if (a.device() != b.device()) {
    throw DeviceMismatch(str(op, ": device mismatch, lhs ", a.device(), " ", a.shape(), ", rhs ",
                             b.device(), " ", b.shape()));
  }
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    throw DTypeMismatch(str(op, ": dtype mismatch, lhs ", a.dtype(), " ", a.shape(), ", rhs ",
                            b.dtype(), " ", b.shape()));
  }
}

void check_dim(const char* op, const Tensor& t, size_t dim) {
  if (dim >= t.rank()) {
    throw IndexOutOfRange(
        str(op, ": dim ", dim, " out of range for shape ", t.shape(), " (rank ", t.rank(), ")"));
  }
}

Shape broadcast_shape(const char* op, const Shape& lhs, const Shape& rhs) {
  size_t rank = std::max(lhs.rank(), rhs.rank());
  std::vector<size_t> dims(rank);
  for (size_t i = 0; i < rank; ++i) {
    size_t l = i < rank - lhs.rank() ? 1 : lhs[i - (rank - lhs.rank())];
    size_t r = i < rank - rhs.rank() ? 1 : rhs[i - (rank - rhs.rank())];
    if (l != r && l != 1 && r != 1) {
      throw ShapeMismatch(str(op, ": shapes cannot be broadcast, lhs ", lhs, ", rhs ", rhs));
    }
    dims[i] = l == 1 ? r : l;
  }
  return Shape(std::move(dims));
}

}  // namespace detail

using namespace detail;

// ---- creation ----

Tensor Tensor::zeros(const Shape& shape, DType dtype, const Device& device) {
  uint64_t zero = 0;  // all-zero bytes are zero in every dtype
  return full_bytes(&zero, dtype, shape, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, const Device& device) {
  return dispatch(dtype, [&]<class T>() { return full(T(1), shape, device); });
}

Tensor Tensor::full_bytes(const void* value, DType dtype, const Shape& shape,
                          const Device& device) {
  return from_storage(backend_device(device).filled(shape.elem_count(), dtype, value), shape);
}

Tensor Tensor::arange_impl(double start, double end, double step, DType dtype,
                           const Device& device) {
  if (step == 0 || !std::isfinite(step) || !std::isfinite(start) || !std::isfinite(end)) {
    throw Error(str("arange: invalid range start ", start, " end ", end, " step ", step));
  }
  double span = (end - start) / step;
  size_t count = span > 0 ? static_cast<size_t>(std::ceil(span)) : 0;
  return dispatch(dtype, [&]<class T>() {
    std::vector<T> values(count);
    for (size_t i = 0; i < count; ++i) values[i] = T(start + static_cast<double>(i) * step);
    return from_vec(values, Shape{count}, device);
  });
}

Tensor Tensor::from_bytes(const void* data, size_t count, DType dtype, const Shape& shape,
                          const Device& device) {
  if (count != shape.elem_count()) {
    throw ShapeMismatch(str("from_vec: ", count, " elements cannot fill shape ", shape, " (",
                            shape.elem_count(), " elements)"));
  }
  return from_storage(backend_device(device).from_host(data, count, dtype), shape);
}

Tensor Tensor::random_impl(bool normal, double a, double b, DType dtype, const Shape& shape,
                           const Device& device) {
  const char* op = normal ? "randn" : "rand";
  if (!is_float(dtype)) {
    throw UnsupportedDType(str(op, ": unsupported dtype ", dtype, " (float dtypes only)"));
  }
  if (normal ? !(b >= 0) : !(a <= b)) {
    throw Error(str(op, ": invalid parameters ", a, ", ", b));
  }
  BackendDevice& dev = backend_device(device);
  size_t n = shape.elem_count();
  return from_storage(normal ? dev.rand_normal(n, dtype, a, b) : dev.rand_uniform(n, dtype, a, b),
                      shape);
}

// ---- inspection ----

const Shape& Tensor::shape() const {
  return impl_of(*this, "shape").layout.shape();
}
size_t Tensor::dim(size_t i) const {
  check_dim("dim", *this, i);
  return dims()[i];
}
DType Tensor::dtype() const {
  return impl_of(*this, "dtype").dtype;
}
Device Tensor::device() const {
  return impl_of(*this, "device").device;
}
const Layout& Tensor::layout() const {
  return impl_of(*this, "layout").layout;
}
uint64_t Tensor::id() const {
  return impl_of(*this, "id").id;
}
bool Tensor::same_storage(const Tensor& other) const {
  return impl_ && other.impl_ && impl_->storage == other.impl_->storage;
}

// ---- read-back ----

size_t Tensor::checked_read_size(DType requested, int rank, const char* op) const {
  const TensorImpl& self = impl_of(*this, op);
  if (requested != self.dtype) {
    throw DTypeMismatch(
        str(op, ": tensor dtype is ", self.dtype, ", requested ", dtype_name(requested)));
  }
  if (rank < 0 ? elem_count() != 1 : this->rank() != static_cast<size_t>(rank)) {
    throw ShapeMismatch(rank < 0
                            ? str(op, ": expected one element, tensor has shape ", shape())
                            : str(op, ": expected rank ", rank, ", tensor has shape ", shape()));
  }
  return elem_count();
}

void Tensor::read_into(void* dst) const {
  auto locks = read_locks({this});
  backend_of(*this).copy_to_host(layout(), dst);
}

std::vector<double> Tensor::to_vec_f64() const {
  Tensor t = to_dtype(DType::F64);
  std::vector<double> out(elem_count());
  t.read_into(out.data());
  return out;
}

// ---- views ----

Tensor Tensor::reshape(const Shape& shape) const {
  impl_of(*this, "reshape");
  if (shape.elem_count() != elem_count()) {
    throw ShapeMismatch(str("reshape: cannot reshape ", this->shape(), " (", elem_count(),
                            " elements) into ", shape, " (", shape.elem_count(), " elements)"));
  }
  Tensor src = is_contiguous() ? *this : contiguous();
  Tensor out = view_of(src, Layout::contiguous(shape, src.layout().start_offset()));
  return record(out, BackpropOp{OpKind::Reshape, {*this}});
}

Tensor Tensor::transpose(size_t dim1, size_t dim2) const {
  check_dim("transpose", *this, dim1);
  check_dim("transpose", *this, dim2);
  std::vector<size_t> order(rank());
  std::iota(order.begin(), order.end(), 0);
  std::swap(order[dim1], order[dim2]);
  return permute(order);
}

Tensor Tensor::t() const {
  if (rank() < 2) throw ShapeMismatch(str("t: needs rank >= 2, got shape ", shape()));
  return transpose(rank() - 2, rank() - 1);
}

Tensor Tensor::permute(const std::vector<size_t>& order) const {
  impl_of(*this, "permute");
  std::vector<bool> seen(rank(), false);
  bool valid = order.size() == rank();
  for (size_t d : order) {
    if (!valid || d >= rank() || seen[d]) {
      valid = false;
      break;
    }
    seen[d] = true;
  }
  if (!valid) {
    throw ShapeMismatch(
        str("permute: ", vec_str(order), " is not a permutation of the dims of ", shape()));
  }
  std::vector<size_t> dims(rank()), strides(rank());
  for (size_t i = 0; i < rank(); ++i) {
    dims[i] = this->dims()[order[i]];
    strides[i] = layout().strides()[order[i]];
  }
  Tensor out = view_of(*this, Layout(Shape(dims), strides, layout().start_offset()));
  BackpropOp op{OpKind::Permute, {*this}};
  op.dims = order;
  return record(out, std::move(op));
}

Tensor Tensor::narrow(size_t dim, size_t start, size_t len) const {
  check_dim("narrow", *this, dim);
  if (start > dims()[dim] || len > dims()[dim] - start) {
    throw IndexOutOfRange(str("narrow: range [", start, ", ", start + len,
                              ") out of bounds for dim ", dim, " of shape ", shape()));
  }
  std::vector<size_t> dims = this->dims();
  dims[dim] = len;
  size_t offset = layout().start_offset() + (len > 0 ? start * layout().strides()[dim] : 0);
  Tensor out = view_of(*this, Layout(Shape(dims), layout().strides(), offset));
  BackpropOp op{OpKind::Narrow, {*this}};
  op.dim = dim;
  op.start = start;
  return record(out, std::move(op));
}

Tensor Tensor::get(size_t i) const {
  if (rank() == 0) throw ShapeMismatch("get: cannot index a rank-0 tensor");
  if (i >= dims()[0]) {
    throw IndexOutOfRange(str("get: index ", i, " out of range for dim 0 of shape ", shape()));
  }
  return narrow(0, i, 1).squeeze(0);
}

Tensor Tensor::squeeze(size_t dim) const {
  check_dim("squeeze", *this, dim);
  if (dims()[dim] != 1) {
    throw ShapeMismatch(
        str("squeeze: dim ", dim, " of shape ", shape(), " has size ", dims()[dim], ", not 1"));
  }
  std::vector<size_t> dims = this->dims(), strides = layout().strides();
  dims.erase(dims.begin() + dim);
  strides.erase(strides.begin() + dim);
  Tensor out = view_of(*this, Layout(Shape(dims), strides, layout().start_offset()));
  return record(out, BackpropOp{OpKind::Reshape, {*this}});
}

Tensor Tensor::unsqueeze(size_t dim) const {
  impl_of(*this, "unsqueeze");
  if (dim > rank()) {
    throw IndexOutOfRange(str("unsqueeze: dim ", dim, " out of range for shape ", shape(),
                              " (at most ", rank(), ")"));
  }
  std::vector<size_t> dims = this->dims(), strides = layout().strides();
  size_t stride = dim < rank() ? strides[dim] * dims[dim] : 1;
  dims.insert(dims.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  Tensor out = view_of(*this, Layout(Shape(dims), strides, layout().start_offset()));
  return record(out, BackpropOp{OpKind::Reshape, {*this}});
}

Tensor Tensor::broadcast_as(const Shape& shape) const {
  impl_of(*this, "broadcast_as");
  if (shape == this->shape()) return *this;
  size_t rank = shape.rank();
  bool ok = rank >= this->rank();
  std::vector<size_t> strides(rank, 0);
  for (size_t i = 0; ok && i < this->rank(); ++i) {
    size_t src = this->rank() - 1 - i, dst = rank - 1 - i;
    if (dims()[src] == shape[dst]) {
      strides[dst] = layout().strides()[src];
    } else if (dims()[src] != 1) {
      ok = false;
    }
  }
  if (!ok)
    throw ShapeMismatch(str("broadcast_as: cannot broadcast ", this->shape(), " to ", shape));
  Tensor out = view_of(*this, Layout(shape, strides, layout().start_offset()));
  return record(out, BackpropOp{OpKind::BroadcastAs, {*this}});
}

Tensor Tensor::broadcast_left(const Shape& left) const {
  std::vector<size_t> dims = left.dims();
  dims.insert(dims.end(), this->dims().begin(), this->dims().end());
  return broadcast_as(Shape(dims));
}

Tensor Tensor::flatten_all() const {
  return reshape(Shape{elem_count()});
}

Tensor Tensor::detach() const {
  return view_of(*this, impl_of(*this, "detach").layout);
}

// ---- copies ----

Tensor Tensor::contiguous() const {
  if (impl_of(*this, "contiguous").layout.is_contiguous()) return *this;
  return copy();
}

Tensor Tensor::copy() const {
  const TensorImpl& self = impl_of(*this, "copy");
  StoragePtr out = backend_device(self.device).alloc(elem_count(), self.dtype);
  {
    auto locks = read_locks({this});
    backend_of(*this).copy_into(self.layout, *out, Layout::contiguous(shape()));
  }
  return record(from_storage(std::move(out), shape()), BackpropOp{OpKind::Copy, {*this}});
}

Tensor Tensor::to_device(const Device& device) const {
  const TensorImpl& self = impl_of(*this, "to_device");
  if (device == self.device) return *this;
  std::vector<uint8_t> host(elem_count() * size_in_bytes(self.dtype));
  read_into(host.data());
  Tensor out = from_storage(backend_device(device).from_host(host.data(), elem_count(), self.dtype),
                            shape());
  return record(out, BackpropOp{OpKind::ToDevice, {*this}});
}

Tensor Tensor::to_dtype(DType dtype) const {
  const TensorImpl& self = impl_of(*this, "to_dtype");
  if (dtype == self.dtype) return *this;
  StoragePtr out;
  {
    auto locks = read_locks({this});
    out = backend_of(*this).to_dtype(self.layout, dtype);
  }
  return record(from_storage(std::move(out), shape()), BackpropOp{OpKind::ToDType, {*this}});
}

Tensor Tensor::cat(const std::vector<Tensor>& tensors, size_t dim) {
  if (tensors.empty()) throw ShapeMismatch("cat: no tensors given");
  const Tensor& first = tensors[0];
  check_dim("cat", first, dim);
  std::vector<size_t> dims = first.dims();
  dims[dim] = 0;
  for (const Tensor& t : tensors) {
    check_same_dtype("cat", first, t);
    check_same_device("cat", first, t);
    bool fits = t.rank() == first.rank();
    for (size_t i = 0; fits && i < t.rank(); ++i) fits = i == dim || t.dims()[i] == first.dims()[i];
    if (!fits) {
      throw ShapeMismatch(
          str("cat: shapes ", first.shape(), " and ", t.shape(), " differ outside dim ", dim));
    }
    dims[dim] += t.dims()[dim];
  }
  Shape shape(dims);
  StoragePtr out = backend_device(first.device()).alloc(shape.elem_count(), first.dtype());
  Layout out_layout = Layout::contiguous(shape);
  size_t offset = 0;
  for (const Tensor& t : tensors) {
    std::vector<size_t> part_dims = dims;
    part_dims[dim] = t.dims()[dim];
    Layout part(Shape(part_dims), out_layout.strides(), offset * out_layout.strides()[dim]);
    auto locks = read_locks({&t});
    backend_of(t).copy_into(t.layout(), *out, part);
    offset += t.dims()[dim];
  }
  BackpropOp op{OpKind::Cat, tensors};
  op.dim = dim;
  return record(from_storage(std::move(out), shape), std::move(op));
}

Tensor Tensor::stack(const std::vector<Tensor>& tensors, size_t dim) {
  if (tensors.empty()) throw ShapeMismatch("stack: no tensors given");
  if (dim > tensors[0].rank()) {
    throw IndexOutOfRange(str("stack: dim ", dim, " out of range for shape ", tensors[0].shape()));
  }
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) {
    if (t.shape() != tensors[0].shape()) {
      throw ShapeMismatch(str("stack: shapes differ, ", tensors[0].shape(), " and ", t.shape()));
    }
    parts.push_back(t.unsqueeze(dim));
  }
  return cat(parts, dim);
}

// ---- autograd handles ----

Tensor Tensor::requires_grad() const {
  Tensor out = view_of(*this, impl_of(*this, "requires_grad").layout);
  out.impl_->is_variable = true;
  return out;
}

bool Tensor::is_tracked() const {
  return impl_ && (impl_->is_variable || impl_->op != nullptr);
}

void Tensor::assign(const Tensor& value) const {
  const TensorImpl& self = impl_of(*this, "assign");
  impl_of(value, "assign");
  if (value.shape() != shape()) {
    throw ShapeMismatch(str("assign: shape mismatch, target ", shape(), ", value ", value.shape()));
  }
  check_same_dtype("assign", *this, value);
  check_same_device("assign", *this, value);
  for (size_t i = 0; i < rank(); ++i) {
    // A broadcast target would have several values written to one element.
    if (self.layout.strides()[i] == 0 && dims()[i] > 1) {
      throw ShapeMismatch(
          str("assign: the target ", shape(), " is a broadcast view (dim ", i, " has stride 0)"));
    }
  }
  // A value that shares this storage may overlap the target: copy it out first.
  Tensor src = same_storage(value) ? value.detach().copy() : value;
  std::lock_guard<std::shared_mutex> write(self.storage->mutex());
  src.impl()->storage->mutex().lock_shared();
  try {
    backend_of(src).copy_into(src.layout(), self.storage->backend(), self.layout);
  } catch (...) {
    src.impl()->storage->mutex().unlock_shared();
    throw;
  }
  src.impl()->storage->mutex().unlock_shared();
}

// ---- printing ----

namespace {

// Keeps at most `edge` items at each end of every dim, so printing reads a bounded amount.
Tensor print_summary(const Tensor& t, size_t edge) {
  Tensor s = t;
  for (size_t d = 0; d < t.rank(); ++d) {
    size_t n = s.dims()[d];
    if (n > 2 * edge) s = Tensor::cat({s.narrow(d, 0, edge), s.narrow(d, n - edge, edge)}, d);
  }
  return s;
}

void print_values(std::ostream& os, const std::vector<double>& v, const Shape& full,
                  const Shape& shown, size_t dim, size_t& pos, size_t edge, bool is_int) {
  if (dim == shown.rank()) {
    double x = v[pos++];
    if (is_int) {
      os << static_cast<long long>(x);
    } else {
      os << x;
    }
    return;
  }
  os << '[';
  for (size_t i = 0; i < shown[dim]; ++i) {
    if (i) os << ", ";
    if (full[dim] > shown[dim] && i == edge) os << "..., ";
    print_values(os, v, full, shown, dim + 1, pos, edge, is_int);
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  constexpr size_t edge = 3;
  Tensor shown = print_summary(t.detach(), edge);
  std::vector<double> values = shown.to_vec_f64();
  size_t pos = 0;
  os << "Tensor(";
  print_values(os, values, t.shape(), shown.shape(), 0, pos, edge, !is_float(t.dtype()));
  return os << ", shape=" << t.shape() << ", dtype=" << t.dtype() << ", device=" << t.device()
            << ')';
}

}  // namespace wick
