// The KV-cache write on CUDA: one kernel writes the step's keys and values (b, h, s, d) at a
// position read on the device (a captured graph replays it at each step's position), one element
// a thread, keys in the first half of the grid and values in the second: one launch, both caches.

#include "cuda/check.h"
#include "cuda/kv_write.h"
#include "wick/error.h"

namespace wick::cuda {

namespace {

constexpr int kBlock = 256;

struct KvArgs {
  void* cache[2];
  const void* src[2];
  int64_t strides[2][4];  // b, h, s, d
  int64_t b, h, s, d;
  int64_t max_len;
};

// Element i of 2 * (b h s d): the first half writes keys, the second values.
template <class U>
__global__ void __launch_bounds__(kBlock)
    kv_write_kernel(KvArgs a, const uint32_t* __restrict__ position) {
  int64_t count = a.b * a.h * a.s * a.d;
  int64_t start = static_cast<int64_t>(*position);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < 2 * count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int which = i < count ? 0 : 1;
    int64_t e = i - which * count;
    int64_t di = e % a.d, t = e / a.d;
    int64_t si = t % a.s;
    t /= a.s;
    int64_t hi = t % a.h, bi = t / a.h;
    int64_t row = start + si;
    if (row >= a.max_len) continue;
    const int64_t* st = a.strides[which];
    const U* src = static_cast<const U*>(a.src[which]);
    U* cache = static_cast<U*>(a.cache[which]);
    cache[((bi * a.h + hi) * a.max_len + row) * a.d + di] =
        src[bi * st[0] + hi * st[1] + si * st[2] + di * st[3]];
  }
}

template <class U>
void launch(const KvArgs& a, const uint32_t* position, cudaStream_t s) {
  int64_t count = 2 * a.b * a.h * a.s * a.d;
  if (count == 0) return;
  int64_t blocks = (count + kBlock - 1) / kBlock;
  unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  kv_write_kernel<U><<<grid, kBlock, 0, s>>>(a, position);
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_kv_write(size_t elem_bytes, const KvWrite& k, const KvWrite& v, const int64_t dims[4],
                     int64_t max_len, const uint32_t* position, cudaStream_t s) {
  KvArgs a{};
  a.cache[0] = k.cache;
  a.cache[1] = v.cache;
  a.src[0] = k.src;
  a.src[1] = v.src;
  for (int i = 0; i < 4; ++i) {
    a.strides[0][i] = k.src_strides[i];
    a.strides[1][i] = v.src_strides[i];
  }
  a.b = dims[0];
  a.h = dims[1];
  a.s = dims[2];
  a.d = dims[3];
  a.max_len = max_len;
  switch (elem_bytes) {
    case 2:
      launch<uint16_t>(a, position, s);
      break;
    case 4:
      launch<uint32_t>(a, position, s);
      break;
    case 8:
      launch<uint64_t>(a, position, s);
      break;
    default:
      throw UnsupportedDType("kv write: elements of 2, 4 or 8 bytes");
  }
}

}  // namespace wick::cuda
