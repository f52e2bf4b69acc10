#pragma once
// CUDA-specific settings and statistics. Available in every build; without CUDA the setters are
// remembered and the queries throw BackendError.

#include <cstddef>
#include <functional>
#include <memory>

#include "wick/device.h"

namespace wick {

/// Lets f32 matmuls on CUDA use TF32 tensor cores (10-bit mantissa products, fp32 accumulation).
/// Off by default: f32 matmuls are true fp32 unless this is called or WICK_ALLOW_TF32=1 is set.
void cuda_allow_tf32(bool allow);
/// Whether f32 matmuls on CUDA may use TF32.
bool cuda_tf32_allowed();

/// Which GEMM runs CUDA matmuls. Auto: cuBLASLt, warmed up on a background thread from device
/// creation, wick's own kernel until the warm-up is done (under batch invariance,
/// WICK_BATCH_INVARIANT=1, the first matmul waits for it instead, so that no matmul's path, and so
/// its bits, depends on timing), when there is no warm-up (WICK_CUDA_WARMUP=0) or cuBLASLt has no
/// algorithm. Cublas waits for the warm-up (or creates cuBLASLt); Wick always uses wick's kernel.
/// For tests and benchmarks; WICK_CUDA_MATMUL=auto|cublas|wick sets it.
enum class CudaMatmulPath { Auto, Cublas, Wick };
void cuda_set_matmul_path(CudaMatmulPath path);
CudaMatmulPath cuda_matmul_path();

/// The caching allocator of one GPU, in bytes.
struct CudaMemoryStats {
  size_t in_use = 0;  // held by live buffers
  size_t cached = 0;  // freed buffers kept for reuse
  size_t peak = 0;    // the highest in_use so far
};
/// Throws BackendError without that GPU.
CudaMemoryStats cuda_memory_stats(int ordinal = 0);
/// Waits for the GPU and returns every cached buffer to the driver.
void cuda_empty_cache(int ordinal = 0);

/// The device queue of one GPU: ops are grouped into batches of ops_per_batch
/// (WICK_CUDA_OPS_PER_BATCH, default 50), closed at that count, at read-back and at synchronize.
struct CudaQueueStats {
  size_t open_batch_ops = 0;  // ops in the batch still open
  size_t closed_batches = 0;  // batches closed since the device was created
  int ops_per_batch = 0;
};
/// Throws BackendError without that GPU.
CudaQueueStats cuda_queue_stats(int ordinal = 0);

/// The device work of one call of a function, captured once as a CUDA graph and replayed.
/// While `record` runs, every op enqueued on the device is recorded into the graph, not run, with
/// no batch boundaries; device memory allocated meanwhile (the step's intermediates and outputs)
/// stays reserved for the graph until it is destroyed, so tensors made by `record` can be read
/// after each replay. Inputs are tensors made before the capture, whose contents the caller
/// rewrites in place (Tensor::assign) between replays; they, and everything else the recorded ops
/// read, must outlive the graph. `record` must not read back, synchronize or upload more than
/// 8 MiB (BackendError). Without CUDA, capture throws BackendError. No other thread may enqueue
/// work on the device while `record` runs (it would be captured too); replay a graph from one
/// thread at a time.
class CudaGraph {
 public:
  CudaGraph() = default;
  static CudaGraph capture(const Device& device, const std::function<void()>& record);
  /// Enqueues one run of the graph on the device's queue (asynchronous, as any op).
  void replay() const;
  bool defined() const { return impl_ != nullptr; }
  /// Kernel and copy nodes in the graph.
  size_t node_count() const;
  /// Device bytes reserved for the graph's intermediates and outputs.
  size_t reserved_bytes() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace wick
