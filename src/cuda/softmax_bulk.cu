// Softmax of f16/bf16 rows of 4-16 KB (and f32 rows when asked) by persistent groups of warps
// that stream rows through shared memory with 1-D bulk copies (softmax_bulk_kernel): rows in
// flight are bound by shared memory, not registers, and the grid is one wave. History:
// docs/perf/row-kernels.md.

#include <algorithm>

#include "cuda/kernel_utils.cuh"
#include "cuda/row_math.cuh"
#include "cuda/softmax_bulk.h"

namespace wick::cuda {
namespace {

using namespace row_math;

// ---- Bulk-copy softmax: persistent groups of warps streaming rows through shared memory ----
// One block per multiprocessor, of 8 groups of 4 warps (4 groups above 8 KB rows); each group
// owns a ring of stages (a row each) that one thread fills with 1-D bulk copies (cp.async.bulk,
// completion counted in bytes on the stage's mbarrier). Rows in flight are bound by shared
// memory, not registers; the copies run the ring's length ahead of the row being computed, and
// the grid is one wave (no half-empty tail wave). A group's 128 threads share a row: the copies
// run at the copy's bandwidth and the softmax is bound by the multiprocessors' issue, so few
// instructions an element matter: max on packed pairs, exp once, kept in registers for the
// output. Sums in f32 with exp_fast, as the other kernels.

constexpr unsigned kBulkGroup = 128;              // threads that share a row
constexpr size_t kBulkStageBytes = 200 * 1024;    // shared memory a block gives its stages
constexpr unsigned kBulkMaxStages = 8;            // rows a group has in flight at most
constexpr size_t kSharedReservedPerBlock = 1024;  // a multiprocessor keeps for each block

/// Global -> this block's shared memory, `bytes` a multiple of 16, both addresses 16-byte
/// aligned; the bytes are counted on `bar` as they land (a plain launch is a 1-block cluster).
__device__ __forceinline__ void bulk_copy_to_shared(uint32_t dst, const void* src, uint32_t bytes,
                                                    uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(static_cast<uint64_t>(__cvta_generic_to_global(src))), "r"(bytes), "r"(bar)
      : "memory");
}
/// Element-wise max of two 16-byte vectors, NaN wins: max.NaN, on f16/bf16 pairs as they are.
template <class T, class V>
__device__ __forceinline__ V max_nan_vec(const V& a, const V& b) {
  V r;
  if constexpr (std::is_same_v<T, float>) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      asm("max.NaN.f32 %0, %1, %2;" : "=f"(r.v[e]) : "f"(a.v[e]), "f"(b.v[e]));
    }
  } else {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    const T2* pa = reinterpret_cast<const T2*>(a.v);
    const T2* pb = reinterpret_cast<const T2*>(b.v);
    T2* pr = reinterpret_cast<T2*>(r.v);
#pragma unroll
    for (int k = 0; k < 4; ++k) pr[k] = __hmax2_nan(pa[k], pb[k]);
  }
  return r;
}

/// Groups a block: 8 for rows up to 8 KB (VPT 4), 4 for rows up to 16 KB (VPT 8).
template <int VPT>
inline constexpr unsigned kBulkGroups = VPT <= 4 ? 8 : 4;

