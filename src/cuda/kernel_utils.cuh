#pragma once
// Shared by wick's .cu files: device element types (f16/bf16 compute in float), conversions, the
// N-d strided indexer over a by-value StridedView, 16-byte vector access, warp reductions, the
// generic element-wise map kernels and launch-size helpers.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda_config.h"
#include "dispatch.h"
#include "ops/unary_math.h"
#include "wick/dtype.h"
#include "wick/error.h"

namespace wick::cuda {

// ---------------------------------------------------------------------------------------------
// Element types

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <class T>
inline constexpr bool is_float_v = is_half_v<T> || std::is_floating_point_v<T>;

/// The element type of each dtype on the device, dispatch.h's map with CUDA's half types:
/// dispatch<DeviceTypes>(dtype, f), dispatch_float<DeviceTypes>(dtype, op, f).
struct DeviceTypes : HostTypes {
  using bf16 = __nv_bfloat16;
  using f16 = __half;
};

/// The device element type of host element type H.
template <class H>
using device_t =
    std::conditional_t<std::is_same_v<H, wick::f16>, __half,
                       std::conditional_t<std::is_same_v<H, wick::bf16>, __nv_bfloat16, H>>;

/// Unsigned integer of `bytes` bytes: kernels that only move bits are instantiated per size.
template <class F>
decltype(auto) dispatch_size(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f.template operator()<uint8_t>();
    case 2:
      return f.template operator()<uint16_t>();
    case 4:
      return f.template operator()<uint32_t>();
    default:
      return f.template operator()<unsigned long long>();
  }
}

}  // namespace wick::cuda

namespace wick::cuda {

using ops::math::float_to_int;

/// Value conversion between any two element types, with the CPU backend's rules: into f16/bf16
/// rounded to nearest even from the exact value, integers to integers modular.
template <class To, class From>
__device__ __forceinline__ To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<From, __half>) {
    return convert<To>(__half2float(x));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return convert<To>(__bfloat162float(x));
  } else if constexpr (std::is_same_v<To, __half>) {
    if constexpr (std::is_same_v<From, float>)
      return __float2half_rn(x);
    else
      return __double2half(static_cast<double>(x));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    if constexpr (std::is_same_v<From, float>)
      return __float2bfloat16_rn(x);
    else
      return __double2bfloat16(static_cast<double>(x));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return float_to_int<To>(static_cast<double>(x));
  } else {
    return static_cast<To>(x);
  }
}

template <class T>
__device__ __forceinline__ compute_t<T> to_compute(T x) {
  return convert<compute_t<T>>(x);
}

/// Largest and smallest values of a compute type (infinities for floats).
template <class C>
__device__ __forceinline__ C highest() {
  if constexpr (std::is_same_v<C, float>)
    return __int_as_float(0x7f800000);
  else if constexpr (std::is_same_v<C, double>)
    return __longlong_as_double(0x7ff0000000000000ll);
  else if constexpr (std::is_same_v<C, int64_t>)
    return INT64_MAX;
  else
    return static_cast<C>(~C(0));  // unsigned
}
template <class C>
__device__ __forceinline__ C lowest() {
  if constexpr (std::is_same_v<C, float>)
    return __int_as_float(static_cast<int>(0xff800000u));
  else if constexpr (std::is_same_v<C, double>)
    return __longlong_as_double(~0x000fffffffffffffll);
  else if constexpr (std::is_same_v<C, int64_t>)
    return INT64_MIN;
  else
    return C(0);
}

// ---------------------------------------------------------------------------------------------
// Layouts

/// Collapses (dims, strides) into `view`: size-1 dims dropped, mergeable neighbours joined.
/// Returns false when more than kMaxDims dims remain.
bool collapse_into(const size_t* dims, const size_t* strides, size_t rank, size_t offset,
                   StridedView& view);

/// Storage offset of element `i` (row-major) of `v`. Divisions run in 32 bits when they fit.
__device__ __forceinline__ int64_t view_offset(const StridedView& v, uint64_t i) {
  if (v.contiguous) return v.offset + static_cast<int64_t>(i);
  int64_t off = v.offset;
  uint64_t r = i;
  // Fully unrolled with constant indices so the view stays in the parameter bank.
#pragma unroll
  for (int d = kMaxDims - 1; d > 0; --d) {
    if (d < v.rank) {
      uint64_t n = static_cast<uint64_t>(v.dims[d]);
      uint64_t q;
      if (((r | n) >> 32) == 0) {
        q = static_cast<uint32_t>(r) / static_cast<uint32_t>(n);
      } else {
        q = r / n;
      }
      off += static_cast<int64_t>(r - q * n) * v.strides[d];
      r = q;
    }
  }
  if (v.rank > 0) off += static_cast<int64_t>(r) * v.strides[0];
  return off;
}

/// A contiguous view of `count` elements from offset 0.
inline StridedView contiguous_view(size_t count) {
  StridedView v;
  v.rank = 1;
  v.dims[0] = static_cast<int64_t>(count);
  v.strides[0] = 1;
  return v;
}

