// The CUDA side of the file formats: GGML blocks dequantised to f32 (one kernel per type, one
// thread per output value; the arithmetic in the order of ggml's reference dequantize_row_*,
// with explicit round-to-nearest intrinsics so that nvcc fuses nothing: results equal the CPU's
// bit for bit), and the staged upload of file bytes (a memory mapping) to the device.

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>

#include "cpu/parallel.h"
#include "cuda/cuda_storage.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/quantized.h"
#include "ops/ggml_blocks.h"
#include "util.h"

namespace wick::cuda {

namespace {

__device__ __forceinline__ float half_at(const uint8_t* p) {
  uint16_t bits = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float mul(float a, float b) {
  return __fmul_rn(a, b);
}

// Each kernel: value i of the tensor from its block. Blocks are byte-aligned only, so
// multi-byte fields are read byte by byte.

__global__ void dq_f16_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) dst[i] = half_at(src + 2 * i);
}

__global__ void dq_bf16_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    uint32_t bits = static_cast<uint32_t>(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
    dst[i] = __uint_as_float(bits);
  }
}

__global__ void dq_q8_0_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    const uint8_t* b = src + (i / 32) * 34;
    int q = ops::q8_0_int(b, static_cast<unsigned>(i % 32));
    dst[i] = mul(static_cast<float>(q), half_at(b));
  }
}

__global__ void dq_q4_0_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    const uint8_t* b = src + (i / 32) * 18;
    int q = ops::q4_0_int(b, static_cast<unsigned>(i % 32));
    dst[i] = mul(static_cast<float>(q), half_at(b));
  }
}

__global__ void dq_q4_1_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    const uint8_t* b = src + (i / 32) * 20;
    int q = ops::q4_1_int(b, static_cast<unsigned>(i % 32));
    dst[i] = __fadd_rn(mul(static_cast<float>(q), half_at(b)), half_at(b + 2));
  }
}

__global__ void dq_q5_0_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    const uint8_t* b = src + (i / 32) * 22;
    int q = ops::q5_0_int(b, ops::q5_0_high_bits(b), static_cast<unsigned>(i % 32));
    dst[i] = mul(static_cast<float>(q), half_at(b));
  }
}

__global__ void dq_q4_k_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    const uint8_t* b = src + (i / 256) * 144;
    unsigned j = i % 256;
    unsigned sub = j / 32;  // sub-block 0..7: scale index; pairs share 32 bytes of qs
    unsigned l = j % 32;
    const uint8_t* scales = b + 4;
    unsigned sc, m;
    ops::q4_k_scale_min(sub, scales, sc, m);
    uint8_t byte = b[16 + (sub / 2) * 32 + l];
    unsigned q = (sub % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
    float d = mul(half_at(b), static_cast<float>(sc));
    float dm = mul(half_at(b + 2), static_cast<float>(m));
    dst[i] = __fsub_rn(mul(d, static_cast<float>(q)), dm);
  }
}

__global__ void dq_q6_k_kernel(const uint8_t* src, float* dst, uint64_t n) {
  for (uint64_t i = global_tid(); i < n; i += grid_stride()) {
    const uint8_t* b = src + (i / 256) * 210;
    unsigned j = i % 256;
    unsigned half = j / 128, r = j % 128;
    unsigned k = r / 32, l = r % 32;  // quarter k of the half, value l of 32
    const uint8_t* ql = b + half * 64;
    const uint8_t* qh = b + 128 + half * 32;
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + half * 8);
    int q = ops::q6_k_int(ql, qh, k, l);
    float d = mul(half_at(b + 208), static_cast<float>(sc[l / 16 + 2 * k]));
    dst[i] = mul(d, static_cast<float>(q));
  }
}

// Pinned staging for uploads from pageable memory: the host fills buffer i + 1 while the copy
// engine drains buffer i. One per device, used by one upload at a time.
constexpr size_t kStageChunk = size_t{16} << 20;
constexpr int kStageBuffers = 4;
// Below this the device's own asynchronous upload (one pinned chunk) is as fast.
constexpr size_t kStageMin = size_t{4} << 20;

struct Stager {
  std::mutex mutex;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;
  void* buffers[kStageBuffers] = {};
  cudaEvent_t done[kStageBuffers] = {};
};

Stager& stager(int ordinal) {
  static std::mutex registry_mutex;
  static std::vector<std::unique_ptr<Stager>>* stagers = new std::vector<std::unique_ptr<Stager>>();
  std::lock_guard lock(registry_mutex);
  if (stagers->size() <= static_cast<size_t>(ordinal)) stagers->resize(ordinal + 1);
  auto& s = (*stagers)[ordinal];
  if (!s) {
    auto fresh = std::make_unique<Stager>();
    make_current(ordinal);
    WICK_CUDA_CHECK(cudaStreamCreateWithFlags(&fresh->stream, cudaStreamNonBlocking));
    WICK_CUDA_CHECK(cudaEventCreateWithFlags(&fresh->ready, cudaEventDisableTiming));
    for (int b = 0; b < kStageBuffers; ++b) {
      WICK_CUDA_CHECK(cudaHostAlloc(&fresh->buffers[b], kStageChunk, cudaHostAllocDefault));
      WICK_CUDA_CHECK(cudaEventCreateWithFlags(&fresh->done[b], cudaEventDisableTiming));
    }
    s = std::move(fresh);
  }
  return *s;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

// Maps the pages of [p, p + n) in one call, far cheaper than one fault per 4 KiB page of a file
// mapping; older kernels answer EINVAL and the copy faults the pages in instead.
void populate(const void* p, size_t n) {
  auto begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095};
  auto end = reinterpret_cast<uintptr_t>(p) + n;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
}

