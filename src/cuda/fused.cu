// layer_norm, rms_norm and softmax_last_dim row kernels (rope: rope.cu; the bulk-copy softmax:
// softmax_bulk.cu). Rows: a warp per row up to 1024 columns; above, when rows are 16-byte aligned:
// f16/bf16 softmax over rows of 4-16 KB, two rows a multiprocessor and more (up to 8 KB: fewer than
// ~3 waves of the warp kernel), takes the bulk-copy kernel (persistent groups of warps stream rows
// through shared memory with 1-D bulk copies: rows in flight bound by shared memory, not registers,
// and one wave, no tail wave); other softmax rows up to 512 vectors (4096 bf16/f16, 2048 f32) take
// a warp per row held in registers (16-byte vectors, one read and one write of each element,
// shuffles only), the norms and longer rows a block per row in registers (one block reduction);
// else a block per row up to 8192 in registers, a looping block above. Statistics in f32 (f64 for
// f64). The norms optionally add a residual to their rounded output (nn::add_rms_normed), so the
// fused op sums in the order the plain norm does and keeps its bits.

#include "cuda/fused_kernels.h"
#include "cuda/kernel_utils.cuh"
#include "cuda/row_math.cuh"
#include "cuda/softmax_bulk.h"
#include "cuda_config.h"
#include "ops/norm_math.h"

namespace wick::cuda {
namespace {

using namespace row_math;

constexpr int kWarpPerLane = 32;  // a warp keeps rows up to 1024 in registers

// A norm's output element o plus the residual element res (nn::add_rms_normed): an add of its own,
// rounded once, as x.add(rms_norm(...)) leaves it (never contracted with the norm's product).
template <class T>
__device__ __forceinline__ T plus_residual(T o, T res) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<C, double>) {
    return convert<T>(__dadd_rn(to_compute(res), to_compute(o)));
  } else {
    return convert<T>(__fadd_rn(to_compute(res), to_compute(o)));
  }
}

// The output element i of a norm: r rounded to T, plus res[i] where a residual is given.
template <class T>
__device__ __forceinline__ T norm_out(compute_t<T> r, const T* res, uint64_t i) {
  const T o = convert<T>(r);
  return res == nullptr ? o : plus_residual(o, res[i]);
}

// The same for a 16-byte vector of outputs: plus vector vi of the residual row res.
template <class T, class V>
__device__ __forceinline__ void add_residual(V& o, const T* res, unsigned vi) {
  const V r = reinterpret_cast<const V*>(res)[vi];
#pragma unroll
  for (int e = 0; e < static_cast<int>(sizeof(V) / sizeof(T)); ++e) {
    o.v[e] = plus_residual(o.v[e], r.v[e]);
  }
}

/// A warp per row of up to 1024 elements.
template <class T, bool kRms>
__global__ void __launch_bounds__(kBlock)
    norm_warp_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                     const T* __restrict__ res, T* __restrict__ y, uint64_t rows, unsigned cols,
                     compute_t<T> eps) {
  using C = compute_t<T>;
  unsigned lane = threadIdx.x % 32;
  uint64_t w0 = global_tid() / 32, nw = grid_stride() / 32;
  for (uint64_t row = w0; row < rows; row += nw) {
    const T* xr = x + row * cols;
    C v[kWarpPerLane];
    C sum = 0;
#pragma unroll
    for (int j = 0; j < kWarpPerLane; ++j) {
      unsigned c = lane + 32 * j;
      v[j] = c < cols ? to_compute(xr[c]) : C(0);
      sum += v[j];
    }
    C mean = kRms ? C(0) : warp_sum(sum) / C(cols);
    C sq = 0;
#pragma unroll
    for (int j = 0; j < kWarpPerLane; ++j) {
      if (lane + 32 * j < cols) {
        C dv = v[j] - mean;
        sq += dv * dv;
      }
    }
    C rstd = ops::norm_rstd(warp_sum(sq), C(cols), eps);
    T* yr = y + row * cols;
#pragma unroll
    for (int j = 0; j < kWarpPerLane; ++j) {
      unsigned c = lane + 32 * j;
      if (c < cols) {
        C o = norm_value<T, kRms>(v[j], mean, rstd, to_compute(w[c]));
        if (!kRms && b != nullptr) o += to_compute(b[c]);
        yr[c] = norm_out<T>(o, res, row * cols + c);
      }
    }
  }
}

