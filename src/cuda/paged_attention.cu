// Attention over paged KV caches for a ragged batch: one block of 4 warps per (query token,
// query head). Warp w takes tiles of 32 keys, j = first + 32 (w + 4 i) + lane for i = 0, 1, ...
// (first: the start of its window; pages from its table row): each lane scores its own key (the
// dot product in f32, in 16-byte pieces: one partial sum a piece's element, added in a fixed tree;
// soft-capped when asked), the tile joins the warp's online softmax, and the lanes then add the
// tile's value rows into their output dims, key by key. The 4 warps' partial results are merged
// in warp order. The split depends on the token's position alone, so a token's output is the same
// bits whatever else the batch holds; a lane per key keeps 32 keys' loads in flight.
// The KV write: one thread per element of the new keys and values.

#include "cuda/check.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/paged_attention.h"

WICK_TIMELINE_TU(paged_attention)

namespace wick::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kTile = 32;  // keys a warp scores at once, one a lane
constexpr int kMaxD = 256;
constexpr int kPerLane = kMaxD / 32;

// q . k over d elements (q in shared memory, scaled), in f32: one partial sum for each element of a
// 16-byte piece, the pieces in order, the partials added in a fixed tree. The same order with
// element loads (unaligned rows).
template <class T>
__device__ __forceinline__ float dot_row(const float* q, const T* k, int64_t d, bool vec) {
  constexpr int N = 16 / sizeof(T);
  float part[N];
#pragma unroll
  for (int i = 0; i < N; ++i) part[i] = 0.0f;
  if (vec) {
    for (int64_t e = 0; e < d; e += N) {
      const uint4 raw = *reinterpret_cast<const uint4*>(k + e);
      const T* piece = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < N; ++i) part[i] = fmaf(q[e + i], static_cast<float>(piece[i]), part[i]);
    }
  } else {
    for (int64_t e = 0; e < d; ++e) {
      part[e % N] = fmaf(q[e], static_cast<float>(k[e]), part[e % N]);
    }
  }
#pragma unroll
  for (int w = N / 2; w > 0; w /= 2) {
#pragma unroll
    for (int i = 0; i < w; ++i) part[i] += part[i + w];
  }
  return part[0];
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) x = fmaxf(x, shfl_xor(x, mask));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int mask = 16; mask > 0; mask >>= 1) x += shfl_xor(x, mask);
  return x;
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(PagedAttentionArgs a) {
  const int64_t t = blockIdx.x / a.h, head = blockIdx.x % a.h;
  const int64_t g = head / (a.h / a.h_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float q_s[kMaxD];
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxD];
  WICK_TL_START();
  // Everything read comes from the kernels before (q and the new key from the one just before).
  pdl_wait();
  WICK_TL_WAITED();
  if (a.launch_next_early) pdl_launch_dependents();
  T* out = static_cast<T*>(a.out) + (t * a.h + head) * a.d;
  const uint32_t seq = a.seq[t], pos = a.pos[t];
  const bool valid = seq < a.n_seqs && pos / a.page_size < a.width;
  const T* q = static_cast<const T*>(a.q) + (t * a.h + head) * a.d;
  for (int64_t e = threadIdx.x; e < a.d; e += blockDim.x) {
    q_s[e] = static_cast<float>(q[e]) * a.scale;
  }
  __syncthreads();
  float m = -INFINITY, l = 0.0f;
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  const T* kp = static_cast<const T*>(a.k);
  const T* vp = static_cast<const T*>(a.v);
  // Rows start 16-byte aligned when the pools do and a row is whole 16-byte pieces.
  const bool vec = (a.d * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(kp) % 16 == 0;
  const uint32_t* row = a.table + (valid ? seq : 0) * a.width;
  const int64_t first = a.window > 0 && pos + 1 > a.window ? pos + 1 - a.window : 0;
  for (int64_t j0 = first + warp * kTile; valid && j0 <= pos; j0 += kWarps * kTile) {
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    long long base = -1;  // the key's row in the pools, -1 for none
    if (j <= pos) {
      const uint32_t page = row[j / a.page_size];
      if (page < a.pages) {
        base = ((page * a.h_kv + g) * a.page_size + j % a.page_size) * a.d;
        s = dot_row(q_s, kp + base, a.d, vec);
        if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
      }
    }
    const float tile_max = warp_max(s);
    if (tile_max == -INFINITY) continue;  // the same for the whole warp
    const float m_new = fmaxf(m, tile_max);
    const float keep = expf(m - m_new);
    const float p = base >= 0 ? expf(s - m_new) : 0.0f;
    l = l * keep + warp_sum(p);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[i] *= keep;
      // Unrolled so that several keys' value loads are in flight at once (the sums stay in key
      // order).
#pragma unroll 8
    for (int key = 0; key < kTile; ++key) {
      const long long at = __shfl_sync(0xffffffffu, base, key);
      if (at < 0) continue;  // the same for the whole warp
      const float pk = __shfl_sync(0xffffffffu, p, key);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int64_t e = lane + 32 * i;
        if (e < a.d) acc[i] = fmaf(pk, static_cast<float>(vp[at + e]), acc[i]);
      }
    }
    m = m_new;
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t e = lane + 32 * i;
    if (e < a.d) acc_s[warp][e] = acc[i];
  }
  __syncthreads();
  // The warps' partials merged in warp order.
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += m_s[w] == -INFINITY ? 0.0f : l_s[w] * expf(m_s[w] - mx);
  for (int64_t e = threadIdx.x; e < a.d; e += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (m_s[w] != -INFINITY) sum += acc_s[w][e] * expf(m_s[w] - mx);
    }
    out[e] = static_cast<T>(valid && total > 0.0f ? sum / total : 0.0f);
  }
  WICK_TL_END(7u << 28);
}

