// The decode step's fused projections (decode_gemv.h): a block of 128 threads per pair of output
// rows, each thread loading two units of both rows (16 bytes of plain weights, or half a GGML
// block) and their activations before using them, f32 sums reduced across the block, then the
// epilogue on thread 0. Memory-bound: each weight byte is read once per token. Launched as
// programmatic dependent launches, so that a kernel's first weights load while the kernel before
// it finishes. Shapes measured on the H200 in a graph, as the decode step runs (Llama-1B down
// projection 2048 x 8192): a warp per pair 17.9 us, this 9.7 us.

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

// ---- weight formats: a row is a run of units, each unit's raw bits loaded apart from its use
// (the first units are loaded before the programmatic-launch wait) and dotted with the unit's
// activations, given as V floats read in runs of R (16-byte aligned) at x_start(unit, run).

template <class T>
struct DenseRows {  // 16 bytes of T a unit
  static constexpr int V = 16 / sizeof(T), R = V;
  using Raw = uint4;
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    return __ldg(reinterpret_cast<const uint4*>(row) + unit);
  }
  __device__ static int64_t x_start(int64_t unit, int) { return unit * V; }
  __device__ static float dot(const Raw& r, const float (&x)[V], float) {
    Vec<T, V> w;
    memcpy(&w, &r, 16);
    float s = 0;
#pragma unroll
    for (int e = 0; e < V; ++e) s += to_compute(w.v[e]) * x[e];
    return s;
  }
};

// From the block's shared-memory copy of its rows.
__device__ __forceinline__ uint16_t u16_at(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ float f16_bits(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}
// Byte j of w plus 2^23, as a float (exact): one byte permute instead of an int-to-float
// conversion, which runs at a quarter of the rate.
__device__ __forceinline__ float byte_plus_2p23(uint32_t w, int j) {
  return __uint_as_float(__byte_perm(w, 0x4b000000u, 0x7440u | j));
}

// Q4_0 (18-byte blocks: f16 d, 16 bytes of nibbles; value = d * (q - 8)) and Q4_1 (20 bytes:
// f16 d, f16 m, nibbles; value = d * q + m). A unit is half a block: nibble bytes 8h .. 8h + 7,
// whose low nibbles are values 8h + i and high nibbles values 16 + 8h + i. Blocks are only
// 2-byte aligned (Q4_0), so the bytes come as 16-bit loads (from shared memory: dot2_staged).
template <bool kMin>
struct Q4Rows {
  static constexpr int kBlock = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  static constexpr int V = 16, R = 8;
  struct Raw {
    uint16_t d, m;
    uint32_t q[2];
  };
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 1) * kBlock;
    const uint8_t* qs = b + kQs + (unit & 1) * 8;
    Raw r;
    r.d = u16_at(b);
    r.m = kMin ? u16_at(b + 2) : 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r.q[i] = u16_at(qs + 4 * i) | (static_cast<uint32_t>(u16_at(qs + 4 * i + 2)) << 16);
    }
    return r;
  }
  __device__ static int64_t x_start(int64_t unit, int run) {
    return (unit >> 1) * 32 + (unit & 1) * 8 + run * 16;
  }
  __device__ static float dot(const Raw& r, const float (&x)[V], float x_sum) {
    // 2^23 + q, less 2^23 (+ 8 for Q4_0): the nibble (minus its offset) exactly.
    constexpr float kBias = kMin ? 8388608.0f : 8388616.0f;
    float s = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t lo = r.q[i] & 0x0f0f0f0fu, hi = (r.q[i] >> 4) & 0x0f0f0f0fu;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s += (byte_plus_2p23(lo, j) - kBias) * x[4 * i + j];
        s += (byte_plus_2p23(hi, j) - kBias) * x[8 + 4 * i + j];
      }
    }
    float v = f16_bits(r.d) * s;
    if constexpr (kMin) v += f16_bits(r.m) * x_sum;
    return v;
  }
};

// Q8_0 (34-byte blocks: f16 d, 32 int8; value = d * q). A unit is half a block, 16 values.
struct Q8Rows {
  static constexpr int V = 16, R = 8;
  struct Raw {
    uint16_t d;
    uint32_t q[4];
  };
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 1) * 34;
    const uint8_t* qs = b + 2 + (unit & 1) * 16;
    Raw r;
    r.d = u16_at(b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.q[i] = u16_at(qs + 4 * i) | (static_cast<uint32_t>(u16_at(qs + 4 * i + 2)) << 16);
    }
    return r;
  }
  __device__ static int64_t x_start(int64_t unit, int run) { return unit * 16 + run * 8; }
  __device__ static float dot(const Raw& r, const float (&x)[V], float) {
    float s = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t u = r.q[i] ^ 0x80808080u;  // q + 128, unsigned
#pragma unroll
      for (int j = 0; j < 4; ++j) s += (byte_plus_2p23(u, j) - 8388736.0f) * x[4 * i + j];
    }
    return f16_bits(r.d) * s;
  }
};

