// Scaled dot-product attention on CUDA, two kernels:
// - flash_mma_kernel (f16/bf16, d = 64 or 128, aligned operands): FlashAttention-2 style. A block
//   of 4 warps owns 64 queries of one head; each warp keeps 16 query rows as mma.sync m16n8k16
//   fragments, streams 64-key tiles of K and V through shared memory, keeps the scores and the
//   online softmax (running max and sum per row) in registers and reuses the probabilities as
//   the A operand of P V without a trip through shared memory. Causal blocks stop at their last
//   visible key and run longest-first.
// - attn_split_kernel (every float dtype and d <= 256; the decode path for short queries against
//   a long KV cache): the warps of a block are the query heads that share one k/v head, so each
//   k/v tile is read from memory once for all of them; the keys are split across blocks
//   (split-KV) and a second kernel merges the partial (max, sum, output) of the splits.

#include <algorithm>
#include <cmath>

#include "cuda/fused_kernels.h"
#include "cuda/kernel_utils.cuh"
#include "util.h"

namespace wick::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

template <class C>
__device__ __forceinline__ C shfl_idx(C x, int lane) {
  return static_cast<C>(__shfl_sync(0xffffffffu, x, lane));
}

template <class C>
__device__ __forceinline__ C exp_c(C x) {
  if constexpr (std::is_same_v<C, float>)
    return __expf(x);
  else
    return exp(x);
}

__device__ __forceinline__ float neg_inf() {
  return __int_as_float(static_cast<int>(0xff800000u));
}

// ---------------------------------------------------------------------------------------------
// Tensor-core path

constexpr int kMmaWarps = 4;
constexpr int kMmaRows = 16 * kMmaWarps;  // queries per block
constexpr int kMmaKeys = 64;              // keys per tile
constexpr int kPad = 8;                   // halves of padding per smem row: no bank conflicts

template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one register of two halves (the first in the low bits).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint16_t l, h;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    l = __bfloat16_as_ushort(__float2bfloat16_rn(lo));
    h = __bfloat16_as_ushort(__float2bfloat16_rn(hi));
  } else {
    l = __half_as_ushort(__float2half_rn(lo));
    h = __half_as_ushort(__float2half_rn(hi));
  }
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}

template <class T>
__device__ __forceinline__ float bits_to_float(uint16_t b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__ushort_as_bfloat16(b));
  } else {
    return __half2float(__ushort_as_half(b));
  }
}

struct MmaArgs {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* mask;
  uint16_t* out;
  int64_t qs[3], ks[3], vs[3], ms[4];
  int h, group, s, s_kv;
  float scale_log2;  // scale * log2(e): the softmax runs in base 2
  bool causal;
};

template <class T, int D>
__global__ void __launch_bounds__(kMmaWarps * 32) flash_mma_kernel(MmaArgs p) {
  constexpr int LD = D + kPad;
  constexpr int KSTEPS = D / 16;      // k-steps of Q K^T
  constexpr int NT_S = kMmaKeys / 8;  // score tiles of 8 keys
  constexpr int NT_O = D / 8;         // output tiles of 8 dims
  __shared__ alignas(16) uint16_t k_tile[kMmaKeys][LD];
  __shared__ alignas(16) uint16_t v_tile[kMmaKeys][LD];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tg = lane & 3;
  // Longest causal blocks first: the last query tiles see the most keys.
  const int qt = gridDim.x - 1 - blockIdx.x;
  const int hi = blockIdx.y, bi = blockIdx.z, hk = hi / p.group;
  const int q0 = qt * kMmaRows;
  const int shift = p.s_kv - p.s;

  const uint16_t* qb = p.q + bi * p.qs[0] + hi * p.qs[1];
  const uint16_t* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  const uint16_t* vb = p.v + bi * p.vs[0] + hk * p.vs[1];

  // This warp's 16 query rows as A fragments (rows g and g + 8, column pairs tg * 2).
  const int row_a = q0 + warp * 16 + g, row_b = row_a + 8;
  uint32_t qf[KSTEPS][4];
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk) {
    int c = kk * 16 + tg * 2;
    auto ld = [&](int row, int col) -> uint32_t {
      if (row >= p.s) return 0u;
      return *reinterpret_cast<const uint32_t*>(qb + row * p.qs[2] + col);
    };
    qf[kk][0] = ld(row_a, c);
    qf[kk][1] = ld(row_b, c);
    qf[kk][2] = ld(row_a, c + 8);
    qf[kk][3] = ld(row_b, c + 8);
  }

  float o[NT_O][4];
