#pragma once
// Storage: owns one backend buffer, guarded by a reader/writer lock that all views share.

#include <memory>
#include <shared_mutex>
#include <vector>

#include "backend.h"

namespace wick {

class Storage {
 public:
  explicit Storage(StoragePtr backend) : backend_(std::move(backend)) {}
  BackendStorage& backend() const { return *backend_; }
  Device device() const { return backend_->device(); }
  DType dtype() const { return backend_->dtype(); }
  std::shared_mutex& mutex() const { return mutex_; }

  /// The seeds' Storage::matmul: same device and dtype, then the backend of that device.
  StoragePtr matmul(const Storage& rhs, MatmulDims dims, const Layout& lhs_layout,
                    const Layout& rhs_layout) const;

 private:
  StoragePtr backend_;
  mutable std::shared_mutex mutex_;
};

/// Shared locks on a set of storages, each distinct storage locked once (a.matmul(a) reads one
/// storage twice; std::shared_mutex must not be locked twice by one thread).
class ReadLocks {
 public:
  explicit ReadLocks(std::vector<const Storage*> storages);
  ~ReadLocks();
  ReadLocks(const ReadLocks&) = delete;
  ReadLocks& operator=(const ReadLocks&) = delete;

 private:
  std::vector<const Storage*> locked_;
};

}  // namespace wick
