// The decode step's fused projections (decode_gemv.h): one token's activations against weights
// read once per token, so the kernels are bound by the weight stream. Plain rows: a block of
// 64-256 threads per 2, 4 or 8 output rows, each thread one 16-byte unit of every row at a time.
// GGML rows (Q4_0, Q4_1, Q8_0): copied to shared memory by cp.async, dotted in integers (dp4a)
// against activations quantized once a block as the CPU's qmatmul quantizes them; by blocks of
// rows, streamed through fewer blocks, or in warp-owned pairs (k a multiple of 2048). The f32
// sums are reduced across the block and each pair of rows goes through its epilogue (bias, rope,
// SiLU, residual, argmax) on one thread. Programmatic dependent launches: a kernel's first
// weights load while the kernel before it finishes. History and figures: docs/perf/gemv.md.

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#ifdef WICK_DEVICE_TIMELINE
#include <cstdio>
#include <cstdlib>
#endif

#include "cuda/decode_gemv.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"

WICK_TIMELINE_TU(decode_gemv)

namespace wick::cuda {
namespace {

template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_compute(convert<T>(v));
}

// Activation v after RMSNorm with weight w, as transformers computes it in the dtype:
// w * round(v * rstd), rounded.
template <class T>
__device__ __forceinline__ float rms_normed(float v, float w, float rstd) {
  return round_to<T>(w * round_to<T>(v * rstd));
}

__device__ __forceinline__ float warp_total(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// ---- weight formats: a row is a run of units, each unit's raw bits loaded apart from its use
// (the first units are loaded before the programmatic-launch wait) and dotted with the unit's
// activations, read as V floats in runs of R (16-byte aligned) at x_start(unit, run): as they
// are (plain weights) or quantized (GGML blocks: QUnit below).

template <class T>
struct DenseRows {  // 16 bytes of T a unit
  static constexpr int V = 16 / sizeof(T), R = V;
  using Raw = uint4;
  // Read once a token: not kept in the L1, and left in the L2's normal eviction class.
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    Raw r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(reinterpret_cast<const uint4*>(row) + unit));
    return r;
  }
  __device__ static int64_t x_start(int64_t unit, int) { return unit * V; }
  __device__ static float dot(const Raw& r, const float (&x)[V]) {
    Vec<T, V> w;
    memcpy(&w, &r, 16);
    float s = 0;
#pragma unroll
    for (int e = 0; e < V; ++e) s += to_compute(w.v[e]) * x[e];
    return s;
  }
};

// ---- GGML rows: integer dots (dp4a) of the weights' integers with the activations quantized as
// the CPU's qmatmul takes them by default (cpu/qmatmul.h, 16-bit blocks of 32: q = round(x / d),
// d = max |x| / 32512), each block sum scaled in f32 by the two scales.

constexpr float kQ16Max = 32512;
// 1.5 * 2^23: v + kMagic, for |v| < 2^22, is a float whose low 23 bits are 2^22 + round(v) (to
// nearest even, as lrintf): integers to and from floats with adds (conversion instructions issue
// at an eighth of the rate of float adds on sm_90).
constexpr float kMagic = 12582912;
constexpr int kMagicBits = 0x4b400000;

// A unit's 16 activations quantized: each q as its two bytes, q = 256 hi + lo (hi signed, lo
// unsigned), four values to a word in the unit's order; s = the sum of the unit's 16 q (exact),
// d = the scale of the block of 32 that holds the unit.
struct QUnit {
  uint32_t hi[4], lo[4];
  float s, d;
};

// Four products of the signed bytes of a and the unsigned bytes of b, plus c.
__device__ __forceinline__ int dp4a_su(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Weight bytes w (signed; nibbles 0..15 read the same) dotted with x's q, plus c (an integer
// below 2^22 in magnitude): the integer sum rounded once to f32. The two digits' sums (each below
// 2^22 in magnitude: at most 16 x 128 x 255) start from kMagicBits and come out as floats.
__device__ __forceinline__ float dot_q(const uint32_t (&w)[4], const QUnit& x, float c) {
  int hi = kMagicBits, lo = kMagicBits;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    hi = __dp4a(static_cast<int>(w[i]), static_cast<int>(x.hi[i]), hi);
    lo = dp4a_su(w[i], x.lo[i], lo);
  }
  return __fmaf_rn(256.0f, __int_as_float(hi) - kMagic, __int_as_float(lo) - (kMagic - c));
}

// max(a, b), NaN when either is (fmaxf drops a NaN): a NaN activation makes its block's sums NaN,
// as the f32 products would.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Unit x (16 values, zeros past the end) quantized. The unit's block of 32 is units c and c ^ 1,
// on lanes l and l ^ 1 of the warp (c and l even together): its max |x| is found with one shuffle,
// so every lane of the warp calls this. The arithmetic is the CPU's (Q8Rows::quantize).
__device__ __forceinline__ QUnit quantize_unit(const float (&x)[16]) {
  float amax = 0;
#pragma unroll
  for (int e = 0; e < 16; ++e) amax = max_nan(amax, fabsf(x[e]));
  amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  QUnit u;
  u.d = amax / kQ16Max;
  const float inv = u.d != 0 ? 1.0f / u.d : 0.0f;
  // |x inv| <= 32512: bytes 0 and 1 of the sum's bits are q's lo and hi.
  uint32_t b[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) b[e] = __float_as_uint(__fadd_rn(__fmul_rn(x[e], inv), kMagic));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t p = __byte_perm(b[4 * i], b[4 * i + 1], 0x5140);      // lo0 lo1 hi0 hi1
    const uint32_t q = __byte_perm(b[4 * i + 2], b[4 * i + 3], 0x5140);  // lo2 lo3 hi2 hi3
    u.lo[i] = __byte_perm(p, q, 0x5410);
    u.hi[i] = __byte_perm(p, q, 0x7632);
  }
  constexpr uint32_t kOnes[4] = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};
  u.s = dot_q(kOnes, u, 0);
  return u;
}

