// Rotary position embedding on CUDA (rope_kernel): a thread per rotated pair of a (b, h, s, d)
// view, halves rotated (transformers' rotate_half) or interleaved pairs; f16/bf16 round each
// product, then the sum, as transformers does in the model's dtype.

#include "cuda/fused_kernels.h"
#include "cuda/kernel_utils.cuh"
#include "ops/rope_math.h"

namespace wick::cuda {
namespace {

/// A thread per rotated pair.
template <class T, bool kInterleaved>
__global__ void __launch_bounds__(kBlock)
    rope_kernel(const T* __restrict__ x, int64_t sb, int64_t sh, int64_t ss, uint32_t nh,
                uint32_t seq, uint32_t half, const T* __restrict__ cos, const T* __restrict__ sin,
                T* __restrict__ y, uint64_t pairs) {
  using C = compute_t<T>;
  for (uint64_t p = global_tid(); p < pairs; p += grid_stride()) {
    uint32_t i = static_cast<uint32_t>(p % half);
    uint64_t row = p / half;
    uint32_t t = static_cast<uint32_t>(row % seq);
    uint64_t bh = row / seq;
    const T* xr = x + static_cast<int64_t>(bh / nh) * sb + static_cast<int64_t>(bh % nh) * sh +
                  static_cast<int64_t>(t) * ss;
    T* yr = y + row * 2 * half;
    C c = to_compute(cos[static_cast<uint64_t>(t) * half + i]);
    C sn = to_compute(sin[static_cast<uint64_t>(t) * half + i]);
    uint32_t ia = kInterleaved ? 2 * i : i, ib = kInterleaved ? 2 * i + 1 : i + half;
    C a = to_compute(xr[ia]), b = to_compute(xr[ib]);
    auto round = [](C v) { return to_compute(convert<T>(v)); };
    yr[ia] = convert<T>(ops::rope_lo(a, b, c, sn, round));
    yr[ib] = convert<T>(ops::rope_hi(a, b, c, sn, round));
  }
}

}  // namespace

void launch_rope(DType dtype, bool interleaved, const void* x, const int64_t x_strides[3],
                 const size_t dims[4], const void* cos, const void* sin, void* y, cudaStream_t s) {
  uint64_t half = dims[3] / 2;
  uint64_t pairs = dims[0] * dims[1] * dims[2] * half;
  if (pairs == 0) return;
  dispatch_float<DeviceTypes>(dtype, interleaved ? "rope_interleaved" : "rope", [&]<class T>() {
    auto args = [&](auto kernel) {
      kernel<<<grid_for(pairs), kBlock, 0, s>>>(
          static_cast<const T*>(x), x_strides[0], x_strides[1], x_strides[2],
          static_cast<uint32_t>(dims[1]), static_cast<uint32_t>(dims[2]),
          static_cast<uint32_t>(half), static_cast<const T*>(cos), static_cast<const T*>(sin),
          static_cast<T*>(y), pairs);
    };
    if (interleaved) {
      args(rope_kernel<T, true>);
    } else {
      args(rope_kernel<T, false>);
    }
    WICK_CUDA_CHECK_LAUNCH();
  });
}
}  // namespace wick::cuda
