#pragma once
// A diagnostic timeline of the decode step's kernels, compiled in only with
// -DWICK_DEVICE_TIMELINE (scripts/gpu-timeline.sh): thread 0 of every block of an instrumented
// kernel records the global timer when the block starts, when it passes pdl_wait() and when it
// ends, with a tag naming the kernel, into a ring in device memory (the decode and the paged
// attention also three points inside, WICK_TL_MARK, as a second record). Without the define every
// macro is empty. Nsight Systems is not available on the GPU machine, and ncu runs each kernel
// alone: neither shows how the kernels of a CUDA graph overlap under programmatic launch.

#include <cstdint>
#include <vector>

#ifdef WICK_DEVICE_TIMELINE
namespace wick::cuda::timeline {

struct Record {
  uint32_t tag;    // the kernel (see the callers)
  uint32_t block;  // blockIdx.x + gridDim.x * blockIdx.y
  uint32_t sm;
  uint32_t seq;  // order of the record in the ring
  uint64_t start, waited, end;
};

/// At exit, writes every instrumented translation unit's records to the file named by
/// WICK_DEVICE_TIMELINE_OUT (when set), one per line: tag block sm start waited end (ns). Called
/// at the first decode GEMV launch, after the CUDA runtime's own exit handler is registered.
void write_at_exit();

constexpr uint32_t kCapacity = 1u << 21;

__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace wick::cuda::timeline

// One ring per translation unit; WICK_TIMELINE_TU(name) defines it and a host function
// timeline::take_name() returning its records.
#define WICK_TIMELINE_TU(name)                                                                     \
  namespace wick::cuda::timeline {                                                                 \
  static __device__ Record g_ring[kCapacity];                                                      \
  static __device__ unsigned g_count;                                                              \
  static __shared__ uint64_t s_start, s_waited;                                                    \
  [[maybe_unused]] static __shared__ uint64_t s_mark[3]; /* WICK_TL_MARK */                        \
  static __device__ __forceinline__ void record(uint32_t tag, uint32_t sm, uint64_t a, uint64_t b, \
                                                uint64_t c) {                                      \
    const unsigned i = atomicAdd(&g_count, 1u);                                                    \
    g_ring[i % kCapacity] = Record{tag, blockIdx.x + gridDim.x * blockIdx.y, sm, i, a, b, c};      \
  }                                                                                                \
  std::vector<Record> take_##name() {                                                              \
    unsigned n = 0;                                                                                \
    cudaMemcpyFromSymbol(&n, g_count, sizeof n);                                                   \
    const unsigned kept = n < kCapacity ? n : kCapacity;                                           \
    std::vector<Record> all(kCapacity);                                                            \
    cudaMemcpyFromSymbol(all.data(), g_ring, sizeof(Record) * kCapacity);                          \
    std::vector<Record> out;                                                                       \
    for (unsigned i = n - kept; i < n; ++i) out.push_back(all[i % kCapacity]);                     \
    return out;                                                                                    \
  }                                                                                                \
  }
#define WICK_TL_START()                                                                \
  do {                                                                                 \
    if (threadIdx.x == 0) wick::cuda::timeline::s_start = wick::cuda::timeline::now(); \
  } while (0)
#define WICK_TL_WAITED()                                                                \
  do {                                                                                  \
    if (threadIdx.x == 0) wick::cuda::timeline::s_waited = wick::cuda::timeline::now(); \
  } while (0)
#define WICK_TL_END(tag_value)                                                \
  do {                                                                        \
    if (threadIdx.x == 0) {                                                   \
      using namespace wick::cuda::timeline;                                   \
      unsigned sm;                                                            \
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));                         \
      record(static_cast<uint32_t>(tag_value), sm, s_start, s_waited, now()); \
    }                                                                         \
  } while (0)
// Three more points of a block's life (thread 0), written as one more record with tag_value.
#define WICK_TL_MARK(n)                                                                  \
  do {                                                                                   \
    if (threadIdx.x == 0) wick::cuda::timeline::s_mark[n] = wick::cuda::timeline::now(); \
  } while (0)
#define WICK_TL_END_MARKS(tag_value)                                                \
  do {                                                                              \
    if (threadIdx.x == 0) {                                                         \
      using namespace wick::cuda::timeline;                                         \
      record(static_cast<uint32_t>(tag_value), 0, s_mark[0], s_mark[1], s_mark[2]); \
    }                                                                               \
  } while (0)
#else
#define WICK_TL_MARK(n) \
  do {                  \
  } while (0)
#define WICK_TL_END_MARKS(tag_value) \
  do {                               \
  } while (0)
#define WICK_TIMELINE_TU(name)
#define WICK_TL_START() \
  do {                  \
  } while (0)
#define WICK_TL_WAITED() \
  do {                   \
  } while (0)
#define WICK_TL_END(tag_value) \
  do {                         \
  } while (0)
#endif
