// Attention over paged KV caches for a ragged batch where the tensor-core decode kernel's paged
// mode does not apply (f32, soft-caps, other head dims, pages not made of whole 16-key tiles): one
// block of 8 warps per (query token, query head). Warp w takes tiles of 32 keys, j = first + 32 (w
// + 8 i) + lane for i = 0, 1, ... (first: the start of its window; pages from its table row): each
// lane scores its own key (the dot product in f32, in 16-byte pieces: one partial sum a piece's
// element, added in a fixed tree; soft-capped when asked), the tile joins the warp's online
// softmax, and the lanes then add the tile's value rows into their output dims, key by key. The 8
// warps' partial results are merged in warp order. The split depends on the token's position alone,
// so a token's output is the same bits whatever else the batch holds. A step of one sequence has
// few blocks and short loops, so its time is the latency of its loads: the kernels compiled for a
// head dim (64, 128, 256) keep a row's key pieces and a tile's value rows in flight at once, with
// no branch between the keys. The KV write: one thread per element of the new keys and values.

#include <type_traits>

#include "cuda/check.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda/paged_attention.h"

WICK_TIMELINE_TU(paged_attention)

namespace wick::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kTile = 32;  // keys a warp scores at once, one a lane
constexpr int kMaxD = 256;
constexpr int kPerLane = kMaxD / 32;