#pragma unroll
  for (int n = 0; n < NT_O; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};

  int key_end = p.s_kv;
  if (p.causal) key_end = min(p.s_kv, max(0, q0 + kMmaRows - 1 + shift + 1));

  for (int k0 = 0; k0 < key_end; k0 += kMmaKeys) {
    __syncthreads();  // the previous tile is consumed
    // K and V tiles: 16-byte vectors, zeros past the end (0 * garbage could be nan).
    constexpr int VEC_PER_ROW = D / 8;
    for (int i = threadIdx.x; i < kMmaKeys * VEC_PER_ROW; i += blockDim.x) {
      int r = i / VEC_PER_ROW, c = (i % VEC_PER_ROW) * 8;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
      if (k0 + r < p.s_kv) {
        kv = *reinterpret_cast<const uint4*>(kb + (k0 + r) * p.ks[2] + c);
        vv = *reinterpret_cast<const uint4*>(vb + (k0 + r) * p.vs[2] + c);
      }
      *reinterpret_cast<uint4*>(&k_tile[r][c]) = kv;
      *reinterpret_cast<uint4*>(&v_tile[r][c]) = vv;
    }
    __syncthreads();

    // S = Q K^T for 16 rows x 64 keys.
    float sc[NT_S][4];
#pragma unroll
    for (int n = 0; n < NT_S; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
      for (int n = 0; n < NT_S; ++n) {
        const uint16_t* kr = &k_tile[n * 8 + g][kk * 16 + tg * 2];
        uint32_t b0 = *reinterpret_cast<const uint32_t*>(kr);
        uint32_t b1 = *reinterpret_cast<const uint32_t*>(kr + 8);
        mma_16816<T>(sc[n], qf[kk], b0, b1);
      }
    }

    // Scale, mask, and the online softmax of rows g (r = 0) and g + 8 (r = 1).
    bool edge =
        k0 + kMmaKeys > p.s_kv || (p.causal && k0 + kMmaKeys - 1 > q0 + shift) || p.mask != nullptr;
    float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
    for (int n = 0; n < NT_S; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = sc[n][e] * p.scale_log2;
        if (edge) {
          int row = e < 2 ? row_a : row_b;
          int col = k0 + n * 8 + tg * 2 + (e & 1);
          if (col >= p.s_kv || (p.causal && col > row + shift)) {
            x = neg_inf();
          } else if (p.mask != nullptr && row < p.s) {
            x += bits_to_float<T>(
                     p.mask[bi * p.ms[0] + hi * p.ms[1] + row * p.ms[2] + col * p.ms[3]]) *
                 kLog2e;
          }
        }
        sc[n][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float corr[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      float m_new = fmaxf(m[r], mx[r]);
      // A row with no visible key so far keeps exp2(-inf - 0) = 0 instead of nan.
      m_use[r] = m_new == neg_inf() ? 0.f : m_new;
      corr[r] = exp2f(m[r] - m_use[r]);
      m[r] = m_new;
      l[r] *= corr[r];
    }
#pragma unroll
    for (int n = 0; n < NT_S; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float pe = exp2f(sc[n][e] - m_use[e >> 1]);
        sc[n][e] = pe;
        l[e >> 1] += pe;
      }
    }
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }

    // O += P V: the score accumulators of key tiles 2j and 2j + 1 are the A fragment of k-step j.
#pragma unroll
    for (int j = 0; j < kMmaKeys / 16; ++j) {
      uint32_t a[4];
      a[0] = pack2<T>(sc[2 * j][0], sc[2 * j][1]);
      a[1] = pack2<T>(sc[2 * j][2], sc[2 * j][3]);
      a[2] = pack2<T>(sc[2 * j + 1][0], sc[2 * j + 1][1]);
      a[3] = pack2<T>(sc[2 * j + 1][2], sc[2 * j + 1][3]);
      const int kr = j * 16 + tg * 2;
#pragma unroll
      for (int n = 0; n < NT_O; ++n) {
        const int c = n * 8 + g;
        uint32_t b0 =
            static_cast<uint32_t>(v_tile[kr][c]) | (static_cast<uint32_t>(v_tile[kr + 1][c]) << 16);
        uint32_t b1 = static_cast<uint32_t>(v_tile[kr + 8][c]) |
                      (static_cast<uint32_t>(v_tile[kr + 9][c]) << 16);
        mma_16816<T>(o[n], a, b0, b1);
      }
    }
  }

  // Each thread summed a quarter of its rows' probabilities: finish across the quad.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  float inv[2] = {l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f};
  uint16_t* ob = p.out + ((static_cast<int64_t>(bi) * p.h + hi) * p.s) * D;
