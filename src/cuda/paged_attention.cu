// Attention over paged KV caches for a ragged batch: one block of 4 warps per (query token,
// query head). Warp w takes the keys j = first + w, first + w + 4, ... of the token's own sequence
// (first: the start of its window; pages from its table row), each key's dot product a warp sum
// in f32 (soft-capped when asked), with an online softmax over its keys;
// the 4 warps' partial results are then merged in warp order. The split depends on the token's
// position alone, so a token's output is the same bits whatever else the batch holds.
// The KV write: one thread per element of the new keys and values.

#include "cuda/check.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/paged_attention.h"

namespace wick::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxD = 256;
constexpr int kPerLane = kMaxD / 32;

template <class T>
__global__ void __launch_bounds__(kWarps * 32) paged_attention_kernel(PagedAttentionArgs a) {
  const int64_t t = blockIdx.x / a.h, head = blockIdx.x % a.h;
  const int64_t g = head / (a.h / a.h_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float q_s[kMaxD];
  __shared__ float m_s[kWarps], l_s[kWarps];
  __shared__ float acc_s[kWarps][kMaxD];
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
  const uint32_t* row = a.table + (valid ? seq : 0) * a.width;
  const int64_t first = a.window > 0 && pos + 1 > a.window ? pos + 1 - a.window : 0;
  for (int64_t j = first + warp; valid && j <= pos; j += kWarps) {
    const uint32_t page = row[j / a.page_size];
    if (page >= a.pages) continue;
    const int64_t base = ((page * a.h_kv + g) * a.page_size + j % a.page_size) * a.d;
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      if (e < a.d) part += q_s[e] * static_cast<float>(kp[base + e]);
    }
#pragma unroll
    for (int mask = 16; mask > 0; mask >>= 1) part += shfl_xor(part, mask);
    if (a.softcap > 0.0f) part = a.softcap * tanhf(part / a.softcap);
    const float m_new = fmaxf(m, part);
    const float keep = expf(m - m_new), p = expf(part - m_new);
    l = l * keep + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      if (e < a.d) acc[i] = acc[i] * keep + p * static_cast<float>(vp[base + e]);
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
  const unsigned blocks = static_cast<unsigned>(a.tokens * a.h);
  switch (dtype) {
    case DType::F32:
      paged_attention_kernel<float><<<blocks, kWarps * 32, 0, s>>>(a);
      break;
    case DType::F16:
      paged_attention_kernel<__half><<<blocks, kWarps * 32, 0, s>>>(a);
      break;
    case DType::BF16:
      paged_attention_kernel<__nv_bfloat16><<<blocks, kWarps * 32, 0, s>>>(a);
      break;
    default:
      throw UnsupportedDType("paged_attention: f32, f16 or bf16 on CUDA");
  }
  WICK_CUDA_CHECK_LAUNCH();
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