template <class T, int VPT>
__global__ void __launch_bounds__(kBulkGroup* kBulkGroups<VPT>, 1)
    softmax_bulk_kernel(const T* __restrict__ x, T* __restrict__ y, unsigned rows, unsigned nvec,
                        unsigned stages) {
  using C = compute_t<T>;
  using V = Vec<T, 16 / sizeof(T)>;
  constexpr int N = 16 / sizeof(T);
  constexpr int A = 4;  // independent partial sums
  constexpr unsigned kWarps = kBulkGroup / 32;
  extern __shared__ __align__(128) unsigned char bulk_shared[];
  __shared__ C partial[kBulkGroups<VPT> * kWarps][2];  // each warp's max and sum
  const unsigned t = threadIdx.x % kBulkGroup, group = threadIdx.x / kBulkGroup,
                 groups = blockDim.x / kBulkGroup, warp = threadIdx.x / 32;
  const uint32_t row_bytes = nvec * 16;
  const uint64_t cols = static_cast<uint64_t>(nvec) * N;
  // Stages of every group first (16-byte aligned), then one mbarrier a stage.
  unsigned char* ring = bulk_shared + static_cast<size_t>(group) * stages * row_bytes;
  const uint32_t bars = smem_addr(bulk_shared + static_cast<size_t>(groups) * stages * row_bytes) +
                        group * stages * 8;
  auto group_sync = [&] { named_barrier_sync(1 + group, kBulkGroup); };  // 0 is __syncthreads'
  auto max_nan = [](C a, C b) { return (b > a || b != b) ? b : a; };
  // Row i of a group is first + i * step: every round of rows spreads over all the blocks (the
  // multiprocessors), the last, partial one too.
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * groups;
  const uint64_t first = static_cast<uint64_t>(group) * gridDim.x + blockIdx.x;
  auto load = [&](uint64_t row, unsigned stage) {
    const uint32_t bar = bars + stage * 8;
    mbarrier_arrive_expect_bytes(bar, row_bytes);
    bulk_copy_to_shared(smem_addr(ring + stage * row_bytes), x + row * cols, row_bytes, bar);
  };
  pdl_wait();  // as row_vec_kernel
  pdl_launch_dependents();
  if (t == 0) {
    for (unsigned s = 0; s < stages; ++s) mbarrier_init(bars + s * 8, 1);
    fence_mbarrier_init();
    uint64_t row = first;
    for (unsigned s = 0; s < stages && row < rows; ++s, row += step) load(row, s);
  }
  group_sync();
  uint32_t parity = 0;  // bit s: the parity of stage s's next phase
  unsigned stage = 0;
  for (uint64_t row = first; row < rows; row += step) {
    while (!mbarrier_try_wait_parity(bars + stage * 8, (parity >> stage) & 1)) {
    }
    parity ^= 1u << stage;
    const V* xs = reinterpret_cast<const V*>(ring + stage * row_bytes);
    auto in_row = [&](int j) { return t + kBulkGroup * j < nvec; };
    V m;
#pragma unroll
    for (int e = 0; e < N; ++e) m.v[e] = convert<T>(lowest<C>());
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (in_row(j)) m = max_nan_vec<T>(m, xs[t + kBulkGroup * j]);
    }
    C mx = to_compute(m.v[0]);
#pragma unroll
    for (int e = 1; e < N; ++e) mx = max_nan(mx, to_compute(m.v[e]));
    mx = warp_max_nan(mx);
    if (threadIdx.x % 32 == 0) partial[warp][0] = mx;
    group_sync();
    const C shift =
        max_nan(max_nan(partial[group * kWarps][0], partial[group * kWarps + 1][0]),
                max_nan(partial[group * kWarps + 2][0], partial[group * kWarps + 3][0]));
    // exp(x - max) once, kept for the output.
    V raw[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) raw[j] = in_row(j) ? xs[t + kBulkGroup * j] : V{};
    C ex[VPT][N];
    C part[A] = {};
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        ex[j][e] = in_row(j) ? exp_fast(to_compute(raw[j].v[e]) - shift) : C(0);
        part[e % A] += ex[j][e];
      }
    }
    const C sum = warp_sum((part[0] + part[1]) + (part[2] + part[3]));
    if (threadIdx.x % 32 == 0) partial[warp][1] = sum;
    group_sync();  // the stage is read: it takes the next row while this one is written
    const uint64_t next = row + stages * step;
    if (t == 0 && next < rows) load(next, stage);
    stage = stage + 1 == stages ? 0 : stage + 1;
    const C mul = C(1) / ((partial[group * kWarps][1] + partial[group * kWarps + 1][1]) +
                          (partial[group * kWarps + 2][1] + partial[group * kWarps + 3][1]));
    V* yr = reinterpret_cast<V*>(y + row * cols);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (!in_row(j)) continue;
      V o;
#pragma unroll
      for (int e = 0; e < N; ++e) o.v[e] = convert<T>(ex[j][e] * mul);
      yr[t + kBulkGroup * j] = o;
    }
  }
}

}  // namespace

template <class T>
bool try_softmax_bulk(const T* x, T* y, size_t rows, size_t nvec, cudaStream_t s) {
  auto go = [&](auto kernel, size_t groups) {
    const size_t row_bytes = nvec * 16;
    // The stages' share: at most kBulkStageBytes, and what the GPU lets a block have besides
    // the kernel's static shared memory.
    const size_t budget = std::min(kBulkStageBytes, shared_per_block_optin() - 2048);
    const size_t stages = std::min<size_t>(kBulkMaxStages, budget / (groups * row_bytes));
    if (stages < 2) return false;
    const size_t smem = groups * stages * (row_bytes + sizeof(uint64_t));
    // Above 48 KB of shared memory only by this attribute (per device: set at every launch).
    WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
    const size_t per_sm =
        std::max<size_t>(1, shared_per_multiprocessor() / (smem + kSharedReservedPerBlock));
    const unsigned grid = static_cast<unsigned>(per_sm * static_cast<size_t>(sm_count()));
    launch_pdl(kernel, dim3(grid), dim3(static_cast<unsigned>(groups * kBulkGroup)), smem, s, x, y,
               static_cast<unsigned>(rows), static_cast<unsigned>(nvec),
               static_cast<unsigned>(stages));
    return true;
  };
  if (nvec <= 4 * kBulkGroup) return go(softmax_bulk_kernel<T, 4>, kBulkGroups<4>);
  if (nvec <= 8 * kBulkGroup) return go(softmax_bulk_kernel<T, 8>, kBulkGroups<8>);
  return false;
}

template bool try_softmax_bulk<float>(const float*, float*, size_t, size_t, cudaStream_t);
template bool try_softmax_bulk<__half>(const __half*, __half*, size_t, size_t, cudaStream_t);
template bool try_softmax_bulk<__nv_bfloat16>(const __nv_bfloat16*, __nv_bfloat16*, size_t, size_t,
                                              cudaStream_t);

}  // namespace wick::cuda
