// Tensor: creation, inspection, read-back, views and copies. Each method checks its inputs, then
// makes one backend call (or none, for views).

#include "wick/tensor.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <new>
#include <numeric>

#include "checked.h"
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

bool should_record(Inputs inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t->is_tracked()) return true;
  }
  return false;
}

ReadLocks read_locks(Inputs tensors) {
  constexpr size_t kFew = 8;  // ops have a few operands: no allocation for them
  if (tensors.size() <= kFew) {
    const Storage* storages[kFew];
    size_t n = 0;
    for (const Tensor* t : tensors) storages[n++] = t->impl()->storage.get();
    return ReadLocks(std::span<const Storage* const>(storages, n));
  }
  std::vector<const Storage*> storages;
  for (const Tensor* t : tensors) storages.push_back(t->impl()->storage.get());
  return ReadLocks(storages);
}

size_t physical_memory_bytes() {
  static const size_t bytes = [] {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return std::numeric_limits<size_t>::max();
    size_t out;
    if (__builtin_mul_overflow(static_cast<size_t>(pages), static_cast<size_t>(page), &out)) {
      return std::numeric_limits<size_t>::max();
    }
    return out;
  }();
  return bytes;
}

size_t check_host_bytes(const char* op, size_t count, size_t elem_size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, elem_size, &bytes)) {
    throw BackendError(str(op, ": ", count, " elements of ", elem_size,
                           " bytes overflow 64 bits; cannot allocate them in host memory"));
  }
  if (bytes > physical_memory_bytes()) {
    throw BackendError(str(op, ": out of memory, ", bytes, " bytes (", count,
                           " elements) of host memory asked, the machine has ",
                           physical_memory_bytes()));
  }
  return bytes;
}

void check_output_bytes(const char* op, const Shape& shape, DType dtype, const Device& device) {
  size_t bytes;
  if (__builtin_mul_overflow(shape.elem_count(), size_in_bytes(dtype), &bytes)) {
    throw BackendError(str(op, ": the result ", shape, " ", dtype,
                           " needs more than 2^64 bytes; cannot allocate it"));
  }
  if (device.is_cpu() && bytes > physical_memory_bytes()) {
    throw BackendError(str(op, ": out of memory, the result ", shape, " ", dtype, " needs ", bytes,
                           " bytes, the machine has ", physical_memory_bytes()));
  }
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
  check_output_bytes("full", shape, dtype, device);
  return from_storage(backend_device(device).filled(shape.elem_count(), dtype, value), shape);
}

Tensor Tensor::arange_impl(double start, double end, double step, DType dtype,
                           const Device& device) {
  if (step == 0 || !std::isfinite(step) || !std::isfinite(start) || !std::isfinite(end)) {
    throw Error(str("arange: invalid range start ", start, " end ", end, " step ", step));
  }
  // Compared in double before any cast: a count past 2^63 (or inf) has no size_t value.
  double span = std::ceil((end - start) / step);
  if (!(span < 0x1p63)) {
    throw Error(str("arange: [", start, ", ", end, ") in steps of ", step, " has ", span,
                    " elements, too many for a tensor"));
  }
  size_t count = span > 0 ? static_cast<size_t>(span) : 0;
  check_host_bytes("arange", count, size_in_bytes(dtype));
  return dispatch(dtype, [&]<class T>() {
    std::vector<T> values = host_vector<T>(count, "arange");
    for (size_t i = 0; i < count; ++i) {
      double v = start + static_cast<double>(i) * step;
      if constexpr (std::is_integral_v<T>) {
        values[i] = saturate_to_int<T>(v);
      } else {
        values[i] = T(v);
      }
    }
    return from_vec(values, Shape{count}, device);
  });
}

Tensor Tensor::arange_int(int64_t start, int64_t end, int64_t step, DType dtype,
                          const Device& device) {
  if (step == 0) throw Error(str("arange: step is 0 (start ", start, ", end ", end, ")"));
  // In 128 bits: end - start and the count cannot wrap; values are exact (no trip through double).
  __int128 span = static_cast<__int128>(end) - start;
  __int128 count128 = 0;
  if ((span > 0 && step > 0) || (span < 0 && step < 0)) {
    __int128 abs_span = span > 0 ? span : -span;
    __int128 abs_step = step > 0 ? __int128{step} : -__int128{step};
    count128 = (abs_span + abs_step - 1) / abs_step;
  }
  // At most 2^64 - 1 (a span of 2^64 - 1 in steps of 1): fits size_t.
  size_t count = static_cast<size_t>(count128);
  check_host_bytes("arange", count, size_in_bytes(dtype));
  return dispatch(dtype, [&]<class T>() {
    if constexpr (std::is_integral_v<T>) {
      std::vector<T> values = host_vector<T>(count, "arange");
      for (size_t i = 0; i < count; ++i) {
        values[i] = static_cast<T>(start + static_cast<__int128>(i) * step);  // within [start, end)
      }
      return from_vec(values, Shape{count}, device);
    } else {
      throw Error(str("arange: internal error, integer arange of dtype ", dtype));
      return Tensor();
    }
  });
}