// From the block's shared-memory copy of its rows.
__device__ __forceinline__ uint16_t u16_at(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ float f16_bits(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}

// Q4_0 (18-byte blocks: f16 d, 16 bytes of nibbles; value = d * (q - 8)) and Q4_1 (20 bytes:
// f16 d, f16 m, nibbles; value = d * q + m). A unit is half a block: nibble bytes 8h .. 8h + 7,
// whose low nibbles are values 8h + i and high nibbles values 16 + 8h + i. Blocks are only
// 2-byte aligned (Q4_0), so the bytes come as 16-bit loads (from shared memory: dot_rows_staged).
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
  // The CPU's tile kernels: d dx (dot(q, x) - 8 s) for Q4_0; d dx dot(q, x) + m dx s for Q4_1,
  // here per half block.
  __device__ static float dot(const Raw& r, const QUnit& x) {
    const uint32_t w[4] = {r.q[0] & 0x0f0f0f0fu, r.q[1] & 0x0f0f0f0fu, (r.q[0] >> 4) & 0x0f0f0f0fu,
                           (r.q[1] >> 4) & 0x0f0f0f0fu};
    float v = dot_q(w, x, kMin ? 0.0f : -8 * x.s) * (f16_bits(r.d) * x.d);
    if constexpr (kMin) v = fmaf(f16_bits(r.m), x.d * x.s, v);
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
  __device__ static int64_t x_start(int64_t unit, int run) {
    return unit * 16 + run * 8;
  }
  __device__ static float dot(const Raw& r, const QUnit& x) {
    return dot_q(r.q, x, 0) * (f16_bits(r.d) * x.d);
  }
};

// 16 bytes of T as floats.
template <class T>
__device__ __forceinline__ void unpack16(const uint4& bits, float* out) {
  constexpr int PER = 16 / sizeof(T);
  Vec<T, PER> v;
  memcpy(&v, &bits, 16);
#pragma unroll
  for (int e = 0; e < PER; ++e) out[e] = to_compute(v.v[e]);
}

// N activations from p (16-byte aligned) as floats.
template <class T, int N>
__device__ __forceinline__ void load_run(const T* p, float* out) {
  constexpr int PER = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < N / PER; ++i) {
    unpack16<T>(__ldg(reinterpret_cast<const uint4*>(p) + i), out + i * PER);
  }
}

// The block's totals of s[0 .. R), on every thread of the N.
template <int R, int N = kGemvThreads>
__device__ __forceinline__ void block_totals(float (&s)[R]) {
  __shared__ float part[R][N / 32];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float t = warp_total(s[r]);
    if (threadIdx.x % 32 == 0) part[r][threadIdx.x / 32] = t;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = 0;
#pragma unroll
    for (int i = 0; i < N / 32; ++i) s[r] += part[r][i];
  }
}

// What a block dots its rows with: x, or with a norm weight nw the RMSNorm of x as transformers
// computes it in the dtype, nw * round(x * rstd) rounded, rstd found by the block first (every
// block reads all of x anyway; this replaces a separate norm kernel, or a serial tail in the
// kernel that made x). Finding rstd from the values the products use instead (no second read
// of x) held both in registers at once and cost more in occupancy than it saved.
template <class T>
struct Input {
  const T* x;
  const T* nw;  // null: x as it is
  float rstd = 1;

  template <int N = kGemvThreads>
  __device__ void find_rstd(int64_t k, double eps) {
    constexpr int PER = 16 / sizeof(T);
    float sq = 0;
    for (int64_t c = threadIdx.x; c < k / PER; c += N) {
      float v[PER];
      load_run<T, PER>(x + c * PER, v);
#pragma unroll
      for (int e = 0; e < PER; ++e) sq += v[e] * v[e];
    }
    float t[1] = {sq};
    block_totals<1, N>(t);
    rstd = rsqrtf(t[0] / static_cast<float>(k) + static_cast<float>(eps));
  }
};

// The activations of the U units from `base` N apart (zeros past the end), normalised when the
// input takes a norm.
template <class T, class F, int U, int N = kGemvThreads>
__device__ __forceinline__ void load_inputs(const Input<T>& in, int64_t base, int64_t units,
                                            float (&xv)[U][F::V]) {
  constexpr int V = F::V, RUN = F::R;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = base + u * N;
#pragma unroll
    for (int run = 0; run < V / RUN; ++run) {
      float* out = &xv[u][run * RUN];
      if (c >= units) {
#pragma unroll
        for (int e = 0; e < RUN; ++e) out[e] = 0;
        continue;
      }
      load_run<T, RUN>(in.x + F::x_start(c, run), out);
      if (in.nw != nullptr) {
        float w[RUN];
        load_run<T, RUN>(in.nw + F::x_start(c, run), w);
#pragma unroll
        for (int e = 0; e < RUN; ++e) out[e] = rms_normed<T>(out[e], w[e], in.rstd);
      }
    }
  }
}

// Units of each GGML row a thread quantizes and dots at once: fewer when a block has many rows
// (registers).
template <int R>
inline constexpr int kUnroll = R >= 8 ? 1 : 2;

// Plain rows w[0 .. R) (k values each) dotted with the input by the whole block of N threads,
// totals on every thread. The first units of the weights are loaded before pdl_wait(): they do not
// depend on the kernel before. A thread holds one unit of each row at a time, so that more blocks
// fit a multiprocessor. kPrefetchRows: the rest of the rows is asked of the L2 before pdl_wait too
// (GemvArgs::prefetch_rows; one prefetch a row and unit, no registers).
template <class T, class F, int R, bool kPrefetchRows, int N>
__device__ __forceinline__ void dot_rows(const uint8_t* const (&w)[R], Input<T>& in, int64_t k,
                                         double eps, float (&acc)[R]) {
  constexpr int V = F::V;
  const int64_t units = k / V;
  typename F::Raw raw[R];
  // A unit past the end is all zero bits: zero elements add nothing.
  auto load_weights = [&](int64_t c) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (c < units) {
        raw[r] = F::load(w[r], c);
      } else {
        memset(&raw[r], 0, sizeof(raw[r]));
      }
    }
  };
  int64_t base = threadIdx.x;
  load_weights(base);
  if constexpr (kPrefetchRows) {
    for (int64_t c = base + N; c < units; c += N) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w[r] + c * 16) : "memory");
      }
    }
  }
  // The first unit's norm weights too: they are weights. A unit is 16 bytes of T.
  const bool nw_first = in.nw != nullptr && base < units;
  uint4 nw_bits = make_uint4(0, 0, 0, 0);
  if (nw_first) nw_bits = __ldg(reinterpret_cast<const uint4*>(in.nw) + base);
  pdl_wait();
  WICK_TL_WAITED();
  if (in.nw != nullptr) in.template find_rstd<N>(k, eps);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0;
  for (bool first = true;; first = false) {
    float xv[1][V];
    if (first && nw_first) {
      float w[V];
      load_run<T, V>(in.x + base * V, xv[0]);
      unpack16<T>(nw_bits, w);
#pragma unroll
      for (int e = 0; e < V; ++e) xv[0][e] = rms_normed<T>(xv[0][e], w[e], in.rstd);
    } else {
      load_inputs<T, F, 1, N>(in, base, units, xv);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += F::dot(raw[r], xv[0]);
    base += N;
    if (base >= units) break;
    load_weights(base);
  }
  pdl_launch_dependents();  // the next kernel may start loading its weights
  block_totals<R, N>(acc);
}

// Bytes between the rows' copies in shared memory.
__host__ __device__ constexpr int64_t staged_stride(int64_t row_bytes) {
  return (row_bytes + 15) / 16 * 16;
}

