// The decode step's fused projections (decode_gemv.h): a block of 128 threads per pair of output
// rows, each thread loading two 16-byte chunks of both rows (and of x) before using them, f32
// sums reduced across the block, then the epilogue on thread 0. Memory-bound: each weight byte is
// read once per token. Shapes measured on the H200 in a graph, as the decode step runs (Llama-1B
// down projection 2048 x 8192): a warp per pair 17.9 us, this 9.7 us.

#include "cuda/decode_gemv.h"
#include "cuda/kernel_utils.cuh"

namespace wick::cuda {
namespace {

constexpr int kGemvThreads = 128;
constexpr int kGemvUnroll = 2;  // chunks per row a thread has in flight

template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_compute(convert<T>(v));
}

template <class T>
__device__ __forceinline__ float load_cg(const T* p) {
  if constexpr (sizeof(T) == 2) {
    unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(p));
    T v;
    memcpy(&v, &bits, 2);
    return to_compute(v);
  } else {
    return __ldcg(p);
  }
}

__device__ __forceinline__ float warp_total(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Rows w0 and w1 (k elements each) dotted with x by the whole block, on every thread.
template <class T>
__device__ __forceinline__ void dot2(const T* __restrict__ w0, const T* __restrict__ w1,
                                     const T* __restrict__ x, int64_t k, float& a0, float& a1) {
  constexpr int N = 16 / sizeof(T);
  const int64_t chunks = k / N;
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  const uint4* w04 = reinterpret_cast<const uint4*>(w0);
  const uint4* w14 = reinterpret_cast<const uint4*>(w1);
  float s0 = 0, s1 = 0;
  for (int64_t base = threadIdx.x; base < chunks; base += kGemvThreads * kGemvUnroll) {
    // All loads first, so that each thread has 3 x kGemvUnroll of them in flight; a chunk past
    // the end is zero and adds nothing.
    uint4 rx[kGemvUnroll], r0[kGemvUnroll], r1[kGemvUnroll];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      int64_t c = base + u * kGemvThreads;
      bool in = c < chunks;
      rx[u] = in ? __ldg(x4 + c) : make_uint4(0, 0, 0, 0);
      r0[u] = in ? __ldg(w04 + c) : make_uint4(0, 0, 0, 0);
      r1[u] = in ? __ldg(w14 + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      Vec<T, N> vx, v0, v1;
      memcpy(&vx, &rx[u], 16);
      memcpy(&v0, &r0[u], 16);
      memcpy(&v1, &r1[u], 16);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        float xe = to_compute(vx.v[e]);
        s0 += to_compute(v0.v[e]) * xe;
        s1 += to_compute(v1.v[e]) * xe;
      }
    }
  }
  s0 = warp_total(s0);
  s1 = warp_total(s1);
  __shared__ float part[2][kGemvThreads / 32];
  if (threadIdx.x % 32 == 0) {
    part[0][threadIdx.x / 32] = s0;
    part[1][threadIdx.x / 32] = s1;
  }
  __syncthreads();
  a0 = 0;
  a1 = 0;
#pragma unroll
  for (int i = 0; i < kGemvThreads / 32; ++i) {
    a0 += part[0][i];
    a1 += part[1][i];
  }
}

