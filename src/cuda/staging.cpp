#include "cuda/staging.h"

#include <algorithm>
#include <bit>

#include "cuda/check.h"

namespace wick::cuda {

void* PinnedStaging::read_buffer(size_t bytes) {
  if (bytes > read_bytes_) {
    size_t size = std::bit_ceil(std::max<size_t>(bytes, 64 << 10));
    void* p = nullptr;
    WICK_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocDefault));
    if (read_ != nullptr) {
      // Earlier read-backs have all completed (each one waits).
      WICK_CUDA_CHECK(cudaFreeHost(read_));
    }
    read_ = p;
    read_bytes_ = size;
  }
  return read_;
}

std::shared_ptr<void> PinnedStaging::upload_chunk(size_t bytes) {
  size_t size = std::bit_ceil(std::max<size_t>(bytes, 4096));
  void* p = nullptr;
  {
    std::lock_guard lock(upload_mutex_);
    for (size_t i = 0; i < upload_free_.size(); ++i) {
      if (upload_free_[i].first == size) {
        p = upload_free_[i].second;
        upload_free_[i] = upload_free_.back();
        upload_free_.pop_back();
        break;
      }
    }
  }
  if (p == nullptr) WICK_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocDefault));
  return std::shared_ptr<void>(p, [this, size](void* q) {
    std::lock_guard lock(upload_mutex_);
    upload_free_.emplace_back(size, q);
  });
}

}  // namespace wick::cuda