// Rows src[0 .. R) (row_bytes each) into shared memory at dst, `stride` apart: cp.async, `copy`
// bytes (16, 8 or 4) at a time.
template <int R>
__device__ __forceinline__ void stage_rows(uint8_t* dst, const uint8_t* const (&src)[R],
                                           int64_t row_bytes, int64_t stride, int copy) {
  auto run = [&]<int N>() {
    for (int64_t i = threadIdx.x * N; i < row_bytes; i += kGemvThreads * N) {
#pragma unroll
      for (int r = 0; r < R; ++r) cp_async<N>(dst + r * stride + i, src[r] + i);
    }
  };
  if (copy == 16) {
    run.template operator()<16>();
  } else if (copy == 8) {
    run.template operator()<8>();
  } else {
    run.template operator()<4>();
  }
}

// The U units from `base` a kGemvThreads apart, quantized. Every lane, units past the end too
// (zeros): the two halves of a block of 32 are units c and c ^ 1, on lanes l and l ^ 1
// (kGemvThreads is even), past the end together (units is even).
template <class T, class F, int U>
__device__ __forceinline__ void quantize_inputs(const Input<T>& in, int64_t base, int64_t units,
                                                QUnit (&xq)[U]) {
  float xv[U][F::V];
  load_inputs<T, F, U>(in, base, units, xv);
#pragma unroll
  for (int u = 0; u < U; ++u) xq[u] = quantize_unit(xv[u]);
}

// Rows of GGML blocks: copied whole into shared memory (cp.async, `copy` bytes at a time: 16, 8
// or 4, as the rows' alignment allows) before pdl_wait(), then dotted from there. A few wide
// loads per thread keep more bytes in flight than 16-bit loads of the blocks would, and the
// copies do not hold registers. Each unit of activations is quantized once for the R rows.
template <class T, class F, int R>
__device__ __forceinline__ void dot_rows_staged(const uint8_t* const (&w)[R], Input<T>& in,
                                                int64_t k, double eps, int64_t row_bytes, int copy,
                                                float (&acc)[R]) {
  constexpr int V = F::V, U = kUnroll<R>;
  extern __shared__ __align__(16) uint8_t gemv_rows[];
  const int64_t stride = staged_stride(row_bytes);
  stage_rows<R>(gemv_rows, w, row_bytes, stride, copy);
  cp_async_commit();
  pdl_wait();
  WICK_TL_WAITED();
  const int64_t units = k / V;
  if (in.nw != nullptr) in.find_rstd(k, eps);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0;
  // Every thread runs every round (the first has a block barrier), units past the end idle.
  const int64_t rounds = (units + U * kGemvThreads - 1) / (U * kGemvThreads);
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t base = threadIdx.x + round * U * kGemvThreads;
    QUnit xq[U];
    quantize_inputs<T, F, U>(in, base, units, xq);
    if (round == 0) {  // the rows have landed (the first activations' loads went out before)
      cp_async_wait<0>();
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + u * kGemvThreads;
      if (c < units) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += F::dot(F::load(gemv_rows + r * stride, c), xq[u]);
      }
    }
  }
  pdl_launch_dependents();
  block_totals<R>(acc);
}

// The two rows of output pair p.
__device__ __forceinline__ void pair_rows(const GemvArgs& a, int64_t p, int64_t& r0, int64_t& r1) {
  if (a.epilogue == GemvEpilogue::QkvRope) {
    const int64_t half = a.d / 2;
    r0 = (p / half) * a.d + p % half;
    r1 = r0 + half;
  } else if (a.epilogue == GemvEpilogue::SiluMul) {
    r0 = p;
    r1 = a.n / 2 + p;
  } else {
    r0 = 2 * p;
    r1 = r0 + 1;
  }
}

// What follows the product of pair p: rows r0 and r1 with f32 sums a0 and a1.
template <class T>
__device__ __forceinline__ void epilogue(const GemvArgs& a, int64_t p, int64_t r0, int64_t r1,
                                         float a0, float a1) {
  // The product as a matmul (nn.Linear) would store it: a bias joins the f32 sum, then one
  // rounding.
  if (a.epilogue == GemvEpilogue::QkvRope && a.bias != nullptr) {
    const T* bias = static_cast<const T*>(a.bias);
    a0 += to_compute(bias[r0]);
    a1 += to_compute(bias[r1]);
  }
  a0 = round_to<T>(a0);
  a1 = round_to<T>(a1);
  if (a.epilogue == GemvEpilogue::QkvRope) {
    const int64_t half = a.d / 2, head = p / half, i = p % half;
    const int64_t pos = static_cast<int64_t>(*a.position);
    if (pos >= a.max_len) return;
    if (head < a.h + a.h_kv) {
      // Each product rounded, then the sum: transformers' q * cos + rotate_half(q) * sin in the
      // model's dtype (f32: plain products).
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
  } else if (a.epilogue == GemvEpilogue::Store) {
    static_cast<T*>(a.out)[r0] = convert<T>(a0);
    static_cast<T*>(a.out)[r1] = convert<T>(a1);
  } else if (a.epilogue == GemvEpilogue::SiluMul) {
    // silu rounded, then the product: transformers' act_fn(gate) * up in the dtype.
    static_cast<T*>(a.out)[p] = convert<T>(round_to<T>(a0 / (1.0f + expf(-a0))) * a1);
  } else {  // Add
    const T* res = static_cast<const T*>(a.residual);
    T* out = static_cast<T*>(a.out);
    out[r0] = convert<T>(to_compute(res[r0]) + a0);
    out[r1] = convert<T>(to_compute(res[r1]) + a1);
  }
}

// The R rows of output pairs p0, p0 + 1, ... (a pair past the last repeats it, and finish_pairs
// writes nothing for it).
template <int R>
__device__ __forceinline__ void group_rows(const GemvArgs& a, int64_t p0, int64_t (&rows)[R]) {
#pragma unroll
  for (int j = 0; j < R / 2; ++j) {
    pair_rows(a, min(p0 + j, a.n / 2 - 1), rows[2 * j], rows[2 * j + 1]);
  }
}

// Where rows start in the weight.
template <int R>
__device__ __forceinline__ void row_starts(const GemvArgs& a, int64_t row_bytes,
                                           const int64_t (&rows)[R], const uint8_t* (&ptr)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) ptr[r] = static_cast<const uint8_t*>(a.w) + rows[r] * row_bytes;
}

// Thread j < R / 2 runs the epilogue of pair p0 + j with the block's totals acc.
template <class T, int R>
__device__ __forceinline__ void finish_pairs(const GemvArgs& a, int64_t p0,
                                             const int64_t (&rows)[R], const float (&acc)[R]) {
  if (threadIdx.x >= R / 2) return;
  const int j = static_cast<int>(threadIdx.x);
  // acc is indexed by a constant in each branch (registers, not local memory).
#pragma unroll
  for (int jj = 0; jj < R / 2; ++jj) {
    if (jj == j && p0 + jj < a.n / 2) {
      epilogue<T>(a, p0 + jj, rows[2 * jj], rows[2 * jj + 1], acc[2 * jj], acc[2 * jj + 1]);
    }
  }
}