Tensor Tensor::from_bytes(const void* data, size_t count, DType dtype, const Shape& shape,
                          const Device& device) {
  if (count != shape.elem_count()) {
    throw ShapeMismatch(str("from_vec: ", count, " elements cannot fill shape ", shape, " (",
                            shape.elem_count(), " elements)"));
  }
  check_output_bytes("from_vec", shape, dtype, device);
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
  check_output_bytes(op, shape, dtype, device);
  BackendDevice& dev = backend_device(device);
  size_t n = shape.elem_count();
  return from_storage(normal ? dev.rand_normal(n, dtype, a, b) : dev.rand_uniform(n, dtype, a, b),
                      shape);
}

Tensor Tensor::randn(double mean, double std, const Shape& shape, const Device& device,
                     DType dtype) {
  return random_impl(true, mean, std, dtype, shape, device);
}

Tensor Tensor::rand(double lo, double hi, const Shape& shape, const Device& device, DType dtype) {
  return random_impl(false, lo, hi, dtype, shape, device);
}

Tensor Tensor::randn(const Shape& shape, DType dtype, const Device& device) {
  return random_impl(true, 0.0, 1.0, dtype, shape, device);
}

Tensor Tensor::rand(const Shape& shape, DType dtype, const Device& device) {
  return random_impl(false, 0.0, 1.0, dtype, shape, device);
}

void Tensor::throw_literal_range(const char* op, uint64_t value) {
  throw Error(str(op, ": the unsigned value ", value,
                  " does not fit i64, the dtype of a plain integer (at most 2^63 - 1)"));
}

void Tensor::throw_negative_dim(const char* op, int64_t dim) {
  throw IndexOutOfRange(str(op, ": dim ", dim, " is negative (dims count from 0)"));
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
  check_host_bytes(op, elem_count(), size_in_bytes(self.dtype));
  return elem_count();
}

void Tensor::throw_out_of_memory(const char* op, size_t count, size_t elem_size) {
  throw BackendError(
      str(op, ": out of memory allocating ", count, " x ", elem_size, " bytes of host memory"));
}

void Tensor::read_into(void* dst) const {
  auto locks = read_locks({this});
  backend_of(*this).copy_to_host(layout(), dst);
}

std::vector<double> Tensor::to_vec_f64() const {
  check_host_bytes("to_vec_f64", elem_count(), sizeof(double));
  Tensor t = to_dtype(DType::F64);
  std::vector<double> out = host_vector<double>(elem_count(), "to_vec_f64");
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
  return record_if_tracked(out, {this}, [&] { return BackpropOp{OpKind::Reshape, {*this}}; });
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
  return record_if_tracked(out, {this}, [&] {
    BackpropOp op{OpKind::Permute, {*this}};
    op.dims = order;
    return op;
  });
}

Tensor Tensor::narrow(size_t dim, size_t start, size_t len) const {
  check_dim("narrow", *this, dim);
  if (start > dims()[dim] || len > dims()[dim] - start) {
    // start + len may not fit in 64 bits: print the two, not their sum.
    throw IndexOutOfRange(str("narrow: start ", start, " and length ", len,
                              " out of bounds for dim ", dim, " (size ", dims()[dim], ") of shape ",
                              shape()));
  }
  std::vector<size_t> dims = this->dims();
  dims[dim] = len;
  size_t offset = layout().start_offset() + (len > 0 ? start * layout().strides()[dim] : 0);
  Tensor out = view_of(*this, Layout(Shape(dims), layout().strides(), offset));
  return record_if_tracked(out, {this}, [&] {
    BackpropOp op{OpKind::Narrow, {*this}};
    op.dim = dim;
    op.start = start;
    return op;
  });
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
  return record_if_tracked(out, {this}, [&] { return BackpropOp{OpKind::Reshape, {*this}}; });
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
  return record_if_tracked(out, {this}, [&] { return BackpropOp{OpKind::Reshape, {*this}}; });
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
  return record_if_tracked(out, {this}, [&] { return BackpropOp{OpKind::BroadcastAs, {*this}}; });
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
  check_output_bytes("copy", shape(), self.dtype, self.device);
  StoragePtr out = backend_device(self.device).alloc(elem_count(), self.dtype);
  {
    auto locks = read_locks({this});
    backend_of(*this).copy_into(self.layout, *out, Layout::contiguous(shape()));
  }
  return record_if_tracked(from_storage(std::move(out), shape()), {this}, [&] {
    return BackpropOp{OpKind::Copy, {*this}};
  });
}

