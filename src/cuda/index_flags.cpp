#include "cuda/index_flags.h"

#include <cstring>

#include "cuda/check.h"
#include "cuda/trace.h"
#include "util.h"

namespace wick::cuda {

namespace {
constexpr size_t kSlots = 4096;
}  // namespace

IndexErrorFlags::IndexErrorFlags(int ordinal, cudaStream_t stream, bool trace)
    : ordinal_(ordinal), stream_(stream) {
  double t0 = now_ms();
  WICK_CUDA_CHECK(cudaMalloc(&dev_, kSlots * sizeof(int)));
  WICK_CUDA_CHECK(cudaMemsetAsync(dev_, 0, kSlots * sizeof(int), stream_));
  WICK_CUDA_CHECK(cudaHostAlloc(&host_, kSlots * sizeof(int), cudaHostAllocDefault));
  ops_.reserve(kSlots);
  if (trace) trace_line("LIB", str("cuda:", ordinal, " index flags"), now_ms() - t0);
}

int* IndexErrorFlags::slot(const char* op) {
  if (ops_.size() < kSlots) {
    ops_.push_back(op);
    return dev_ + ops_.size() - 1;
  }
  // Out of slots until the next check: later ops share the last one.
  ops_.back() = "an index op";
  return dev_ + kSlots - 1;
}

void IndexErrorFlags::enqueue_copy() {
  if (ops_.empty()) return;
  WICK_CUDA_CHECK(
      cudaMemcpyAsync(host_, dev_, ops_.size() * sizeof(int), cudaMemcpyDeviceToHost, stream_));
}

void IndexErrorFlags::check() {
  if (ops_.empty()) return;
  size_t n = ops_.size();
  const char* bad = nullptr;
  for (size_t i = 0; i < n && bad == nullptr; ++i) {
    if (host_[i] != 0) bad = ops_[i];
  }
  ops_.clear();
  if (bad == nullptr) return;
  // The device stays usable: clear the flags for the ops to come.
  WICK_CUDA_CHECK(cudaMemsetAsync(dev_, 0, n * sizeof(int), stream_));
  std::memset(host_, 0, n * sizeof(int));
  throw IndexOutOfRange(str(bad, ": index out of range on cuda:", ordinal_,
                            " (found by the GPU, reported at the next read-back or synchronize)"));
}

}  // namespace wick::cuda