constexpr int kNormPerThread = 32;  // a block keeps rows up to 8192 in registers

/// A block per row of up to 8192 elements, in registers, 16-byte vectors when `vec`.
template <class T, bool kRms>
__global__ void __launch_bounds__(kBlock)
    norm_block_reg_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                          const T* __restrict__ res, T* __restrict__ y, uint64_t rows,
                          unsigned cols, compute_t<T> eps, bool vec) {
  using C = compute_t<T>;
  constexpr int N = 16 / sizeof(T);
  constexpr int V = kNormPerThread / N;
  __shared__ C scratch[kBlock / 32];
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    C v[V][N];
    C sum = 0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      unsigned c0 = (j * kBlock + threadIdx.x) * N;
      if (vec && c0 < cols) {
        Vec<T, N> t = *reinterpret_cast<const Vec<T, N>*>(xr + c0);
#pragma unroll
        for (int e = 0; e < N; ++e) v[j][e] = to_compute(t.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) v[j][e] = c0 + e < cols ? to_compute(xr[c0 + e]) : C(0);
      }
#pragma unroll
      for (int e = 0; e < N; ++e) sum += v[j][e];
    }
    C mean = kRms ? C(0) : block_sum(sum, scratch) / C(cols);
    C sq = 0;
#pragma unroll
    for (int j = 0; j < V; ++j) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if ((j * kBlock + threadIdx.x) * N + e < cols) {
          C dv = v[j][e] - mean;
          sq += dv * dv;
        }
      }
    }
    C rstd = ops::norm_rstd(block_sum(sq, scratch), C(cols), eps);
    T* yr = y + row * cols;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      unsigned c0 = (j * kBlock + threadIdx.x) * N;
      if (c0 >= cols) continue;
      if (vec) {
        Vec<T, N> wt = *reinterpret_cast<const Vec<T, N>*>(w + c0);
        Vec<T, N> bt{};
        if (!kRms && b != nullptr) bt = *reinterpret_cast<const Vec<T, N>*>(b + c0);
        Vec<T, N> o;
#pragma unroll
        for (int e = 0; e < N; ++e) {
          C r = norm_value<T, kRms>(v[j][e], mean, rstd, to_compute(wt.v[e]));
          if (!kRms && b != nullptr) r += to_compute(bt.v[e]);
          o.v[e] = convert<T>(r);
        }
        if (res != nullptr) add_residual<T>(o, res + row * cols, c0 / N);
        *reinterpret_cast<Vec<T, N>*>(yr + c0) = o;
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) {
          unsigned c = c0 + e;
          if (c < cols) {
            C r = norm_value<T, kRms>(v[j][e], mean, rstd, to_compute(w[c]));
            if (!kRms && b != nullptr) r += to_compute(b[c]);
            yr[c] = norm_out<T>(r, res, row * cols + c);
          }
        }
      }
    }
  }
}

/// A block per row longer than 8192: the row is read three times (mean, variance, write).
template <class T, bool kRms>
__global__ void __launch_bounds__(kBlock)
    norm_block_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                      const T* __restrict__ res, T* __restrict__ y, uint64_t rows, uint64_t cols,
                      compute_t<T> eps) {
  using C = compute_t<T>;
  __shared__ C scratch[kBlock / 32];
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    C mean = 0;
    if (!kRms) {
      C sum = 0;
      for (uint64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += to_compute(xr[c]);
      mean = block_sum(sum, scratch) / C(cols);
    }
    C sq = 0;
    for (uint64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      C dv = to_compute(xr[c]) - mean;
      sq += dv * dv;
    }
    C rstd = ops::norm_rstd(block_sum(sq, scratch), C(cols), eps);
    T* yr = y + row * cols;
    for (uint64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      C r = norm_value<T, kRms>(to_compute(xr[c]), mean, rstd, to_compute(w[c]));
      if (!kRms && b != nullptr) r += to_compute(b[c]);
      yr[c] = norm_out<T>(r, res, row * cols + c);
    }
  }
}