inline bool aligned16(const void* base, int64_t offset_elems, size_t elem_size) {
  auto addr = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(offset_elems) * elem_size;
  return addr % 16 == 0;
}

// ---------------------------------------------------------------------------------------------
// Launch sizes

constexpr int kBlock = 256;
/// Grid-stride loops cover the rest above this many blocks.
constexpr uint64_t kMaxGrid = 1u << 22;

inline unsigned grid_for(uint64_t items, uint64_t per_block = kBlock) {
  uint64_t g = (items + per_block - 1) / per_block;
  if (g == 0) g = 1;
  return static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid);
}

__device__ __forceinline__ uint64_t global_tid() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ uint64_t grid_stride() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

// ---------------------------------------------------------------------------------------------
// Vectors and warps

/// N elements loaded or stored as one (up to 16-byte) access.
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <class T>
__device__ __forceinline__ T shfl_xor(T x, int mask) {
  return static_cast<T>(__shfl_xor_sync(0xffffffffu, x, mask));
}

// ---------------------------------------------------------------------------------------------
// Element-wise map kernels: contiguous 16-byte vector path, or the strided indexer per element.
// dst is contiguous from element 0.

/// Elements per vector access: 16 bytes of the widest operand.
template <class... Ts>
inline constexpr int vec_width = static_cast<int>(16 / std::max({sizeof(Ts)...}));

template <class Out, class A, class F>
__global__ void __launch_bounds__(kBlock)
    map1_kernel(const A* __restrict__ a, StridedView av, Out* __restrict__ dst, uint64_t n, F f,
                bool vec) {
  uint64_t tid = global_tid(), stride = grid_stride();
  if (vec) {
    constexpr int N = vec_width<Out, A>;
    const A* pa = a + av.offset;
    uint64_t nv = n / N;
    for (uint64_t v = tid; v < nv; v += stride) {
      Vec<A, N> x = reinterpret_cast<const Vec<A, N>*>(pa)[v];
      Vec<Out, N> y;
#pragma unroll
      for (int j = 0; j < N; ++j) y.v[j] = f(x.v[j]);
      reinterpret_cast<Vec<Out, N>*>(dst)[v] = y;
    }
    for (uint64_t i = nv * N + tid; i < n; i += stride) dst[i] = f(pa[i]);
  } else {
    for (uint64_t i = tid; i < n; i += stride) dst[i] = f(a[view_offset(av, i)]);
  }
}

template <class Out, class A, class B, class F>
__global__ void __launch_bounds__(kBlock)
    map2_kernel(const A* __restrict__ a, StridedView av, const B* __restrict__ b, StridedView bv,
                Out* __restrict__ dst, uint64_t n, F f, bool vec) {
  uint64_t tid = global_tid(), stride = grid_stride();
  if (vec) {
    constexpr int N = vec_width<Out, A, B>;
    const A* pa = a + av.offset;
    const B* pb = b + bv.offset;
    uint64_t nv = n / N;
    for (uint64_t v = tid; v < nv; v += stride) {
      Vec<A, N> x = reinterpret_cast<const Vec<A, N>*>(pa)[v];
      Vec<B, N> y = reinterpret_cast<const Vec<B, N>*>(pb)[v];
      Vec<Out, N> z;
#pragma unroll
      for (int j = 0; j < N; ++j) z.v[j] = f(x.v[j], y.v[j]);
      reinterpret_cast<Vec<Out, N>*>(dst)[v] = z;
    }
    for (uint64_t i = nv * N + tid; i < n; i += stride) dst[i] = f(pa[i], pb[i]);
  } else {
    for (uint64_t i = tid; i < n; i += stride) {
      dst[i] = f(a[view_offset(av, i)], b[view_offset(bv, i)]);
    }
  }
}

template <class Out, class A, class B, class C, class F>
__global__ void __launch_bounds__(kBlock)
    map3_kernel(const A* __restrict__ a, StridedView av, const B* __restrict__ b, StridedView bv,
                const C* __restrict__ c, StridedView cv, Out* __restrict__ dst, uint64_t n, F f,
                bool vec) {
  uint64_t tid = global_tid(), stride = grid_stride();
  if (vec) {
    constexpr int N = vec_width<Out, A, B, C>;
    const A* pa = a + av.offset;
    const B* pb = b + bv.offset;
    const C* pc = c + cv.offset;
    uint64_t nv = n / N;
    for (uint64_t v = tid; v < nv; v += stride) {
      Vec<A, N> x = reinterpret_cast<const Vec<A, N>*>(pa)[v];
      Vec<B, N> y = reinterpret_cast<const Vec<B, N>*>(pb)[v];
      Vec<C, N> z = reinterpret_cast<const Vec<C, N>*>(pc)[v];
      Vec<Out, N> w;
#pragma unroll
      for (int j = 0; j < N; ++j) w.v[j] = f(x.v[j], y.v[j], z.v[j]);
      reinterpret_cast<Vec<Out, N>*>(dst)[v] = w;
    }
    for (uint64_t i = nv * N + tid; i < n; i += stride) dst[i] = f(pa[i], pb[i], pc[i]);
  } else {
    for (uint64_t i = tid; i < n; i += stride) {
      dst[i] = f(a[view_offset(av, i)], b[view_offset(bv, i)], c[view_offset(cv, i)]);
    }
  }
}