template <class U>
__global__ void paged_kv_write_kernel(U* k_pages, U* v_pages, const U* k, const U* v,
                                      const uint32_t* slots, int64_t tokens, int64_t h_kv,
                                      int64_t d, int64_t pages, int64_t page_size) {
  const int64_t count = tokens * h_kv * d;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < 2 * count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int which = i < count ? 0 : 1;
    const int64_t e = i - which * count;
    const int64_t di = e % d, g = (e / d) % h_kv, t = e / (d * h_kv);
    const uint32_t slot = slots[t];
    const int64_t page = slot / page_size, r = slot % page_size;
    if (page >= pages) continue;
    U* dst = which == 0 ? k_pages : v_pages;
    const U* src = which == 0 ? k : v;
    dst[((page * h_kv + g) * page_size + r) * d + di] = src[e];
  }
}

}  // namespace

void launch_paged_attention(DType dtype, const PagedAttentionArgs& a, cudaStream_t s) {
  if (a.tokens == 0) return;
  if (a.d > kMaxD) {
    throw UnsupportedDType("paged_attention: head dim above 256 is not supported on CUDA");
  }
  const dim3 blocks(static_cast<unsigned>(a.tokens * a.h)), threads(kWarps * 32);
  switch (dtype) {
    case DType::F32:
      launch_pdl(paged_attention_kernel<float>, blocks, threads, 0, s, a);
      break;
    case DType::F16:
      launch_pdl(paged_attention_kernel<__half>, blocks, threads, 0, s, a);
      break;
    case DType::BF16:
      launch_pdl(paged_attention_kernel<__nv_bfloat16>, blocks, threads, 0, s, a);
      break;
    default:
      throw UnsupportedDType("paged_attention: f32, f16 or bf16 on CUDA");
  }
}

void launch_paged_kv_write(size_t elem_bytes, void* k_pages, void* v_pages, const void* k,
                           const void* v, const uint32_t* slots, int64_t tokens, int64_t h_kv,
                           int64_t d, int64_t pages, int64_t page_size, cudaStream_t s) {
  const int64_t count = 2 * tokens * h_kv * d;
  if (count == 0) return;
  const int64_t blocks = (count + 255) / 256;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  switch (elem_bytes) {
    case 2:
      paged_kv_write_kernel<uint16_t>
          <<<grid, 256, 0, s>>>(static_cast<uint16_t*>(k_pages), static_cast<uint16_t*>(v_pages),
                                static_cast<const uint16_t*>(k), static_cast<const uint16_t*>(v),
                                slots, tokens, h_kv, d, pages, page_size);
      break;
    case 4:
      paged_kv_write_kernel<uint32_t>
          <<<grid, 256, 0, s>>>(static_cast<uint32_t*>(k_pages), static_cast<uint32_t*>(v_pages),
                                static_cast<const uint32_t*>(k), static_cast<const uint32_t*>(v),
                                slots, tokens, h_kv, d, pages, page_size);
      break;
    case 8:
      paged_kv_write_kernel<uint64_t>
          <<<grid, 256, 0, s>>>(static_cast<uint64_t*>(k_pages), static_cast<uint64_t*>(v_pages),
                                static_cast<const uint64_t*>(k), static_cast<const uint64_t*>(v),
                                slots, tokens, h_kv, d, pages, page_size);
      break;
    default:
      throw UnsupportedDType("paged_kv_write: element size not 2, 4 or 8 bytes");
  }
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace wick::cuda
