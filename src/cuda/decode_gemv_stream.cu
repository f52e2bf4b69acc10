// The decode projections over GGML rows streamed through fewer blocks (gemv_stream_kernel), for
// projections with four groups of rows or more per multiprocessor: a block quantizes its units of
// x once (after the norm, when there is one), then takes groups of 8 rows through two
// shared-memory stages, the next group's copy in flight while this one is dotted.

#include "cuda/device_timeline.cuh"

WICK_TIMELINE_TU(gemv_stream)

#include "cuda/decode_gemv_device.cuh"
#include "cuda/decode_gemv_launch.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"

namespace wick::cuda {
namespace {

using namespace gemv;

// GGML rows, streamed: a block quantizes its U units of x once (after the norm, when there is
// one), then takes the groups of kStreamRows rows blockIdx.x, blockIdx.x + gridDim.x, ... through
// two shared-memory stages, the next group's copy in flight while this one is dotted. One block
// per group did that work on x for every group.
constexpr int kStreamRows = 8;
constexpr int kStreamMaxUnits = 4;  // units of x a thread keeps: k up to 4 x 128 x 16
// Blocks a multiprocessor should hold (registers): 6 with 1 or 2 units of x a thread (80
// registers, no spills); with 4 the two stages of longer rows allow about 3 anyway.

template <class T, class F, int U>
__global__ void __launch_bounds__(kGemvThreads, U >= 4 ? 3 : 6)
    gemv_stream_kernel(GemvArgs a, int64_t row_bytes, int copy, int64_t groups) {
  constexpr int R = kStreamRows, P = R / 2;
  extern __shared__ __align__(16) uint8_t gemv_rows[];
  WICK_TL_START();
  prefetch_cache_rows<T>(a);
  const int64_t stride = staged_stride(row_bytes), units = a.k / F::V;
  // Group g's rows into stage `buf`.
  auto stage = [&](int64_t g, int buf) {
    int64_t rows[R];
    const uint8_t* src[R];
    group_rows<R>(a, g * P, rows);
    row_starts<R>(a, row_bytes, rows, src);
    stage_rows<R>(gemv_rows + buf * R * stride, src, row_bytes, stride, copy);
  };
  int64_t g = blockIdx.x;  // the grid has no more blocks than groups
  stage(g, 0);
  cp_async_commit();
  pdl_wait();
  WICK_TL_WAITED();
  Input<T> in = input_of<T>(a);
  if (in.normed()) in.find_rstd(a.k, a.eps);
  QUnit xq[U];
  quantize_inputs<T, F, U>(in, threadIdx.x, units, xq);
  for (int buf = 0; g < groups; g += gridDim.x, buf ^= 1) {
    const bool last = g + gridDim.x >= groups;
    if (!last) stage(g + gridDim.x, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this group's rows have landed
    __syncthreads();     // ... every thread's copies
    const uint8_t* staged = gemv_rows + buf * R * stride;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = threadIdx.x + u * kGemvThreads;
      if (c < units) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += F::dot(F::load(staged + r * stride, c), xq[u]);
      }
    }
    if (last) pdl_launch_dependents();
    // Its barrier also keeps the next iteration's copy off this stage until every thread is done.
    block_totals<R>(acc);
    int64_t rows[R];
    group_rows<R>(a, g * P, rows);
    finish_pairs<T, R>(a, g * P, rows, acc);
  }
  WICK_TL_END(2u << 28 | static_cast<uint32_t>(a.epilogue) << 24 | static_cast<uint32_t>(a.k));
}

// Units of x a thread of gemv_stream_kernel keeps (1, 2 or 4); 0 when k is too long for it.
int stream_units(const GemvArgs& a) {
  const int64_t per_thread = (a.k / 16 + kGemvThreads - 1) / kGemvThreads;
  if (per_thread > kStreamMaxUnits) return 0;
  return per_thread <= 1 ? 1 : per_thread <= 2 ? 2 : 4;
}

template <class T, class F, int U>
void launch_stream(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  auto kernel = gemv_stream_kernel<T, F, U>;
  const size_t smem = static_cast<size_t>(2 * kStreamRows * staged_stride(row_bytes));
  if (smem > static_cast<size_t>(kMaxStagedBytes)) {
    WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), smem);
  const int64_t groups = (a.n / 2 + kStreamRows / 2 - 1) / (kStreamRows / 2);
  const int64_t blocks = std::min<int64_t>(groups, int64_t{per_sm} * sm_count());
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), kGemvThreads, smem, s, a, row_bytes,
             staged_copy_bytes(a.w, row_bytes), groups);
}

template <class T, class F>
void launch_stream_units(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  switch (stream_units(a)) {
    case 1:
      return launch_stream<T, F, 1>(a, row_bytes, s);
    case 2:
      return launch_stream<T, F, 2>(a, row_bytes, s);
    default:
      return launch_stream<T, F, 4>(a, row_bytes, s);
  }
}

}  // namespace

namespace gemv {

bool ggml_stream_fits(const GemvArgs& a) {
  return a.n / kStreamRows >= 4 * int64_t{sm_count()} && stream_units(a) > 0;
}

void launch_ggml_stream(DType dtype, const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  by_dtype(dtype, [&]<class T>() {
    by_ggml_rows(a.weights, [&]<class F>() { launch_stream_units<T, F>(a, row_bytes, s); });
  });
}

}  // namespace gemv
}  // namespace wick::cuda
