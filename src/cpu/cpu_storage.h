#pragma once
// The CPU backend: a host buffer; every op is finished when it returns.

#include <cstdint>
#include <memory>
#include <mutex>
#include <random>

#include "backend.h"

namespace wick::cpu {

class CpuStorage final : public BackendStorage {
 public:
  CpuStorage(size_t count, DType dtype);
  /// A buffer that views `data` (not owned: `keepalive` keeps it valid, e.g. a file mapping).
  CpuStorage(void* data, size_t count, DType dtype, std::shared_ptr<const void> keepalive);
  Device device() const override { return Device::cpu(); }
  DType dtype() const override { return dtype_; }
  size_t elem_count() const override { return count_; }

  CpuStorage(const CpuStorage&) = delete;
  CpuStorage& operator=(const CpuStorage&) = delete;

  void* data() { return data_ptr_; }
  const void* data() const { return data_ptr_; }
  template <class T>
  T* as() {
    return static_cast<T*>(data());
  }
  template <class T>
  const T* as() const {
    return static_cast<const T*>(data());
  }

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
  StoragePtr matmul(const BackendStorage& rhs, MatmulDims dims, const Layout& lhs_layout,
                    const Layout& rhs_layout) const override;

 private:
  struct FreeDeleter {
    size_t cached_bytes;  // the size class when the buffer cache may keep it (0: free it)
    void operator()(void* p) const;
  };
  // Buffers up to kInlineBytes live in the storage object itself (one allocation for both);
  // up to kMallocBytes they come from plain malloc (16-byte aligned, glibc's fast path); larger
  // ones are 64-byte aligned (a cache line: no false sharing between threads' chunks); from
  // 1 MiB they go through a cache of freed buffers (cpu_device.cpp).
  static constexpr size_t kInlineBytes = 64;
  static constexpr size_t kMallocBytes = 4096;

  size_t count_;
  DType dtype_;
  void* data_ptr_ = nullptr;                 // inline_, data_ or a viewed buffer
  std::unique_ptr<void, FreeDeleter> data_;  // owned heap buffer, if any
  std::shared_ptr<const void> keepalive_;    // owner of a viewed buffer
  alignas(16) unsigned char inline_[kInlineBytes];
};

/// The downcast every CPU op does on its operands (validated above, so never fails).
inline const CpuStorage& as_cpu(const BackendStorage& s) {
  return static_cast<const CpuStorage&>(s);
}
inline CpuStorage& as_cpu(BackendStorage& s) {
  return static_cast<CpuStorage&>(s);
}

class CpuDevice final : public BackendDevice {
 public:
  StoragePtr alloc(size_t count, DType dtype) override;
  StoragePtr filled(size_t count, DType dtype, const void* value) override;
  StoragePtr from_host(const void* data, size_t count, DType dtype) override;
  StoragePtr rand_uniform(size_t count, DType dtype, double lo, double hi) override;
  StoragePtr rand_normal(size_t count, DType dtype, double mean, double std) override;
  void set_seed(uint64_t seed) override;
  void synchronize() override {}
  /// src/cpu/decode_plan.cpp: a plan for decoders with quantized projections, else null.
  std::unique_ptr<DecodePlan> decode_plan(const DecoderWeights& weights) override;

 private:
  std::mutex rng_mutex_;
  std::mt19937_64 rng_{299792458};
};

}  // namespace wick::cpu