// R activations from p (16-byte aligned) as floats.
template <class T, int R>
__device__ __forceinline__ void load_run(const T* p, float* out) {
  constexpr int N = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < R / N; ++i) {
    Vec<T, N> v;
    const uint4 bits = __ldg(reinterpret_cast<const uint4*>(p) + i);
    memcpy(&v, &bits, 16);
#pragma unroll
    for (int e = 0; e < N; ++e) out[i * N + e] = to_compute(v.v[e]);
  }
}

// The block's sums of s0 and s1, on every thread.
__device__ __forceinline__ void block_total2(float s0, float s1, float& a0, float& a1) {
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

// Bytes between the two rows' copies in shared memory.
__host__ __device__ constexpr int64_t staged_stride(int64_t row_bytes) {
  return (row_bytes + 15) / 16 * 16;
}

// Rows w0 and w1 (k values each) dotted with x by the whole block, on every thread. The first
// units of the weights are loaded before pdl_wait(): they do not depend on the kernel before.
template <class T, class F>
__device__ __forceinline__ void dot2(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                     const T* __restrict__ x, int64_t k, float& a0, float& a1) {
  constexpr int V = F::V, R = F::R;
  const int64_t units = k / V;
  float s0 = 0, s1 = 0;
  typename F::Raw r0[kGemvUnroll], r1[kGemvUnroll];
  // A unit past the end is all zero bits: a zero scale (or zero elements) adds nothing.
  auto load_weights = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t c = base + u * kGemvThreads;
      if (c < units) {
        r0[u] = F::load(w0, c);
        r1[u] = F::load(w1, c);
      } else {
        memset(&r0[u], 0, sizeof(r0[u]));
        memset(&r1[u], 0, sizeof(r1[u]));
      }
    }
  };
  int64_t base = threadIdx.x;
  load_weights(base);
  pdl_wait();
  while (true) {
    float xv[kGemvUnroll][V];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t c = base + u * kGemvThreads;
#pragma unroll
      for (int run = 0; run < V / R; ++run) {
        if (c < units) {
          load_run<T, R>(x + F::x_start(c, run), &xv[u][run * R]);
        } else {
#pragma unroll
          for (int e = 0; e < R; ++e) xv[u][run * R + e] = 0;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      float x_sum = 0;
#pragma unroll
      for (int e = 0; e < V; ++e) x_sum += xv[u][e];
      s0 += F::dot(r0[u], xv[u], x_sum);
      s1 += F::dot(r1[u], xv[u], x_sum);
    }
    base += kGemvThreads * kGemvUnroll;
    if (base >= units) break;
    load_weights(base);
  }
  pdl_launch_dependents();  // the next kernel may start loading its weights
  block_total2(s0, s1, a0, a1);
}