/// rms_norm of f16/bf16 rows by an f32 weight (Gemma's 1 + w): a block per row, all in f32, the
/// output rounded once.
template <class T>
__global__ void __launch_bounds__(kBlock)
    rms_norm_f32_weight_kernel(const T* __restrict__ x, const float* __restrict__ w,
                               const T* __restrict__ res, T* __restrict__ y, uint64_t rows,
                               uint64_t cols, float eps) {
  __shared__ float scratch[kBlock / 32];
  // Launched programmatically, as row_vec_kernel: the next kernel loads its weights meanwhile.
  pdl_wait();
  pdl_launch_dependents();
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    float sq = 0;
    for (uint64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = to_compute(xr[c]);
      sq += v * v;
    }
    const float rstd = ops::norm_rstd(block_sum(sq, scratch), static_cast<float>(cols), eps);
    T* yr = y + row * cols;
    for (uint64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      yr[c] = norm_out<T>(norm_value<float, true>(to_compute(xr[c]), 0.0f, rstd, w[c]), res,
                          row * cols + c);
    }
  }
}

/// The same for f16/bf16 rows of one 16-byte vector (8 elements) a thread, up to kBlock vectors,
/// 16-byte aligned: the weight is loaded before pdl_wait (it is a weight), x and the residual
/// together after it, so that the kernel waits on one round trip; the same bits as the kernel above
/// but for the sum's order.
template <class T>
__global__ void __launch_bounds__(kBlock)
    rms_norm_f32_weight_vec_kernel(const T* __restrict__ x, const float* __restrict__ w,
                                   const T* __restrict__ res, T* __restrict__ y, uint64_t rows,
                                   unsigned cols, float eps) {
  static_assert(sizeof(T) == 2, "a vector of 8 elements, two float4 of weights");
  constexpr int N = 8;
  __shared__ float scratch[kBlock / 32];
  const unsigned vi = threadIdx.x, c0 = vi * N;
  const bool mine = c0 < cols;
  float wv[N];
  if (mine) {
    const float4 w0 = reinterpret_cast<const float4*>(w + c0)[0];
    const float4 w1 = reinterpret_cast<const float4*>(w + c0)[1];
    const float ws[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int e = 0; e < N; ++e) wv[e] = ws[e];
  }
  pdl_wait();
  pdl_launch_dependents();
  for (uint64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    Vec<T, N> xv{}, rv{};
    if (mine) {
      xv = reinterpret_cast<const Vec<T, N>*>(x + row * cols)[vi];
      if (res != nullptr) rv = reinterpret_cast<const Vec<T, N>*>(res + row * cols)[vi];
    }
    float v[N], sq = 0;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      v[e] = to_compute(xv.v[e]);
      sq += v[e] * v[e];
    }
    const float rstd = ops::norm_rstd(block_sum(sq, scratch), static_cast<float>(cols), eps);
    if (!mine) continue;
    Vec<T, N> o;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      o.v[e] = convert<T>(norm_value<float, true>(v[e], 0.0f, rstd, wv[e]));
      if (res != nullptr) o.v[e] = plus_residual(o.v[e], rv.v[e]);
    }
    reinterpret_cast<Vec<T, N>*>(y + row * cols)[vi] = o;
  }
}

// ---- Vector row kernels: a block per row, VPT 16-byte vectors per thread in registers ----
// Every load of the row (and of the weights) is issued before the first reduction, each element
// is read once and written once, and the statistics need one block reduction: per-thread
// (count, mean, M2) merged with Chan's formula for layer_norm, sums of squares for rms_norm,
// (max, sum of exp) pairs for softmax.

enum class RowOp { LayerNorm, RmsNorm, Softmax };

constexpr int kRowMaxThreads = 512;

template <class C>
struct RowStat {
  C a, b, c;  // layer: (count, mean, M2); rms: (sum sq, -, -); softmax: (max, sum, -)
};

