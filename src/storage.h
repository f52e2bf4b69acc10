#pragma once
// Storage: the cell every view of one buffer shares: the backend buffer, the reader/writer lock
// that guards it and the version counter that in-place writes bump (autograd checks it). Ops go
// to the backend directly (tensor_internal.h: run_op); nothing here forwards them.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "backend.h"

namespace wick {

/// A reader/writer lock that does not starve writers: once a writer waits, new readers wait
/// behind it (glibc's std::shared_mutex prefers readers, so a steady stream of readers could
/// hold a writer off forever). Not recursive: a thread must not take it twice.
///
/// The state is one atomic word, so that an uncontended lock or unlock is a single atomic
/// operation; the mutex and condition variables are touched only when someone has to wait.
class FairSharedMutex {
 public:
  void lock() {
    uint64_t free = 0;
    if (!state_.compare_exchange_strong(free, kWriter, std::memory_order_acquire,
                                        std::memory_order_relaxed)) {
      lock_slow();
    }
  }
  void unlock() {
    uint64_t old = state_.fetch_and(~kWriter, std::memory_order_release);
    if (old & (kWritersWaiting | kReadersWaiting)) wake_all();
  }
  void lock_shared() {
    uint64_t s = state_.load(std::memory_order_relaxed);
    if ((s & (kWriter | kWritersWaiting)) != 0 || (s & kReaders) == kReaders ||
        !state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      lock_shared_slow();
    }
  }
  void unlock_shared() {
    uint64_t old = state_.fetch_sub(1, std::memory_order_release);
    // The last reader out hands over to a queued writer.
    if ((old & kReaders) == 1 && (old & kWritersWaiting)) wake_all();
  }

 private:
  // Bits of state_: readers holding the lock, readers queued, writers queued, a writer holding it.
  static constexpr uint64_t kReaders = (uint64_t(1) << 24) - 1;
  static constexpr uint64_t kReaderWaitingOne = uint64_t(1) << 24;
  static constexpr uint64_t kReadersWaiting = ((uint64_t(1) << 20) - 1) << 24;
  static constexpr uint64_t kWriterWaitingOne = uint64_t(1) << 44;
  static constexpr uint64_t kWritersWaiting = ((uint64_t(1) << 19) - 1) << 44;
  static constexpr uint64_t kWriter = uint64_t(1) << 63;

  void lock_slow();
  void lock_shared_slow();
  void wake_all();

  std::atomic<uint64_t> state_{0};
  std::mutex mutex_;  // only for waiting: guards nothing but the condition variables' sleep
  std::condition_variable readers_cv_;
  std::condition_variable writers_cv_;
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

 private:
  StoragePtr backend_;
  mutable FairSharedMutex mutex_;
  std::atomic<uint64_t> version_{0};
};

/// The locks of one op: each distinct storage locked once (a.matmul(a) reads one storage twice),
/// exclusively when the op writes it and shared otherwise, all in one global order (by address)
/// so that two ops never wait on each other (a.assign(b) against b.assign(a)). Up to kInline
/// storages are kept without allocating (an op has a few operands).
class StorageLocks {
 public:
  StorageLocks(std::span<const Storage* const> reads, std::span<const Storage* const> writes);
  StorageLocks(std::initializer_list<const Storage*> reads,
               std::initializer_list<const Storage*> writes)
      : StorageLocks(std::span<const Storage* const>(reads.begin(), reads.size()),
                     std::span<const Storage* const>(writes.begin(), writes.size())) {}
  ~StorageLocks();
  StorageLocks(const StorageLocks&) = delete;
  StorageLocks& operator=(const StorageLocks&) = delete;

 private:
  struct Held {
    const Storage* storage;
    bool exclusive;
  };
  static constexpr size_t kInline = 6;
  Held inline_[kInline];
  std::unique_ptr<Held[]> heap_;  // when an op has more operands
  Held* held_ = inline_;
  size_t count_ = 0;
};

/// Shared locks only.
class ReadLocks : public StorageLocks {
 public:
  explicit ReadLocks(std::span<const Storage* const> storages) : StorageLocks(storages, {}) {}
  ReadLocks(std::initializer_list<const Storage*> storages)
      : StorageLocks(std::span<const Storage* const>(storages.begin(), storages.size()), {}) {}
};

}  // namespace wick
