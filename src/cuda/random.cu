// Counter-based random numbers: Philox4x32-10 keyed by the seed, counter = element index / 4, so
// (seed, offset + i) alone decides element i, whatever the launch shape. Uniform values use 24
// random bits (53 for f64); normal values come from Box-Muller over pairs of elements.

#include "cuda/kernel_utils.cuh"

namespace wick::cuda {

namespace {

struct U4 {
  uint32_t x, y, z, w;
};

__device__ __forceinline__ U4 philox(uint64_t counter, uint32_t stream, uint64_t seed) {
  U4 c{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), stream, 0u};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
    c = {hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

/// Four uniforms in [0, 1) (or (0, 1] with `open_low`), in the compute type's precision.
template <class C>
__device__ __forceinline__ void uniforms(uint64_t block, uint64_t seed, bool open_low, C u[4]) {
  U4 a = philox(block, 0, seed);
  uint32_t w[4] = {a.x, a.y, a.z, a.w};
  C bias = open_low ? C(1) : C(0);
  if constexpr (std::is_same_v<C, double>) {
    U4 b = philox(block, 1, seed);  // 21 more bits each for 53-bit doubles
    uint32_t e[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint64_t bits = (static_cast<uint64_t>(w[j]) << 21) | (e[j] >> 11);
      u[j] = (static_cast<double>(bits) + bias) * 0x1.0p-53;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) u[j] = (static_cast<C>(w[j] >> 8) + bias) * C(0x1.0p-24f);
  }
}

// Integers draw in double; floats in their compute type.
template <class T>
using draw_t =
    std::conditional_t<std::is_same_v<T, double> || std::is_integral_v<T>, double, float>;

template <class T>
__global__ void __launch_bounds__(kBlock)
    random_kernel(T* __restrict__ dst, uint64_t count, uint64_t offset, uint64_t seed, bool normal,
                  double a, double b) {
  using C = draw_t<T>;
  uint64_t first = offset / 4, last = (offset + count - 1) / 4;
  for (uint64_t blk = first + global_tid(); blk <= last; blk += grid_stride()) {
    C v[4];
    if (normal) {
      C u[4];
      uniforms(blk, seed, true, u);  // u in (0, 1]: log is finite
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        C r = sqrt(C(-2) * log(u[j]));
        C sn, cs;
        if constexpr (std::is_same_v<C, double>)
          sincospi(C(2) * u[j + 1], &sn, &cs);
        else
          sincospif(C(2) * u[j + 1], &sn, &cs);
        v[j] = static_cast<C>(a) + static_cast<C>(b) * r * cs;
        v[j + 1] = static_cast<C>(a) + static_cast<C>(b) * r * sn;
      }
    } else {
      uniforms(blk, seed, false, v);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = static_cast<C>(a) + static_cast<C>(b - a) * v[j];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint64_t e = blk * 4 + j;
      if (e >= offset && e - offset < count) dst[e - offset] = convert<T>(v[j]);
    }
  }
}

void launch_random(bool normal, DType dtype, void* dst, size_t count, double a, double b,
                   uint64_t seed, uint64_t offset, cudaStream_t s) {
  if (count == 0) return;
  uint64_t blocks = (offset + count - 1) / 4 - offset / 4 + 1;
  dispatch<DeviceTypes>(dtype, [&]<class T>() {
    random_kernel<T><<<grid_for(blocks), kBlock, 0, s>>>(static_cast<T*>(dst), count, offset, seed,
                                                         normal, a, b);
    WICK_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void launch_rand_uniform(DType dtype, void* dst, size_t count, double lo, double hi, uint64_t seed,
                         uint64_t offset, cudaStream_t s) {
  launch_random(false, dtype, dst, count, lo, hi, seed, offset, s);
}

void launch_rand_normal(DType dtype, void* dst, size_t count, double mean, double std,
                        uint64_t seed, uint64_t offset, cudaStream_t s) {
  launch_random(true, dtype, dst, count, mean, std, seed, offset, s);
}

}  // namespace wick::cuda
