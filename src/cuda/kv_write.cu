#include "cuda/check.h"
#include "cuda/kv_write.h"
#include "wick/error.h"

namespace wick::cuda {

namespace {

constexpr int kBlock = 256;

struct KvDims {
  int64_t b, h, s, d;
  int64_t sb, sh, ss, sd;
  int64_t max_len;
};

template <class U>
__global__ void __launch_bounds__(kBlock)
    kv_write_kernel(U* __restrict__ cache, const U* __restrict__ src, KvDims k,
                    const uint32_t* __restrict__ position) {
  int64_t count = k.b * k.h * k.s * k.d;
  int64_t start = static_cast<int64_t>(*position);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t di = i % k.d, t = i / k.d;
    int64_t si = t % k.s;
    t /= k.s;
    int64_t hi = t % k.h, bi = t / k.h;
    int64_t row = start + si;
    if (row >= k.max_len) continue;
    cache[((bi * k.h + hi) * k.max_len + row) * k.d + di] =
        src[bi * k.sb + hi * k.sh + si * k.ss + di * k.sd];
  }
}

template <class U>
void launch(void* cache, const void* src, const KvDims& k, const uint32_t* position,
            cudaStream_t s) {
  int64_t count = k.b * k.h * k.s * k.d;
  if (count == 0) return;
  int64_t blocks = (count + kBlock - 1) / kBlock;
  unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  kv_write_kernel<U>
      <<<grid, kBlock, 0, s>>>(static_cast<U*>(cache), static_cast<const U*>(src), k, position);
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_kv_write(size_t elem_bytes, void* cache, const void* src, const int64_t dims[4],
                     const int64_t src_strides[4], int64_t max_len, const uint32_t* position,
                     cudaStream_t s) {
  KvDims k{dims[0],        dims[1],        dims[2],        dims[3], src_strides[0],
           src_strides[1], src_strides[2], src_strides[3], max_len};
  switch (elem_bytes) {
    case 2:
      launch<uint16_t>(cache, src, k, position, s);
      break;
    case 4:
      launch<uint32_t>(cache, src, k, position, s);
      break;
    case 8:
      launch<uint64_t>(cache, src, k, position, s);
      break;
    default:
      throw UnsupportedDType("kv write: elements of 2, 4 or 8 bytes");
  }
}

}  // namespace wick::cuda