// Two floats as one register of two halves of T (the first in the low bits), one cvt
// instruction (the attention kernels' P tiles).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// 2^x by the special-function unit alone (the online softmax: inputs <= 0, results in [0, 1]).
__device__ __forceinline__ float exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// ---------------------------------------------------------------------------------------------
// Asynchronous copies global -> shared (cp.async, sm_80+): no registers held while in flight.

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes, zero-filled when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// N = 4, 8 or 16 bytes, both addresses N-aligned.
template <int N>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "n"(N));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---------------------------------------------------------------------------------------------
// mbarriers and named barriers (sm_90): the stages that bulk copies and TMA fill (softmax_bulk_
// kernel, flash_wgmma_kernel). `bar` is a shared-window address (smem_addr).

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}
/// Makes the initialised mbarriers visible to the async proxy (the bulk copies).
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/// One arrival on `bar` that also expects `bytes` more bytes before the phase completes.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
/// Whether the phase of `bar` with this parity has completed (may suspend the thread a while).
__device__ __forceinline__ bool mbarrier_try_wait_parity(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.b32 %0, 1, 0, p;\n}"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait_parity(bar, parity)) {
  }
}

// Barrier `id` (1-15: 0 is __syncthreads') among `threads` threads, whole warps: sync waits for
// them all, arrive counts this warp and goes on.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Programmatic dependent launch (sm_90): a kernel launched by launch_pdl may start while the
// kernel before it on the stream finishes. It may read only what that kernel does not write (its
// weights) before pdl_wait(), which returns once the earlier kernel is complete and its writes
// visible; it writes nothing before it. pdl_launch_dependents() lets the next such kernel start.
// Both are no-ops in a kernel launched the ordinary way.

__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}
__device__ __forceinline__ void pdl_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/// Asked by the decode step's latency-bound kernels (attention, small projections) together: the
/// split of each multiprocessor's L1 and shared memory that gives shared memory the most, so that
/// a multiprocessor does not change the split (which waits for it to drain) between them. Large
/// projections keep the default split: their loads fill the L1.
inline constexpr int kCarveoutMaxShared = 100;

/// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent launch unless
/// tuning().pdl is off; with `carveout` >= 0 the preferred percentage of shared memory in the
/// L1/shared split.
template <class... Params, class... Args>
void launch_pdl_carveout(int carveout, void (*kernel)(Params...), dim3 grid, dim3 block,
                         size_t smem, cudaStream_t s, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (tuning().pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (carveout >= 0) {
    attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attrs[n++].val.sharedMemCarveout = static_cast<unsigned>(carveout);
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  WICK_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

/// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent launch unless
/// tuning().pdl is off.
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                Args&&... args) {
  launch_pdl_carveout(-1, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

/// The vector path needs every operand contiguous and 16-byte aligned at its first element.
template <class T>
bool vec_ok(const T* p, const StridedView& v) {
  return v.contiguous && aligned16(p, v.offset, sizeof(T));
}

template <class Out, class A, class F>
void launch_map1(const A* a, const StridedView& av, Out* dst, size_t n, F f, cudaStream_t s) {
  if (n == 0) return;
  bool vec = vec_ok(a, av) && aligned16(dst, 0, sizeof(Out));
  uint64_t items = vec ? n / vec_width<Out, A> : n;
  map1_kernel<<<grid_for(items), kBlock, 0, s>>>(a, av, dst, n, f, vec);
  WICK_CUDA_CHECK_LAUNCH();
}

template <class Out, class A, class B, class F>
void launch_map2(const A* a, const StridedView& av, const B* b, const StridedView& bv, Out* dst,
                 size_t n, F f, cudaStream_t s) {
  if (n == 0) return;
  bool vec = vec_ok(a, av) && vec_ok(b, bv) && aligned16(dst, 0, sizeof(Out));
  uint64_t items = vec ? n / vec_width<Out, A, B> : n;
  map2_kernel<<<grid_for(items), kBlock, 0, s>>>(a, av, b, bv, dst, n, f, vec);
  WICK_CUDA_CHECK_LAUNCH();
}

template <class Out, class A, class B, class C, class F>
void launch_map3(const A* a, const StridedView& av, const B* b, const StridedView& bv, const C* c,
                 const StridedView& cv, Out* dst, size_t n, F f, cudaStream_t s) {
  if (n == 0) return;
  bool vec = vec_ok(a, av) && vec_ok(b, bv) && vec_ok(c, cv) && aligned16(dst, 0, sizeof(Out));
  uint64_t items = vec ? n / vec_width<Out, A, B, C> : n;
  map3_kernel<<<grid_for(items), kBlock, 0, s>>>(a, av, b, bv, c, cv, dst, n, f, vec);
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace wick::cuda
