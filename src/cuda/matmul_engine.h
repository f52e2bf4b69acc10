#pragma once
// The matmul engine of one GPU: the cuBLASLt handle and workspace, a plan (algorithm) cache keyed
// by shape, dtype, layout and alignment, graph replay of repeated identical matmuls, and the
// warm-up that makes cuBLASLt ready on a background thread from device creation, so that the first
// matmul does not pay cuBLAS's first-use cost; wick's own GEMM serves the matmuls
// that arrive before (matmul.cpp).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cuda/allocator.h"
#include "cuda/check.h"
#include "wick/dtype.h"

namespace wick::cuda {

class Queue;

/// One cuBLASLt matmul in row-major terms: C (m x n) = A (m x k) B (k x n), batched with batch
/// strides sa, sb (C dense); `ta`/`tb` when an operand is column-major; the operands' byte
/// alignments.
struct PlanKey {
  DType dtype;
  bool tf32, ta, tb;
  uint32_t align_a, align_b, align_c;
  int64_t m, n, k, lda, ldb, batch, sa, sb;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& p) const;
};

class MatmulEngine {
 public:
  /// Starts the warm-up thread unless WICK_CUDA_WARMUP=0. `allocator` gives the workspace;
  /// `queue` tells whether its stream is being captured. Both must outlive the engine.
  MatmulEngine(int ordinal, Allocator& allocator, const Queue& queue);
  /// Waits for the warm-up thread.
  ~MatmulEngine();
  MatmulEngine(const MatmulEngine&) = delete;
  MatmulEngine& operator=(const MatmulEngine&) = delete;

  /// Waits for the warm-up thread (at process end, and before a whole-step capture).
  void stop();
  /// Whether cuBLASLt is ready (or has failed: see failed()).
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  /// Makes cuBLASLt ready on this thread (no warm-up thread) or waits for the warm-up thread.
  void wait_ready();
  /// cuBLASLt could not be set up: every matmul stays on wick's GEMM.
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  /// Enqueues one cuBLASLt matmul on `s`; false when cuBLASLt has no algorithm for it.
  bool run(const PlanKey& key, const void* a, const void* b, void* c, cudaStream_t s);
  /// Whether this matmul is the first on the cuBLASLt path (for the trace).
  bool first_cublas() { return !cublas_traced_.exchange(true); }

 private:
  struct Plan;
  struct GraphKey {
    PlanKey key;
    const void* a;
    const void* b;
    void* c;
    bool operator==(const GraphKey&) const = default;
  };
  struct GraphKeyHash {
    size_t operator()(const GraphKey& g) const;
  };
  struct GraphEntry {
    int calls = 0;
    cudaGraphExec_t exec = nullptr;
  };

  void call(const Plan& plan, const PlanKey& key, const void* a, const void* b, void* c,
            cudaStream_t s);
  bool capture(const Plan& plan, const PlanKey& key, const void* a, const void* b, void* c,
               GraphEntry& g);
  void clear_graphs_locked();
  Plan* plan_locked(const PlanKey& key);
  std::unique_ptr<Plan> make_plan(const PlanKey& key);
  /// Creates the handle and workspace; with `gemms`, runs one GEMM per dtype. Then ready.
  void warm_up(bool gemms);

  int ordinal_;
  Allocator& allocator_;
  const Queue& queue_;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::mutex plans_mutex_;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
  std::unordered_map<GraphKey, GraphEntry, GraphKeyHash> graphs_;
  cudaStream_t capture_stream_ = nullptr;
  std::mutex init_mutex_;
  std::condition_variable ready_cv_;
  bool started_ = false;
  std::thread thread_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> failed_{false};
  std::atomic<bool> cublas_traced_{false};
};

/// Waits for every device's cuBLASLt warm-up thread. Runs when a thread that used a device ends,
/// the main thread at exit() included (its thread_local destructors run before any static
/// destructor), so that cuBLAS's static state is never torn down under the warm-up thread.
void wait_for_warm_ups();

}  // namespace wick::cuda