Tensor Tensor::to_device(const Device& device) const {
  const TensorImpl& self = impl_of(*this, "to_device");
  if (device == self.device) return *this;
  check_host_bytes("to_device", elem_count(), size_in_bytes(self.dtype));
  std::vector<uint8_t> host =
      host_vector<uint8_t>(elem_count() * size_in_bytes(self.dtype), "to_device");
  read_into(host.data());
  Tensor out = from_storage(backend_device(device).from_host(host.data(), elem_count(), self.dtype),
                            shape());
  return record_if_tracked(out, {this}, [&] { return BackpropOp{OpKind::ToDevice, {*this}}; });
}

Tensor Tensor::to_dtype(DType dtype) const {
  const TensorImpl& self = impl_of(*this, "to_dtype");
  if (dtype == self.dtype) return *this;
  check_output_bytes("to_dtype", shape(), dtype, self.device);
  return run_op(
      {this}, shape(), [&] { return backend_of(*this).to_dtype(self.layout, dtype); },
      [&] {
        return BackpropOp{OpKind::ToDType, {*this}};
      });
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
    dims[dim] = checked_add(dims[dim], t.dims()[dim], "cat");
  }
  Shape shape(dims);
  check_output_bytes("cat", shape, first.dtype(), first.device());
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
  Tensor result = from_storage(std::move(out), shape);
  if (!grad_enabled() || std::none_of(tensors.begin(), tensors.end(),
                                      [](const Tensor& t) { return t.is_tracked(); })) {
    return result;
  }
  BackpropOp op{OpKind::Cat, tensors};
  op.dim = dim;
  return record(std::move(result), std::move(op));
}

Tensor Tensor::stack(const std::vector<Tensor>& tensors, size_t dim) {
  if (tensors.empty()) throw ShapeMismatch("stack: no tensors given");
  for (const Tensor& t : tensors) impl_of(t, "stack");
  if (dim > tensors[0].rank()) {
    throw IndexOutOfRange(str("stack: dim ", dim, " out of range for shape ", tensors[0].shape()));
  }
  std::vector<Tensor> parts;
  for (const Tensor& t : tensors) {
    if (t.shape() != tensors[0].shape()) {
      throw ShapeMismatch(str("stack: shapes differ, ", tensors[0].shape(), " and ", t.shape()));
    }
    check_same_dtype("stack", tensors[0], t);
    check_same_device("stack", tensors[0], t);
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
  // Both locks at once, in the global order: a.assign(b) against b.assign(a) cannot deadlock.
  StorageLocks locks({src.impl()->storage.get()}, {self.storage.get()});
  backend_of(src).copy_into(src.layout(), self.storage->backend(), self.layout);
  // Recorded ops that saved this storage now hold stale values: backward through them throws.
  self.storage->bump_version();
}

// ---- printing ----

namespace {

constexpr size_t kPrintEdge = 3;          // items shown at each end of a long dim
constexpr size_t kPrintMaxValues = 1000;  // values read in all, whatever the rank

// Prints `t` (a view) reading only the elements shown, one narrow view at a time, so that a
// [7, 4e9] broadcast view costs a few small reads. `budget` bounds the reads for high ranks.
void print_view(std::ostream& os, const Tensor& t, bool is_int, size_t& budget) {
  if (t.rank() == 0) {
    if (is_int) {
      os << t.to_dtype(DType::I64).to_scalar<int64_t>();
    } else {
      os << t.to_dtype(DType::F64).to_scalar<double>();
    }
    --budget;
    return;
  }
  size_t n = t.dims()[0];
  bool cut = n > 2 * kPrintEdge;
  size_t shown = cut ? 2 * kPrintEdge : n;
  os << '[';
  for (size_t k = 0; k < shown; ++k) {
    if (k) os << ", ";
    if (cut && k == kPrintEdge) os << "..., ";
    if (budget == 0) {
      os << "...";
      break;
    }
    size_t i = cut && k >= kPrintEdge ? n - shown + k : k;
    print_view(os, t.get(i), is_int, budget);
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  NoGradGuard no_grad;
  size_t budget = kPrintMaxValues;
  os << "Tensor(";
  print_view(os, t.detach(), !is_float(t.dtype()), budget);
  return os << ", shape=" << t.shape() << ", dtype=" << t.dtype() << ", device=" << t.device()
            << ')';
}

}  // namespace wick