// memcpy split over the CPU pool: one thread cannot read a page-cache mapping as fast as PCIe.
void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  cpu::parallel_for(bytes, size_t{1} << 20, [&](size_t lo, size_t hi) {
    populate(static_cast<const char*>(src) + lo, hi - lo);
    std::memcpy(static_cast<char*>(dst) + lo, static_cast<const char*>(src) + lo, hi - lo);
  });
}

}  // namespace

StoragePtr upload_staged(int ordinal, const void* src, size_t count, DType dtype) {
  CudaDevice& dev = cuda_device(ordinal);
  auto out = std::make_unique<CudaStorage>(dev, count, dtype);
  size_t bytes = count * size_in_bytes(dtype);
  if (bytes == 0) return out;
  if (bytes < kStageMin) {
    dev.queue().upload(src, bytes, out->data());
    return out;
  }
  Stager& s = stager(ordinal);
  std::lock_guard lock(s.mutex);
  make_current(ordinal);
  // The buffer may come from the allocator's cache with work still queued on the device's
  // stream: the staging stream starts after it. flush() ends an open graph capture first.
  dev.queue().flush();
  WICK_CUDA_CHECK(cudaEventRecord(s.ready, dev.stream()));
  WICK_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.ready, 0));
  const auto* from = static_cast<const char*>(src);
  auto* to = static_cast<char*>(out->data());
  for (size_t off = 0, i = 0; off < bytes; off += kStageChunk, ++i) {
    size_t n = std::min(kStageChunk, bytes - off);
    int b = static_cast<int>(i % kStageBuffers);
    WICK_CUDA_CHECK(cudaEventSynchronize(s.done[b]));  // the copy out of this buffer has finished
    parallel_memcpy(s.buffers[b], from + off, n);
    WICK_CUDA_CHECK(cudaMemcpyAsync(to + off, s.buffers[b], n, cudaMemcpyHostToDevice, s.stream));
    WICK_CUDA_CHECK(cudaEventRecord(s.done[b], s.stream));
  }
  // Later ops run on the device's stream: the data is there before this returns.
  WICK_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  return out;
}

StoragePtr CudaDevice::upload(const void* data, size_t count, DType dtype) {
  return upload_staged(ordinal(), data, count, dtype);
}

StoragePtr dequantize(GgmlType type, const BackendStorage& raw_storage, size_t n) {
  const CudaStorage& raw = as_cuda(raw_storage);
  CudaDevice& dev = raw.cuda_device();
  auto out = std::make_unique<CudaStorage>(dev, n, DType::F32);
  if (n == 0) return out;
  const auto* src = static_cast<const uint8_t*>(raw.data());
  float* dst = out->as<float>();
  auto launch = [&](const char* name, void (*kernel)(const uint8_t*, float*, uint64_t)) {
    dev.queue().enqueue(
        name, DType::F32,
        [&](cudaStream_t s) {
          kernel<<<grid_for(n), kBlock, 0, s>>>(src, dst, n);
          WICK_CUDA_CHECK_LAUNCH();
        },
        static_cast<double>(n));
  };
  switch (type) {
    case GgmlType::F32:
      dev.queue().enqueue("dequantize_f32", DType::F32, [&](cudaStream_t s) {
        WICK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, s));
      });
      break;
    case GgmlType::F16:
      launch("dequantize_f16", dq_f16_kernel);
      break;
    case GgmlType::BF16:
      launch("dequantize_bf16", dq_bf16_kernel);
      break;
    case GgmlType::Q8_0:
      launch("dequantize_q8_0", dq_q8_0_kernel);
      break;
    case GgmlType::Q4_0:
      launch("dequantize_q4_0", dq_q4_0_kernel);
      break;
    case GgmlType::Q4_1:
      launch("dequantize_q4_1", dq_q4_1_kernel);
      break;
    case GgmlType::Q5_0:
      launch("dequantize_q5_0", dq_q5_0_kernel);
      break;
    case GgmlType::Q4_K:
      launch("dequantize_q4_k", dq_q4_k_kernel);
      break;
    case GgmlType::Q6_K:
      launch("dequantize_q6_k", dq_q6_k_kernel);
      break;
    default:
      throw UnsupportedDType(
          str("dequantize: ggml type ", ggml_type_name(type), " is not supported on cuda"));
  }
  dev.queue().retain(raw.buffer());  // the blocks stay alive until the batch has run
  return out;
}

}  // namespace wick::cuda
