#include "cuda/queue.h"

#include <cstring>
#include <string>

#include "cuda/trace.h"
#include "cuda_config.h"
#include "util.h"

namespace wick::cuda {

namespace {

constexpr size_t kMaxStagingBytes = size_t{64} << 20;  // larger read-backs go straight to `dst`
constexpr size_t kMaxUploadChunk = size_t{8} << 20;    // larger uploads copy from pageable memory
constexpr size_t kErrorOpsShown = 12;

// Names of the ops of `batches` (oldest first), shortened to a readable list.
std::string op_list(const std::deque<std::vector<const char*>>& batches) {
  std::vector<const char*> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  if (all.empty()) return "(none recorded)";
  std::string s = "[";
  for (size_t i = 0; i < all.size() && i < kErrorOpsShown; ++i) {
    if (i) s += ", ";
    s += all[i];
  }
  if (all.size() > kErrorOpsShown) s += str(", ... (", all.size(), " ops)");
  return s + "]";
}

}  // namespace

cudaStream_t create_device_stream(int ordinal) {
  double t0 = now_ms();
  WICK_CUDA_CHECK(cudaSetDevice(ordinal));
  WICK_CUDA_CHECK(cudaFree(nullptr));
  if (trace_enabled()) trace_line("LIB", str("cuda:", ordinal, " context"), now_ms() - t0);
  cudaStream_t s = nullptr;
  WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

Queue::Queue(int ordinal, cudaStream_t stream, PinnedStaging& staging)
    : ordinal_(ordinal),
      stream_(stream),
      staging_(staging),
      trace_(trace_enabled()),
      ops_per_batch_(config().ops_per_batch),
      graph_(ordinal, stream_, trace_),
      flags_(ordinal, stream_, trace_) {
  open_.ops.reserve(ops_per_batch_);
}

void Queue::synchronize() {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked("synchronize");
  make_current(ordinal_);
  end_capture_locked();  // the flag copy below is not captured
  flags_.enqueue_copy();
  close_batch_locked();
  wait_locked("synchronize");
  flags_.check();
}

bool Queue::finished(const char* what) {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked(what);
  make_current(ordinal_);
  end_capture_locked();  // a capturing stream cannot be queried
  cudaError_t st = cudaStreamQuery(stream_);
  if (st == cudaErrorNotReady) return false;
  wait_locked(what);  // at once when the work is done; throws, naming the ops, when it failed
  return true;
}

void Queue::drain() {
  std::lock_guard lock(mutex_);
  close_batch_locked();
  (void)cudaStreamSynchronize(stream_);
}

// ---- batches ----

bool Queue::first_use(const char* name, DType dtype) {
  return used_kernels_.insert(FirstUseKey{name, dtype}).second;
}

double Queue::begin_first_use() {
  // Trace mode only: wait so that the time below is this kernel's load and run alone.
  WICK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return now_ms();
}

void Queue::end_first_use(const char* name, DType dtype, double t0) {
  WICK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  trace_line("PIPE", str(name, ".", dtype_name(dtype)), now_ms() - t0);
}

void Queue::count_op_locked(const char* name) {
  open_.ops.push_back(name);
  if (open_.ops.size() >= static_cast<size_t>(ops_per_batch_) || graph_.must_close()) {
    close_batch_locked();
  }
}

void Queue::retain(std::shared_ptr<const void> keep) {
  std::lock_guard lock(mutex_);
  // While a step is recorded its graph reads `keep` at every replay: the graph holds it.
  (step_capture_ ? step_kept_ : open_.retained).push_back(std::move(keep));
}

void Queue::close_batch_locked() {
  graph_.commit(open_.ops);  // graph mode: ends the capture and launches the graph
  graph_.reset_batch();
  if (open_.ops.empty() && open_.retained.empty()) return;
  cudaEvent_t ev;
  if (!free_events_.empty()) {
    ev = free_events_.back();
    free_events_.pop_back();
  } else {
    WICK_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  }
  WICK_CUDA_CHECK(cudaEventRecord(ev, stream_));
  open_.done = ev;
  in_flight_.push_back(std::move(open_));
  open_ = Batch{};
  open_.ops.reserve(ops_per_batch_);
  ++closed_batches_;
  reap_locked();
}

void Queue::reap_locked() {
  while (!in_flight_.empty()) {
    cudaError_t st = cudaEventQuery(in_flight_.front().done);
    if (st == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: leave no trace for the next launch check
      return;
    }
    if (st != cudaSuccess) return;  // an asynchronous error: wait_locked reports it
    free_events_.push_back(in_flight_.front().done);
    in_flight_.pop_front();
  }
}

void Queue::wait_locked(const char* what) {
  cudaError_t st = cudaStreamSynchronize(stream_);
  if (st == cudaSuccess) {
    for (auto& b : in_flight_) free_events_.push_back(b.done);
    in_flight_.clear();
    graph_.rethrow_lost(what);  // a batch whose capture failed never ran
    return;
  }
  (void)cudaGetLastError();
  std::deque<std::vector<const char*>> ops;
  for (auto& b : in_flight_) ops.push_back(std::move(b.ops));
  // Events of a failed context cannot be reused; drop them.
  in_flight_.clear();
  throw BackendError(str(what, ": asynchronous CUDA error ", cudaGetErrorName(st), " (",
                         cudaGetErrorString(st), ") on cuda:", ordinal_, " from work of the ops ",
                         op_list(ops)));
}

size_t Queue::open_batch_ops() const {
  std::lock_guard lock(mutex_);
  return open_.ops.size();
}

size_t Queue::closed_batches() const {
  std::lock_guard lock(mutex_);
  return closed_batches_;
}

int* Queue::error_flag(const char* op) {
  std::lock_guard lock(mutex_);
  return flags_.slot(op);
}

// ---- transfers ----

void Queue::read_back(const void* src, size_t bytes, void* dst) {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked("read-back");
  make_current(ordinal_);
  end_capture_locked();  // the captured ops run before the copy, which is not captured
  if (bytes <= kMaxStagingBytes) {
    void* staging = staging_.read_buffer(bytes);
    WICK_CUDA_CHECK(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToHost, stream_));
    flags_.enqueue_copy();
    close_batch_locked();
    wait_locked("read-back");
    flags_.check();
    std::memcpy(dst, staging, bytes);
  } else {
    // Big reads: the driver stages pageable memory itself, at full speed for this size.
    WICK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    flags_.enqueue_copy();
    close_batch_locked();
    wait_locked("read-back");
    flags_.check();
  }
}

void Queue::read_back_later(const void* src, size_t bytes, void* dst, cudaEvent_t done) {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked("read-back");
  make_current(ordinal_);
  end_capture_locked();  // the captured ops run before the copy, which is not captured
  WICK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  flags_.enqueue_copy();
  WICK_CUDA_CHECK(cudaEventRecord(done, stream_));
  close_batch_locked();
}

void Queue::wait_for(cudaEvent_t done, const char* what) {
  // Unlocked while waiting: other threads may queue work meanwhile.
  const cudaError_t st = cudaEventSynchronize(done);
  std::lock_guard lock(mutex_);
  if (st != cudaSuccess) wait_locked(what);  // throws, naming the ops of the failed work
  reap_locked();
  flags_.check();
}

void Queue::upload(const void* src, size_t bytes, void* dst) {
  if (bytes == 0) return;
  make_current(ordinal_);
  if (bytes > kMaxUploadChunk) {
    // From pageable memory the driver copies synchronously, so `src` may be reused after this.
    std::lock_guard lock(mutex_);
    refuse_in_step_capture_locked("an upload over 8 MiB");
    end_capture_locked();  // pageable copies cannot be captured
    WICK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    count_op_locked("upload");
    return;
  }
  // Small uploads through pinned memory stay asynchronous; the chunk lives until its batch ran.
  auto chunk = staging_.upload_chunk(bytes);
  std::memcpy(chunk.get(), src, bytes);
  std::lock_guard lock(mutex_);
  WICK_CUDA_CHECK(cudaMemcpyAsync(dst, chunk.get(), bytes, cudaMemcpyHostToDevice, stream_));
  if (step_capture_) {
    step_kept_.push_back(std::move(chunk));  // every replay copies from it again
    ++step_ops_;
    return;
  }
  open_.retained.push_back(std::move(chunk));
  count_op_locked("upload");
}

// ---- graph mode ----

bool Queue::graph_admit_locked(double work) {
  auto bytes = static_cast<double>(pending_bytes_.exchange(0, std::memory_order_relaxed));
  if (graph_.admit(work + kWorkPerByte * bytes, open_.ops.size())) return true;
  end_capture_locked();  // the batch so far runs first
  graph_.count_direct();
  return false;
}

void Queue::graph_abort_locked(const char* name) {
  graph_.abort(open_.ops, name);
}

void Queue::end_capture_locked() {
  if (graph_.capturing()) close_batch_locked();
}

void Queue::set_graph_mode(bool on) {
  std::lock_guard lock(mutex_);
  make_current(ordinal_);
  close_batch_locked();
  graph_.set_enabled(on);
  pending_bytes_.store(0, std::memory_order_relaxed);
}

bool Queue::graph_capturing() const {
  std::lock_guard lock(mutex_);
  return graph_.capturing();
}

GraphStats Queue::graph_stats() const {
  std::lock_guard lock(mutex_);
  return graph_.stats();
}

void Queue::flush() {
  std::lock_guard lock(mutex_);
  make_current(ordinal_);
  end_capture_locked();
}

void Queue::note_alloc(size_t bytes) {
  if (!graph_.enabled() || step_capture_) return;
  pending_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (static_cast<double>(bytes) * kWorkPerByte >= graph_.work_limit()) flush();
}

// ---- whole-step capture ----

void Queue::refuse_in_step_capture_locked(const char* what) const {
  if (step_capture_) {
    throw BackendError(str(what, " on cuda:", ordinal_,
                           " while a CudaGraph is recording (the recorded function must only "
                           "enqueue device work)"));
  }
}

void Queue::fork_aside_locked() {
  if (side_ == nullptr) {
    WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    WICK_CUDA_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
    WICK_CUDA_CHECK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
  }
  WICK_CUDA_CHECK(cudaEventRecord(side_fork_, stream_));
  WICK_CUDA_CHECK(cudaStreamWaitEvent(side_, side_fork_, 0));
}

void Queue::begin_step_capture(Allocator& allocator) {
  std::lock_guard lock(mutex_);
  if (step_capture_)
    throw BackendError(str("CudaGraph::capture: cuda:", ordinal_, " is already recording a graph"));
  make_current(ordinal_);
  close_batch_locked();
  // Relaxed: the allocator may cudaMalloc while recording.
  WICK_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  allocator.begin_reserving();
  step_capture_ = true;
  step_ops_ = 0;
  step_kept_.clear();
}

cudaGraph_t Queue::end_step_capture(Allocator& allocator, std::vector<Allocator::Block>& reserved,
                                    std::vector<std::shared_ptr<const void>>& kept, size_t& ops) {
  std::lock_guard lock(mutex_);
  make_current(ordinal_);
  step_capture_ = false;
  reserved = allocator.end_reserving();
  kept = std::move(step_kept_);
  step_kept_.clear();
  ops = step_ops_;
  if (side_open_) {  // a capture ends with every branch joined
    side_open_ = false;
    (void)cudaStreamWaitEvent(stream_, side_done_, 0);  // a failure shows in the end below
  }
  cudaGraph_t graph = nullptr;
  cudaError_t st = cudaStreamEndCapture(stream_, &graph);
  if (st != cudaSuccess || graph == nullptr) {
    (void)cudaGetLastError();
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    allocator.release_reserved(reserved);
    reserved.clear();
    kept.clear();
    throw BackendError(str("CudaGraph::capture on cuda:", ordinal_, ": the capture of ", ops,
                           " ops failed: ", cudaGetErrorName(st), " (", cudaGetErrorString(st),
                           ")"));
  }
  return graph;
}

void Queue::launch_graph(cudaGraphExec_t exec) {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked("CudaGraph::replay");
  make_current(ordinal_);
  end_capture_locked();  // graph mode: the batch so far runs first
  WICK_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  count_op_locked("graph_replay");
}

}  // namespace wick::cuda