template <RowOp Op, class C>
__device__ __forceinline__ RowStat<C> merge_stat(RowStat<C> x, RowStat<C> y) {
  if constexpr (Op == RowOp::LayerNorm) {
    C n = x.a + y.a;
    if (n == C(0)) return x;
    C delta = y.b - x.b, f = y.a / n;
    return {n, x.b + delta * f, x.c + y.c + delta * delta * x.a * f};
  } else if constexpr (Op == RowOp::RmsNorm) {
    return {x.a + y.a, C(0), C(0)};
  } else {
    // NaN wins; equal maxima add without exp(m - m) of infinities.
    bool y_wins = y.a > x.a || y.a != y.a;
    C m = y_wins ? y.a : x.a;
    C sx = x.a == m ? x.b : x.b * exp_fast(x.a - m);
    C sy = y.a == m ? y.b : y.b * exp_fast(y.a - m);
    return {m, sx + sy, C(0)};
  }
}

template <RowOp Op, class C>
__device__ __forceinline__ RowStat<C> block_merge(RowStat<C> st, RowStat<C>* scratch) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    RowStat<C> o{shfl_xor(st.a, m), shfl_xor(st.b, m), shfl_xor(st.c, m)};
    st = merge_stat<Op>(st, o);
  }
  const unsigned warps = blockDim.x / 32;
  if (warps == 1) return st;
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = st;
  __syncthreads();
  RowStat<C> r = scratch[0];
  for (unsigned w = 1; w < warps; ++w) r = merge_stat<Op>(r, scratch[w]);
  __syncthreads();  // scratch is reused by the next row
  return r;
}

template <class T, int VPT, RowOp Op>
__global__ void __launch_bounds__(kRowMaxThreads, 2)
    row_vec_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                   const T* __restrict__ res, T* __restrict__ y, unsigned rows, unsigned nvec,
                   compute_t<T> eps) {
  using C = compute_t<T>;
  using V = Vec<T, 16 / sizeof(T)>;
  constexpr int N = 16 / sizeof(T);
  __shared__ RowStat<C> scratch[kRowMaxThreads / 32];
  const unsigned cols = nvec * N;
  // Launched programmatically (launch_pdl): x may come from the kernel before. The next kernel
  // may start as soon as every block has (it waits for this one's end before reading y), which
  // hides back-to-back launches' gap.
  pdl_wait();
  pdl_launch_dependents();
  for (unsigned row = blockIdx.x; row < rows; row += gridDim.x) {
    const V* xr = reinterpret_cast<const V*>(x + static_cast<uint64_t>(row) * cols);
    // The row stays in registers as loaded (T); values are widened where used.
    V raw[VPT];
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      unsigned vi = threadIdx.x + j * blockDim.x;
      if (vi < nvec) raw[j] = xr[vi];
    }
    RowStat<C> st{};
    int count = 0;
    C ex[Op == RowOp::Softmax ? VPT : 1][N];  // softmax: exp(x - this thread's max)
    if constexpr (Op == RowOp::Softmax) st.a = lowest<C>();
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (threadIdx.x + j * blockDim.x >= nvec) continue;
      count += N;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        C v = to_compute(raw[j].v[e]);
        if constexpr (Op == RowOp::LayerNorm) {
          st.b += v;
        } else if constexpr (Op == RowOp::RmsNorm) {
          st.a += v * v;
        } else {
          st.a = (v > st.a || v != v) ? v : st.a;
        }
      }
    }
    if constexpr (Op == RowOp::LayerNorm) {
      st.a = C(count);
      st.b = count > 0 ? st.b / C(count) : C(0);
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
        if (threadIdx.x + j * blockDim.x >= nvec) continue;
#pragma unroll
        for (int e = 0; e < N; ++e) {
          C dv = to_compute(raw[j].v[e]) - st.b;
          st.c += dv * dv;
        }
      }
    } else if constexpr (Op == RowOp::Softmax) {
#pragma unroll
      for (int j = 0; j < VPT; ++j) {
#pragma unroll
        for (int e = 0; e < N; ++e) {
          ex[j][e] =
              threadIdx.x + j * blockDim.x < nvec ? exp_fast(to_compute(raw[j].v[e]) - st.a) : C(0);
          st.b += ex[j][e];
        }
      }
    }
    const C own_max = st.a;
    st = block_merge<Op>(st, scratch);
    C shift, mul;
    if constexpr (Op == RowOp::LayerNorm) {
      shift = st.b;
      mul = ops::norm_rstd(st.c, C(cols), eps);
    } else if constexpr (Op == RowOp::RmsNorm) {
      shift = C(0);
      mul = ops::norm_rstd(st.a, C(cols), eps);
    } else {
      // exp(x - M) / S = exp(x - m_own) * (exp(m_own - M) / S)
      shift = C(0);
      mul = (own_max == st.a ? C(1) : exp_fast(own_max - st.a)) / st.b;
    }
    V* yr = reinterpret_cast<V*>(y + static_cast<uint64_t>(row) * cols);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      unsigned vi = threadIdx.x + j * blockDim.x;
      if (vi >= nvec) continue;
      // Weights are read here (L2 hits for every row but the first), not held in registers.
      V wr{}, br{};
      if constexpr (Op != RowOp::Softmax) wr = reinterpret_cast<const V*>(w)[vi];
      if constexpr (Op == RowOp::LayerNorm) {
        if (b != nullptr) br = reinterpret_cast<const V*>(b)[vi];
      }
      V o;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        C r;
        if constexpr (Op == RowOp::Softmax) {
          r = ex[j][e] * mul;
        } else {
          r = norm_value<T, Op == RowOp::RmsNorm>(to_compute(raw[j].v[e]), shift, mul,
                                                  to_compute(wr.v[e]));
          if constexpr (Op == RowOp::LayerNorm) {
            if (b != nullptr) r += to_compute(br.v[e]);
          }
        }
        o.v[e] = convert<T>(r);
      }
      if (Op != RowOp::Softmax && res != nullptr) {
        add_residual<T>(o, res + uint64_t{row} * cols, vi);
      }
      yr[vi] = o;
    }
  }
}

