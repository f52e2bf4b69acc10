#pragma once
// Graph mode of the device queue (WICK_CUDA_GRAPHS=1): the ops of a batch are captured from the
// device stream into a CUDA graph instead of being launched one by one; closing the batch ends
// the capture and launches the graph. Instantiated graphs are cached by the batch's structure
// (the ops' names and dtypes, and of the captured graph its nodes, each kernel's function and
// launch shape, each copy's size, its edges and their types: graph.cpp, structure_key); a
// repeated batch, whose buffers usually sit at new addresses, updates the cached executable in
// place (cudaGraphExecUpdate) and re-instantiates it only when the update is refused.
//
// Captures run in relaxed mode: the caching allocator may cudaMalloc during a capture (the
// allocation is not part of the graph, and every launch is updated with the addresses of its own
// capture), other threads may use CUDA freely, and any thread holding the queue lock may add
// ops. Work that cannot be captured (host read-back, pageable uploads, stream waits) closes the
// batch first. A failed capture loses the ops captured so far: the next synchronize or
// read-back throws naming them, and the device stays usable.
//
// Every member is called with the queue lock held (queue.h).

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "wick/dtype.h"

namespace wick::cuda {

/// WICK_CUDA_GRAPHS=0|1; anything else (or unset) gives the default the benchmark chose.
bool graphs_enabled_by_default();

/// Estimated work (flop-equivalents) above which a batch closes early; WICK_CUDA_BATCH_WORK.
double batch_work_limit();

/// Flop-equivalents counted per byte of device memory an op allocates (its outputs, mostly).
constexpr double kWorkPerByte = 32;

struct GraphStats {
  size_t commits = 0;         // captured batches launched
  size_t updates = 0;         // cache hits launched after cudaGraphExecUpdate
  size_t instantiations = 0;  // cache misses (and refused updates) instantiated
  size_t refused = 0;         // updates refused
  size_t direct = 0;          // big ops launched at once, uncaptured
  size_t lost = 0;            // batches lost to a failed capture
  size_t cached = 0;          // executables in the cache
};

class GraphQueue {
 public:
  GraphQueue(int ordinal, cudaStream_t stream, bool trace);
  ~GraphQueue();
  GraphQueue(const GraphQueue&) = delete;
  GraphQueue& operator=(const GraphQueue&) = delete;

  /// Read without the queue lock too (DeviceBuffer, the matmul engine): atomic.
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  /// Only between batches (the device closes the open one first).
  void set_enabled(bool on) { enabled_.store(on, std::memory_order_relaxed); }
  bool capturing() const { return capturing_; }
  double work_limit() const { return work_limit_; }

  /// Before an op's launch in graph mode, with its estimated work and the number of ops already
  /// in the batch: true when the op is to be captured (a capture is then open), false when it is
  /// big enough to launch at once (the caller closes the open batch first).
  bool admit(double work, size_t batch_ops);
  /// After a captured launch: the op joins the batch's structure key.
  void note(const char* name, DType dtype);
  /// Whether the open batch should close now (its work passed the limit, or a big op ran).
  bool must_close() const { return close_requested_; }
  /// Counts a big op launched at once; its batch closes after it.
  void count_direct() {
    ++stats_.direct;
    close_requested_ = true;
  }

  /// Ends the capture, updates or instantiates the cached executable and launches it on the
  /// stream. Never throws: a failure loses the batch, reported by rethrow_lost.
  void commit(const std::vector<const char*>& ops);
  /// Ends a capture whose op `failed` threw during its launch: the captured ops are lost.
  void abort(const std::vector<const char*>& ops, const char* failed);
  /// Throws BackendError (once) when a batch was lost since the last call.
  void rethrow_lost(const char* what);
  /// Clears the per-batch state after the device closed a batch.
  void reset_batch();

  GraphStats stats() const;

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };

  void lose(const std::vector<const char*>& ops, const char* extra, const std::string& why);
  void evict_one();

  int ordinal_;
  cudaStream_t stream_;
  bool trace_;
  std::atomic<bool> enabled_;
  double work_limit_;

  bool capturing_ = false;
  bool close_requested_ = false;
  size_t first_op_ = 0;  // index in the batch's op list of the first captured op
  double work_ = 0;
  uint64_t key_ = 0;

  uint64_t clock_ = 0;
  std::unordered_map<uint64_t, Entry> cache_;
  GraphStats stats_;
  std::string lost_;  // the first lost batch since the last rethrow_lost
};

}  // namespace wick::cuda