#pragma unroll
  for (int n = 0; n < NT_O; ++n) {
    int c = n * 8 + tg * 2;
    if (row_a < p.s) {
      *reinterpret_cast<uint32_t*>(ob + static_cast<int64_t>(row_a) * D + c) =
          pack2<T>(o[n][0] * inv[0], o[n][1] * inv[0]);
    }
    if (row_b < p.s) {
      *reinterpret_cast<uint32_t*>(ob + static_cast<int64_t>(row_b) * D + c) =
          pack2<T>(o[n][2] * inv[1], o[n][3] * inv[1]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Split-KV path (any float dtype, d <= 256)

constexpr int kSplitKeys = 32;     // keys per smem tile: one per lane
constexpr int kSplitMaxWarps = 8;  // query heads per block
constexpr int kMaxDimPerLane = 8;  // d <= 256

template <class T>
struct SplitArgs {
  const T* q;
  const T* k;
  const T* v;
  const T* mask;
  T* out;
  float* part_ml;  // (rows, splits, 2): max and sum per split, when splits > 1
  float* part_o;   // (rows, splits, d)
  int64_t qs[3], ks[3], vs[3], ms[4];
  int h, group, s, s_kv, d;
  int splits, keys_per_split, head_chunks;
  int row0;  // first query row of this launch (grid.y is limited to 65535)
  compute_t<T> scale;
  bool causal;
};

template <class T>
__global__ void attn_split_kernel(SplitArgs<T> p) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* k_tile = reinterpret_cast<C*>(smem_raw);   // [32][d + 1]
  C* v_tile = k_tile + kSplitKeys * (p.d + 1);  // [32][d]
  C* q_rows = v_tile + kSplitKeys * p.d;        // [warps][d]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x;
  const int row = p.row0 + static_cast<int>(blockIdx.y) / p.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int bi = blockIdx.z / (p.h / p.group), hk = blockIdx.z % (p.h / p.group);
  const int head_in_group = chunk * kSplitMaxWarps + warp;
  const bool active = head_in_group < p.group;
  const int hi = hk * p.group + min(head_in_group, p.group - 1);
  const int d = p.d;

  // This warp's query, pre-scaled.
  const T* qr = p.q + bi * p.qs[0] + hi * p.qs[1] + row * p.qs[2];
  for (int t = lane; t < d; t += 32) q_rows[warp * d + t] = to_compute(qr[t]) * p.scale;

  const int shift = p.s_kv - p.s;
  int key_lo = split * p.keys_per_split;
  int key_hi = min(p.s_kv, key_lo + p.keys_per_split);
  if (p.causal) key_hi = min(key_hi, max(0, row + shift + 1));

  C o[kMaxDimPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimPerLane; ++i) o[i] = 0;
  C m = lowest<C>(), l = 0;
  const T* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  const T* vb = p.v + bi * p.vs[0] + hk * p.vs[1];

  for (int k0 = key_lo; k0 < key_hi; k0 += kSplitKeys) {
    __syncthreads();  // q_rows written / the previous tile consumed
    for (int i = threadIdx.x; i < kSplitKeys * d; i += blockDim.x) {
      int r = i / d, c = i % d;
      bool in = k0 + r < key_hi;
      k_tile[r * (d + 1) + c] = in ? to_compute(kb[(k0 + r) * p.ks[2] + c]) : C(0);
      v_tile[r * d + c] = in ? to_compute(vb[(k0 + r) * p.vs[2] + c]) : C(0);
    }
    __syncthreads();
    // Lane j scores key k0 + j.
    int key = k0 + lane;
    C sc = lowest<C>();
    if (key < key_hi) {
      C acc = 0;
      const C* kr = k_tile + lane * (d + 1);
      const C* qw = q_rows + warp * d;
      for (int t = 0; t < d; ++t) acc += qw[t] * kr[t];
      if (p.mask != nullptr) {
        acc += to_compute(p.mask[bi * p.ms[0] + hi * p.ms[1] + row * p.ms[2] + key * p.ms[3]]);
      }
      sc = acc;
    }
    C mx = sc;
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) mx = max(mx, shfl_xor(mx, w));
    C m_new = max(m, mx);
    if (m_new == lowest<C>()) continue;  // nothing visible yet (all -inf)
    C corr = m == lowest<C>() ? C(0) : exp_c(m - m_new);
    C pj = sc == lowest<C>() ? C(0) : exp_c(sc - m_new);
    C psum = pj;
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) psum += shfl_xor(psum, w);
    l = l * corr + psum;
    m = m_new;
#pragma unroll
    for (int i = 0; i < kMaxDimPerLane; ++i) o[i] *= corr;
    for (int j = 0; j < kSplitKeys; ++j) {
      C pb = shfl_idx(pj, j);
      const C* vr = v_tile + j * d;
#pragma unroll
      for (int i = 0; i < kMaxDimPerLane; ++i) {
        int t = lane + 32 * i;
        if (t < d) o[i] += pb * vr[t];
      }
    }
  }
  if (!active) return;
  int64_t out_row = (static_cast<int64_t>(bi) * p.h + hi) * p.s + row;
  if (p.splits == 1) {
    C inv = l > C(0) ? C(1) / l : C(0);
#pragma unroll
    for (int i = 0; i < kMaxDimPerLane; ++i) {
      int t = lane + 32 * i;
      if (t < d) p.out[out_row * d + t] = convert<T>(o[i] * inv);
    }
    return;
  }
  int64_t part = out_row * p.splits + split;
  if (lane == 0) {
    p.part_ml[part * 2] = static_cast<float>(m);
    p.part_ml[part * 2 + 1] = static_cast<float>(l);
  }
#pragma unroll
  for (int i = 0; i < kMaxDimPerLane; ++i) {
    int t = lane + 32 * i;
    if (t < d) p.part_o[part * d + t] = static_cast<float>(o[i]);
  }
}