// ---- Warp row kernel: a warp per row of up to 512 16-byte vectors (4096 bf16/f16, 2048 f32) ----
// The row stays in registers as loaded (VPT vectors a lane), the statistics need warp shuffles
// alone (no shared memory, no block barrier), every element is read once and written once.
// Registers decide how many rows are in flight per multiprocessor: at 4096 bf16 18-24 (80-99
// registers a thread), where the block kernel above keeps 4-9.

constexpr int kRowWarpMaxRows = 4;  // rows (warps) per block at most

/// Element e of a 16-byte vector as a float, converted anew at every call: the asm is volatile so
/// that the compiler does not keep a float copy of the whole row alive between the passes (twice
/// the registers: fewer rows in flight).
template <class T, class V>
__device__ __forceinline__ compute_t<T> elem(const V& vec, int e) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    uint32_t pair = reinterpret_cast<const uint32_t*>(vec.v)[e / 2], bits;
    if (e % 2 == 0) {
      asm volatile("shl.b32 %0, %1, 16;" : "=r"(bits) : "r"(pair));
    } else {
      asm volatile("and.b32 %0, %1, 0xffff0000;" : "=r"(bits) : "r"(pair));
    }
    return __uint_as_float(bits);
  } else if constexpr (std::is_same_v<T, __half>) {
    float f;
    asm volatile("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(__half_as_ushort(vec.v[e])));
    return f;
  } else {
    return vec.v[e];
  }
}

