#include "cuda/cuda_device.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "cuda/cuda_storage.h"
#include "cuda/kernels.h"
#include "util.h"
#include "wick/cuda.h"

namespace wick::cuda {

namespace {

constexpr size_t kFlagSlots = 4096;
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

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

void trace_line(const char* kind, const std::string& name, double ms) {
  std::fprintf(stderr, "[wick] %s %s %.3f ms\n", kind, name.c_str(), ms);
}

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line) {
  const char* base = std::strrchr(file, '/');
  throw BackendError(str("CUDA error: ", call, " failed with ", cudaGetErrorName(status), " (",
                         cudaGetErrorString(status), ") at ", base ? base + 1 : file, ":", line));
}

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line) {
  const char* base = std::strrchr(file, '/');
  throw BackendError(str("cuBLAS error: ", call, " failed with ", cublasGetStatusName(status), " (",
                         cublasGetStatusString(status), ") at ", base ? base + 1 : file, ":",
                         line));
}

// ---- DeviceBuffer ----

DeviceBuffer::DeviceBuffer(CudaDevice& device, size_t bytes)
    : device_(&device), ptr_(nullptr), bytes_(bytes) {
  device.note_alloc(bytes);
  ptr_ = device.allocator().alloc(bytes);
}

DeviceBuffer::~DeviceBuffer() {
  device_->allocator().free(ptr_, bytes_);
}

// ---- CudaDevice ----

namespace {
// Makes `ordinal` current and creates its context now, not inside the first op.
cudaStream_t create_stream(int ordinal, double& context_ms) {
  double t0 = now_ms();
  WICK_CUDA_CHECK(cudaSetDevice(ordinal));
  WICK_CUDA_CHECK(cudaFree(nullptr));
  context_ms = now_ms() - t0;
  cudaStream_t s = nullptr;
  WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}
}  // namespace

void make_current(int ordinal) {
  thread_local int current = -1;
  if (current != ordinal) {
    WICK_CUDA_CHECK(cudaSetDevice(ordinal));
    current = ordinal;
  }
}

CudaDevice::CudaDevice(int ordinal)
    : ordinal_(ordinal),
      stream_(create_stream(ordinal, context_ms_)),
      allocator_(ordinal, stream_),
      trace_(trace_enabled()),
      ops_per_batch_(config().ops_per_batch),
      graph_(ordinal, stream_, trace_) {
  double t0 = now_ms();
  WICK_CUDA_CHECK(cudaMalloc(&flags_dev_, kFlagSlots * sizeof(int)));
  WICK_CUDA_CHECK(cudaMemsetAsync(flags_dev_, 0, kFlagSlots * sizeof(int), stream_));
  WICK_CUDA_CHECK(cudaHostAlloc(&flags_host_, kFlagSlots * sizeof(int), cudaHostAllocDefault));
  flag_ops_.reserve(kFlagSlots);
  open_.ops.reserve(ops_per_batch_);
  if (trace_) {
    trace_line("LIB", str("cuda:", ordinal, " context"), context_ms_);
    trace_line("LIB", str("cuda:", ordinal, " stream+flags"), now_ms() - t0);
  }
  matmul_ = make_matmul_engine(*this);
}

CudaDevice::~CudaDevice() {
  shutdown();
}

void CudaDevice::shutdown() noexcept {
  try {
    if (matmul_) stop_matmul_engine(*matmul_);
    std::lock_guard lock(mutex_);
    close_batch_locked();
    (void)cudaStreamSynchronize(stream_);
  } catch (...) {
    // At process end there is no one left to tell.
  }
}

StoragePtr CudaDevice::alloc(size_t count, DType dtype) {
  return std::make_unique<CudaStorage>(*this, count, dtype);
}

StoragePtr CudaDevice::filled(size_t count, DType dtype, const void* value) {
  auto out = std::make_unique<CudaStorage>(*this, count, dtype);
  if (count == 0) return out;
  enqueue("fill", dtype, [&](cudaStream_t s) { launch_fill(dtype, out->data(), count, value, s); });
  return out;
}

StoragePtr CudaDevice::from_host(const void* data, size_t count, DType dtype) {
  auto out = std::make_unique<CudaStorage>(*this, count, dtype);
  if (count > 0) upload(data, count * size_in_bytes(dtype), out->data());
  return out;
}

StoragePtr CudaDevice::rand_uniform(size_t count, DType dtype, double lo, double hi) {
  return random(false, count, dtype, lo, hi);
}

