#pragma once
// One CudaDevice per GPU: the stream that is the device's queue, the caching allocator, pinned
// staging memory, the out-of-range flags of index kernels, the random generator state and the
// matmul engine (cuBLASLt, warmed up on a background thread).
//
// The queue: every op is an asynchronous launch on the stream. Ops are counted into batches of
// WICK_CUDA_OPS_PER_BATCH (default 50, the seeds' compute_per_buffer); a batch is closed at that
// count, at read-back, at synchronize() and when the process ends. A closed batch records an event
// and keeps alive what its work uses until the event has passed. In graph mode (graph.h,
// WICK_CUDA_GRAPHS=1) a batch's ops are captured and run as one CUDA graph when it closes.
// Errors of asynchronous work are rethrown at the next read-back or synchronize, naming the ops
// that may have caused them.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "backend.h"
#include "cuda/allocator.h"
#include "cuda/check.h"
#include "cuda/graph.h"
#include "cuda_config.h"

namespace wick::cuda {

class CudaDevice;
class MatmulEngine;
struct MatmulEngineDeleter {
  void operator()(MatmulEngine* engine) const;
};
/// Creates the device's matmul engine and starts its cuBLASLt warm-up thread (matmul.cpp).
std::unique_ptr<MatmulEngine, MatmulEngineDeleter> make_matmul_engine(CudaDevice& device);
/// Waits for the warm-up thread (at process end).
void stop_matmul_engine(MatmulEngine& engine);
/// Waits for every device's cuBLASLt warm-up thread. Runs when a thread that used a device ends,
/// the main thread at exit() included (its thread_local destructors run before any static
/// destructor), so that cuBLAS's static state is never torn down under the warm-up thread.
void wait_for_warm_ups();

/// One device allocation, returned to the allocator's cache when the last owner lets go.
class DeviceBuffer {
 public:
  DeviceBuffer(CudaDevice& device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  CudaDevice* device_;
  void* ptr_;
  size_t bytes_;
};

/// Makes GPU `ordinal` current on this thread (cheap when it already is).
void make_current(int ordinal);

/// Prints one trace line: "[wick] <kind> <name> <ms> ms".
void trace_line(const char* kind, const std::string& name, double ms);
/// Milliseconds on a steady clock.
double now_ms();

class CudaDevice final : public BackendDevice {
 public:
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;
  /// Closes the open batch, waits for the GPU and for the warm-up thread; errors are swallowed
  /// (runs at process end).
  void shutdown() noexcept;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  Device device() const { return Device::cuda(ordinal_); }
  cudaStream_t stream() const { return stream_; }
  Allocator& allocator() { return allocator_; }
  MatmulEngine& matmul_engine() { return *matmul_; }

  // ---- BackendDevice ----
  StoragePtr alloc(size_t count, DType dtype) override;
  StoragePtr filled(size_t count, DType dtype, const void* value) override;
  StoragePtr from_host(const void* data, size_t count, DType dtype) override;
  StoragePtr rand_uniform(size_t count, DType dtype, double lo, double hi) override;
  StoragePtr rand_normal(size_t count, DType dtype, double mean, double std) override;
  void set_seed(uint64_t seed) override;
  /// Closes the batch, waits for all work, rethrows deferred errors.
  void synchronize() override;

  // ---- the queue ----
  /// Enqueues op `name` (dtype `dtype`): calls launch(stream) and counts the op into the batch.
  /// With WICK_TRACE=1 the first launch of each (name, dtype) is timed and printed. In graph
  /// mode the launch is captured into the batch's graph, unless `work` (flop-equivalents, plus
  /// the bytes allocated since the last op) is past the batch work limit: then the batch so far
  /// is launched and this op starts at once.
  template <class F>
  void enqueue(const char* name, DType dtype, F&& launch, double work = 0) {
    std::lock_guard lock(mutex_);
    make_current(ordinal_);
    if (step_capture_) {
      launch(stream_);  // recorded into the step's graph: no batch, no first-use timing
      ++step_ops_;
    } else if (trace_ && first_use(name, dtype)) {
      end_capture_locked();  // the timing waits on the stream, which a capture forbids
      double t0 = begin_first_use();
      launch(stream_);
      end_first_use(name, dtype, t0);
    } else if (graph_.enabled() && graph_admit_locked(work)) {
      try {
        launch(stream_);
      } catch (...) {
        graph_abort_locked(name);  // the device stays usable; the batch is reported lost
        throw;
      }
      graph_.note(name, dtype);
    } else {
      launch(stream_);
    }
    if (!step_capture_) count_op_locked(name);
  }
  /// Keeps `keep` alive until the current batch has run on the GPU.
  void retain(std::shared_ptr<const void> keep);
  /// A device int, zero until an index kernel of op `op` finds an id out of range; checked (and
  /// rethrown as IndexOutOfRange naming `op`) at the next read-back or synchronize.
  int* error_flag(const char* op);
  /// Copies `bytes` of device memory at `src` to host `dst`: closes the batch, waits for the
  /// copy (so for all earlier work of the stream) and rethrows deferred errors.
  void read_back(const void* src, size_t bytes, void* dst);
  /// Enqueues a copy of `bytes` host bytes to device memory `dst`; `src` may be reused at once.
  void upload(const void* src, size_t bytes, void* dst);
  /// Ops in the open batch, batches closed so far (for tests and traces).
  size_t open_batch_ops() const;
  size_t closed_batches() const;
  int ops_per_batch() const { return ops_per_batch_; }