template <class T, int VPT, RowOp Op>
__global__ void __launch_bounds__(kRowWarpMaxRows * 32)
    row_warp_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                    const T* __restrict__ res, T* __restrict__ y, unsigned rows, unsigned nvec,
                    compute_t<T> eps) {
  using C = compute_t<T>;
  using V = Vec<T, 16 / sizeof(T)>;
  constexpr int N = 16 / sizeof(T);
  constexpr int A = 4;  // independent partial sums: short dependency chains
  const unsigned lane = threadIdx.x % 32;
  const unsigned row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const unsigned cols = nvec * N;
  const V* xr = reinterpret_cast<const V*>(x + static_cast<uint64_t>(row) * cols);
  // Every load of the row is issued before the first use.
  V raw[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const unsigned vi = lane + 32 * j;
    raw[j] = vi < nvec ? xr[vi] : V{};
  }
  auto in_row = [&](int j) { return lane + 32 * j < nvec; };
  auto sum_of = [](const C(&part)[A]) { return (part[0] + part[1]) + (part[2] + part[3]); };
  C shift = 0, mul;
  if constexpr (Op == RowOp::RmsNorm) {
    C sq[A] = {};
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
#pragma unroll
      for (int e = 0; e < N; ++e) {
        C v = elem<T>(raw[j], e);  // zeros past the row add nothing
        sq[e % A] += v * v;
      }
    }
    mul = ops::norm_rstd(warp_sum(sum_of(sq)), C(cols), eps);
  } else if constexpr (Op == RowOp::LayerNorm) {
    // Two passes over the registers: the mean, then the squared deviations from it.
    C s[A] = {};
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
#pragma unroll
      for (int e = 0; e < N; ++e) s[e % A] += elem<T>(raw[j], e);
    }
    shift = warp_sum(sum_of(s)) / C(cols);
    C sq[A] = {};
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (!in_row(j)) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        C dv = elem<T>(raw[j], e) - shift;
        sq[e % A] += dv * dv;
      }
    }
    mul = ops::norm_rstd(warp_sum(sum_of(sq)), C(cols), eps);
  } else {
    // The row's max first, then the sum of exp(x - max); the output pass recomputes exp (the
    // row of floats would halve the rows in flight).
    C mx = lowest<C>();
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (!in_row(j)) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        C v = elem<T>(raw[j], e);
        mx = (v > mx || v != v) ? v : mx;
      }
    }
    shift = warp_max_nan(mx);
    C s[A] = {};
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      if (!in_row(j)) continue;
#pragma unroll
      for (int e = 0; e < N; ++e) s[e % A] += exp_fast(elem<T>(raw[j], e) - shift);
    }
    mul = C(1) / warp_sum(sum_of(s));
  }
  V* yr = reinterpret_cast<V*>(y + static_cast<uint64_t>(row) * cols);
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const unsigned vi = lane + 32 * j;
    if (vi >= nvec) continue;
    // Weights are read here (L1/L2 hits for every row but the first), not held in registers.
    V wr{}, br{};
    if constexpr (Op != RowOp::Softmax) wr = reinterpret_cast<const V*>(w)[vi];
    if constexpr (Op == RowOp::LayerNorm) {
      if (b != nullptr) br = reinterpret_cast<const V*>(b)[vi];
    }
    V o;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      C r;
      if constexpr (Op == RowOp::Softmax) {
        r = exp_fast(elem<T>(raw[j], e) - shift) * mul;
      } else {
        r = norm_value<T, Op == RowOp::RmsNorm>(elem<T>(raw[j], e), shift, mul,
                                                to_compute(wr.v[e]));
        if constexpr (Op == RowOp::LayerNorm) {
          if (b != nullptr) r += to_compute(br.v[e]);
        }
      }
      o.v[e] = convert<T>(r);
    }
    if (Op != RowOp::Softmax && res != nullptr) add_residual<T>(o, res + uint64_t{row} * cols, vi);
    yr[vi] = o;
  }
}