// Rows of GGML blocks: both rows copied whole into shared memory (cp.async, `copy` bytes at a
// time: 16, 8 or 4, as the rows' alignment allows) before pdl_wait(), then dotted from there. A
// few wide loads per thread keep more bytes in flight than 16-bit loads of the blocks would, and
// the copies do not hold registers.
template <class T, class F>
__device__ __forceinline__ void dot2_staged(const uint8_t* __restrict__ w0,
                                            const uint8_t* __restrict__ w1,
                                            const T* __restrict__ x, int64_t k, int64_t row_bytes,
                                            int copy, float& a0, float& a1) {
  constexpr int V = F::V, R = F::R;
  extern __shared__ __align__(16) uint8_t gemv_rows[];
  uint8_t* sw0 = gemv_rows;
  uint8_t* sw1 = gemv_rows + staged_stride(row_bytes);
  auto stage = [&]<int N>() {
    for (int64_t i = threadIdx.x * N; i < row_bytes; i += kGemvThreads * N) {
      cp_async<N>(sw0 + i, w0 + i);
      cp_async<N>(sw1 + i, w1 + i);
    }
  };
  if (copy == 16) {
    stage.template operator()<16>();
  } else if (copy == 8) {
    stage.template operator()<8>();
  } else {
    stage.template operator()<4>();
  }
  cp_async_commit();
  pdl_wait();
  cp_async_wait<0>();
  __syncthreads();
  const int64_t units = k / V;
  float s0 = 0, s1 = 0;
  for (int64_t base = threadIdx.x; base < units; base += kGemvThreads * kGemvUnroll) {
    float xv[kGemvUnroll][V];
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t c = base + u * kGemvThreads;
#pragma unroll
      for (int run = 0; run < V / R; ++run) {
        if (c < units) {
          load_run<T, R>(x + F::x_start(c, run), &xv[u][run * R]);
        } else {
#pragma unroll
          for (int e = 0; e < R; ++e) xv[u][run * R + e] = 0;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kGemvUnroll; ++u) {
      const int64_t c = base + u * kGemvThreads;
      if (c < units) {
        float x_sum = 0;
#pragma unroll
        for (int e = 0; e < V; ++e) x_sum += xv[u][e];
        s0 += F::dot(F::load(sw0, c), xv[u], x_sum);
        s1 += F::dot(F::load(sw1, c), xv[u], x_sum);
      }
    }
  }
  pdl_launch_dependents();
  block_total2(s0, s1, a0, a1);
}

template <class T, class F>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(GemvArgs a, int64_t row_bytes, int copy) {
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
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
    if constexpr (std::is_same_v<F, DenseRows<T>>) {
      dot2<T, F>(w + r0 * row_bytes, w + r1 * row_bytes, x, a.k, a0, a1);
    } else {
      dot2_staged<T, F>(w + r0 * row_bytes, w + r1 * row_bytes, x, a.k, row_bytes, copy, a0, a1);
    }
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
      } else if (a.epilogue == GemvEpilogue::Store) {
        static_cast<T*>(a.out)[r0] = convert<T>(a0);
        static_cast<T*>(a.out)[r1] = convert<T>(a1);
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

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Bytes of a row of k values; 0 when k does not suit the format.
int64_t row_bytes_of(DType dtype, GemvWeights weights, int64_t k) {
  switch (weights) {
    case GemvWeights::Dense: {
      const int64_t size = static_cast<int64_t>(size_in_bytes(dtype));
      return k % (16 / size) == 0 ? k * size : 0;
    }
    case GemvWeights::Q4_0:
      return k % 32 == 0 ? k / 32 * 18 : 0;
    case GemvWeights::Q4_1:
      return k % 32 == 0 ? k / 32 * 20 : 0;
    case GemvWeights::Q8_0:
      return k % 32 == 0 ? k / 32 * 34 : 0;
  }
  return 0;
}

// The widest cp.async (16, 8 or 4 bytes) that every row of w allows; 0 when none does.
int staged_copy_bytes(const void* w, int64_t row_bytes) {
  for (int n : {16, 8, 4}) {
    if (aligned(w, n) && row_bytes % n == 0) return n;
  }
  return 0;
}

constexpr int64_t kMaxStagedBytes = 48 * 1024;  // shared memory without an opt-in attribute

template <class T>
void launch_typed(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.n / 2));
  const int copy = staged_copy_bytes(a.w, row_bytes);
  const size_t smem = static_cast<size_t>(2 * staged_stride(row_bytes));
  switch (a.weights) {
    case GemvWeights::Dense:
      launch_pdl(gemv_kernel<T, DenseRows<T>>, grid, kGemvThreads, 0, s, a, row_bytes, 0);
      break;
    case GemvWeights::Q4_0:
      launch_pdl(gemv_kernel<T, Q4Rows<false>>, grid, kGemvThreads, smem, s, a, row_bytes, copy);
      break;
    case GemvWeights::Q4_1:
      launch_pdl(gemv_kernel<T, Q4Rows<true>>, grid, kGemvThreads, smem, s, a, row_bytes, copy);
      break;
    case GemvWeights::Q8_0:
      launch_pdl(gemv_kernel<T, Q8Rows>, grid, kGemvThreads, smem, s, a, row_bytes, copy);
      break;
  }
}

}  // namespace

bool gemv_fits(DType dtype, const GemvArgs& a) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return false;
  if (a.k <= 0 || a.n <= 0 || a.n % 2 != 0 || a.n / 2 > INT32_MAX) return false;
  const int64_t row_bytes = row_bytes_of(dtype, a.weights, a.k);
  if (row_bytes == 0 || !aligned(a.x, 16)) return false;
  // Dense rows are read 16 bytes at a time; GGML rows are copied to shared memory in pieces of
  // at least 4 bytes.
  if (a.weights == GemvWeights::Dense) {
    if (!aligned(a.w, 16)) return false;
  } else if (staged_copy_bytes(a.w, row_bytes) == 0 ||
             2 * staged_stride(row_bytes) > kMaxStagedBytes) {
    return false;
  }
  if (a.epilogue == GemvEpilogue::QkvRope) {
    return a.d > 0 && a.d % 2 == 0 && a.n == (a.h + 2 * a.h_kv) * a.d;
  }
  return a.epilogue != GemvEpilogue::AddNorm || a.counter != nullptr;
}

void launch_gemv(DType dtype, const GemvArgs& a, cudaStream_t s) {
  const int64_t row_bytes = row_bytes_of(dtype, a.weights, a.k);
  switch (dtype) {
    case DType::F32:
      launch_typed<float>(a, row_bytes, s);
      break;
    case DType::F16:
      launch_typed<__half>(a, row_bytes, s);
      break;
    case DType::BF16:
      launch_typed<__nv_bfloat16>(a, row_bytes, s);
      break;
    default:
      throw UnsupportedDType("decode gemv: f32, f16 or bf16");
  }
}

}  // namespace wick::cuda
