#pragma once
// The queue of one GPU's stream: the command batches, graph mode, whole-step capture and the
// errors of asynchronous work.
//
// Every op is an asynchronous launch on the stream. Ops are counted into batches of
// WICK_CUDA_OPS_PER_BATCH (default 50, the seeds' compute_per_buffer); a batch is closed at that
// count, at read-back, at synchronize() and when the process ends. A closed batch records an event
// and keeps alive what its work uses until the event has passed. In graph mode (graph.h,
// WICK_CUDA_GRAPHS=1) a batch's ops are captured and run as one CUDA graph when it closes.
// Errors of asynchronous work are rethrown at the next read-back or synchronize, naming the ops
// that may have caused them; so are ids out of range found by index kernels (index_flags.h).

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "cuda/allocator.h"
#include "cuda/check.h"
#include "cuda/graph.h"
#include "cuda/index_flags.h"
#include "cuda/staging.h"

namespace wick::cuda {

/// Makes `ordinal` current, creates its context now (not inside the first op) and the device's
/// stream. The stream is left to the driver: devices live until the process ends.
cudaStream_t create_device_stream(int ordinal);

class Queue {
 public:
  /// Read-backs and uploads go through `staging`, which must outlive the queue.
  Queue(int ordinal, cudaStream_t stream, PinnedStaging& staging);
  ~Queue() = default;
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;

  cudaStream_t stream() const { return stream_; }

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
  /// During a whole-step capture only: records launch(side stream) as a branch that starts after
  /// the step's work so far and that the rest of the step does not wait for (the branches join the
  /// step at the capture's end). Does nothing outside of one.
  template <class F>
  void enqueue_aside(F&& launch) {
    std::lock_guard lock(mutex_);
    if (!step_capture_) return;
    make_current(ordinal_);
    fork_aside_locked();
    launch(side_);
    WICK_CUDA_CHECK(cudaEventRecord(side_done_, side_));
    side_open_ = true;
    ++step_ops_;
  }
  /// Keeps `keep` alive until the current batch has run on the GPU.
  void retain(std::shared_ptr<const void> keep);
  /// A device int, zero until an index kernel of op `op` finds an id out of range; checked (and
  /// rethrown as IndexOutOfRange naming `op`) at the next read-back or synchronize.
  int* error_flag(const char* op);
  /// Copies `bytes` of device memory at `src` to host `dst`: closes the batch, waits for the
  /// copy (so for all earlier work of the stream) and rethrows deferred errors.
  void read_back(const void* src, size_t bytes, void* dst);
  /// Enqueues a copy of `bytes` of device memory at `src` to pinned host memory `dst` after the
  /// work queued so far, records `done` after it and launches the open batch, without waiting:
  /// a read-back that wait_for(done) ends without waiting for the work queued after it.
  void read_back_later(const void* src, size_t bytes, void* dst, cudaEvent_t done);
  /// Waits for `done` of read_back_later (not for later work) and rethrows the errors of the work
  /// before it, as read_back does.
  void wait_for(cudaEvent_t done, const char* what);
  /// Enqueues a copy of `bytes` host bytes to device memory `dst`; `src` may be reused at once.
  void upload(const void* src, size_t bytes, void* dst);
  /// Closes the batch, waits for all work, rethrows deferred errors.
  void synchronize();
  /// Launches the open batch and answers whether all work has finished, without waiting;
  /// rethrows the errors of failed work as synchronize() does.
  bool finished(const char* what);
  /// Closes the open batch and waits for the stream, ignoring its errors (at process end).
  void drain();
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
  /// the blocks `allocator` hands out meanwhile reserved for it. BackendError when already
  /// recording.
  void begin_step_capture(Allocator& allocator);
  /// Ends the recording. `reserved`: the blocks to give back (Allocator::release_reserved) when
  /// the graph is destroyed; `kept`: host memory (upload staging) the graph reads. Throws
  /// BackendError, having released everything, when the capture failed.
  cudaGraph_t end_step_capture(Allocator& allocator, std::vector<Allocator::Block>& reserved,
                               std::vector<std::shared_ptr<const void>>& kept, size_t& ops);
  bool step_capturing() const { return step_capture_.load(std::memory_order_relaxed); }
  /// Enqueues one launch of an instantiated graph as one op of the queue.
  void launch_graph(cudaGraphExec_t exec);

 private:
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

  /// BackendError when a step capture is recording: `what` cannot be captured.
  void refuse_in_step_capture_locked(const char* what) const;
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
  /// The side stream waits for the work recorded on the stream so far (enqueue_aside).
  void fork_aside_locked();
  /// Waits for the stream; on failure throws naming the ops of the unfinished batches.
  void wait_locked(const char* what);

  int ordinal_;
  cudaStream_t stream_;
  PinnedStaging& staging_;
  bool trace_;
  int ops_per_batch_;
  GraphQueue graph_;
  std::atomic<size_t> pending_bytes_{0};   // allocated since the last op (graph mode)
  std::atomic<bool> step_capture_{false};  // recording a whole step (CudaGraph); read unlocked

  size_t step_ops_ = 0;
  // enqueue_aside's stream and events, made on first use; side_open_: a branch awaits its join.
  cudaStream_t side_ = nullptr;
  cudaEvent_t side_fork_ = nullptr, side_done_ = nullptr;
  bool side_open_ = false;
  std::vector<std::shared_ptr<const void>> step_kept_;

  mutable std::recursive_mutex mutex_;
  Batch open_;
  std::deque<Batch> in_flight_;
  std::vector<cudaEvent_t> free_events_;
  size_t closed_batches_ = 0;
  std::unordered_set<FirstUseKey, FirstUseHash> used_kernels_;
  IndexErrorFlags flags_;
};

}  // namespace wick::cuda