/// A warp per output row: merges the splits' (max, sum, unnormalised output).
template <class T>
__global__ void __launch_bounds__(kBlock)
    attn_merge_kernel(const float* __restrict__ part_ml, const float* __restrict__ part_o,
                      T* __restrict__ out, uint64_t rows, int splits, int d) {
  unsigned lane = threadIdx.x % 32;
  for (uint64_t row = global_tid() / 32; row < rows; row += grid_stride() / 32) {
    const float* ml = part_ml + row * splits * 2;
    float mx = neg_inf();
    for (int i = 0; i < splits; ++i) mx = fmaxf(mx, ml[2 * i]);
    float l = 0;
    for (int i = 0; i < splits; ++i) {
      if (ml[2 * i] != neg_inf()) l += ml[2 * i + 1] * __expf(ml[2 * i] - mx);
    }
    float inv = l > 0.f ? 1.f / l : 0.f;
    for (int t = lane; t < d; t += 32) {
      float acc = 0;
      for (int i = 0; i < splits; ++i) {
        if (ml[2 * i] != neg_inf()) {
          acc += part_o[(row * splits + i) * d + t] * __expf(ml[2 * i] - mx);
        }
      }
      out[row * d + t] = convert<T>(acc * inv);
    }
  }
}

int sm_count() {
  static int count = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) n = 100;
    return n;
  }();
  return count;
}