StoragePtr CudaDevice::rand_normal(size_t count, DType dtype, double mean, double std) {
  return random(true, count, dtype, mean, std);
}

std::unique_ptr<BackendStorage> CudaDevice::random(bool normal, size_t count, DType dtype, double a,
                                                   double b) {
  auto out = std::make_unique<CudaStorage>(*this, count, dtype);
  if (count == 0) return out;
  std::lock_guard lock(mutex_);
  uint64_t seed = seed_, offset = rng_offset_;
  // Counter blocks of 4 values: the next call starts on a fresh block.
  rng_offset_ += (count + 3) / 4 * 4;
  if (normal) {
    enqueue("rand_normal", dtype, [&](cudaStream_t s) {
      launch_rand_normal(dtype, out->data(), count, a, b, seed, offset, s);
    });
  } else {
    enqueue("rand_uniform", dtype, [&](cudaStream_t s) {
      launch_rand_uniform(dtype, out->data(), count, a, b, seed, offset, s);
    });
  }
  return out;
}

void CudaDevice::set_seed(uint64_t seed) {
  std::lock_guard lock(mutex_);
  seed_ = seed;
  rng_offset_ = 0;
}

void CudaDevice::synchronize() {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked("synchronize");
  make_current(ordinal_);
  end_capture_locked();  // the flag copy below is not captured
  enqueue_flag_copy_locked();
  close_batch_locked();
  wait_locked("synchronize");
  check_flags_locked();
}

// ---- the queue ----

bool CudaDevice::first_use(const char* name, DType dtype) {
  return used_kernels_.insert(FirstUseKey{name, dtype}).second;
}

double CudaDevice::begin_first_use() {
  // Trace mode only: wait so that the time below is this kernel's load and run alone.
  WICK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return now_ms();
}

void CudaDevice::end_first_use(const char* name, DType dtype, double t0) {
  WICK_CUDA_CHECK(cudaStreamSynchronize(stream_));
  trace_line("PIPE", str(name, ".", dtype_name(dtype)), now_ms() - t0);
}

void CudaDevice::count_op_locked(const char* name) {
  open_.ops.push_back(name);
  if (open_.ops.size() >= static_cast<size_t>(ops_per_batch_) || graph_.must_close()) {
    close_batch_locked();
  }
}

bool CudaDevice::graph_admit_locked(double work) {
  auto bytes = static_cast<double>(pending_bytes_.exchange(0, std::memory_order_relaxed));
  if (graph_.admit(work + kWorkPerByte * bytes, open_.ops.size())) return true;
  end_capture_locked();  // the batch so far runs first
  graph_.count_direct();
  return false;
}

void CudaDevice::graph_abort_locked(const char* name) {
  graph_.abort(open_.ops, name);
}

void CudaDevice::end_capture_locked() {
  if (graph_.capturing()) close_batch_locked();
}

void CudaDevice::set_graph_mode(bool on) {
  std::lock_guard lock(mutex_);
  make_current(ordinal_);
  close_batch_locked();
  graph_.set_enabled(on);
  pending_bytes_.store(0, std::memory_order_relaxed);
}

bool CudaDevice::graph_capturing() const {
  std::lock_guard lock(mutex_);
  return graph_.capturing();
}

GraphStats CudaDevice::graph_stats() const {
  std::lock_guard lock(mutex_);
  return graph_.stats();
}

void CudaDevice::flush() {
  std::lock_guard lock(mutex_);
  make_current(ordinal_);
  end_capture_locked();
}

void CudaDevice::note_alloc(size_t bytes) {
  if (!graph_.enabled() || step_capture_) return;
  pending_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  if (static_cast<double>(bytes) * kWorkPerByte >= graph_.work_limit()) flush();
}

void CudaDevice::retain(std::shared_ptr<const void> keep) {
  std::lock_guard lock(mutex_);
  // While a step is recorded its graph reads `keep` at every replay: the graph holds it.
  (step_capture_ ? step_kept_ : open_.retained).push_back(std::move(keep));
}

void CudaDevice::refuse_in_step_capture_locked(const char* what) const {
  if (step_capture_) {
    throw BackendError(str(what, " on cuda:", ordinal_,
                           " while a CudaGraph is recording (the recorded function must only "
                           "enqueue device work)"));
  }
}

