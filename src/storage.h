#pragma once
// Storage: owns one backend buffer, guarded by a reader/writer lock that all views share, and a
// version counter that in-place writes bump (autograd checks it).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backend.h"

namespace wick {

/// A reader/writer lock that does not starve writers: once a writer waits, new readers wait
/// behind it (glibc's std::shared_mutex prefers readers, so a steady stream of readers could
/// hold a writer off forever). Not recursive: a thread must not take it twice.
class FairSharedMutex {
 public:
  void lock();
  void unlock();
  void lock_shared();
  void unlock_shared();

 private:
  std::mutex mutex_;
  std::condition_variable readers_cv_;
  std::condition_variable writers_cv_;
  size_t readers_ = 0;          // readers holding the lock
  size_t writers_waiting_ = 0;  // writers queued; they block new readers
  bool writer_active_ = false;
};

class Storage {
 public:
  explicit Storage(StoragePtr backend) : backend_(std::move(backend)) {}
  BackendStorage& backend() const { return *backend_; }
  Device device() const { return backend_->device(); }
  DType dtype() const { return backend_->dtype(); }
  FairSharedMutex& mutex() const { return mutex_; }

  /// Bumped by every in-place write (assign, optimizer steps).
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  void bump_version() { version_.fetch_add(1, std::memory_order_acq_rel); }

  /// The seeds' Storage::matmul: same device and dtype, then the backend of that device.
  StoragePtr matmul(const Storage& rhs, MatmulDims dims, const Layout& lhs_layout,
                    const Layout& rhs_layout) const;

 private:
  StoragePtr backend_;
  mutable FairSharedMutex mutex_;
  std::atomic<uint64_t> version_{0};
};

/// The locks of one op: each distinct storage locked once (a.matmul(a) reads one storage twice),
/// exclusively when the op writes it and shared otherwise, all in one global order (by address)
/// so that two ops never wait on each other (a.assign(b) against b.assign(a)).
class StorageLocks {
 public:
  StorageLocks(std::vector<const Storage*> reads, std::vector<const Storage*> writes);
  ~StorageLocks();
  StorageLocks(const StorageLocks&) = delete;
  StorageLocks& operator=(const StorageLocks&) = delete;

 private:
  struct Held {
    const Storage* storage;
    bool exclusive;
  };
  std::vector<Held> held_;
};

/// Shared locks only.
class ReadLocks : public StorageLocks {
 public:
  explicit ReadLocks(std::vector<const Storage*> storages)
      : StorageLocks(std::move(storages), {}) {}
};

}  // namespace wick