// The qkv projection's first 2 h_kv blocks each ask the L2 for one k/v head's cache rows before
// the position (read before pdl_wait: a stale position only makes the hint a row short), so that
// the attention after this kernel finds them there instead of waiting on the HBM behind this
// kernel's weight stream.
template <class T>
__device__ __forceinline__ void prefetch_cache_rows(const GemvArgs& a) {
  if (a.epilogue != GemvEpilogue::QkvRope || threadIdx.x != 0) return;
  const int64_t region = blockIdx.x;
  if (region >= 2 * a.h_kv || (a.d * static_cast<int64_t>(sizeof(T))) % 16 != 0) return;
  const int64_t rows = min(static_cast<int64_t>(*a.position), a.max_len);
  const uint32_t bytes = static_cast<uint32_t>(rows * a.d * static_cast<int64_t>(sizeof(T)));
  if (bytes == 0) return;
  const T* base = static_cast<const T*>(region < a.h_kv ? a.k_cache : a.v_cache) +
                  (region % a.h_kv) * a.max_len * a.d;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base), "r"(bytes) : "memory");
}

// The share of GemvArgs::l2_next of block `index` of the `blocks` that share the ask (its slice of
// the two regions' bytes), asked of the L2 by thread 0 in bulk: one request a region it touches.
__device__ __forceinline__ void prefetch_next_share(const GemvArgs& a, int64_t index,
                                                    int64_t blocks) {
  if (threadIdx.x != 0 || a.l2_next == nullptr) return;
  const int64_t bytes = a.l2_next_bytes, slice = (2 * bytes / blocks + 15) / 16 * 16;
  const int64_t from = index * slice, to = min(from + slice, 2 * bytes);
  for (int64_t region = 0; region < 2; ++region) {
    const int64_t lo = max(from, region * bytes), hi = min(to, (region + 1) * bytes);
    if (lo >= hi) continue;
    const uint8_t* p =
        static_cast<const uint8_t*>(a.l2_next) + region * a.l2_next_half + (lo - region * bytes);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p),
                 "r"(static_cast<uint32_t>(hi - lo))
                 : "memory");
  }
}

// launch_l2_aside: each of kL2AsideBlocks blocks asks for its share, by its thread 0.
constexpr int kL2AsideBlocks = 16;
__global__ void l2_aside_kernel(GemvArgs a) {
  prefetch_next_share(a, blockIdx.x, gridDim.x);
}

// GemvArgs::argmax without reading the logits again: each block offers its best row as one
// 64-bit atomic max (orderable value bits above the complemented index) to one of kArgmaxSlots
// words, a fire-and-forget reduction that the block does not wait for; argmax_pick_kernel, queued
// right after with the projection (nothing runs between them), takes the largest and sets the
// words back to zero.
constexpr int kArgmaxSlots = 64;
constexpr int kArgmaxStride = 16;  // words between slots: one slot a 128-byte line
__device__ unsigned long long g_argmax_slots[kArgmaxSlots * kArgmaxStride];

template <class T, int R>
__device__ __forceinline__ void post_argmax(const GemvArgs& a, const int64_t (&rows)[R],
                                            const float (&acc)[R]) {
  if (threadIdx.x != 0) return;
  unsigned long long best = 0;  // below every offer: the order bits of a value are never 0
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = round_to<T>(acc[r]) + 0.0f;  // the stored value; -0 as +0
    const uint32_t bits = __float_as_uint(v);
    const uint32_t order = v != v               ? 0xffffffffu  // NaN above everything
                           : (bits >> 31) != 0u ? ~bits
                                                : bits | 0x80000000u;
    const uint32_t index = static_cast<uint32_t>(rows[r]);
    best = max(best, static_cast<unsigned long long>(order) << 32 | (0xffffffffu - index));
  }
  atomicMax(&g_argmax_slots[(blockIdx.x % kArgmaxSlots) * kArgmaxStride], best);
}

// One warp per 32 slots: the winner of the slots, which it leaves at zero for the next launch.
__global__ void __launch_bounds__(kArgmaxSlots)
    argmax_pick_kernel(uint32_t* argmax, bool launch_next) {
  if (launch_next) pdl_launch_dependents();  // the step's advance waits for this kernel
  pdl_wait();
  unsigned long long* slot = &g_argmax_slots[threadIdx.x * kArgmaxStride];
  unsigned long long best = *slot;
  *slot = 0;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, m));
  __shared__ unsigned long long warp_best[kArgmaxSlots / 32];
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kArgmaxSlots / 32; ++w) best = max(best, warp_best[w]);
  *argmax = 0xffffffffu - static_cast<uint32_t>(best);
}

// Blocks of N threads a multiprocessor should hold: for 4 plain rows a block, as many as 64
// registers a thread allow (more blocks than the compiler's own choice, without spills).
template <class T, class F, int R, int N>
inline constexpr int kGemvMinBlocks = (std::is_same_v<F, DenseRows<T>> && R == 4)
                                          ? 8 * kGemvThreads / N
                                          : 1;

// R rows (R / 2 output pairs) a block of N threads (plain rows: 64, 128 or 256; GGML rows 128).
template <class T, class F, int R, bool kPrefetchRows = false, int N = kGemvThreads>
__global__ void __launch_bounds__(N, (kGemvMinBlocks<T, F, R, N>))
    gemv_kernel(GemvArgs a, int64_t row_bytes, int copy) {
  WICK_TL_START();
  // Only plain rows take end asks: their code would cost the GGML kernels of 8 rows registers,
  // and a block a multiprocessor.
  constexpr bool kDense = std::is_same_v<F, DenseRows<T>>;
  prefetch_cache_rows<T>(a);
  if (!kDense || a.l2_next_end_blocks == 0) prefetch_next_share(a, blockIdx.x, gridDim.x);
  const int64_t p0 = static_cast<int64_t>(blockIdx.x) * (R / 2);
  int64_t rows[R];
  const uint8_t* row_ptr[R];
  group_rows<R>(a, p0, rows);
  row_starts<R>(a, row_bytes, rows, row_ptr);
  Input<T> in{static_cast<const T*>(a.x), static_cast<const T*>(a.norm_weight)};
  float acc[R];
  if constexpr (kDense) {
    dot_rows<T, F, R, kPrefetchRows, N>(row_ptr, in, a.k, a.eps, acc);
  } else {
    dot_rows_staged<T, F, R>(row_ptr, in, a.k, a.eps, row_bytes, copy, acc);
  }
  finish_pairs<T, R>(a, p0, rows, acc);
  if (a.argmax != nullptr) post_argmax<T, R>(a, rows, acc);
  if (kDense && a.l2_next_end_blocks > 0) {
    const int64_t n = min(static_cast<int64_t>(a.l2_next_end_blocks), int64_t{gridDim.x});
    const int64_t i = static_cast<int64_t>(blockIdx.x) - (gridDim.x - n);
    if (i >= 0) prefetch_next_share(a, i, n);
  }
  WICK_TL_END(1u << 28 | static_cast<uint32_t>(a.epilogue) << 24 | static_cast<uint32_t>(a.k));
}