template <class T>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(GemvArgs a) {
  const T* w = static_cast<const T*>(a.w);
  const T* x = static_cast<const T*>(a.x);
  const int64_t pairs = a.n / 2;
  const int64_t p = blockIdx.x;  // the grid is one block per pair
  const bool first = threadIdx.x == 0;
  if (p < pairs) {
    // The two rows of this block.
    int64_t r0, r1;
    const int64_t half = a.d / 2;
    if (a.epilogue == GemvEpilogue::QkvRope) {
      r0 = (p / half) * a.d + p % half;
      r1 = r0 + half;
    } else if (a.epilogue == GemvEpilogue::SiluMul) {
      r0 = p;
      r1 = pairs + p;
    } else {
      r0 = 2 * p;
      r1 = r0 + 1;
    }
    float a0, a1;
    dot2<T>(w + r0 * a.k, w + r1 * a.k, x, a.k, a0, a1);
    // The product as a matmul (nn.Linear) would store it: a bias joins the f32 sum, then one
    // rounding.
    if (a.epilogue == GemvEpilogue::QkvRope && a.bias != nullptr) {
      const T* bias = static_cast<const T*>(a.bias);
      a0 += to_compute(bias[r0]);
      a1 += to_compute(bias[r1]);
    }
    a0 = round_to<T>(a0);
    a1 = round_to<T>(a1);
    if (first) {
      if (a.epilogue == GemvEpilogue::QkvRope) {
        const int64_t head = p / half, i = p % half;
        const int64_t pos = static_cast<int64_t>(*a.position);
        if (pos < a.max_len) {
          if (head < a.h + a.h_kv) {
            // Each product rounded, then the sum: transformers' q * cos + rotate_half(q) * sin
            // in the model's dtype (f32: plain products).
            float c = to_compute(static_cast<const T*>(a.cos)[pos * half + i]);
            float s = to_compute(static_cast<const T*>(a.sin)[pos * half + i]);
            float x1 = round_to<T>(__fmul_rn(a0, c)) - round_to<T>(__fmul_rn(a1, s));
            float x2 = round_to<T>(__fmul_rn(a1, c)) + round_to<T>(__fmul_rn(a0, s));
            a0 = x1;
            a1 = x2;
          }
          T* dst;
          if (head < a.h) {
            dst = static_cast<T*>(a.q) + head * a.d;
          } else if (head < a.h + a.h_kv) {
            dst = static_cast<T*>(a.k_cache) + ((head - a.h) * a.max_len + pos) * a.d;
          } else {
            dst = static_cast<T*>(a.v_cache) + ((head - a.h - a.h_kv) * a.max_len + pos) * a.d;
          }
          dst[i] = convert<T>(a0);
          dst[i + half] = convert<T>(a1);
        }
      } else if (a.epilogue == GemvEpilogue::SiluMul) {
        // silu rounded, then the product: transformers' act_fn(gate) * up in the dtype.
        static_cast<T*>(a.out)[p] = convert<T>(round_to<T>(a0 / (1.0f + expf(-a0))) * a1);
      } else {
        const T* res = static_cast<const T*>(a.residual);
        T* sum = static_cast<T*>(a.sum);
        sum[r0] = convert<T>(to_compute(res[r0]) + a0);
        sum[r1] = convert<T>(to_compute(res[r1]) + a1);
        __threadfence();  // visible to the block that normalises
      }
    }
  }
  if (a.epilogue != GemvEpilogue::AddNorm) return;

  // The last block to finish normalises the whole sum (threadFenceReduction's pattern).
  __shared__ bool is_last;
  __shared__ float scratch[kGemvThreads / 32];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    is_last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  const T* sum = static_cast<const T*>(a.sum);
  float sq = 0;
  for (int64_t c = threadIdx.x; c < a.n; c += blockDim.x) {
    float v = load_cg(sum + c);
    sq += v * v;
  }
  sq = warp_total(sq);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = sq;
  __syncthreads();
  float total = 0;
  for (int i = 0; i < kGemvThreads / 32; ++i) total += scratch[i];
  float rstd = rsqrtf(total / static_cast<float>(a.n) + static_cast<float>(a.eps));
  const T* nw = static_cast<const T*>(a.norm_weight);
  T* normed = static_cast<T*>(a.normed);
  for (int64_t c = threadIdx.x; c < a.n; c += blockDim.x) {
    // Normalised, rounded, then times the weight: transformers' RMSNorm casts the normalised
    // row back to the dtype before the weight multiplies it.
    normed[c] = convert<T>(to_compute(nw[c]) * round_to<T>(load_cg(sum + c) * rstd));
  }
  if (threadIdx.x == 0) *a.counter = 0;  // ready for the next launch
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool gemv_fits(DType dtype, const GemvArgs& a) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return false;
  int64_t per_vec = 16 / static_cast<int64_t>(size_in_bytes(dtype));
  if (a.k <= 0 || a.k % per_vec != 0 || a.n <= 0 || a.n % 2 != 0) return false;
  if (!aligned16(a.w) || !aligned16(a.x)) return false;
  if (a.epilogue == GemvEpilogue::QkvRope) {
    return a.d > 0 && a.d % 2 == 0 && a.n == (a.h + 2 * a.h_kv) * a.d;
  }
  return a.epilogue != GemvEpilogue::AddNorm || a.counter != nullptr;
}

void launch_gemv(DType dtype, const GemvArgs& a, cudaStream_t s) {
  unsigned grid = static_cast<unsigned>(a.n / 2);
  switch (dtype) {
    case DType::F32:
      gemv_kernel<float><<<grid, kGemvThreads, 0, s>>>(a);
      break;
    case DType::F16:
      gemv_kernel<__half><<<grid, kGemvThreads, 0, s>>>(a);
      break;
    case DType::BF16:
      gemv_kernel<__nv_bfloat16><<<grid, kGemvThreads, 0, s>>>(a);
      break;
    default:
      throw UnsupportedDType("decode gemv: f32, f16 or bf16");
  }
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace wick::cuda
