#pragma once
// Device pieces of the decode projections (decode_gemv*.cu): the weight formats (plain rows here,
// GGML rows in decode_gemv_ggml_rows.cuh), the input (x, or its RMSNorm as transformers computes
// it in the dtype), the block's dot of its rows and the epilogues (store, qkv + rope + cache write,
// SiLU product, residual add), with the L2 requests the step's kernels make. Each includer expands
// WICK_TIMELINE_TU first.

#include <algorithm>

#include "cuda/decode_gemv.h"
#include "cuda/decode_gemv_ggml_rows.cuh"
#include "cuda/decode_gemv_launch.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "ops/norm_math.h"
#include "ops/rope_math.h"

namespace wick::cuda::gemv {

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
// are (plain weights) or quantized (GGML blocks: QUnit, decode_gemv_ggml_rows.cuh).

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
  const T* nw;        // null: x as it is (unless nw32)
  const float* nw32;  // an f32 weight of f16/bf16 x: round(nw32 * (x * rstd)), one rounding
  float rstd = 1;

  __device__ bool normed() const { return nw != nullptr || nw32 != nullptr; }

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
    rstd = ops::norm_rstd(t[0], static_cast<float>(k), static_cast<float>(eps));
  }
};

// GemvArgs' input: x and its norm weight of the dtype, or of f32 (GemvArgs::norm_f32).
template <class T>
__device__ __forceinline__ Input<T> input_of(const GemvArgs& a) {
  const void* nw = a.norm_weight;
  return Input<T>{static_cast<const T*>(a.x), a.norm_f32 ? nullptr : static_cast<const T*>(nw),
                  a.norm_f32 ? static_cast<const float*>(nw) : nullptr};
}

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
      } else if (in.nw32 != nullptr) {
        float w[RUN];
        load_run<float, RUN>(in.nw32 + F::x_start(c, run), w);
#pragma unroll
        for (int e = 0; e < RUN; ++e) out[e] = round_to<T>(w[e] * (out[e] * in.rstd));
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
  if (in.normed()) in.template find_rstd<N>(k, eps);
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
  if (in.normed()) in.find_rstd(k, eps);
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
    const ops::RopePair e = ops::rope_pair(p % half, half, a.rot_half);
    r0 = (p / half) * a.d + e.lo;
    r1 = (p / half) * a.d + e.hi;
  } else if (a.epilogue == GemvEpilogue::SiluMul || a.epilogue == GemvEpilogue::GeluMul) {
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
    const ops::RopePair e = ops::rope_pair(i, half, a.rot_half);
    const int64_t pos = static_cast<int64_t>(*a.position);
    // The cache row: the position's in (h_kv, max_len, d) caches, or the slot's in pools of
    // pages (pages, h_kv, max_len, d) whose pages are max_len rows long.
    int64_t row = pos, page = 0;
    if (a.slot != nullptr) {
      row = static_cast<int64_t>(*a.slot) % a.max_len;
      page = static_cast<int64_t>(*a.slot) / a.max_len;
    } else if (pos >= a.max_len) {
      return;
    }
    if (head < a.h + a.h_kv && e.rotates) {
      // Each product rounded, then the sum: transformers' q * cos + rotate_half(q) * sin in the
      // model's dtype (f32: plain products).
      float c = to_compute(static_cast<const T*>(a.cos)[pos * a.rot_half + i]);
      float s = to_compute(static_cast<const T*>(a.sin)[pos * a.rot_half + i]);
      float x1 = round_to<T>(__fmul_rn(a0, c)) - round_to<T>(__fmul_rn(a1, s));
      float x2 = round_to<T>(__fmul_rn(a1, c)) + round_to<T>(__fmul_rn(a0, s));
      a0 = x1;
      a1 = x2;
    }
    T* dst;
    if (head < a.h) {
      dst = static_cast<T*>(a.q) + head * a.d;
    } else if (head < a.h + a.h_kv) {
      dst = static_cast<T*>(a.k_cache) + (((page * a.h_kv) + head - a.h) * a.max_len + row) * a.d;
    } else {
      dst = static_cast<T*>(a.v_cache) +
            (((page * a.h_kv) + head - a.h - a.h_kv) * a.max_len + row) * a.d;
    }
    dst[e.lo] = convert<T>(a0);
    dst[e.hi] = convert<T>(a1);
  } else if (a.epilogue == GemvEpilogue::Store) {
    static_cast<T*>(a.out)[r0] = convert<T>(a0);
    static_cast<T*>(a.out)[r1] = convert<T>(a1);
  } else if (a.epilogue == GemvEpilogue::SiluMul) {
    // silu rounded, then the product: transformers' act_fn(gate) * up in the dtype.
    static_cast<T*>(a.out)[p] = convert<T>(round_to<T>(a0 / (1.0f + expf(-a0))) * a1);
  } else if (a.epilogue == GemvEpilogue::GeluMul) {
    // gelu rounded, then the product, as gelu (the tanh approximation of wick/unary_ops.def)
    // then mul compute it in the dtype.
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const float g = 0.5f * a0 * (1.0f + tanhf(k * a0 * (1.0f + 0.044715f * a0 * a0)));
    static_cast<T*>(a.out)[p] = convert<T>(round_to<T>(g) * a1);
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
  if (a.epilogue != GemvEpilogue::QkvRope || a.slot != nullptr || threadIdx.x != 0) return;
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

}  // namespace wick::cuda::gemv