// GGML rows, streamed: a block quantizes its U units of x once (after the norm, when there is
// one), then takes the groups of kStreamRows rows blockIdx.x, blockIdx.x + gridDim.x, ... through
// two shared-memory stages, the next group's copy in flight while this one is dotted. One block
// per group did that work on x for every group.
constexpr int kStreamRows = 8;
constexpr int kStreamMaxUnits = 4;  // units of x a thread keeps: k up to 4 x 128 x 16
// Blocks a multiprocessor should hold (registers): 6 with 1 or 2 units of x a thread (80
// registers, no spills); with 4 the two stages of longer rows allow about 3 anyway.

template <class T, class F, int U>
__global__ void __launch_bounds__(kGemvThreads, U >= 4 ? 3 : 6)
    gemv_stream_kernel(GemvArgs a, int64_t row_bytes, int copy, int64_t groups) {
  constexpr int R = kStreamRows, P = R / 2;
  extern __shared__ __align__(16) uint8_t gemv_rows[];
  WICK_TL_START();
  prefetch_cache_rows<T>(a);
  const int64_t stride = staged_stride(row_bytes), units = a.k / F::V;
  // Group g's rows into stage `buf`.
  auto stage = [&](int64_t g, int buf) {
    int64_t rows[R];
    const uint8_t* src[R];
    group_rows<R>(a, g * P, rows);
    row_starts<R>(a, row_bytes, rows, src);
    stage_rows<R>(gemv_rows + buf * R * stride, src, row_bytes, stride, copy);
  };
  int64_t g = blockIdx.x;  // the grid has no more blocks than groups
  stage(g, 0);
  cp_async_commit();
  pdl_wait();
  WICK_TL_WAITED();
  Input<T> in{static_cast<const T*>(a.x), static_cast<const T*>(a.norm_weight)};
  if (in.nw != nullptr) in.find_rstd(a.k, a.eps);
  QUnit xq[U];
  quantize_inputs<T, F, U>(in, threadIdx.x, units, xq);
  for (int buf = 0; g < groups; g += gridDim.x, buf ^= 1) {
    const bool last = g + gridDim.x >= groups;
    if (!last) stage(g + gridDim.x, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();  // this group's rows have landed
    __syncthreads();     // ... every thread's copies
    const uint8_t* staged = gemv_rows + buf * R * stride;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = threadIdx.x + u * kGemvThreads;
      if (c < units) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += F::dot(F::load(staged + r * stride, c), xq[u]);
      }
    }
    if (last) pdl_launch_dependents();
    // Its barrier also keeps the next iteration's copy off this stage until every thread is done.
    block_totals<R>(acc);
    int64_t rows[R];
    group_rows<R>(a, g * P, rows);
    finish_pairs<T, R>(a, g * P, rows, acc);
  }
  WICK_TL_END(2u << 28 | static_cast<uint32_t>(a.epilogue) << 24 | static_cast<uint32_t>(a.k));
}

// ---- GGML rows in warp-owned pairs (gemv_pairs_kernel), for k a multiple of 2048 ----
// A unit is two GGML blocks (64 values) of a row. Lane l of a warp dots units l, l + 32, ... of
// the warp's two rows from their shared-memory copy with 32-bit loads: units 9 (Q4_0), 10 (Q4_1)
// or 17 (Q8_0) words apart put the lanes' words in different banks (Q4_1: two lanes a bank),
// where the 16-bit loads of half blocks above meet three to five lanes a bank. Each warp copies
// its own rows into shared memory and needs no block barrier after x is quantized.

// A block's 16 nibble bytes (values 0-15 in the low nibbles, 16-31 in the high ones) as the
// integers of its two half blocks, four to a word.
struct Nibbles {
  uint32_t lo[4], hi[4];
  __device__ explicit Nibbles(const uint32_t* q) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = q[i] & 0x0f0f0f0fu;
      hi[i] = (q[i] >> 4) & 0x0f0f0f0fu;
    }
  }
};

// A unit's words (the two blocks' scales and integers) dotted with x's four half blocks.
struct Q4_0Unit {
  static constexpr int kWords = 9;  // f16 d, 16 nibble bytes; twice
  __device__ static float block(const uint32_t (&q)[4], float d, const QUnit& xa, const QUnit& xb) {
    const Nibbles n(q);
    return (dot_q(n.lo, xa, -8 * xa.s) + dot_q(n.hi, xb, -8 * xb.s)) * (d * xa.d);
  }
  __device__ static float dot(const uint32_t (&w)[kWords], const QUnit (&x)[4]) {
    // The first block's integers start 2 bytes into word 0; the second's are word-aligned.
    const uint32_t q0[4] = {__byte_perm(w[0], w[1], 0x5432), __byte_perm(w[1], w[2], 0x5432),
                            __byte_perm(w[2], w[3], 0x5432), __byte_perm(w[3], w[4], 0x5432)};
    const uint32_t q1[4] = {w[5], w[6], w[7], w[8]};
    return block(q0, f16_bits(static_cast<uint16_t>(w[0])), x[0], x[1]) +
           block(q1, f16_bits(static_cast<uint16_t>(w[4] >> 16)), x[2], x[3]);
  }
};

struct Q4_1Unit {
  static constexpr int kWords = 10;  // f16 d, f16 m, 16 nibble bytes; twice
  __device__ static float block(const uint32_t* w, const QUnit& xa, const QUnit& xb) {
    const Nibbles n(w + 1);
    const float v =
        (dot_q(n.lo, xa, 0) + dot_q(n.hi, xb, 0)) * (f16_bits(static_cast<uint16_t>(w[0])) * xa.d);
    return fmaf(f16_bits(static_cast<uint16_t>(w[0] >> 16)), xa.d * (xa.s + xb.s), v);
  }
  __device__ static float dot(const uint32_t (&w)[kWords], const QUnit (&x)[4]) {
    return block(w, x[0], x[1]) + block(w + 5, x[2], x[3]);
  }
};

