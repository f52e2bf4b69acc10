#include "storage.h"

#include <algorithm>

#include "util.h"
#include "wick/error.h"

namespace wick {

void FairSharedMutex::lock_slow() {
  std::unique_lock lock(mutex_);
  state_.fetch_add(kWriterWaitingOne, std::memory_order_relaxed);
  for (;;) {
    uint64_t s = state_.load(std::memory_order_relaxed);
    if ((s & kWriter) == 0 && (s & kReaders) == 0) {
      if (state_.compare_exchange_weak(s, (s - kWriterWaitingOne) | kWriter,
                                       std::memory_order_acquire, std::memory_order_relaxed)) {
        return;
      }
      continue;
    }
    writers_cv_.wait(lock);
  }
}

void FairSharedMutex::lock_shared_slow() {
  std::unique_lock lock(mutex_);
  state_.fetch_add(kReaderWaitingOne, std::memory_order_relaxed);
  for (;;) {
    uint64_t s = state_.load(std::memory_order_relaxed);
    // Queued writers go first: a reader waits while any writer holds or waits for the lock.
    if ((s & (kWriter | kWritersWaiting)) == 0 && (s & kReaders) != kReaders) {
      if (state_.compare_exchange_weak(s, s - kReaderWaitingOne + 1, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        return;
      }
      continue;
    }
    readers_cv_.wait(lock);
  }
}

void FairSharedMutex::wake_all() {
  // A waiter registers itself in state_ and checks it under mutex_ before sleeping; taking
  // mutex_ here orders this wake-up after that check, so that no wake-up is lost.
  { std::lock_guard lock(mutex_); }
  writers_cv_.notify_one();
  readers_cv_.notify_all();
}

StorageLocks::StorageLocks(std::span<const Storage* const> reads,
                           std::span<const Storage* const> writes) {
  size_t total = reads.size() + writes.size();
  if (total > kInline) {
    heap_ = std::make_unique<Held[]>(total);
    held_ = heap_.get();
  }
  for (const Storage* s : writes) held_[count_++] = {s, true};
  for (const Storage* s : reads) held_[count_++] = {s, false};
  // By address, writes first among equals, so that a storage both read and written is kept once,
  // exclusively.
  auto before = [](const Held& a, const Held& b) {
    return a.storage != b.storage ? std::less<const Storage*>()(a.storage, b.storage)
                                  : a.exclusive > b.exclusive;
  };
  std::sort(held_, held_ + count_, before);
  count_ = std::unique(held_, held_ + count_,
                       [](const Held& a, const Held& b) { return a.storage == b.storage; }) -
           held_;
  for (size_t i = 0; i < count_; ++i) {
    if (held_[i].exclusive) {
      held_[i].storage->mutex().lock();
    } else {
      held_[i].storage->mutex().lock_shared();
    }
  }
}

StorageLocks::~StorageLocks() {
  for (size_t i = count_; i-- > 0;) {
    if (held_[i].exclusive) {
      held_[i].storage->mutex().unlock();
    } else {
      held_[i].storage->mutex().unlock_shared();
    }
  }
}

}  // namespace wick
