#include "cuda/cuda_device.h"

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/cuda_storage.h"
#include "cuda/kernels.h"
#include "cuda/matmul_engine.h"
#include "cuda/trace.h"
#include "cuda_config.h"
#include "util.h"
#include "wick/cuda.h"

namespace wick::cuda {

// ---- DeviceBuffer ----

DeviceBuffer::DeviceBuffer(CudaDevice& device, size_t bytes)
    : allocator_(&device.allocator()), ptr_(nullptr), bytes_(bytes) {
  device.queue().note_alloc(bytes);
  ptr_ = allocator_->alloc(bytes);
}

DeviceBuffer::~DeviceBuffer() {
  allocator_->free(ptr_, bytes_);
}

// ---- CudaDevice ----

CudaDevice::CudaDevice(int ordinal)
    : ordinal_(ordinal),
      stream_(create_device_stream(ordinal)),
      allocator_(ordinal, stream_),
      queue_(ordinal, stream_, staging_),
      matmul_(std::make_unique<MatmulEngine>(ordinal, allocator_, queue_)) {}

CudaDevice::~CudaDevice() {
  shutdown();
}

void CudaDevice::shutdown() noexcept {
  try {
    if (matmul_) matmul_->stop();
    queue_.drain();
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
  queue_.enqueue("fill", dtype,
                 [&](cudaStream_t s) { launch_fill(dtype, out->data(), count, value, s); });
  return out;
}

StoragePtr CudaDevice::from_host(const void* data, size_t count, DType dtype) {
  auto out = std::make_unique<CudaStorage>(*this, count, dtype);
  if (count > 0) queue_.upload(data, count * size_in_bytes(dtype), out->data());
  return out;
}

StoragePtr CudaDevice::rand_uniform(size_t count, DType dtype, double lo, double hi) {
  return random(false, count, dtype, lo, hi);
}

StoragePtr CudaDevice::rand_normal(size_t count, DType dtype, double mean, double std) {
  return random(true, count, dtype, mean, std);
}

StoragePtr CudaDevice::random(bool normal, size_t count, DType dtype, double a, double b) {
  auto out = std::make_unique<CudaStorage>(*this, count, dtype);
  if (count == 0) return out;
  RngState::Draw d = rng_.take(count);
  if (normal) {
    queue_.enqueue("rand_normal", dtype, [&](cudaStream_t s) {
      launch_rand_normal(dtype, out->data(), count, a, b, d.seed, d.offset, s);
    });
  } else {
    queue_.enqueue("rand_uniform", dtype, [&](cudaStream_t s) {
      launch_rand_uniform(dtype, out->data(), count, a, b, d.seed, d.offset, s);
    });
  }
  return out;
}

void CudaDevice::set_seed(uint64_t seed) {
  rng_.set_seed(seed);
}

void CudaDevice::synchronize() {
  queue_.synchronize();
}

void CudaDevice::begin_step_capture() {
  // cuBLASLt ready first, so that the graph holds its matmuls and not the warm-up fallback.
  if (matmul_) matmul_->stop();
  queue_.begin_step_capture(allocator_);
}

cudaGraph_t CudaDevice::end_step_capture(std::vector<Allocator::Block>& reserved,
                                         std::vector<std::shared_ptr<const void>>& kept,
                                         size_t& ops) {
  return queue_.end_step_capture(allocator_, reserved, kept, ops);
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
    register_custom_kernels();
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
  d.queue().flush();  // the allocator waits on the stream, which a capture forbids
  d.allocator().release_cached();
}

CudaQueueStats cuda_queue_stats(int ordinal) {
  const cuda::Queue& q = cuda::cuda_device(ordinal).queue();
  return CudaQueueStats{q.open_batch_ops(), q.closed_batches(), q.ops_per_batch()};
}

}  // namespace wick