/// The vector row kernel when rows are 16-byte aligned and short enough to sit in registers;
/// false (nothing launched) otherwise. res: the norms' residual (may be null).
template <class T, RowOp Op>
bool try_row_vec(const T* x, const T* w, const T* b, const T* res, T* y, size_t rows, size_t cols,
                 double eps, cudaStream_t s) {
  constexpr int N = 16 / sizeof(T);
  if (cols % N != 0 || rows > 0xffffffffu || !aligned16(x, 0, 1) || !aligned16(y, 0, 1) ||
      (res != nullptr && !aligned16(res, 0, 1))) {
    return false;
  }
  if (Op != RowOp::Softmax && !aligned16(w, 0, 1)) return false;
  if (Op == RowOp::LayerNorm && b != nullptr && !aligned16(b, 0, 1)) return false;
  size_t nvec = cols / N;
  using C = compute_t<T>;
  C e = static_cast<C>(eps);
  // softmax: the bulk-copy kernel for f16/bf16 rows above 8 KB, else a warp per row when the row
  // fits in 16 vectors a lane; the norms take the block kernel. The choice follows the row's
  // length alone (the two kernels sum in different orders), so that a row's bits do not depend on
  // the row count. TuningOverrides::row_kernel forces one (bulk where it applies).
  static const RowKernel choice = tuning().row_kernel;
  if constexpr (Op == RowOp::Softmax && sizeof(T) == 2) {
    const size_t row_bytes = nvec * 16;
    const bool bulk = choice == RowKernel::Bulk || (choice == RowKernel::Auto && row_bytes > 8192);
    if (bulk && try_softmax_bulk(x, y, rows, nvec, s)) return true;
  } else if constexpr (Op == RowOp::Softmax && sizeof(T) == 4) {
    if (choice == RowKernel::Bulk && try_softmax_bulk(x, y, rows, nvec, s)) return true;
  }
  const bool warp =
      choice == RowKernel::Warp ||
      ((choice == RowKernel::Auto || choice == RowKernel::Bulk) && Op == RowOp::Softmax);
  // Two rows a block: fine steps of occupancy (TuningOverrides::row_warps: one or four).
  static const unsigned row_warps = static_cast<unsigned>(tuning().row_warps);
  if constexpr (sizeof(T) <= 4) {
    if (warp && nvec <= 32 * 16 && rows <= 0xffffffffu - kRowWarpMaxRows) {
      unsigned blocks = static_cast<unsigned>((rows + row_warps - 1) / row_warps);
      auto go = [&](auto kernel) {
        kernel<<<blocks, row_warps * 32, 0, s>>>(x, w, b, res, y, static_cast<unsigned>(rows),
                                                 static_cast<unsigned>(nvec), e);
        WICK_CUDA_CHECK_LAUNCH();
      };
      if (nvec <= 32 * 8) {
        go(row_warp_kernel<T, 8, Op>);
      } else {
        go(row_warp_kernel<T, 16, Op>);
      }
      return true;
    }
  }
  auto threads_for = [&](size_t vpt) {
    return static_cast<unsigned>((nvec + vpt - 1) / vpt + 31) / 32 * 32;
  };
  unsigned grid = static_cast<unsigned>(std::min<size_t>(rows, 1u << 20));
  auto go = [&](auto kernel, unsigned threads) {
    launch_pdl(kernel, dim3(grid), dim3(threads), 0, s, x, w, b, res, y,
               static_cast<unsigned>(rows), static_cast<unsigned>(nvec), e);
  };
  // Four vectors a thread (64 bytes in flight each) up to 256 threads, then eight up to 512;
  // TuningOverrides::row_vectors_per_thread forces one.
  static const int forced = tuning().row_vectors_per_thread;
  // softmax keeps exp(x) as floats: two vectors a thread keep it in registers.
  const bool two = forced == 2 || (forced == 0 && Op == RowOp::Softmax && threads_for(2) <= 256);
  if (two && threads_for(2) <= kRowMaxThreads) {
    go(row_vec_kernel<T, 2, Op>, threads_for(2));
  } else if ((forced == 0 || forced == 4) && threads_for(4) <= 256) {
    go(row_vec_kernel<T, 4, Op>, threads_for(4));
  } else if (threads_for(8) <= kRowMaxThreads) {
    go(row_vec_kernel<T, 8, Op>, threads_for(8));
  } else {
    return false;
  }
  return true;
}