template <class T>
void run_split(const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
  using C = compute_t<T>;
  SplitArgs<T> p{};
  p.q = static_cast<const T*>(a.q);
  p.k = static_cast<const T*>(a.k);
  p.v = static_cast<const T*>(a.v);
  p.mask = static_cast<const T*>(a.mask);
  p.out = static_cast<T*>(a.out);
  for (int i = 0; i < 3; ++i) {
    p.qs[i] = a.q_strides[i];
    p.ks[i] = a.k_strides[i];
    p.vs[i] = a.v_strides[i];
  }
  for (int i = 0; i < 4; ++i) p.ms[i] = a.mask_strides[i];
  p.h = a.h;
  p.group = a.h / a.h_kv;
  p.s = a.s;
  p.s_kv = a.s_kv;
  p.d = a.d;
  p.scale = static_cast<C>(a.scale);
  p.causal = a.causal;
  int warps = std::min(p.group, kSplitMaxWarps);
  p.head_chunks = (p.group + kSplitMaxWarps - 1) / kSplitMaxWarps;
  // Enough blocks to fill the GPU twice over, each split at least 64 keys.
  int64_t base = static_cast<int64_t>(a.b) * a.h_kv * a.s * p.head_chunks;
  int64_t want = (2 * static_cast<int64_t>(sm_count()) + base - 1) / base;
  int64_t max_splits = std::max<int64_t>(1, (a.s_kv + 63) / 64);
  p.splits = static_cast<int>(std::clamp<int64_t>(want, 1, max_splits));
  p.keys_per_split = (a.s_kv + p.splits - 1) / p.splits;
  p.keys_per_split = (p.keys_per_split + kSplitKeys - 1) / kSplitKeys * kSplitKeys;
  p.splits = std::max(1, (a.s_kv + p.keys_per_split - 1) / p.keys_per_split);
  uint64_t rows = static_cast<uint64_t>(a.b) * a.h * a.s;
  if (p.splits > 1) {
    p.part_ml = static_cast<float*>(temp(rows * p.splits * 2 * sizeof(float)));
    p.part_o = static_cast<float*>(temp(rows * p.splits * a.d * sizeof(float)));
  }
  size_t smem = (kSplitKeys * (a.d + 1) + kSplitKeys * a.d + warps * a.d) * sizeof(C);
  if (smem > 48 * 1024) {
    WICK_CUDA_CHECK(cudaFuncSetAttribute(
        attn_split_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  int rows_per_launch = 65535 / p.head_chunks;
  for (int row0 = 0; row0 < a.s; row0 += rows_per_launch) {
    p.row0 = row0;
    int n = std::min(rows_per_launch, a.s - row0);
    dim3 grid(p.splits, n * p.head_chunks, a.b * a.h_kv);
    attn_split_kernel<T><<<grid, warps * 32, smem, s>>>(p);
    WICK_CUDA_CHECK_LAUNCH();
  }
  if (p.splits > 1) {
    attn_merge_kernel<T><<<grid_for(rows, kBlock / 32), kBlock, 0, s>>>(p.part_ml, p.part_o, p.out,
                                                                        rows, p.splits, a.d);
    WICK_CUDA_CHECK_LAUNCH();
  }
}

// The tensor-core kernel needs 4-byte aligned query pairs and 16-byte aligned k/v rows.
bool mma_fits(const AttentionArgs& a) {
  if (a.d != 64 && a.d != 128) return false;
  if (a.s < 16) return false;  // short queries: the split path reads k/v once per head group
  auto al = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (!al(a.q, 4) || !al(a.k, 16) || !al(a.v, 16) || !al(a.out, 4)) return false;
  for (int i = 0; i < 3; ++i) {
    if (a.q_strides[i] % 2 != 0 || a.k_strides[i] % 8 != 0 || a.v_strides[i] % 8 != 0) {
      return false;
    }
  }
  return true;
}

template <class T>
void run_mma(const AttentionArgs& a, cudaStream_t s) {
  MmaArgs p{};
  p.q = static_cast<const uint16_t*>(a.q);
  p.k = static_cast<const uint16_t*>(a.k);
  p.v = static_cast<const uint16_t*>(a.v);
  p.mask = static_cast<const uint16_t*>(a.mask);
  p.out = static_cast<uint16_t*>(a.out);
  for (int i = 0; i < 3; ++i) {
    p.qs[i] = a.q_strides[i];
    p.ks[i] = a.k_strides[i];
    p.vs[i] = a.v_strides[i];
  }
  for (int i = 0; i < 4; ++i) p.ms[i] = a.mask_strides[i];
  p.h = a.h;
  p.group = a.h / a.h_kv;
  p.s = a.s;
  p.s_kv = a.s_kv;
  p.scale_log2 = a.scale * kLog2e;
  p.causal = a.causal;
  dim3 grid((a.s + kMmaRows - 1) / kMmaRows, a.h, a.b);
  if (a.d == 64) {
    flash_mma_kernel<T, 64><<<grid, kMmaWarps * 32, 0, s>>>(p);
  } else {
    flash_mma_kernel<T, 128><<<grid, kMmaWarps * 32, 0, s>>>(p);
  }
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_attention(DType dtype, const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
  if (static_cast<int64_t>(a.b) * a.h * a.s * a.d == 0) return;
  if (a.d > 32 * kMaxDimPerLane &&
      !((dtype == DType::BF16 || dtype == DType::F16) && mma_fits(a))) {
    throw UnsupportedDType(
        str("scaled_dot_product_attention: head dim ", a.d, " is above 256 on cuda"));
  }
  if (dtype == DType::BF16 && mma_fits(a)) return run_mma<__nv_bfloat16>(a, s);
  if (dtype == DType::F16 && mma_fits(a)) return run_mma<__half>(a, s);
  if (a.s_kv == 0) {
    // No keys: zeros, as the CPU.
    WICK_CUDA_CHECK(cudaMemsetAsync(
        a.out, 0, static_cast<size_t>(a.b) * a.h * a.s * a.d * size_in_bytes(dtype), s));
    return;
  }
  dispatch_dev_float(dtype, "scaled_dot_product_attention",
                     [&]<class T>() { run_split<T>(a, temp, s); });
}

}  // namespace wick::cuda