// q . k over d elements (q in shared memory, scaled), in f32: one partial sum for each element of a
// 16-byte piece, the pieces in order, the partials added in a fixed tree. The same order with
// element loads (unaligned rows). D > 0: d is D, the loop unrolled so that a row's pieces are all
// in flight at once.
template <class T, int D>
__device__ __forceinline__ float dot_row(const float* q, const T* k, int64_t d, bool vec) {
  constexpr int N = 16 / sizeof(T);
  float part[N];
#pragma unroll
  for (int i = 0; i < N; ++i) part[i] = 0.0f;
  if (D > 0 || vec) {
#pragma unroll(D > 0 ? D / N : 1)
    for (int64_t e = 0; e < (D > 0 ? D : d); e += N) {
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

// The value elements a lane adds up: with D > 0, the E = D / 32 consecutive elements
// lane * E ... (one load of E * sizeof(T) bytes); with D = 0, elements lane + 32 i below d.
template <class T, int D>
struct ValueSlice {
  static constexpr int E = D > 0 ? D / 32 : kPerLane;
  static_assert(D == 0 || (D % 32 == 0 && E * sizeof(T) >= 4 && E * sizeof(T) <= 32));
  __device__ __forceinline__ static int64_t element(int lane, int i) {
    return D > 0 ? lane * E + i : lane + 32 * i;
  }
  __device__ __forceinline__ static void load(const T* row, int lane, int64_t d, float (&out)[E]) {
    if constexpr (D > 0) {
      constexpr int kBytes = E * sizeof(T);
      constexpr int kWords = kBytes < 16 ? 1 : kBytes / 16;
      using Word =
          std::conditional_t<kBytes == 4, uint32_t, std::conditional_t<kBytes == 8, uint2, uint4>>;
      Word raw[kWords];
#pragma unroll
      for (int w = 0; w < kWords; ++w) raw[w] = reinterpret_cast<const Word*>(row + lane * E)[w];
      const T* elems = reinterpret_cast<const T*>(raw);
#pragma unroll
      for (int i = 0; i < E; ++i) out[i] = static_cast<float>(elems[i]);
    } else {
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const int64_t e = lane + 32 * i;
        out[i] = e < d ? static_cast<float>(row[e]) : 0.0f;
      }
    }
  }
};

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

template <class T, int D>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(PagedAttentionArgs a) {
  using Slice = ValueSlice<T, D>;
  const int64_t t = blockIdx.x / a.h, head = blockIdx.x % a.h;
  const int64_t g = head / (a.h / a.h_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float q_s[kMaxD];
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxD];
  WICK_TL_START();
  // q and the new keys come from the kernels before; the token's sequence, position and page-table
  // row too, unless the caller promises they were written before the kernel before this one
  // started (indices_ready): then they are read, and the pages asked for, while it runs.
  if (!a.indices_ready) {
    pdl_wait();
    WICK_TL_WAITED();
  }
  const uint32_t seq = a.seq[t], pos = a.pos[t];
  const bool valid = seq < a.n_seqs && pos / a.page_size < a.width;
  const uint32_t* row = a.table + (valid ? seq : 0) * a.width;
  const int64_t first = a.window > 0 && pos + 1 > a.window ? pos + 1 - a.window : 0;
  const T* kp = static_cast<const T*>(a.k);
  const T* vp = static_cast<const T*>(a.v);
  // Rows start 16-byte aligned when the pools do and a row is whole 16-byte pieces.
  const bool vec = (a.d * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(kp) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(vp) % 16 == 0;
  // The k/v head's pages of the block's first two passes over the window asked of the L2 in bulk
  // (a hint: it moves no value; bounded, so that a long sequence does not push its own first pages
  // out), shared among the query heads that read them, so that the tiles' loads find them there.
  if (valid && vec) {
    const int64_t group = a.h / a.h_kv, share = head % group;
    const int64_t page_bytes = a.page_size * a.d * static_cast<int64_t>(sizeof(T));
    const int64_t last = min(static_cast<int64_t>(pos), first + 2 * kWarps * kTile - 1);
    for (int64_t i = first / a.page_size + share + group * threadIdx.x; i <= last / a.page_size;
         i += group * blockDim.x) {
      const uint32_t page = row[i];
      if (page >= a.pages) continue;
      const int64_t at = (page * a.h_kv + g) * a.page_size * a.d;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(kp + at),
                   "r"(static_cast<uint32_t>(page_bytes))
                   : "memory");
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(vp + at),
                   "r"(static_cast<uint32_t>(page_bytes))
                   : "memory");
    }
  }
  if (a.indices_ready) {
    pdl_wait();
    WICK_TL_WAITED();
  }
  if (a.launch_next_early) pdl_launch_dependents();
  T* out = static_cast<T*>(a.out) + (t * a.h + head) * a.d;
  const T* q = static_cast<const T*>(a.q) + (t * a.h + head) * a.d;
  for (int64_t e = threadIdx.x; e < a.d; e += blockDim.x) {
    q_s[e] = static_cast<float>(q[e]) * a.scale;
  }
  __syncthreads();
  WICK_TL_MARK(0);
  float m = -INFINITY, l = 0.0f;
  float acc[Slice::E];
#pragma unroll
  for (int i = 0; i < Slice::E; ++i) acc[i] = 0.0f;
  for (int64_t j0 = first + warp * kTile; valid && j0 <= pos; j0 += kWarps * kTile) {
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    long long base = -1;  // the key's row in the pools, -1 for none
    if (j <= pos) {
      const uint32_t page = row[j / a.page_size];
      if (page < a.pages) {
        base = ((page * a.h_kv + g) * a.page_size + j % a.page_size) * a.d;
        s = dot_row<T, D>(q_s, kp + base, a.d, vec);
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
    for (int i = 0; i < Slice::E; ++i) acc[i] *= keep;
      // The tile's value rows, key by key, the sums in key order. No branch between the keys (a
      // missing key reads the pool's first row and adds nothing), so that many keys' loads are in
      // flight at once.
#pragma unroll(D > 0 && D * sizeof(T) <= 256 ? kTile : 8)
    for (int key = 0; key < kTile; ++key) {
      const long long at = __shfl_sync(0xffffffffu, base, key);
      const float pk = __shfl_sync(0xffffffffu, p, key);
      float v[Slice::E];
      Slice::load(vp + (at < 0 ? 0 : at), lane, a.d, v);
#pragma unroll
      for (int i = 0; i < Slice::E; ++i) acc[i] = at < 0 ? acc[i] : fmaf(pk, v[i], acc[i]);
    }
    m = m_new;
  }
  WICK_TL_MARK(1);
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < Slice::E; ++i) {
    const int64_t e = Slice::element(lane, i);
    if (e < a.d) acc_s[warp][e] = acc[i];
  }
  __syncthreads();
  // The warps' partials merged in warp order.
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += m_s[w] == -INFINITY ? 0.0f : l_s[w] * expf(m_s[w] - mx);
  WICK_TL_MARK(2);
  for (int64_t e = threadIdx.x; e < a.d; e += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (m_s[w] != -INFINITY) sum += acc_s[w][e] * expf(m_s[w] - mx);
    }
    out[e] = static_cast<T>(valid && total > 0.0f ? sum / total : 0.0f);
  }
  WICK_TL_END(7u << 28);
  WICK_TL_END_MARKS(5u << 28);
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

// A head dim of 64, 128 or 256 in 16-byte aligned pools takes the kernel compiled for it.
template <class T>
void launch_for(const PagedAttentionArgs& a, cudaStream_t s) {
  const dim3 blocks(static_cast<unsigned>(a.tokens * a.h)), threads(kWarps * 32);
  const bool aligned =
      reinterpret_cast<uintptr_t>(a.k) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v) % 16 == 0;
  switch (aligned ? a.d : 0) {
    case 64:
      launch_pdl(paged_attention_kernel<T, 64>, blocks, threads, 0, s, a);
      break;
    case 128:
      launch_pdl(paged_attention_kernel<T, 128>, blocks, threads, 0, s, a);
      break;
    case 256:
      launch_pdl(paged_attention_kernel<T, 256>, blocks, threads, 0, s, a);
      break;
    default:
      launch_pdl(paged_attention_kernel<T, 0>, blocks, threads, 0, s, a);
  }
}

}  // namespace

void launch_paged_attention(DType dtype, const PagedAttentionArgs& a, const TempAlloc& temp,
                            cudaStream_t s) {
  if (a.tokens == 0) return;
  if (paged_decode_fits(dtype, a)) return launch_paged_decode_attention(dtype, a, temp, s);
  if (a.d > kMaxD) {
    throw UnsupportedDType("paged_attention: head dim above 256 is not supported on CUDA");
  }
  switch (dtype) {
    case DType::F32:
      launch_for<float>(a, s);
      break;
    case DType::F16:
      launch_for<__half>(a, s);
      break;
    case DType::BF16:
      launch_for<__nv_bfloat16>(a, s);
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