void CudaDevice::begin_step_capture() {
  // cuBLASLt ready first, so that the graph holds its matmuls and not the warm-up fallback.
  if (matmul_) stop_matmul_engine(*matmul_);
  std::lock_guard lock(mutex_);
  if (step_capture_)
    throw BackendError(str("CudaGraph::capture: cuda:", ordinal_, " is already recording a graph"));
  make_current(ordinal_);
  close_batch_locked();
  // Relaxed: the allocator may cudaMalloc while recording.
  WICK_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  allocator_.begin_reserving();
  step_capture_ = true;
  step_ops_ = 0;
  step_kept_.clear();
}

cudaGraph_t CudaDevice::end_step_capture(std::vector<Allocator::Block>& reserved,
                                         std::vector<std::shared_ptr<const void>>& kept,
                                         size_t& ops) {
  std::lock_guard lock(mutex_);
  make_current(ordinal_);
  step_capture_ = false;
  reserved = allocator_.end_reserving();
  kept = std::move(step_kept_);
  step_kept_.clear();
  ops = step_ops_;
  cudaGraph_t graph = nullptr;
  cudaError_t st = cudaStreamEndCapture(stream_, &graph);
  if (st != cudaSuccess || graph == nullptr) {
    (void)cudaGetLastError();
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    allocator_.release_reserved(reserved);
    reserved.clear();
    kept.clear();
    throw BackendError(str("CudaGraph::capture on cuda:", ordinal_, ": the capture of ", ops,
                           " ops failed: ", cudaGetErrorName(st), " (", cudaGetErrorString(st),
                           ")"));
  }
  return graph;
}

void CudaDevice::launch_graph(cudaGraphExec_t exec) {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked("CudaGraph::replay");
  make_current(ordinal_);
  end_capture_locked();  // graph mode: the batch so far runs first
  WICK_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  count_op_locked("graph_replay");
}

void CudaDevice::close_batch_locked() {
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

void CudaDevice::reap_locked() {
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

void CudaDevice::wait_locked(const char* what) {
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

int* CudaDevice::error_flag(const char* op) {
  std::lock_guard lock(mutex_);
  if (flag_ops_.size() < kFlagSlots) {
    flag_ops_.push_back(op);
    return flags_dev_ + flag_ops_.size() - 1;
  }
  // Out of slots until the next check: later ops share the last one.
  flag_ops_.back() = "an index op";
  return flags_dev_ + kFlagSlots - 1;
}

void CudaDevice::enqueue_flag_copy_locked() {
  if (flag_ops_.empty()) return;
  WICK_CUDA_CHECK(cudaMemcpyAsync(flags_host_, flags_dev_, flag_ops_.size() * sizeof(int),
                                  cudaMemcpyDeviceToHost, stream_));
}

void CudaDevice::check_flags_locked() {
  if (flag_ops_.empty()) return;
  size_t n = flag_ops_.size();
  const char* bad = nullptr;
  for (size_t i = 0; i < n && bad == nullptr; ++i) {
    if (flags_host_[i] != 0) bad = flag_ops_[i];
  }
  flag_ops_.clear();
  if (bad == nullptr) return;
  // The device stays usable: clear the flags for the ops to come.
  WICK_CUDA_CHECK(cudaMemsetAsync(flags_dev_, 0, n * sizeof(int), stream_));
  std::memset(flags_host_, 0, n * sizeof(int));
  throw IndexOutOfRange(str(bad, ": index out of range on cuda:", ordinal_,
                            " (found by the GPU, reported at the next read-back or synchronize)"));
}

void* CudaDevice::pinned_staging_locked(size_t bytes) {
  if (bytes > staging_bytes_) {
    size_t size = std::max<size_t>(bytes, 64 << 10);
    size = std::bit_ceil(size);
    void* p = nullptr;
    WICK_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocDefault));
    if (staging_ != nullptr) {
      // Earlier read-backs have all completed (each one waits).
      WICK_CUDA_CHECK(cudaFreeHost(staging_));
    }
    staging_ = p;
    staging_bytes_ = size;
  }
  return staging_;
}

void CudaDevice::read_back(const void* src, size_t bytes, void* dst) {
  std::lock_guard lock(mutex_);
  refuse_in_step_capture_locked("read-back");
  make_current(ordinal_);
  end_capture_locked();  // the captured ops run before the copy, which is not captured
  if (bytes <= kMaxStagingBytes) {
    void* staging = pinned_staging_locked(bytes);
    WICK_CUDA_CHECK(cudaMemcpyAsync(staging, src, bytes, cudaMemcpyDeviceToHost, stream_));
    enqueue_flag_copy_locked();
    close_batch_locked();
    wait_locked("read-back");
    check_flags_locked();
    std::memcpy(dst, staging, bytes);
  } else {
    // Big reads: the driver stages pageable memory itself, at full speed for this size.
    WICK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    enqueue_flag_copy_locked();
    close_batch_locked();
    wait_locked("read-back");
    check_flags_locked();
  }
}

std::shared_ptr<void> CudaDevice::pinned_upload_chunk(size_t bytes) {
  size_t size = std::bit_ceil(std::max<size_t>(bytes, 4096));
  void* p = nullptr;
  {
    std::lock_guard lock(upload_mutex_);
    for (size_t i = 0; i < upload_free_.size(); ++i) {
      if (upload_free_[i].first == size) {
        p = upload_free_[i].second;
        upload_free_[i] = upload_free_.back();
        upload_free_.pop_back();
        break;
      }
    }
  }
  if (p == nullptr) WICK_CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocDefault));
  return std::shared_ptr<void>(p, [this, size](void* q) {
    std::lock_guard lock(upload_mutex_);
    upload_free_.emplace_back(size, q);
  });
}

