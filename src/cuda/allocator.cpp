#include "cuda/allocator.h"

#include <algorithm>
#include <bit>
#include <utility>

#include "cuda/check.h"
#include "util.h"
#include "wick/error.h"

namespace wick::cuda {

namespace {
constexpr size_t kSmallLimit = size_t{1} << 20;  // below: 512-byte steps
constexpr size_t kSmallStep = 512;
constexpr size_t kLargeSubdivisions = 8;  // above: 8 classes per power of two (<= 12.5% waste)
}  // namespace

Allocator::~Allocator() {
  // Devices live until the process ends; by then the driver may already be gone, so the cached
  // blocks are not freed one by one here.
}

size_t Allocator::class_size(size_t bytes) {
  if (bytes == 0) return 0;
  if (bytes <= kSmallLimit) return (bytes + kSmallStep - 1) / kSmallStep * kSmallStep;
  size_t pow2 = std::bit_floor(bytes);
  size_t step = pow2 / kLargeSubdivisions;
  return (bytes + step - 1) / step * step;
}

void* Allocator::alloc(size_t bytes) {
  size_t size = class_size(bytes);
  if (size == 0) return nullptr;
  std::lock_guard lock(mutex_);
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    stats_.in_use_bytes += size;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.in_use_bytes);
    note_new_block_locked(p, size);
    return p;
  }
  void* p = nullptr;
  make_current(ordinal_);
  cudaError_t status = cudaMalloc(&p, size);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // out-of-memory is not sticky: clear it and try again
    release_cached_locked();
    status = cudaMalloc(&p, size);
  }
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    throw BackendError(str("alloc: out of memory on cuda:", ordinal_, ": requested ", bytes,
                           " bytes, ", free_bytes, " bytes free of ", total_bytes, " (wick holds ",
                           stats_.in_use_bytes, " bytes in use)"));
  }
  if (status != cudaSuccess) throw_cuda_error(status, "cudaMalloc", __FILE__, __LINE__);
  ++stats_.malloc_count;
  stats_.in_use_bytes += size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.in_use_bytes);
  note_new_block_locked(p, size);
  return p;
}

void Allocator::note_new_block_locked(void* ptr, size_t size) {
  if (!reserving_) return;
  reserving_blocks_.emplace_back(ptr, size);
  reserved_[ptr] = false;
}

void Allocator::free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  size_t size = class_size(bytes);
  std::lock_guard lock(mutex_);
  if (!reserved_.empty()) {
    auto it = reserved_.find(ptr);
    if (it != reserved_.end()) {
      it->second = true;  // a graph still writes it: back to the free list at the graph's end
      return;
    }
  }
  free_[size].push_back(ptr);
  stats_.in_use_bytes -= size;
  stats_.cached_bytes += size;
}

void Allocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void Allocator::release_cached_locked() {
  if (stats_.cached_bytes == 0) return;
  make_current(ordinal_);
  // Work already enqueued may still touch a cached block: wait for it before the driver gets it.
  WICK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) WICK_CUDA_CHECK(cudaFree(p));
    blocks.clear();
  }
  stats_.cached_bytes = 0;
}

void Allocator::begin_reserving() {
  std::lock_guard lock(mutex_);
  reserving_ = true;
  reserving_blocks_.clear();
}

std::vector<Allocator::Block> Allocator::end_reserving() {
  std::lock_guard lock(mutex_);
  reserving_ = false;
  return std::exchange(reserving_blocks_, {});
}

void Allocator::release_reserved(const std::vector<Block>& blocks) {
  std::lock_guard lock(mutex_);
  for (const auto& [ptr, size] : blocks) {
    auto it = reserved_.find(ptr);
    if (it == reserved_.end()) continue;
    if (it->second) {
      // Its owner freed it earlier; replays already enqueued are ordered before any reuse.
      free_[size].push_back(ptr);
      stats_.in_use_bytes -= size;
      stats_.cached_bytes += size;
    }
    reserved_.erase(it);
  }
}

AllocatorStats Allocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace wick::cuda
