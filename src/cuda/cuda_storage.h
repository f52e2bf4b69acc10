#pragma once
// The CUDA backend's storage: one device buffer. Ops enqueue kernels on the device's stream and
// return at once; reading back waits.

#include <memory>

#include "backend.h"
#include "cuda/cuda_device.h"
#include "cuda/kernels.h"

namespace wick::cuda {

class CudaStorage final : public BackendStorage {
 public:
  /// An uninitialised buffer of `count` elements on `device`.
  CudaStorage(CudaDevice& device, size_t count, DType dtype);

  Device device() const override { return dev_->device(); }
  DType dtype() const override { return dtype_; }
  size_t elem_count() const override { return count_; }

  CudaDevice& cuda_device() const { return *dev_; }
  void* data() const { return buffer_->data(); }
  template <class T>
  T* as() const {
    return static_cast<T*>(data());
  }
  /// Byte address of element `offset`.
  void* data_at(size_t offset) const {
    return static_cast<char*>(data()) + offset * size_in_bytes(dtype_);
  }
  const std::shared_ptr<DeviceBuffer>& buffer() const { return buffer_; }

  void copy_to_host(const Layout& layout, void* dst) const override;
  void copy_into(const Layout& src_layout, BackendStorage& dst,
                 const Layout& dst_layout) const override;
  StoragePtr to_dtype(const Layout& layout, DType dtype) const override;
  StoragePtr unary(const UnaryOp& op, const Layout& layout) const override;
  StoragePtr binary(BinaryKind op, const Layout& layout, const BackendStorage& rhs,
                    const Layout& rhs_layout) const override;
  StoragePtr cmp(CmpKind op, const Layout& layout, const BackendStorage& rhs,
                 const Layout& rhs_layout) const override;
  StoragePtr where_cond(const Layout& layout, const BackendStorage& on_true,
                        const Layout& true_layout, const BackendStorage& on_false,
                        const Layout& false_layout) const override;
  StoragePtr reduce(ReduceKind op, const Layout& layout,
                    const std::vector<size_t>& dims) const override;
  StoragePtr softmax_last_dim(const Layout& layout) const override;
  StoragePtr index_select(const Layout& layout, const BackendStorage& ids, const Layout& ids_layout,
                          size_t dim) const override;
  StoragePtr gather(const Layout& layout, const BackendStorage& ids, const Layout& ids_layout,
                    size_t dim) const override;
  StoragePtr index_add(const Layout& layout, const BackendStorage& ids, const Layout& ids_layout,
                       const BackendStorage& src, const Layout& src_layout,
                       size_t dim) const override;
  StoragePtr scatter_add(const Layout& layout, const BackendStorage& ids, const Layout& ids_layout,
                         const BackendStorage& src, const Layout& src_layout,
                         size_t dim) const override;
  /// In matmul.cpp.
  StoragePtr matmul(const BackendStorage& rhs, MatmulDims dims, const Layout& lhs_layout,
                    const Layout& rhs_layout) const override;

  /// A fresh row-major copy of the elements of `layout` (any rank, any strides).
  std::unique_ptr<CudaStorage> contiguous_copy(const Layout& layout) const;

 private:
  CudaDevice* dev_;
  size_t count_;
  DType dtype_;
  std::shared_ptr<DeviceBuffer> buffer_;
};

/// The downcast every CUDA op does on its operands (validated above, so never fails).
inline const CudaStorage& as_cuda(const BackendStorage& s) {
  return static_cast<const CudaStorage&>(s);
}
inline CudaStorage& as_cuda(BackendStorage& s) {
  return static_cast<CudaStorage&>(s);
}

/// The view of a contiguous run of `count` elements.
StridedView dense_view(size_t count);

}  // namespace wick::cuda
