// The decode projections over plain rows (the model's dtype, row-major): gemv_kernel with
// DenseRows, a block of 64, 128 or 256 threads per 2, 4 or 8 rows, each thread one 16-byte unit
// of every row at a time, as many blocks a multiprocessor as 64 registers a thread allow. Also
// the kernels the plain-weight decode step adds: the greedy argmax's pick after the output head,
// and the side branch that asks the L2 for the next projection's rows.

#include "cuda/device_timeline.cuh"

WICK_TIMELINE_TU(gemv_plain)

#include "cuda/decode_gemv_kernel.cuh"
#include "cuda/decode_gemv_launch.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"

namespace wick::cuda {
namespace {

using namespace gemv;

// launch_l2_aside: each of kL2AsideBlocks blocks asks for its share, by its thread 0.
constexpr int kL2AsideBlocks = 16;
__global__ void l2_aside_kernel(GemvArgs a) {
  prefetch_next_share(a, blockIdx.x, gridDim.x);
}

// One warp per 32 slots: the winner of the slots, which it leaves at zero for the next launch.
__global__ void __launch_bounds__(kArgmaxSlots)
    argmax_pick_kernel(uint32_t* argmax, bool launch_next) {
  if (launch_next) pdl_launch_dependents();  // the step's advance waits for this kernel
  pdl_wait();
  unsigned long long* slot = &g_argmax_slots[threadIdx.x * kArgmaxStride];
  unsigned long long best = *slot;
  *slot = 0;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, m));
  __shared__ unsigned long long warp_best[kArgmaxSlots / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kArgmaxSlots / 32; ++w) best = max(best, warp_best[w]);
  *argmax = 0xffffffffu - static_cast<uint32_t>(best);
}

// Threads a block of 4 plain rows. Projections of up to 16 MB (Llama-1B's qkv and o) run as one
// wave of 128-thread blocks; larger ones fill the multiprocessors' registers in as few waves as
// they can: one of 256-thread blocks (Llama-1B's down), one of 32-thread blocks (one warp, 32 a
// multiprocessor) where each thread then takes at most kWarpBlockUnits 16-byte units of a row
// (Gemma-3-1B's gate/up, 144 units a row: 3,456 blocks), else two of 64 (Llama-1B's gate/up:
// 256 units a row would be 8 a thread of a warp), else 128 (the output head).
// TuningOverrides::gemv_threads forces 32, 64, 128 or 256; gemv_wave_threads the choice among
// 32, 64 and 128 for the projections of up to 32 blocks a multiprocessor.
constexpr int64_t kOneWaveBytes = int64_t{16} << 20;
constexpr int64_t kWarpBlockUnits = 5;

int dense_threads(const GemvArgs& a, int64_t row_bytes) {
  if (tuning().gemv_threads > 0) return tuning().gemv_threads;
  if (a.n * row_bytes <= kOneWaveBytes) return kGemvThreads;
  const int64_t blocks = a.n / 4, sms = sm_count(), units = row_bytes / 16;
  if (blocks <= 4 * sms && units >= 256) return 256;
  if (blocks > 32 * sms) return kGemvThreads;
  if (tuning().gemv_wave_threads > 0) return tuning().gemv_wave_threads;
  return blocks > 16 * sms && units <= 32 * kWarpBlockUnits ? 32 : 64;
}

template <class T, int N>
void launch_dense(const GemvArgs& a, int64_t row_bytes, dim3 grid, int carveout, cudaStream_t s) {
  auto kernel = gemv_kernel<T, DenseRows<T>, 4, false, N>;
  if constexpr (N == kGemvThreads) {  // the blocks of the one-wave projections that ask for it
    if (a.prefetch_rows) kernel = gemv_kernel<T, DenseRows<T>, 4, true, N>;
  }
  launch_pdl_carveout(carveout, kernel, grid, N, 0, s, a, row_bytes, 0);
}

template <class T, int R>
void launch_plain(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((a.n / 2 + R / 2 - 1) / (R / 2)));
  // Small projections are latency-bound: they take the attention kernel's split of L1 and
  // shared memory (kernel_utils.cuh); large ones keep the L1 that their loads fill.
  const int carveout = a.n * row_bytes <= kLatencyBoundBytes ? kCarveoutMaxShared : -1;
  if constexpr (R == 4) {  // the blocks' rows that plain weights take unless forced
    switch (dense_threads(a, row_bytes)) {
      case 32:
        return launch_dense<T, 32>(a, row_bytes, grid, carveout, s);
      case 64:
        return launch_dense<T, 64>(a, row_bytes, grid, carveout, s);
      case 256:
        return launch_dense<T, 256>(a, row_bytes, grid, carveout, s);
      default:
        return launch_dense<T, kGemvThreads>(a, row_bytes, grid, carveout, s);
    }
  }
  launch_pdl_carveout(carveout, gemv_kernel<T, DenseRows<T>, R>, grid, kGemvThreads, 0, s, a,
                      row_bytes, 0);
}

}  // namespace

namespace gemv {

void launch_plain_rows(DType dtype, const GemvArgs& a, int64_t row_bytes, int rows,
                       cudaStream_t s) {
  by_dtype(dtype, [&]<class T>() {
    switch (rows) {
      case 8:
        return launch_plain<T, 8>(a, row_bytes, s);
      case 4:
        return launch_plain<T, 4>(a, row_bytes, s);
      default:
        return launch_plain<T, 2>(a, row_bytes, s);
    }
  });
}

void launch_argmax_pick(uint32_t* argmax, bool launch_next, cudaStream_t s) {
  launch_pdl(argmax_pick_kernel, dim3(1), dim3(kArgmaxSlots), 0, s, argmax, launch_next);
}

}  // namespace gemv

void launch_l2_aside(const void* base, int64_t bytes, int64_t half, cudaStream_t s) {
  GemvArgs a{};
  a.l2_next = base;
  a.l2_next_bytes = bytes;
  a.l2_next_half = half;
  l2_aside_kernel<<<kL2AsideBlocks, 32, 0, s>>>(a);
  WICK_CUDA_CHECK_LAUNCH();
}
}  // namespace wick::cuda
