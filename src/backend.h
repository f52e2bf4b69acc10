#pragma once
// The backend interface: one BackendStorage per buffer, one BackendDevice per device. Tensor and
// Storage validate every op before calling here, so backends trust shapes, dtypes and devices.
//
// Conventions: every op returning a storage returns a fresh row-major buffer holding the op's
// result for the given layouts; layouts may be strided, broadcast (stride 0) or offset.

#include <cstdint>
#include <memory>
#include <vector>

#include "ops.h"
#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/layout.h"

namespace wick {

class BackendStorage;
using StoragePtr = std::unique_ptr<BackendStorage>;
struct DecoderWeights;
class DecodePlan;

/// Sizes of one matmul: b batches of (m x k) times (k x n).
struct MatmulDims {
  size_t b, m, n, k;
};

/// One operand of a kernel: a storage and the layout of its elements; `storage` is null for an
/// absent optional operand.
struct KernelOperand {
  const BackendStorage* storage = nullptr;
  Layout layout;
};

class BackendStorage {
 public:
  virtual ~BackendStorage() = default;
  virtual Device device() const = 0;
  virtual DType dtype() const = 0;
  /// Capacity in elements.
  virtual size_t elem_count() const = 0;

  /// Copies the elements of `layout`, in row-major order, to host memory at `dst`.
  virtual void copy_to_host(const Layout& layout, void* dst) const = 0;
  /// Writes the elements of `src` (this storage, layout `src_layout`) into `dst` at `dst_layout`
  /// (same shape and dtype, same device).
  virtual void copy_into(const Layout& src_layout, BackendStorage& dst,
                         const Layout& dst_layout) const = 0;
  virtual StoragePtr to_dtype(const Layout& layout, DType dtype) const = 0;

  virtual StoragePtr unary(const UnaryOp& op, const Layout& layout) const = 0;
  /// Both layouts have the same shape (broadcasting is done with stride 0 before the call).
  virtual StoragePtr binary(BinaryKind op, const Layout& layout, const BackendStorage& rhs,
                            const Layout& rhs_layout) const = 0;
  /// Result dtype U8.
  virtual StoragePtr cmp(CmpKind op, const Layout& layout, const BackendStorage& rhs,
                         const Layout& rhs_layout) const = 0;
  /// This storage is the U8 condition; all three layouts have the same shape.
  virtual StoragePtr where_cond(const Layout& layout, const BackendStorage& on_true,
                                const Layout& true_layout, const BackendStorage& on_false,
                                const Layout& false_layout) const = 0;
  /// Reduces over `dims` (sorted, unique, non-empty): the result has the input's shape with those
  /// dims set to 1. ArgMax/ArgMin get exactly one dim and give U32 (the first index on ties).
  virtual StoragePtr reduce(ReduceKind op, const Layout& layout,
                            const std::vector<size_t>& dims) const = 0;
  /// Softmax over the last dim (float dtypes).
  virtual StoragePtr softmax_last_dim(const Layout& layout) const = 0;
  /// ids: rank 1, U32 or I64; result: layout's shape with dims[dim] = ids count. Out-of-range ids
  /// throw IndexOutOfRange (or raise it at the next synchronize on asynchronous devices).
  virtual StoragePtr index_select(const Layout& layout, const BackendStorage& ids,
                                  const Layout& ids_layout, size_t dim) const = 0;
  /// ids: same rank as layout, equal dims except `dim`; result has ids' shape.
  virtual StoragePtr gather(const Layout& layout, const BackendStorage& ids,
                            const Layout& ids_layout, size_t dim) const = 0;
  /// result = copy of self; result[.., ids[i], ..] += src[.., i, ..] along dim (ids rank 1).
  virtual StoragePtr index_add(const Layout& layout, const BackendStorage& ids,
                               const Layout& ids_layout, const BackendStorage& src,
                               const Layout& src_layout, size_t dim) const = 0;
  /// result = copy of self; result[.., ids[p], ..] += src[p] along dim (ids shape = src shape).
  virtual StoragePtr scatter_add(const Layout& layout, const BackendStorage& ids,
                                 const Layout& ids_layout, const BackendStorage& src,
                                 const Layout& src_layout, size_t dim) const = 0;
  /// dims.b batches; layouts are (batch..., m, k) and (batch..., k, n) with any strides, the batch
  /// dims already broadcast to equal sizes. Result: b * m * n row-major.
  virtual StoragePtr matmul(const BackendStorage& rhs, MatmulDims dims, const Layout& lhs_layout,
                            const Layout& rhs_layout) const = 0;
};

class BackendDevice {
 public:
  virtual ~BackendDevice() = default;
  /// Uninitialised buffer of `count` elements.
  virtual StoragePtr alloc(size_t count, DType dtype) = 0;
  /// Every element set to the element at `value` (one element of `dtype`).
  virtual StoragePtr filled(size_t count, DType dtype, const void* value) = 0;
  virtual StoragePtr from_host(const void* data, size_t count, DType dtype) = 0;
  /// from_host for large sources such as a file mapping (pageable memory): the CUDA device
  /// stages it through pinned buffers. Returns when the data is on the device.
  virtual StoragePtr upload(const void* data, size_t count, DType dtype) {
    return from_host(data, count, dtype);
  }
  virtual StoragePtr rand_uniform(size_t count, DType dtype, double lo, double hi) = 0;
  virtual StoragePtr rand_normal(size_t count, DType dtype, double mean, double std) = 0;
  virtual void set_seed(uint64_t seed) = 0;
  virtual void synchronize() = 0;
  /// The backend's plan for one-token decode steps over `weights` (decode_plan.h), or null when
  /// the model's composed ops are what it would run anyway.
  virtual std::unique_ptr<DecodePlan> decode_plan(const DecoderWeights& weights);
};

/// The one dispatch point from a Device to its backend. Throws BackendError for a missing device.
BackendDevice& backend_device(const Device& device);

namespace cpu {
BackendDevice& device();
}
namespace cuda {
/// Throws BackendError when built without CUDA or when the GPU is not there.
BackendDevice& device(int ordinal);
int device_count();
}  // namespace cuda

}  // namespace wick
