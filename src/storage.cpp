#include "storage.h"

#include <algorithm>

#include "util.h"
#include "wick/error.h"

namespace wick {

void FairSharedMutex::lock() {
  std::unique_lock lock(mutex_);
  ++writers_waiting_;
  writers_cv_.wait(lock, [&] { return !writer_active_ && readers_ == 0; });
  --writers_waiting_;
  writer_active_ = true;
}

void FairSharedMutex::unlock() {
  {
    std::lock_guard lock(mutex_);
    writer_active_ = false;
  }
  // Queued writers go first; readers re-check and wait again while writers are queued.
  writers_cv_.notify_one();
  readers_cv_.notify_all();
}

void FairSharedMutex::lock_shared() {
  std::unique_lock lock(mutex_);
  readers_cv_.wait(lock, [&] { return !writer_active_ && writers_waiting_ == 0; });
  ++readers_;
}

void FairSharedMutex::unlock_shared() {
  bool last;
  {
    std::lock_guard lock(mutex_);
    last = --readers_ == 0;
  }
  if (last) writers_cv_.notify_one();
}

StoragePtr Storage::matmul(const Storage& rhs, MatmulDims dims, const Layout& lhs_layout,
                           const Layout& rhs_layout) const {
  if (device() != rhs.device()) {
    throw DeviceMismatch(str("matmul: device mismatch, lhs ", device(), " rhs ", rhs.device()));
  }
  if (dtype() != rhs.dtype()) {
    throw DTypeMismatch(str("matmul: dtype mismatch, lhs ", dtype(), " rhs ", rhs.dtype()));
  }
  return backend_->matmul(rhs.backend(), dims, lhs_layout, rhs_layout);
}

StorageLocks::StorageLocks(std::vector<const Storage*> reads, std::vector<const Storage*> writes) {
  held_.reserve(reads.size() + writes.size());
  for (const Storage* s : writes) held_.push_back({s, true});
  for (const Storage* s : reads) held_.push_back({s, false});
  // By address, writes first among equals, so that a storage both read and written is kept once,
  // exclusively.
  std::sort(held_.begin(), held_.end(), [](const Held& a, const Held& b) {
    return a.storage != b.storage ? std::less<const Storage*>()(a.storage, b.storage)
                                  : a.exclusive > b.exclusive;
  });
  held_.erase(std::unique(held_.begin(), held_.end(),
                          [](const Held& a, const Held& b) { return a.storage == b.storage; }),
              held_.end());
  for (const Held& h : held_) {
    if (h.exclusive) {
      h.storage->mutex().lock();
    } else {
      h.storage->mutex().lock_shared();
    }
  }
}

StorageLocks::~StorageLocks() {
  for (auto it = held_.rbegin(); it != held_.rend(); ++it) {
    if (it->exclusive) {
      it->storage->mutex().unlock();
    } else {
      it->storage->mutex().unlock_shared();
    }
  }
}

}  // namespace wick