template <class T, bool kRms>
void run_norm(const T* x, const T* w, const T* b, const T* res, T* y, size_t rows, size_t cols,
              double eps, cudaStream_t s) {
  using C = compute_t<T>;
  C e = static_cast<C>(eps);
  if (cols <= 32 * kWarpPerLane) {
    norm_warp_kernel<T, kRms><<<grid_for(rows, kBlock / 32), kBlock, 0, s>>>(
        x, w, b, res, y, rows, static_cast<unsigned>(cols), e);
  } else if (try_row_vec < T,
             kRms ? RowOp::RmsNorm : RowOp::LayerNorm > (x, w, b, res, y, rows, cols, eps, s)) {
    return;
  } else if (cols <= kBlock * kNormPerThread) {
    bool vec = (cols * sizeof(T)) % 16 == 0 && aligned16(x, 0, 1) && aligned16(w, 0, 1) &&
               (b == nullptr || aligned16(b, 0, 1)) && (res == nullptr || aligned16(res, 0, 1)) &&
               aligned16(y, 0, 1);
    norm_block_reg_kernel<T, kRms><<<grid_for(rows, 1), kBlock, 0, s>>>(
        x, w, b, res, y, rows, static_cast<unsigned>(cols), e, vec);
  } else {
    norm_block_kernel<T, kRms><<<grid_for(rows, 1), kBlock, 0, s>>>(x, w, b, res, y, rows, cols, e);
  }
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_norm(DType dtype, bool rms, const void* x, const void* weight, const void* bias,
                 void* y, size_t rows, size_t cols, double eps, cudaStream_t s,
                 const void* residual) {
  if (rows == 0 || cols == 0) return;
  dispatch_float<DeviceTypes>(dtype, rms ? "rms_norm" : "layer_norm", [&]<class T>() {
    auto xp = static_cast<const T*>(x);
    auto wp = static_cast<const T*>(weight);
    auto bp = static_cast<const T*>(bias);
    auto rp = static_cast<const T*>(residual);
    auto yp = static_cast<T*>(y);
    if (rms) {
      run_norm<T, true>(xp, wp, nullptr, rp, yp, rows, cols, eps, s);
    } else {
      run_norm<T, false>(xp, wp, bp, rp, yp, rows, cols, eps, s);
    }
  });
}

void launch_rms_norm_f32_weight(DType dtype, const void* x, const float* weight, void* y,
                                size_t rows, size_t cols, double eps, cudaStream_t s,
                                const void* residual) {
  if (rows == 0 || cols == 0) return;
  if (dtype != DType::F16 && dtype != DType::BF16) {
    throw UnsupportedDType("rms_norm with an f32 weight: x must be f16 or bf16");
  }
  dispatch_float<DeviceTypes>(dtype, "rms_norm", [&]<class T>() {
    if constexpr (sizeof(T) == 2) {
      auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
      if (cols % 8 == 0 && cols <= kBlock * 8 && aligned(x) && aligned(weight) && aligned(y) &&
          (residual == nullptr || aligned(residual))) {
        launch_pdl(rms_norm_f32_weight_vec_kernel<T>, dim3(grid_for(rows, 1)), dim3(kBlock), 0, s,
                   static_cast<const T*>(x), weight, static_cast<const T*>(residual),
                   static_cast<T*>(y), static_cast<uint64_t>(rows), static_cast<unsigned>(cols),
                   static_cast<float>(eps));
        return;
      }
    }
    launch_pdl(rms_norm_f32_weight_kernel<T>, dim3(grid_for(rows, 1)), dim3(kBlock), 0, s,
               static_cast<const T*>(x), weight, static_cast<const T*>(residual),
               static_cast<T*>(y), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
               static_cast<float>(eps));
  });
}

bool launch_softmax_rows_vec(DType dtype, const void* src, void* dst, size_t rows, size_t cols,
                             cudaStream_t s) {
  if (rows == 0 || cols == 0) return true;
  return dispatch_float<DeviceTypes>(dtype, "softmax", [&]<class T>() {
    return try_row_vec<T, RowOp::Softmax>(static_cast<const T*>(src), nullptr, nullptr, nullptr,
                                          static_cast<T*>(dst), rows, cols, 0.0, s);
  });
}

}  // namespace wick::cuda