struct Q8_0Unit {
  static constexpr int kWords = 17;  // f16 d, 32 int8; twice
  __device__ static float dot(const uint32_t (&w)[kWords], const QUnit (&x)[4]) {
    uint32_t q0[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q0[i] = __byte_perm(w[i], w[i + 1], 0x5432);
    const uint32_t a0[4] = {q0[0], q0[1], q0[2], q0[3]}, b0[4] = {q0[4], q0[5], q0[6], q0[7]};
    const uint32_t a1[4] = {w[9], w[10], w[11], w[12]}, b1[4] = {w[13], w[14], w[15], w[16]};
    return (dot_q(a0, x[0], 0) + dot_q(b0, x[1], 0)) *
               (f16_bits(static_cast<uint16_t>(w[0])) * x[0].d) +
           (dot_q(a1, x[2], 0) + dot_q(b1, x[3], 0)) *
               (f16_bits(static_cast<uint16_t>(w[8] >> 16)) * x[2].d);
  }
};

constexpr int kPairsWarps = kGemvThreads / 32;
// x quantized in shared memory, a unit's four half blocks (hi and lo words, 128 bytes, then
// their sums and scales) 176 bytes apart: the 16-byte loads of 8 consecutive units meet
// different banks.
constexpr int kXUnitBytes = 176;

__device__ __forceinline__ void store_x_half(uint8_t* xs, int64_t half, const QUnit& q) {
  uint8_t* u = xs + (half / 4) * kXUnitBytes;
  const int j = static_cast<int>(half % 4);
  *reinterpret_cast<uint4*>(u + 32 * j) = make_uint4(q.hi[0], q.hi[1], q.hi[2], q.hi[3]);
  *reinterpret_cast<uint4*>(u + 32 * j + 16) = make_uint4(q.lo[0], q.lo[1], q.lo[2], q.lo[3]);
  reinterpret_cast<float*>(u + 128)[j] = q.s;
  reinterpret_cast<float*>(u + 144)[j] = q.d;
}

__device__ __forceinline__ void load_x_unit(const uint8_t* xs, int64_t unit, QUnit (&x)[4]) {
  const uint8_t* u = xs + unit * kXUnitBytes;
  const float4 s = *reinterpret_cast<const float4*>(u + 128);
  const float4 d = *reinterpret_cast<const float4*>(u + 144);
  const float ss[4] = {s.x, s.y, s.z, s.w}, dd[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint4 hi = *reinterpret_cast<const uint4*>(u + 32 * j);
    const uint4 lo = *reinterpret_cast<const uint4*>(u + 32 * j + 16);
    x[j] = QUnit{{hi.x, hi.y, hi.z, hi.w}, {lo.x, lo.y, lo.z, lo.w}, ss[j], dd[j]};
  }
}

// x quantized into shared memory by the whole block (the one block barrier), as the CPU's
// qmatmul takes it, normalised first when the projection takes a norm. With k = 2048 each thread
// quantizes one half block: it keeps its 16 values from the sum of squares to the quantization
// (one read of x, not two) and loads its norm weights, as floats, before pdl_wait (they are
// weights).
template <class T, bool kOneUnit>
__device__ __forceinline__ void quantize_x_to_shared(const GemvArgs& a, uint8_t* xs) {
  const T* x = static_cast<const T*>(a.x);
  const T* nw = static_cast<const T*>(a.norm_weight);
  const int64_t halves = a.k / 16;  // a multiple of the block's threads
  if constexpr (kOneUnit) {
    float v[16], w[16];
    if (nw != nullptr) load_run<T, 16>(nw + 16 * threadIdx.x, w);
    pdl_wait();
    WICK_TL_WAITED();
    load_run<T, 16>(x + 16 * threadIdx.x, v);
    if (nw != nullptr) {
      float sq[1] = {0};
#pragma unroll
      for (int e = 0; e < 16; ++e) sq[0] += v[e] * v[e];
      block_totals<1>(sq);
      const float rstd = rsqrtf(sq[0] / static_cast<float>(a.k) + static_cast<float>(a.eps));
#pragma unroll
      for (int e = 0; e < 16; ++e) v[e] = rms_normed<T>(v[e], w[e], rstd);
    }
    store_x_half(xs, threadIdx.x, quantize_unit(v));
  } else {
    // A thread's halves of x are loaded ROUNDS at a time before any is used: one round trip to
    // the L2 for them, not one a half (k = 8192, bf16: four halves a thread, one load round).
    constexpr int PIECES = 16 * sizeof(T) / 16;  // 16-byte loads a half
    constexpr int ROUNDS = 8 / PIECES;           // 8 loads in flight: 32 registers
    pdl_wait();
    WICK_TL_WAITED();
    Input<T> in{x, nw};
    if (nw != nullptr) in.find_rstd(a.k, a.eps);
    // Every thread runs every round (halves is a multiple of the block's threads): the
    // quantization's shuffle needs the whole warp.
    for (int64_t h0 = threadIdx.x; h0 < halves; h0 += ROUNDS * kGemvThreads) {
      uint4 raw[ROUNDS][PIECES];
#pragma unroll
      for (int r = 0; r < ROUNDS; ++r) {
        const int64_t h = h0 + r * kGemvThreads;
#pragma unroll
        for (int i = 0; i < PIECES; ++i) {
          raw[r][i] = h < halves ? __ldg(reinterpret_cast<const uint4*>(x + 16 * h) + i)
                                 : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int r = 0; r < ROUNDS; ++r) {
        const int64_t h = h0 + r * kGemvThreads;
        if (h >= halves) break;  // the same for the whole block
        float v[16];
#pragma unroll
        for (int i = 0; i < PIECES; ++i) unpack16<T>(raw[r][i], v + i * 16 / PIECES);
        if (nw != nullptr) {
          float w[16];
          load_run<T, 16>(nw + 16 * h, w);
#pragma unroll
          for (int e = 0; e < 16; ++e) v[e] = rms_normed<T>(v[e], w[e], in.rstd);
        }
        store_x_half(xs, h, quantize_unit(v));
      }
    }
  }
  __syncthreads();
}

// Warp w of the grid takes pairs of rows w, w + warps, ... (an item each), copying the next
// item's rows as soon as it has read this one's: one item in flight a warp leaves room for more
// warps a multiprocessor than a deeper ring would. With k = 2048 a lane's one unit of x stays in
// registers.
template <class T, class F, bool kOneUnit>
__global__ void __launch_bounds__(kGemvThreads, 6)
    gemv_pairs_kernel(GemvArgs a, int64_t row_bytes, int64_t items) {
  extern __shared__ __align__(16) uint8_t gemv_rows[];
  WICK_TL_START();
  prefetch_cache_rows<T>(a);
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  uint8_t* staged = gemv_rows + warp * 2 * row_bytes;
  uint8_t* xs = gemv_rows + kPairsWarps * 2 * row_bytes;
  const int64_t warps = int64_t{gridDim.x} * kPairsWarps;
  int64_t item = int64_t{blockIdx.x} * kPairsWarps + warp;
  auto stage = [&](int64_t it) {  // item it's two rows into the warp's shared memory
    if (it >= items) return;
    int64_t rows[2];
    const uint8_t* src[2];
    group_rows<2>(a, it, rows);
    row_starts<2>(a, row_bytes, rows, src);
    for (int64_t i = lane * 16; i < row_bytes; i += 32 * 16) {
      cp_async<16>(staged + i, src[0] + i);
      cp_async<16>(staged + row_bytes + i, src[1] + i);
    }
    cp_async_commit();
  };
  stage(item);
  // The grid is one wave: the kernel after it may take the multiprocessors' spare room now and
  // load its first weights while this one streams.
  pdl_launch_dependents();
  quantize_x_to_shared<T, kOneUnit>(a, xs);
  const int64_t units = a.k / 64;
  QUnit x_own[4];
  if constexpr (kOneUnit) load_x_unit(xs, lane, x_own);
  for (; item < items; item += warps) {
    cp_async_wait<0>();
    __syncwarp();  // every lane's copies have landed
    float acc[2] = {0, 0};
    for (int64_t u = lane; u < units; u += 32) {
      QUnit xu[4];
      if constexpr (kOneUnit) {
#pragma unroll
        for (int j = 0; j < 4; ++j) xu[j] = x_own[j];
      } else {
        load_x_unit(xs, u, xu);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t* src =
            reinterpret_cast<const uint32_t*>(staged + r * row_bytes) + u * F::kWords;
        uint32_t w[F::kWords];
#pragma unroll
        for (int i = 0; i < F::kWords; ++i) w[i] = src[i];
        acc[r] += F::dot(w, xu);
      }
    }
    __syncwarp();  // every lane is done with the rows before the next item's replace them
    stage(item + warps);
    acc[0] = warp_total(acc[0]);
    acc[1] = warp_total(acc[1]);
    if (lane == 0) {
      int64_t r0, r1;
      pair_rows(a, item, r0, r1);
      epilogue<T>(a, item, r0, r1, acc[0], acc[1]);
    }
  }
#ifdef WICK_DEVICE_TIMELINE
  __syncthreads();  // the block's end is its last warp's
#endif
  WICK_TL_END(6u << 28 | static_cast<uint32_t>(a.epilogue) << 24 | static_cast<uint32_t>(a.k));
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

// Rows a block: fewer, longer-lived blocks for many rows (launching a block costs about as much
// as reading a few kilobytes): 4 plain rows (a single wave of blocks for Llama's qkv), or 8 rows
// of blocks (their copies in shared memory hold no registers) where there are 2,048 rows or more;
// else 2. WICK_GEMV_ROWS forces 2, 4 or 8 where shared memory allows.
int rows_per_block(const GemvArgs& a, int64_t row_bytes) {
  const bool dense = a.weights == GemvWeights::Dense;
  const int forced = config().gemv_rows;
  if (forced > 0 && (dense || forced * staged_stride(row_bytes) <= kMaxStagedBytes)) return forced;
  if (dense) return 4;
  return a.n >= 2048 && 8 * staged_stride(row_bytes) <= kMaxStagedBytes ? 8 : 2;
}

// Threads a block of 4 plain rows. Projections of up to 16 MB (Llama-1B's qkv and o) run as one
// wave of 128-thread blocks; larger ones fill the multiprocessors' registers in as few waves as
// they can: one of 256-thread blocks (Llama-1B's down), else two of 64 (gate/up), else 128 (the
// output head). WICK_GEMV_THREADS forces 64, 128 or 256.
constexpr int64_t kOneWaveBytes = int64_t{16} << 20;

int dense_threads(const GemvArgs& a, int64_t row_bytes) {
  if (config().gemv_threads > 0) return config().gemv_threads;
  if (a.n * row_bytes <= kOneWaveBytes) return kGemvThreads;
  const int64_t blocks = a.n / 4, sms = sm_count();
  if (blocks <= 4 * sms && row_bytes / 16 >= 256) return 256;
  return blocks <= 32 * sms ? 64 : kGemvThreads;
}

template <class T, int N>
void launch_dense(const GemvArgs& a, int64_t row_bytes, dim3 grid, int carveout, cudaStream_t s) {
  auto kernel = gemv_kernel<T, DenseRows<T>, 4, false, N>;
  if constexpr (N == kGemvThreads) {  // the blocks of the one-wave projections that ask for it
    if (a.prefetch_rows) kernel = gemv_kernel<T, DenseRows<T>, 4, true, N>;
  }
  launch_pdl_carveout(carveout, kernel, grid, N, 0, s, a, row_bytes, 0);
}

template <class T, int R>
void launch_rows(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((a.n / 2 + R / 2 - 1) / (R / 2)));
  const int copy = staged_copy_bytes(a.w, row_bytes);
  const size_t smem = static_cast<size_t>(R * staged_stride(row_bytes));
  switch (a.weights) {
    case GemvWeights::Dense: {
      // Small projections are latency-bound: they take the attention kernel's split of L1 and
      // shared memory (kernel_utils.cuh); large ones keep the L1 that their loads fill.
      const int carveout = a.n * row_bytes <= kLatencyBoundBytes ? kCarveoutMaxShared : -1;
      if constexpr (R == 4) {  // the blocks' rows that plain weights take unless forced
        switch (dense_threads(a, row_bytes)) {
          case 64:
            return launch_dense<T, 64>(a, row_bytes, grid, carveout, s);
          case 256:
            return launch_dense<T, 256>(a, row_bytes, grid, carveout, s);
          default:
            return launch_dense<T, kGemvThreads>(a, row_bytes, grid, carveout, s);
        }
      }
      launch_pdl_carveout(carveout, gemv_kernel<T, DenseRows<T>, R>, grid, kGemvThreads, 0, s, a,
                          row_bytes, 0);
      break;
    }
    case GemvWeights::Q4_0:
      launch_pdl(gemv_kernel<T, Q4Rows<false>, R>, grid, kGemvThreads, smem, s, a, row_bytes, copy);
      break;
    case GemvWeights::Q4_1:
      launch_pdl(gemv_kernel<T, Q4Rows<true>, R>, grid, kGemvThreads, smem, s, a, row_bytes, copy);
      break;
    case GemvWeights::Q8_0:
      launch_pdl(gemv_kernel<T, Q8Rows, R>, grid, kGemvThreads, smem, s, a, row_bytes, copy);
      break;
  }
}

// Units of x a thread of gemv_stream_kernel keeps (1, 2 or 4); 0 when k is too long for it.
int stream_units(const GemvArgs& a) {
  const int64_t per_thread = (a.k / 16 + kGemvThreads - 1) / kGemvThreads;
  if (per_thread > kStreamMaxUnits) return 0;
  return per_thread <= 1 ? 1 : per_thread <= 2 ? 2 : 4;
}

// Blocks of kGemvThreads threads that a multiprocessor holds of `kernel` with `smem` bytes of
// dynamic shared memory (1 when the query fails), asked once per kernel and size: a model's
// projections share a few sizes.
int blocks_per_sm(const void* kernel, size_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, size_t>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, added] = known.try_emplace({kernel, smem}, 0);
  if (added && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&it->second, kernel, kGemvThreads,
                                                             smem) != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the launch check
    it->second = 1;
  }
  return std::max(it->second, 1);
}

