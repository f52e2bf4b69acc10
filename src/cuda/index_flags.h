#pragma once
// Deferred errors of index kernels: each index op gets a device int that its kernel sets when an
// id is out of range. The flags are copied back with the next read-back or synchronize and
// rethrown as IndexOutOfRange naming the op; then cleared, so the device stays usable.
//
// Every member is called with the queue lock held.

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace wick::cuda {

class IndexErrorFlags {
 public:
  /// Allocates and clears the flags (on `stream`); with `trace`, prints the time it took.
  IndexErrorFlags(int ordinal, cudaStream_t stream, bool trace);
  IndexErrorFlags(const IndexErrorFlags&) = delete;
  IndexErrorFlags& operator=(const IndexErrorFlags&) = delete;

  /// A flag for index op `op`, zero until its kernel finds an id out of range.
  int* slot(const char* op);
  /// Enqueues the copy of the flags in use to the host (before the wait).
  void enqueue_copy();
  /// After the wait: throws IndexOutOfRange naming the first op whose flag is set.
  void check();

 private:
  int ordinal_;
  cudaStream_t stream_;
  int* dev_ = nullptr;
  int* host_ = nullptr;
  std::vector<const char*> ops_;  // one slot per op since the last check
};

}  // namespace wick::cuda
