// The decode projections over GGML rows (every type of decode_gemv_device.cuh's by_ggml_rows), a
// block per group of 2, 4 or 8 rows:
// gemv_kernel copies its rows whole into shared memory (cp.async, before pdl_wait: they are
// weights), quantizes each unit of activations once for its rows as the CPU's qmatmul does, and
// dots the weights' integers with them (dp4a), each half block's sum scaled in f32. The
// projections with many rows take the streamed or warp-owned-pair kernels instead.

#include "cuda/device_timeline.cuh"

WICK_TIMELINE_TU(gemv_ggml)

#include "cuda/decode_gemv_kernel.cuh"
#include "cuda/decode_gemv_launch.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"

namespace wick::cuda {
namespace {

using namespace gemv;

template <class T, int R>
void launch_ggml(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((a.n / 2 + R / 2 - 1) / (R / 2)));
  const int copy = staged_copy_bytes(a.w, row_bytes);
  const size_t smem = static_cast<size_t>(R * staged_stride(row_bytes));
  by_ggml_rows(a.weights, [&]<class F>() {
    launch_pdl(gemv_kernel<T, F, R>, grid, kGemvThreads, smem, s, a, row_bytes, copy);
  });
}

}  // namespace

namespace gemv {

void launch_ggml_rows(DType dtype, const GemvArgs& a, int64_t row_bytes, int rows, cudaStream_t s) {
  by_dtype(dtype, [&]<class T>() {
    switch (rows) {
      case 8:
        return launch_ggml<T, 8>(a, row_bytes, s);
      case 4:
        return launch_ggml<T, 4>(a, row_bytes, s);
      default:
        return launch_ggml<T, 2>(a, row_bytes, s);
    }
  });
}

}  // namespace gemv
}  // namespace wick::cuda
