#pragma once
// Helpers shared by the Tensor front-end sources (tensor.cpp, tensor_ops.cpp).

#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "tensor_impl.h"
#include "util.h"

namespace wick::detail {

/// Throws wick::Error when `t` is an empty handle.
const TensorImpl& impl_of(const Tensor& t, const char* op);

/// A fresh tensor owning `storage`, row-major with `shape`.
Tensor from_storage(StoragePtr storage, const Shape& shape);

/// A view of `t`'s storage with another layout (no recording).
Tensor view_of(const Tensor& t, Layout layout);

/// The tensor operands of an op (every one defined).
using Inputs = std::span<const Tensor* const>;

/// True when an op on `inputs` must record itself: recording is on and an input is tracked.
/// Hot ops test this first so that untracked ops build no BackpropOp.
bool should_record(Inputs inputs);
inline bool should_record(std::initializer_list<const Tensor*> inputs) {
  return should_record(Inputs(inputs.begin(), inputs.size()));
}

/// The backend storage of a tensor.
inline BackendStorage& backend_of(const Tensor& t) {
  return t.impl()->storage->backend();
}

/// Shared read locks on the storages of `tensors`, each locked once.
ReadLocks read_locks(Inputs tensors);
inline ReadLocks read_locks(std::initializer_list<const Tensor*> tensors) {
  return read_locks(Inputs(tensors.begin(), tensors.size()));
}

/// The one op path, after the front-end checks: takes the shared locks of `inputs` (each
/// distinct storage once), calls `backend()` (which returns the output StoragePtr) while they are
/// held, wraps the result as a fresh row-major tensor of `shape`, and records `make_record()` (a
/// BackpropOp) only when recording is on and an input is tracked, so untracked ops build none.
template <class Backend, class MakeRecord>
Tensor run_op(Inputs inputs, const Shape& shape, Backend&& backend, MakeRecord&& make_record) {
  StoragePtr out;
  {
    auto locks = read_locks(inputs);
    out = backend();
  }
  Tensor result = from_storage(std::move(out), shape);
  if (!should_record(inputs)) return result;
  return record(std::move(result), make_record());
}
template <class Backend, class MakeRecord>
Tensor run_op(std::initializer_list<const Tensor*> inputs, const Shape& shape, Backend&& backend,
              MakeRecord&& make_record) {
  return run_op(Inputs(inputs.begin(), inputs.size()), shape, std::forward<Backend>(backend),
                std::forward<MakeRecord>(make_record));
}

/// Records `make_record()` (a BackpropOp) on `out` only when recording is on and an input is
/// tracked: views and copies of untracked tensors build no record.
template <class MakeRecord>
Tensor record_if_tracked(Tensor out, std::initializer_list<const Tensor*> inputs,
                         MakeRecord&& make_record) {
  if (!should_record(inputs)) return out;
  return record(std::move(out), make_record());
}

/// run_op for an op that is not differentiable (comparisons, argmax): nothing is recorded.
template <class Backend>
Tensor run_op(std::initializer_list<const Tensor*> inputs, const Shape& shape, Backend&& backend) {
  StoragePtr out;
  {
    auto locks = read_locks(inputs);
    out = backend();
  }
  return from_storage(std::move(out), shape);
}

/// Bytes of `count` host elements; BackendError naming `op` when they overflow or exceed the
/// machine's physical memory (so huge requests fail cleanly, before any allocation).
size_t check_host_bytes(const char* op, size_t count, size_t elem_size);
/// BackendError naming `op` when `shape` elements of `dtype` take more than 2^64 bytes, or, on
/// the CPU, more than the machine's physical memory (checked before the backend allocates, so
/// the answer does not depend on the kernel's overcommit policy or on a sanitizer's allocator).
void check_output_bytes(const char* op, const Shape& shape, DType dtype, const Device& device);

void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_same_dtype(const char* op, const Tensor& a, const Tensor& b);
/// Throws IndexOutOfRange unless dim < rank.
void check_dim(const char* op, const Tensor& t, size_t dim);
/// numpy-style broadcast of two shapes; ShapeMismatch naming `op` when impossible.
Shape broadcast_shape(const char* op, const Shape& lhs, const Shape& rhs);

}  // namespace wick::detail