template <class T, class F, int U>
void launch_stream(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  auto kernel = gemv_stream_kernel<T, F, U>;
  const size_t smem = static_cast<size_t>(2 * kStreamRows * staged_stride(row_bytes));
  if (smem > static_cast<size_t>(kMaxStagedBytes)) {
    WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem)));
  }
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), smem);
  const int64_t groups = (a.n / 2 + kStreamRows / 2 - 1) / (kStreamRows / 2);
  const int64_t blocks = std::min<int64_t>(groups, int64_t{per_sm} * sm_count());
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), kGemvThreads, smem, s, a, row_bytes,
             staged_copy_bytes(a.w, row_bytes), groups);
}

template <class T, class F>
void launch_stream_units(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  switch (stream_units(a)) {
    case 1:
      return launch_stream<T, F, 1>(a, row_bytes, s);
    case 2:
      return launch_stream<T, F, 2>(a, row_bytes, s);
    default:
      return launch_stream<T, F, 4>(a, row_bytes, s);
  }
}

// Whether gemv_pairs_kernel takes the projection: k a multiple of 2048 (every lane has whole
// units, x's halves a multiple of the block's threads), rows that cp.async copies 16 bytes at a
// time, and a block's shared memory within the opt-in limit, less room for its static shared
// memory (block_totals' sums; the timeline's records).
constexpr int64_t kPairsK = 2048;

