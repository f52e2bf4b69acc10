#pragma once
// The caching allocator of one GPU: buffers are rounded up to a size class and returned to a free
// list of that class, never to the driver, so steady-state allocation costs no cudaMalloc and no
// device synchronisation. All work of a device runs on its one stream, so a block freed after its
// last use was enqueued can be handed to the next op at once: the reuse is ordered by the stream.

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace wick::cuda {

struct AllocatorStats {
  size_t in_use_bytes = 0;  // handed out (size-class bytes)
  size_t cached_bytes = 0;  // on the free lists
  size_t peak_bytes = 0;    // highest in_use_bytes seen
  size_t malloc_count = 0;  // cudaMalloc calls made
};

class Allocator {
 public:
  Allocator(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  /// The size class `bytes` is rounded up to (0 for 0).
  static size_t class_size(size_t bytes);

  /// A block of at least `bytes` (nullptr for 0). On out-of-memory the cached blocks are released
  /// and the cudaMalloc retried once; then BackendError naming the requested and free bytes.
  void* alloc(size_t bytes);
  /// Returns a block from alloc(bytes) to its free list.
  void free(void* ptr, size_t bytes);
  /// Waits for the stream, then gives every cached block back to the driver.
  void release_cached();
  AllocatorStats stats() const;

  /// A block and its class size.
  using Block = std::pair<void*, size_t>;
  /// Whole-step graph captures (CudaGraph): blocks allocated between begin_reserving() and
  /// end_reserving() are reserved for the graph, whose replays write them. free() keeps a
  /// reserved block off the free lists until release_reserved() (the graph's end) gives back
  /// those whose owners have let go.
  void begin_reserving();
  std::vector<Block> end_reserving();
  void release_reserved(const std::vector<Block>& blocks);

 private:
  void release_cached_locked();
  void note_new_block_locked(void* ptr, size_t size);

  int ordinal_;
  cudaStream_t stream_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // class size -> blocks
  AllocatorStats stats_;
  bool reserving_ = false;
  std::vector<Block> reserving_blocks_;
  std::unordered_map<void*, bool> reserved_;  // reserved block -> freed by its owner
};

}  // namespace wick::cuda