void CudaDevice::upload(const void* src, size_t bytes, void* dst) {
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
  auto chunk = pinned_upload_chunk(bytes);
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

size_t CudaDevice::open_batch_ops() const {
  std::lock_guard lock(mutex_);
  return open_.ops.size();
}

size_t CudaDevice::closed_batches() const {
  std::lock_guard lock(mutex_);
  return closed_batches_;
}

// ---- the device registry ----

namespace {

struct Registry {
  std::mutex mutex;
  int count = -1;
  std::string count_error;
  std::vector<CudaDevice*> devices;  // never destroyed: storages may outlive static destructors
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

int device_count_locked(Registry& r) {
  if (r.count < 0) {
    int n = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      r.count_error = str(cudaGetErrorName(st), " (", cudaGetErrorString(st), ")");
      n = 0;
    }
    r.count = n;
  }
  return r.count;
}

void shutdown_all() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (CudaDevice* d : r.devices) {
    if (d != nullptr) d->shutdown();
  }
}

}  // namespace

namespace {
struct WarmUpGuard {
  ~WarmUpGuard() { wait_for_warm_ups(); }
};
}  // namespace

CudaDevice& cuda_device(int ordinal) {
  thread_local WarmUpGuard guard;  // see wait_for_warm_ups
  (void)guard;
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  int n = device_count_locked(r);
  if (ordinal < 0 || ordinal >= n) {
    if (n == 0) {
      throw BackendError(str("no CUDA device: cuda:", ordinal, " requested, none visible",
                             r.count_error.empty() ? "" : ": cudaGetDeviceCount: ", r.count_error));
    }
    throw BackendError(
        str("no CUDA device: cuda:", ordinal, " requested, ", n, " visible (cuda:0..", n - 1, ")"));
  }
  if (r.devices.empty()) {
    r.devices.assign(n, nullptr);
    std::atexit(shutdown_all);
  }
  if (r.devices[ordinal] == nullptr) {
    double t0 = now_ms();
    r.devices[ordinal] = new CudaDevice(ordinal);
    if (trace_enabled()) trace_line("LIB", str("cuda:", ordinal, " device"), now_ms() - t0);
  }
  return *r.devices[ordinal];
}

BackendDevice& device(int ordinal) {
  return cuda_device(ordinal);
}

int device_count() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return device_count_locked(r);
}

}  // namespace wick::cuda

namespace wick {

CudaMemoryStats cuda_memory_stats(int ordinal) {
  cuda::AllocatorStats s = cuda::cuda_device(ordinal).allocator().stats();
  return CudaMemoryStats{s.in_use_bytes, s.cached_bytes, s.peak_bytes};
}

void cuda_empty_cache(int ordinal) {
  cuda::CudaDevice& d = cuda::cuda_device(ordinal);
  d.flush();  // the allocator waits on the stream, which a capture forbids
  d.allocator().release_cached();
}

CudaQueueStats cuda_queue_stats(int ordinal) {
  cuda::CudaDevice& d = cuda::cuda_device(ordinal);
  return CudaQueueStats{d.open_batch_ops(), d.closed_batches(), d.ops_per_batch()};
}

}  // namespace wick