size_t pairs_smem(int64_t row_bytes, int64_t k) {
  return static_cast<size_t>(kPairsWarps * 2 * row_bytes + k / 64 * kXUnitBytes);
}

size_t pairs_max_smem() {
  return shared_per_block_optin() - 1024;
}

bool pairs_fit(const GemvArgs& a, int64_t row_bytes) {
  return config().gemv_pairs && config().gemv_rows == 0 && a.k % kPairsK == 0 && aligned(a.w, 16) &&
         row_bytes % 16 == 0 && pairs_smem(row_bytes, a.k) <= pairs_max_smem();
}

// As many blocks as a multiprocessor holds with the shared memory.
template <class T, class F, bool kOneUnit>
void launch_pairs(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  auto kernel = gemv_pairs_kernel<T, F, kOneUnit>;
  static std::once_flag attribute;
  std::call_once(attribute, [&] {
    WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(pairs_max_smem())));
  });
  const size_t smem = pairs_smem(row_bytes, a.k);
  const int per_sm = blocks_per_sm(reinterpret_cast<const void*>(kernel), smem);
  const int64_t items = a.n / 2;
  const int64_t blocks =
      std::min((items + kPairsWarps - 1) / kPairsWarps, int64_t{per_sm} * sm_count());
  launch_pdl(kernel, dim3(static_cast<unsigned>(blocks)), kGemvThreads, smem, s, a, row_bytes,
             items);
}

template <class T, class F>
void launch_pairs_units(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  if (a.k == kPairsK) return launch_pairs<T, F, true>(a, row_bytes, s);
  launch_pairs<T, F, false>(a, row_bytes, s);
}

template <class T>
void launch_typed(const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  // GGML rows stream through fewer blocks when there are four groups of rows or more per
  // multiprocessor (fewer would leave each block one group, in fewer blocks than one group of 2
  // rows each), unless WICK_GEMV_STREAM=0, rows a block are forced, or k is too long to keep x in
  // registers.
  if (a.weights != GemvWeights::Dense && pairs_fit(a, row_bytes)) {
    switch (a.weights) {
      case GemvWeights::Q4_0:
        return launch_pairs_units<T, Q4_0Unit>(a, row_bytes, s);
      case GemvWeights::Q4_1:
        return launch_pairs_units<T, Q4_1Unit>(a, row_bytes, s);
      default:
        return launch_pairs_units<T, Q8_0Unit>(a, row_bytes, s);
    }
  }
  if (a.weights != GemvWeights::Dense && config().gemv_stream && config().gemv_rows == 0 &&
      a.n / kStreamRows >= 4 * int64_t{sm_count()} && stream_units(a) > 0) {
    switch (a.weights) {
      case GemvWeights::Q4_0:
        return launch_stream_units<T, Q4Rows<false>>(a, row_bytes, s);
      case GemvWeights::Q4_1:
        return launch_stream_units<T, Q4Rows<true>>(a, row_bytes, s);
      default:
        return launch_stream_units<T, Q8Rows>(a, row_bytes, s);
    }
  }
  switch (rows_per_block(a, row_bytes)) {
    case 8:
      launch_rows<T, 8>(a, row_bytes, s);
      break;
    case 4:
      launch_rows<T, 4>(a, row_bytes, s);
      break;
    default:
      launch_rows<T, 2>(a, row_bytes, s);
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
  if (a.argmax != nullptr &&
      (a.epilogue != GemvEpilogue::Store || a.weights != GemvWeights::Dense || a.n > INT32_MAX)) {
    return false;
  }
  if (a.epilogue == GemvEpilogue::QkvRope) {
    return a.d > 0 && a.d % 2 == 0 && a.n == (a.h + 2 * a.h_kv) * a.d;
  }
  return a.epilogue != GemvEpilogue::Add || a.residual != nullptr;
}

void launch_l2_aside(const void* base, int64_t bytes, int64_t half, cudaStream_t s) {
  GemvArgs a{};
  a.l2_next = base;
  a.l2_next_bytes = bytes;
  a.l2_next_half = half;
  l2_aside_kernel<<<kL2AsideBlocks, 32, 0, s>>>(a);
  WICK_CUDA_CHECK_LAUNCH();
}

void launch_gemv(DType dtype, const GemvArgs& a, cudaStream_t s) {
#ifdef WICK_DEVICE_TIMELINE
  timeline::write_at_exit();
#endif
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
  if (a.argmax != nullptr) {
    launch_pdl(argmax_pick_kernel, dim3(1), dim3(kArgmaxSlots), 0, s, a.argmax,
               config().pdl_step_ends);
  }
}

#ifdef WICK_DEVICE_TIMELINE
namespace timeline {
std::vector<Record> take_attention();
std::vector<Record> take_decoder_ops();

void write_at_exit() {
  static const bool registered = [] {
    if (std::getenv("WICK_DEVICE_TIMELINE_OUT") == nullptr) return false;
    std::atexit([] {
      cudaDeviceSynchronize();
      FILE* f = std::fopen(std::getenv("WICK_DEVICE_TIMELINE_OUT"), "w");
      if (f == nullptr) return;
      using Take = std::vector<Record> (*)();
      for (Take take : {Take{take_decode_gemv}, Take{take_attention}, Take{take_decoder_ops}}) {
        for (const Record& r : take()) {
          std::fprintf(f, "%u %u %u %u %llu %llu %llu\n", r.tag, r.block, r.sm, r.seq,
                       static_cast<unsigned long long>(r.start),
                       static_cast<unsigned long long>(r.waited),
                       static_cast<unsigned long long>(r.end));
        }
      }
      std::fclose(f);
    });
    return true;
  }();
  (void)registered;
}
}  // namespace timeline
#endif

}  // namespace wick::cuda
