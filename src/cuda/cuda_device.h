#pragma once
// One CudaDevice per GPU, the owner of its parts, each with one job:
//   PinnedStaging  (staging.h)       pinned host memory for read-backs and uploads
//   Allocator      (allocator.h)     the caching allocator of device memory
//   Queue          (queue.h)         the stream's command batches, graph mode, whole-step capture
//                                    and the deferred errors of asynchronous work
//   RngState       (rng.h)           the random generator's seed and counter
//   MatmulEngine   (matmul_engine.h) cuBLASLt: handle, plans, graph replay, warm-up thread
// Settings come from cuda_config.h, read once. Devices are created on first use and never
// destroyed (storages may outlive static destructors); at process end each one waits for its
// warm-up thread, closes its open batch and waits for the GPU.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend.h"
#include "cuda/allocator.h"
#include "cuda/check.h"
#include "cuda/queue.h"
#include "cuda/rng.h"
#include "cuda/staging.h"

namespace wick::cuda {

class MatmulEngine;

class CudaDevice final : public BackendDevice {
 public:
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;
  /// Waits for the warm-up thread, closes the open batch and waits for the GPU; errors are
  /// swallowed (runs at process end).
  void shutdown() noexcept;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  Device device() const { return Device::cuda(ordinal_); }
  cudaStream_t stream() const { return stream_; }
  Queue& queue() { return queue_; }
  const Queue& queue() const { return queue_; }
  Allocator& allocator() { return allocator_; }
  PinnedStaging& staging() { return staging_; }
  MatmulEngine& matmul_engine() { return *matmul_; }

  // ---- BackendDevice ----
  StoragePtr alloc(size_t count, DType dtype) override;
  StoragePtr filled(size_t count, DType dtype, const void* value) override;
  StoragePtr from_host(const void* data, size_t count, DType dtype) override;
  /// Staged through pinned buffers (upload_staged in dequant.cu).
  StoragePtr upload(const void* data, size_t count, DType dtype) override;
  StoragePtr rand_uniform(size_t count, DType dtype, double lo, double hi) override;
  StoragePtr rand_normal(size_t count, DType dtype, double mean, double std) override;
  void set_seed(uint64_t seed) override;
  /// Closes the batch, waits for all work, rethrows deferred errors.
  void synchronize() override;
  std::unique_ptr<DecodePlan> decode_plan(const DecoderWeights& weights) override;

  // ---- whole-step capture (CudaGraph in wick/cuda.h; see Queue) ----
  /// Waits for cuBLASLt's warm-up (so that the graph holds cuBLASLt matmuls, not wick's GEMM),
  /// then starts recording with the allocator's new blocks reserved for the graph.
  void begin_step_capture();
  cudaGraph_t end_step_capture(std::vector<Allocator::Block>& reserved,
                               std::vector<std::shared_ptr<const void>>& kept, size_t& ops);

 private:
  StoragePtr random(bool normal, size_t count, DType dtype, double a, double b);

  // Declaration order is construction order: each part is built after those it uses and
  // destroyed before them (the queue's batches hold buffers and upload chunks).
  int ordinal_;
  cudaStream_t stream_;  // create_device_stream: all of the device's work runs on it
  PinnedStaging staging_;
  Allocator allocator_;
  Queue queue_;
  RngState rng_;
  std::unique_ptr<MatmulEngine> matmul_;  // its warm-up thread uses the allocator and the queue
};

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
  Allocator* allocator_;
  void* ptr_;
  size_t bytes_;
};

/// Scratch for one enqueued launch: alloc() gives a TempAlloc (kernels.h) whose every call is a
/// DeviceBuffer, all freed with this object.
class TempBuffers {
 public:
  explicit TempBuffers(CudaDevice& device) : device_(&device) {}
  std::function<void*(size_t)> alloc() {
    return [this](size_t bytes) {
      buffers_.push_back(std::make_unique<DeviceBuffer>(*device_, bytes));
      return buffers_.back()->data();
    };
  }

 private:
  CudaDevice* device_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
};

/// The device of `ordinal`, created on first use (BackendError without that GPU).
CudaDevice& cuda_device(int ordinal);

/// Fills the CUDA kernel slots of the fused ops (custom_kernels.cpp); cuda_device runs it before
/// it creates the first device.
void register_custom_kernels();

}  // namespace wick::cuda
