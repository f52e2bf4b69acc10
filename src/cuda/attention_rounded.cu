// f16/bf16 attention rounded where transformers' eager attention rounds in the model's dtype
// (attn_rounded_kernel), for up to 64 queries against up to 11,264 keys, taken only with
// WICK_ATTENTION_ROUNDING=transformers: greedy tokens then follow transformers' token by token
// (docs/NUMERICS.md). A block per query row keeps the row's scores in shared memory: the rounded
// probabilities need the row's final max and sum, which an online softmax cannot give.

#include <algorithm>
#include <cmath>

#include "cuda/attention_kernels.h"
#include "cuda/attention_mma.cuh"
#include "cuda/attention_operands.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"

namespace wick::cuda {
namespace {

using namespace attn;

// f16/bf16 rounded as transformers' eager attention (short queries): a block per query row.
// scores = round(round(q k) * scale) (+ mask, rounded), a softmax in f32 over the whole row
// with the probabilities rounded to the dtype, then P V summed in f32 and rounded once. The
// row's scores stay in shared memory: the probabilities need its final max and sum before any
// is rounded, which an online softmax cannot give.

constexpr int kRndThreads = 256;
constexpr int kRndMaxKeys = 11264;  // scores in the default 48 KiB of shared memory
constexpr int kRndMaxRows = 64;     // queries per call (decode, short prompts)

struct RoundedArgs : HalfOperands {
  int d;
  float scale;
};

__device__ __forceinline__ float block_reduce(float x, float* scratch, bool is_max) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    float o = __shfl_xor_sync(0xffffffffu, x, m);
    x = is_max ? fmaxf(x, o) : x + o;
  }
  __syncthreads();  // scratch free from any earlier use
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kRndThreads / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

template <class T>
__device__ __forceinline__ float round_as(float x) {
  return bits_to_float<T>(static_cast<uint16_t>(pack2<T>(x, 0.f) & 0xffffu));
}

template <class T>
__global__ void __launch_bounds__(kRndThreads) attn_rounded_kernel(RoundedArgs p) {
  extern __shared__ float sc[];  // s_kv scores, then probabilities
  __shared__ float q[256];
  __shared__ float scratch[kRndThreads / 32];
  __shared__ float part[kRndThreads];
  const int qi = blockIdx.x % p.s, bh = blockIdx.x / p.s;
  const int hi = bh % p.h, bi = bh / p.h, hk = hi / p.group;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const uint16_t* qr = p.q + bi * p.qs[0] + hi * p.qs[1] + qi * p.qs[2];
  for (int c = threadIdx.x; c < p.d; c += kRndThreads) q[c] = bits_to_float<T>(qr[c]);
  // Causal: query qi sees keys j <= qi + s_kv - s.
  const int key_end = p.causal ? max(0, min(p.s_kv, qi + p.s_kv - p.s + 1)) : p.s_kv;
  __syncthreads();
  const uint16_t* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  for (int j = warp; j < key_end; j += kRndThreads / 32) {
    const uint16_t* kr = kb + j * p.ks[2];
    float a = 0.f;
    for (int c = lane; c < p.d; c += 32) a = fmaf(q[c], bits_to_float<T>(kr[c]), a);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) a += __shfl_xor_sync(0xffffffffu, a, m);
    if (lane == 0) {
      float v = round_as<T>(round_as<T>(a) * p.scale);
      if (p.mask != nullptr) {
        v = round_as<T>(
            v + bits_to_float<T>(p.mask[bi * p.ms[0] + hi * p.ms[1] + qi * p.ms[2] + j * p.ms[3]]));
      }
      sc[j] = v;
    }
  }
  __syncthreads();
  float mx = neg_inf();
  for (int j = threadIdx.x; j < key_end; j += kRndThreads) mx = fmaxf(mx, sc[j]);
  mx = block_reduce(mx, scratch, true);
  float sum = 0.f;
  for (int j = threadIdx.x; j < key_end; j += kRndThreads) {
    float e = mx == neg_inf() ? 0.f : expf(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
  sum = block_reduce(sum, scratch, false);
  for (int j = threadIdx.x; j < key_end; j += kRndThreads) {
    sc[j] = sum > 0.f ? round_as<T>(sc[j] / sum) : 0.f;
  }
  __syncthreads();
  // P V: threads (part, column); the parts' sums are added in a fixed order.
  const int parts = kRndThreads / p.d;  // d <= 256
  const int c = threadIdx.x % p.d, pi = threadIdx.x / p.d;
  const uint16_t* vb = p.v + bi * p.vs[0] + hk * p.vs[1] + c;
  float acc = 0.f;
  if (pi < parts) {
    for (int j = pi; j < key_end; j += parts)
      acc = fmaf(sc[j], bits_to_float<T>(vb[j * p.vs[2]]), acc);
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < p.d) {
    float o = 0.f;
    for (int i = 0; i < parts; ++i) o += part[i * p.d + threadIdx.x];
    p.out[((static_cast<int64_t>(bi) * p.h + hi) * p.s + qi) * p.d + threadIdx.x] =
        static_cast<uint16_t>(pack2<T>(o, 0.f) & 0xffffu);
  }
}

// WICK_ATTENTION_ROUNDING=transformers sends short f16/bf16 queries to the rounded kernel; by
// default they take the online-softmax kernels, which are faster (decode: tensor cores over the
// whole GPU) and round the scores and probabilities once each in f32 instead.
bool rounded_enabled() {
  return config().attention_rounding_transformers;
}

bool rounded_fits(DType dtype, const AttentionArgs& a) {
  return (dtype == DType::BF16 || dtype == DType::F16) && rounded_enabled() && a.s <= kRndMaxRows &&
         a.s_kv > 0 && a.s_kv <= kRndMaxKeys && a.d <= 256 && a.h % a.h_kv == 0;
}

template <class T>
void run_rounded(const AttentionArgs& a, cudaStream_t s) {
  RoundedArgs p{operands<uint16_t>(a), a.d, a.scale};
  unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.b) * a.h * a.s);
  attn_rounded_kernel<T><<<blocks, kRndThreads, a.s_kv * sizeof(float), s>>>(p);
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool rounded_attention_fits(DType dtype, const AttentionArgs& a) {
  return rounded_fits(dtype, a);
}

void launch_rounded_attention(DType dtype, const AttentionArgs& a, cudaStream_t s) {
  if (dtype == DType::BF16) return run_rounded<__nv_bfloat16>(a, s);
  return run_rounded<__half>(a, s);
}

}  // namespace wick::cuda
