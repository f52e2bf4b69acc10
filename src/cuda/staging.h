#pragma once
// Pinned host memory of one GPU's transfers: the read-back buffer, which grows and never shrinks,
// and chunks by size class (uploads, and read-backs waited for later: PendingTokens), reused once
// the copy from or into them has run. Pinned memory keeps small copies asynchronous and at full
// speed. Freed by the driver at process end.

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace wick::cuda {

class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  /// Read-back buffer of at least `bytes`. The caller serialises (the queue lock) and has waited
  /// for every earlier read-back: a bigger buffer replaces the old one.
  void* read_buffer(size_t bytes);
  /// A chunk of at least `bytes`, back in the pool when the last owner lets go (an upload's: the
  /// queue keeps it until its batch has run). Thread-safe.
  std::shared_ptr<void> upload_chunk(size_t bytes);

 private:
  void* read_ = nullptr;
  size_t read_bytes_ = 0;
  std::mutex upload_mutex_;
  std::vector<std::pair<size_t, void*>> upload_free_;  // (class size, chunk)
};

}  // namespace wick::cuda