  // ---- graph mode (graph.h) ----
  bool graph_mode() const { return graph_.enabled(); }
  /// Switches between graph and stream mode; closes the open batch first.
  void set_graph_mode(bool on);
  bool graph_capturing() const;
  GraphStats graph_stats() const;
  /// Launches what the open batch has captured so far: for code that puts its own work on
  /// stream() or waits on it while graph mode is on.
  void flush();
  /// DeviceBuffer: `bytes` allocated for the next op count into its work estimate; a big
  /// allocation ends the capture first (the allocator's out-of-memory retry waits on the stream).
  void note_alloc(size_t bytes);

  // ---- whole-step capture (CudaGraph in wick/cuda.h) ----
  /// Closes the open batch and starts recording every op of every thread into one graph, with
  /// the blocks allocated meanwhile reserved for it. BackendError when already recording.
  void begin_step_capture();
  /// Ends the recording. `reserved`: the blocks to give back (Allocator::release_reserved) when
  /// the graph is destroyed; `kept`: host memory (upload staging) the graph reads. Throws
  /// BackendError, having released everything, when the capture failed.
  cudaGraph_t end_step_capture(std::vector<Allocator::Block>& reserved,
                               std::vector<std::shared_ptr<const void>>& kept, size_t& ops);
  bool step_capturing() const { return step_capture_.load(std::memory_order_relaxed); }
  /// Enqueues one launch of an instantiated graph as one op of the queue.
  void launch_graph(cudaGraphExec_t exec);

 private:
  /// BackendError when a step capture is recording: `what` cannot be captured.
  void refuse_in_step_capture_locked(const char* what) const;
  struct Batch {
    cudaEvent_t done = nullptr;
    std::vector<const char*> ops;
    std::vector<std::shared_ptr<const void>> retained;
  };
  struct FirstUseKey {
    const char* name;
    DType dtype;
    bool operator==(const FirstUseKey&) const = default;
  };
  struct FirstUseHash {
    size_t operator()(const FirstUseKey& k) const {
      return std::hash<const void*>()(k.name) ^ static_cast<size_t>(k.dtype);
    }
  };

  bool first_use(const char* name, DType dtype);
  double begin_first_use();
  void end_first_use(const char* name, DType dtype, double t0);
  void count_op_locked(const char* name);
  /// Graph mode: true when the next op is to be captured; false when it is big (the batch so
  /// far has then been launched).
  bool graph_admit_locked(double work);
  void graph_abort_locked(const char* name);
  /// Graph mode: closes the batch when a capture is open (before uncapturable work).
  void end_capture_locked();
  void close_batch_locked();
  void reap_locked();
  /// Waits for the stream; on failure throws naming the ops of the unfinished batches.
  void wait_locked(const char* what);
  void enqueue_flag_copy_locked();
  void check_flags_locked();
  void* pinned_staging_locked(size_t bytes);
  std::shared_ptr<void> pinned_upload_chunk(size_t bytes);
  std::unique_ptr<BackendStorage> random(bool normal, size_t count, DType dtype, double a,
                                         double b);

  int ordinal_;
  double context_ms_ = 0;
  cudaStream_t stream_ = nullptr;
  Allocator allocator_;
  bool trace_;
  int ops_per_batch_;
  GraphQueue graph_;
  std::atomic<size_t> pending_bytes_{0};   // allocated since the last op (graph mode)
  std::atomic<bool> step_capture_{false};  // recording a whole step (CudaGraph); read unlocked

  size_t step_ops_ = 0;
  std::vector<std::shared_ptr<const void>> step_kept_;

  mutable std::recursive_mutex mutex_;
  Batch open_;
  std::deque<Batch> in_flight_;
  std::vector<cudaEvent_t> free_events_;
  size_t closed_batches_ = 0;
  std::unordered_set<FirstUseKey, FirstUseHash> used_kernels_;

  // Read-back staging (pinned; grows, never shrinks).
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  // Upload chunks (pinned), by size class, reused once their batch has run.
  std::mutex upload_mutex_;
  std::vector<std::pair<size_t, void*>> upload_free_;

  // Index-kernel error flags: one slot per op since the last check.
  int* flags_dev_ = nullptr;
  int* flags_host_ = nullptr;
  std::vector<const char*> flag_ops_;

  // Random generator: counter-based, (seed, offset) fully determine the values.
  uint64_t seed_ = 299792458;
  uint64_t rng_offset_ = 0;

  std::unique_ptr<MatmulEngine, MatmulEngineDeleter> matmul_;
};

/// The device of `ordinal`, created on first use (BackendError without that GPU).
CudaDevice& cuda_device(int ordinal);

}  // namespace wick::cuda
