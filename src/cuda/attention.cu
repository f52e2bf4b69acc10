// Scaled dot-product attention on CUDA, two kernels:
// - flash_mma_kernel (f16/bf16, d = 64 or 128, aligned operands): FlashAttention-2 style. A block
//   of 4 warps owns 128 queries of one head (Q in shared memory); each warp computes 32 query
//   rows (two m16 tiles sharing each K/V fragment) with mma.sync m16n8k16,
//   streams 64-key tiles of K and V through shared memory (cp.async, two stages,
//   fragments read with ldmatrix), keeps the scores and the
//   online softmax (running max and sum per row) in registers and reuses the probabilities as
//   the A operand of P V without a trip through shared memory. Causal blocks stop at their last
//   visible key and run longest-first.
// - attn_split_kernel (every float dtype and d <= 256; the decode path for short queries against
//   a long KV cache): the warps of a block are the query heads that share one k/v head, so each
//   k/v tile is read from memory once for all of them; the keys are split across blocks
//   (split-KV) and a second kernel merges the partial (max, sum, output) of the splits.

#include <algorithm>
#include <cmath>
#include <cstdlib>

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
constexpr int kMmaRowTiles = 2;                          // 16-row tiles per warp
constexpr int kMmaRows = 16 * kMmaRowTiles * kMmaWarps;  // queries per block
constexpr int kMmaKeys = 64;                             // keys per tile
constexpr int kPad = 8;  // halves of padding per smem row: no bank conflicts

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

// Two floats as one register of two halves (the first in the low bits), one cvt instruction.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// 2^x by the special-function unit alone (inputs are <= 0 here: results in [0, 1]).
__device__ __forceinline__ float exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

template <class T>
__device__ __forceinline__ float bits_to_float(uint16_t b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__ushort_as_bfloat16(b));
  } else {
    return __half2float(__ushort_as_half(b));
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without registers; zero-filled when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
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
  bool q_vec;  // q rows 16-byte aligned: cp.async to shared memory
};

template <class T, int D>
__global__ void __launch_bounds__(kMmaWarps * 32) flash_mma_kernel(MmaArgs p) {
  constexpr int LD = D + kPad;
  constexpr int KSTEPS = D / 16;      // k-steps of Q K^T
  constexpr int NT_S = kMmaKeys / 8;  // score tiles of 8 keys
  constexpr int NT_O = D / 8;         // output tiles of 8 dims
  constexpr int MT = kMmaRowTiles;    // 16-row tiles per warp: each K/V fragment feeds MT mmas
  // Q, then two stages of K and V tiles: the next tile streams in (cp.async) while this one is
  // used.
  extern __shared__ __align__(16) unsigned char mma_smem[];
  auto q_tile = reinterpret_cast<uint16_t(*)[LD]>(mma_smem);
  unsigned char* kv_base = mma_smem + kMmaRows * LD * 2;
  auto k_tile = reinterpret_cast<uint16_t(*)[kMmaKeys][LD]>(kv_base);
  auto v_tile = reinterpret_cast<uint16_t(*)[kMmaKeys][LD]>(kv_base + 2 * kMmaKeys * LD * 2);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tg = lane & 3;
  // Heads vary fastest and the longest causal query tiles (the last ones) run first.
  const int hi = blockIdx.x, bi = blockIdx.z, hk = hi / p.group;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kMmaRows;
  const int shift = p.s_kv - p.s;

  const uint16_t* qb = p.q + bi * p.qs[0] + hi * p.qs[1];
  const uint16_t* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  const uint16_t* vb = p.v + bi * p.vs[0] + hk * p.vs[1];

  constexpr int VEC_PER_ROW = D / 8;
  // Q rows to shared memory (zeros past the end); q rows are 16-byte aligned (q_vec) or copied
  // by 4-byte pairs.
  if (p.q_vec) {
    for (int i = threadIdx.x; i < kMmaRows * VEC_PER_ROW; i += blockDim.x) {
      int r = i / VEC_PER_ROW, c = (i % VEC_PER_ROW) * 8;
      bool valid = q0 + r < p.s;
      cp_async16(&q_tile[r][c], qb + (valid ? q0 + r : 0) * p.qs[2] + c, valid);
    }
  } else {
    for (int i = threadIdx.x; i < kMmaRows * (D / 2); i += blockDim.x) {
      int r = i / (D / 2), c = (i % (D / 2)) * 2;
      uint32_t val = 0;
      if (q0 + r < p.s) val = *reinterpret_cast<const uint32_t*>(qb + (q0 + r) * p.qs[2] + c);
      *reinterpret_cast<uint32_t*>(&q_tile[r][c]) = val;
    }
  }

  float o[MT][NT_O][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < NT_O; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    m[mt][0] = m[mt][1] = neg_inf();
    l[mt][0] = l[mt][1] = 0.f;
  }
  // Rows g and g + 8 of this warp's tile mt.
  auto row_of = [&](int mt, int r) { return q0 + warp * 16 * MT + mt * 16 + g + 8 * r; };

  int key_end = p.s_kv;
  if (p.causal) key_end = min(p.s_kv, max(0, q0 + kMmaRows - 1 + shift + 1));
  // This warp's last visible key: tiles past it are skipped by the warp (not by the block).
  const int warp_last_row = q0 + warp * 16 * MT + 16 * MT - 1;
  const int warp_key_end = p.causal ? min(key_end, max(0, warp_last_row + shift + 1)) : key_end;

  // Tile loads: 16-byte chunks, zeros past the end (0 * garbage could be nan).
  auto load_tile = [&](int stage, int k0) {
    for (int i = threadIdx.x; i < kMmaKeys * VEC_PER_ROW; i += blockDim.x) {
      int r = i / VEC_PER_ROW, c = (i % VEC_PER_ROW) * 8;
      bool valid = k0 + r < p.s_kv;
      int64_t key = valid ? k0 + r : 0;
      cp_async16(&k_tile[stage][r][c], kb + key * p.ks[2] + c, valid);
      cp_async16(&v_tile[stage][r][c], vb + key * p.vs[2] + c, valid);
    }
    cp_async_commit();
  };
  // ldmatrix row addresses of this lane: matrix mi = lane / 8, its row ri = lane % 8.
  const int mi = lane >> 3, ri = lane & 7;

  const int tiles = (key_end + kMmaKeys - 1) / kMmaKeys;
  if (tiles > 0) load_tile(0, 0);  // commits Q's copies with the first tile
  if (tiles == 0) cp_async_commit();
  for (int it = 0; it < tiles; ++it) {
    const int k0 = it * kMmaKeys, stage = it & 1;
    if (it + 1 < tiles) {
      load_tile(stage ^ 1, k0 + kMmaKeys);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (k0 < warp_key_end) {
      // S = Q K^T for 16 MT rows x 64 keys. One ldmatrix gives (b0, b1) of key tiles n and
      // n + 1: matrices (keys n, d lo), (keys n, d hi), (keys n + 1, d lo), (keys n + 1, d hi).
      float sc[MT][NT_S][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
          sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < KSTEPS; ++kk) {
        // A fragments: matrices (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (8-15, hi).
        uint32_t qf[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ldmatrix_x4(qf[mt],
                      &q_tile[warp * 16 * MT + mt * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
        }
#pragma unroll
        for (int n = 0; n < NT_S; n += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, &k_tile[stage][(n + (mi >> 1)) * 8 + ri][kk * 16 + (mi & 1) * 8]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(sc[mt][n], qf[mt], b[0], b[1]);
            mma_16816<T>(sc[mt][n + 1], qf[mt], b[2], b[3]);
          }
        }
      }

      // Scale, mask, and the online softmax of rows g (r = 0) and g + 8 (r = 1) of each tile.
      const bool edge = k0 + kMmaKeys > p.s_kv ||
                        (p.causal && k0 + kMmaKeys - 1 > q0 + warp * 16 * MT + shift) ||
                        p.mask != nullptr;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int n = 0; n < NT_S; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = sc[mt][n][e] * p.scale_log2;
            if (edge) {
              int row = row_of(mt, e >> 1);
              int col = k0 + n * 8 + tg * 2 + (e & 1);
              if (col >= p.s_kv || (p.causal && col > row + shift)) {
                x = neg_inf();
              } else if (p.mask != nullptr && row < p.s) {
                x += bits_to_float<T>(
                         p.mask[bi * p.ms[0] + hi * p.ms[1] + row * p.ms[2] + col * p.ms[3]]) *
                     kLog2e;
              }
            }
            sc[mt][n][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
          }
        }
        float corr[2], m_use[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
          float m_new = fmaxf(m[mt][r], mx[r]);
          // A row with no visible key so far keeps exp2(-inf - 0) = 0 instead of nan.
          m_use[r] = m_new == neg_inf() ? 0.f : m_new;
          corr[r] = exp2_approx(m[mt][r] - m_use[r]);
          m[mt][r] = m_new;
          l[mt][r] *= corr[r];
        }
#pragma unroll
        for (int n = 0; n < NT_S; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float pe = exp2_approx(sc[mt][n][e] - m_use[e >> 1]);
            sc[mt][n][e] = pe;
            l[mt][e >> 1] += pe;
          }
        }
#pragma unroll
        for (int n = 0; n < NT_O; ++n) {
          o[mt][n][0] *= corr[0];
          o[mt][n][1] *= corr[0];
          o[mt][n][2] *= corr[1];
          o[mt][n][3] *= corr[1];
        }
      }

      // O += P V: the score accumulators of key tiles 2j and 2j + 1 are the A fragment of
      // k-step j.
#pragma unroll
      for (int j = 0; j < kMmaKeys / 16; ++j) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          a[mt][0] = pack2<T>(sc[mt][2 * j][0], sc[mt][2 * j][1]);
          a[mt][1] = pack2<T>(sc[mt][2 * j][2], sc[mt][2 * j][3]);
          a[mt][2] = pack2<T>(sc[mt][2 * j + 1][0], sc[mt][2 * j + 1][1]);
          a[mt][3] = pack2<T>(sc[mt][2 * j + 1][2], sc[mt][2 * j + 1][3]);
        }
        // V^T fragments by transposed ldmatrix: (keys lo, dims n), (keys hi, dims n),
        // (keys lo, dims n + 1), (keys hi, dims n + 1) give (b0, b1) of output tiles n, n + 1.
#pragma unroll
        for (int n = 0; n < NT_O; n += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, &v_tile[stage][j * 16 + (mi & 1) * 8 + ri][(n + (mi >> 1)) * 8]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_16816<T>(o[mt][n], a[mt], b[0], b[1]);
            mma_16816<T>(o[mt][n + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is reloaded two tiles on
  }
  cp_async_wait<0>();  // no copy outlives the block (tiles = 0)

  uint16_t* ob = p.out + ((static_cast<int64_t>(bi) * p.h + hi) * p.s) * D;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    // Each thread summed a quarter of its rows' probabilities: finish across the quad.
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      inv[r] = lr > 0.f ? 1.f / lr : 0.f;
    }
    const int row_a = row_of(mt, 0), row_b = row_of(mt, 1);
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
      int c = n * 8 + tg * 2;
      if (row_a < p.s) {
        *reinterpret_cast<uint32_t*>(ob + static_cast<int64_t>(row_a) * D + c) =
            pack2<T>(o[mt][n][0] * inv[0], o[mt][n][1] * inv[0]);
      }
      if (row_b < p.s) {
        *reinterpret_cast<uint32_t*>(ob + static_cast<int64_t>(row_b) * D + c) =
            pack2<T>(o[mt][n][2] * inv[1], o[mt][n][3] * inv[1]);
      }
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
  float* part_o;   // (rows, splits, d): unnormalised outputs
  int* counters;   // per (b, h_kv, row, head chunk): splits done; zero before the launch
  int64_t qs[3], ks[3], vs[3], ms[4];
  int h, group, s, s_kv, d;
  int splits, keys_per_split, head_chunks;
  int row0;  // first query row of this launch (grid.y is limited to 65535)
  compute_t<T> scale;
  bool causal;
};

/// Grid (splits, rows x head chunks, b x h_kv); the warps of a block are query heads sharing
/// one k/v head. K/V tiles of 32 keys are double-buffered in shared memory as T (cp.async
/// 16-byte copies when kVec, else element copies); lane j scores key j of the tile. With
/// splits > 1 each block leaves its (max, sum, output) and the last block of a row merges them.
template <class T, bool kVec>
__global__ void attn_split_kernel(SplitArgs<T> p) {
  using C = compute_t<T>;
  constexpr int N = 16 / sizeof(T);  // elements per 16 bytes; also the row padding
  const int d = p.d, ld = d + N;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* k_tiles = reinterpret_cast<T*>(smem_raw);                      // [2][32][ld]
  T* v_tiles = k_tiles + 2 * kSplitKeys * ld;                       // [2][32][ld]
  C* q_rows = reinterpret_cast<C*>(v_tiles + 2 * kSplitKeys * ld);  // [warps][d]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int split = blockIdx.x;
  const int row = p.row0 + static_cast<int>(blockIdx.y) / p.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y) % p.head_chunks;
  const int bi = blockIdx.z / (p.h / p.group), hk = blockIdx.z % (p.h / p.group);
  const int head_in_group = chunk * kSplitMaxWarps + warp;
  const bool active = head_in_group < p.group;
  const int hi = hk * p.group + min(head_in_group, p.group - 1);

  // This warp's query, pre-scaled.
  const T* qr = p.q + bi * p.qs[0] + hi * p.qs[1] + row * p.qs[2];
  for (int t = lane; t < d; t += 32) q_rows[warp * d + t] = to_compute(qr[t]) * p.scale;

  const int shift = p.s_kv - p.s;
  const int key_lo = split * p.keys_per_split;
  int key_hi = min(p.s_kv, key_lo + p.keys_per_split);
  if (p.causal) key_hi = min(key_hi, max(0, row + shift + 1));
  const T* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  const T* vb = p.v + bi * p.vs[0] + hk * p.vs[1];

  auto load_tile = [&](int stage, int k0) {
    T* kt = k_tiles + stage * kSplitKeys * ld;
    T* vt = v_tiles + stage * kSplitKeys * ld;
    if constexpr (kVec) {
      const int per_row = d / N;
      for (int i = threadIdx.x; i < kSplitKeys * per_row; i += blockDim.x) {
        int r = i / per_row, c = (i % per_row) * N;
        bool valid = k0 + r < key_hi;
        int64_t key = valid ? k0 + r : key_lo;
        cp_async16(kt + r * ld + c, kb + key * p.ks[2] + c, valid);
        cp_async16(vt + r * ld + c, vb + key * p.vs[2] + c, valid);
      }
      cp_async_commit();
    } else {
      for (int i = threadIdx.x; i < kSplitKeys * d; i += blockDim.x) {
        int r = i / d, c = i % d;
        bool valid = k0 + r < key_hi;
        kt[r * ld + c] = valid ? kb[(k0 + r) * p.ks[2] + c] : convert<T>(0.0f);
        vt[r * ld + c] = valid ? vb[(k0 + r) * p.vs[2] + c] : convert<T>(0.0f);
      }
    }
  };

  C o[kMaxDimPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimPerLane; ++i) o[i] = 0;
  C m = lowest<C>(), l = 0;
  const int tiles = key_hi > key_lo ? (key_hi - key_lo + kSplitKeys - 1) / kSplitKeys : 0;
  if (tiles > 0) load_tile(0, key_lo);
  for (int it = 0; it < tiles; ++it) {
    const int k0 = key_lo + it * kSplitKeys, stage = it & 1;
    if (it + 1 < tiles) {
      load_tile(stage ^ 1, k0 + kSplitKeys);
      if constexpr (kVec) cp_async_wait<1>();
    } else {
      if constexpr (kVec) cp_async_wait<0>();
    }
    __syncthreads();  // the tile (and, the first time, q_rows) is visible
    const T* kt = k_tiles + stage * kSplitKeys * ld;
    const T* vt = v_tiles + stage * kSplitKeys * ld;
    // Lane j scores key k0 + j.
    const int key = k0 + lane;
    C sc = lowest<C>();
    if (key < key_hi) {
      C acc = 0;
      const T* kr = kt + lane * ld;
      const C* qw = q_rows + warp * d;
      if constexpr (kVec) {
        for (int c = 0; c < d; c += N) {
          Vec<T, N> kv = *reinterpret_cast<const Vec<T, N>*>(kr + c);
#pragma unroll
          for (int e = 0; e < N; ++e) acc += qw[c + e] * to_compute(kv.v[e]);
        }
      } else {
        for (int t = 0; t < d; ++t) acc += qw[t] * to_compute(kr[t]);
      }
      if (p.mask != nullptr) {
        acc += to_compute(p.mask[bi * p.ms[0] + hi * p.ms[1] + row * p.ms[2] + key * p.ms[3]]);
      }
      sc = acc;
    }
    C mx = sc;
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) mx = max(mx, shfl_xor(mx, w));
    C m_new = max(m, mx);
    if (m_new != lowest<C>()) {  // else nothing is visible yet (all -inf)
      C corr = m == lowest<C>() ? C(0) : exp_c(m - m_new);
      C pj = sc == lowest<C>() ? C(0) : exp_c(sc - m_new);
      C psum = pj;
#pragma unroll
      for (int w = 16; w > 0; w >>= 1) psum += shfl_xor(psum, w);
      l = l * corr + psum;
      m = m_new;
#pragma unroll
      for (int i = 0; i < kMaxDimPerLane; ++i) o[i] *= corr;
      const int nk = min(kSplitKeys, key_hi - k0);
      for (int j = 0; j < nk; ++j) {
        C pb = shfl_idx(pj, j);
        const T* vr = vt + j * ld;
#pragma unroll
        for (int i = 0; i < kMaxDimPerLane; ++i) {
          int t = lane + 32 * i;
          if (t < d) o[i] += pb * to_compute(vr[t]);
        }
      }
    }
    __syncthreads();  // this stage is reloaded two tiles on
  }

  const int64_t out_row = (static_cast<int64_t>(bi) * p.h + hi) * p.s + row;
  if (p.splits == 1) {
    if (!active) return;
    C inv = l > C(0) ? C(1) / l : C(0);
#pragma unroll
    for (int i = 0; i < kMaxDimPerLane; ++i) {
      int t = lane + 32 * i;
      if (t < d) p.out[out_row * d + t] = convert<T>(o[i] * inv);
    }
    return;
  }
  if (active) {
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
  // The last block of this (b, h_kv, row, head chunk) to finish merges the splits.
  __threadfence();
  __syncthreads();
  __shared__ int is_last;
  if (threadIdx.x == 0) {
    int64_t id = static_cast<int64_t>(blockIdx.z) * p.s * p.head_chunks +
                 static_cast<int64_t>(row) * p.head_chunks + chunk;
    is_last = atomicAdd(&p.counters[id], 1) == p.splits - 1;
  }
  __syncthreads();
  if (!is_last || !active) return;
  __threadfence();
  const float* ml = p.part_ml + out_row * p.splits * 2;
  float mx = neg_inf();
  for (int i = 0; i < p.splits; ++i) mx = fmaxf(mx, __ldcg(ml + 2 * i));
  float sum = 0;
  for (int i = 0; i < p.splits; ++i) {
    float mi = __ldcg(ml + 2 * i);
    if (mi != neg_inf()) sum += __ldcg(ml + 2 * i + 1) * __expf(mi - mx);
  }
  float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int t = lane; t < d; t += 32) {
    float acc = 0;
    for (int i = 0; i < p.splits; ++i) {
      float mi = __ldcg(ml + 2 * i);
      if (mi != neg_inf())
        acc += __ldcg(p.part_o + (out_row * p.splits + i) * d + t) * __expf(mi - mx);
    }
    p.out[out_row * d + t] = convert<T>(acc * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// Decode path: one query (s = 1) per head against a long KV cache; f16/bf16, d 64 or 128, a
// group of 1, 2, 4 or 8 query heads per k/v head, no mask. Grid (splits, b x h_kv): a block reads
// its range of keys of one k/v head once for the whole query-head group, D / 8 lanes per key (one
// 16-byte vector each), U keys per thread in flight (K and V loaded together); scores reduce by
// shuffles, the online softmax runs per thread, then one merge in the block. With several splits
// each block leaves (max, sum, output) and the last block of its k/v head merges them.

constexpr int kDecThreads = 256;
constexpr int kDecMaxSplits = 128;
constexpr int kDecCounterSlots = 4096;

// Blocks done per (b, k/v head). Zero at load; the merging block sets its slot back to zero, so
// no memset is needed per call (one attention at a time on the device's stream).
__device__ unsigned int g_decode_done[kDecCounterSlots];

struct DecodeArgs {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  uint16_t* out;
  float* part_ml;  // (b, h, splits, 2)
  float* part_o;   // (b, h, splits, d)
  int64_t qs[3], ks[3], vs[3];
  int h, h_kv, s_kv, splits, keys_per_split;
  float scale_log2;
};

template <class T>
__device__ __forceinline__ void unpack8(const uint4& r, float (&f)[8]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = bits_to_float<T>(static_cast<uint16_t>(w[i] & 0xffffu));
    f[2 * i + 1] = bits_to_float<T>(static_cast<uint16_t>(w[i] >> 16));
  }
}

template <class T, int D, int G>
__global__ void __launch_bounds__(kDecThreads) attn_decode_kernel(DecodeArgs p) {
  constexpr int LPK = D / 8;                        // lanes per key
  constexpr int SPW = 32 / LPK;                     // key streams per warp
  constexpr int NS = SPW * kDecThreads / 32;        // key streams per block
  constexpr int U = G >= 8 ? 2 : (G >= 4 ? 6 : 8);  // keys per stream and step (two in flight)
  __shared__ float s_m[NS][G];
  __shared__ float s_o[kDecThreads / 32][G][D];
  __shared__ float s_l[kDecThreads / 32][G];
  __shared__ float s_w[G][kDecMaxSplits];
  __shared__ float s_tot[G];
  __shared__ bool s_last;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slot = lane % LPK, stream = warp * SPW + lane / LPK;
  const int split = blockIdx.x, bkv = blockIdx.y;
  const int bi = bkv / p.h_kv, hk = bkv % p.h_kv;

  float qf[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const uint16_t* qr = p.q + bi * p.qs[0] + (hk * G + g) * p.qs[1] + slot * 8;
#pragma unroll
    for (int e = 0; e < 8; ++e) qf[g][e] = bits_to_float<T>(qr[e]) * p.scale_log2;
  }

  const int key_lo = split * p.keys_per_split;
  const int key_hi = min(p.s_kv, key_lo + p.keys_per_split);
  const uint16_t* kb = p.k + bi * p.ks[0] + hk * p.ks[1] + slot * 8;
  const uint16_t* vb = p.v + bi * p.vs[0] + hk * p.vs[1] + slot * 8;

  float o[G][8], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = neg_inf();
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[g][e] = 0.f;
  }
  // Keys k0 + NS u of this stream; zeros past the split (their scores are masked below).
  auto load_keys = [&](int k0, uint4(&kr)[U], uint4(&vr)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int key = k0 + NS * u;
      if (key < key_hi) {
        kr[u] = __ldg(reinterpret_cast<const uint4*>(kb + key * p.ks[2]));
        vr[u] = __ldg(reinterpret_cast<const uint4*>(vb + key * p.vs[2]));
      } else {
        kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  uint4 kr[U], vr[U];
  load_keys(key_lo + stream, kr, vr);
  // The trip count is the same for every lane (the shuffles below need the whole warp); a
  // stream past the split's end sees only masked keys.
  for (int base = key_lo; base < key_hi; base += NS * U) {
    const int k0 = base + stream;
    // The next keys are in flight while these are used.
    uint4 kn[U], vn[U];
    load_keys(k0 + NS * U, kn, vn);
    float sc[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      unpack8<T>(kr[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float a = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) a = fmaf(qf[g][e], kf[e], a);
        sc[u][g] = a;
      }
    }
#pragma unroll
    for (int off = LPK / 2; off > 0; off >>= 1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int g = 0; g < G; ++g) sc[u][g] += __shfl_xor_sync(0xffffffffu, sc[u][g], off);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (k0 + NS * u >= key_hi) {
#pragma unroll
        for (int g = 0; g < G; ++g) sc[u][g] = neg_inf();
      }
    }
    float pr[U][G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, sc[u][g]);
      // While this stream has seen no key, mx = -inf: exponents against 0 give 0, not nan.
      const float m_use = mx == neg_inf() ? 0.f : mx;
      float corr = exp2_approx(m[g] - m_use);  // 0 while m = -inf
      m[g] = mx;
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        pr[u][g] = exp2_approx(sc[u][g] - m_use);
        sum += pr[u][g];
      }
      l[g] = l[g] * corr + sum;
#pragma unroll
      for (int e = 0; e < 8; ++e) o[g][e] *= corr;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[8];
      unpack8<T>(vr[u], vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int e = 0; e < 8; ++e) o[g][e] = fmaf(pr[u][g], vf[e], o[g][e]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      kr[u] = kn[u];
      vr[u] = vn[u];
    }
  }

  // Merge the block's key streams: common max, then sums across streams and warps.
  if (slot == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) s_m[stream][g] = m[g];
  }
  __syncthreads();
  float mb[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float mx = neg_inf();
    for (int i = 0; i < NS; ++i) mx = fmaxf(mx, s_m[i][g]);
    mb[g] = mx;
    float f = m[g] == neg_inf() ? 0.f : exp2_approx(m[g] - mx);
    l[g] *= f;
#pragma unroll
    for (int e = 0; e < 8; ++e) o[g][e] *= f;
  }
#pragma unroll
  for (int off = LPK; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      l[g] += __shfl_xor_sync(0xffffffffu, l[g], off);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[g][e] += __shfl_xor_sync(0xffffffffu, o[g][e], off);
    }
  }
  if (lane < LPK) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < 8; ++e) s_o[warp][g][slot * 8 + e] = o[g][e];
      if (lane == 0) s_l[warp][g] = l[g];
    }
  }
  __syncthreads();
  const int64_t head0 = static_cast<int64_t>(bi) * p.h + hk * G;  // first query head's row
  for (int idx = threadIdx.x; idx < G * D; idx += kDecThreads) {
    int g = idx / D, c = idx % D;
    float acc = 0.f, sum = 0.f;
#pragma unroll
    for (int w = 0; w < kDecThreads / 32; ++w) {
      acc += s_o[w][g][c];
      sum += s_l[w][g];
    }
    if (p.splits == 1) {
      float r = sum > 0.f ? acc / sum : 0.f;
      p.out[(head0 + g) * D + c] = static_cast<uint16_t>(pack2<T>(r, 0.f) & 0xffffu);
    } else {
      int64_t part = (head0 + g) * p.splits + split;
      p.part_o[part * D + c] = acc;
      if (c == 0) {
        p.part_ml[part * 2] = mb[g];
        p.part_ml[part * 2 + 1] = sum;
      }
    }
  }
  if (p.splits == 1) return;

  // The last block of this (b, k/v head) merges the splits.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned done = atomicAdd(&g_decode_done[bkv], 1u);
    s_last = done == static_cast<unsigned>(p.splits) - 1;
    if (s_last) g_decode_done[bkv] = 0;  // ready for the next call
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < G * p.splits; idx += kDecThreads) {
    int g = idx / p.splits, i = idx % p.splits;
    s_w[g][i] = __ldcg(p.part_ml + ((head0 + g) * p.splits + i) * 2);
  }
  __syncthreads();
  if (threadIdx.x < G) {
    int g = threadIdx.x;
    float mx = neg_inf();
    for (int i = 0; i < p.splits; ++i) mx = fmaxf(mx, s_w[g][i]);
    float tot = 0.f;
    for (int i = 0; i < p.splits; ++i) {
      float mi = s_w[g][i];
      float w = mi == neg_inf() ? 0.f : exp2f(mi - mx);
      tot += w * __ldcg(p.part_ml + ((head0 + g) * p.splits + i) * 2 + 1);
      s_w[g][i] = w;
    }
    s_tot[g] = tot > 0.f ? 1.f / tot : 0.f;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kDecThreads) {
    int g = idx / D, c = idx % D;
    const float* po = p.part_o + (head0 + g) * p.splits * D + c;
    float acc = 0.f;
#pragma unroll 8
    for (int i = 0; i < p.splits; ++i) acc += s_w[g][i] * __ldcg(po + i * D);
    p.out[(head0 + g) * D + c] = static_cast<uint16_t>(pack2<T>(acc * s_tot[g], 0.f) & 0xffffu);
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
bool split_vec_fits(const AttentionArgs& a) {
  constexpr int N = 16 / sizeof(T);
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.d % N != 0 || !al(a.k) || !al(a.v)) return false;
  for (int i = 0; i < 3; ++i) {
    if (a.k_strides[i] % N != 0 || a.v_strides[i] % N != 0) return false;
  }
  return true;
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
    size_t counters = static_cast<size_t>(base) * sizeof(int);
    p.counters = static_cast<int*>(temp(counters));
    WICK_CUDA_CHECK(cudaMemsetAsync(p.counters, 0, counters, s));
  }
  constexpr int N = 16 / sizeof(T);
  size_t smem = 2 * 2 * kSplitKeys * (a.d + N) * sizeof(T) + warps * a.d * sizeof(C);
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024) {
      WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem)));
    }
    int rows_per_launch = 65535 / p.head_chunks;
    for (int row0 = 0; row0 < a.s; row0 += rows_per_launch) {
      p.row0 = row0;
      int n = std::min(rows_per_launch, a.s - row0);
      dim3 grid(p.splits, n * p.head_chunks, a.b * a.h_kv);
      kernel<<<grid, warps * 32, smem, s>>>(p);
      WICK_CUDA_CHECK_LAUNCH();
    }
  };
  if (split_vec_fits<T>(a)) {
    launch(attn_split_kernel<T, true>);
  } else {
    launch(attn_split_kernel<T, false>);
  }
}

// The decode kernel: s = 1, no mask, f16/bf16, d 64/128, group 1/2/4/8, 16-byte aligned k/v rows.
bool decode_fits(DType dtype, const AttentionArgs& a) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (a.s != 1 || a.mask != nullptr || (a.d != 64 && a.d != 128) || a.s_kv == 0) return false;
  int group = a.h / a.h_kv;
  if (group != 1 && group != 2 && group != 4 && group != 8) return false;
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!al(a.k) || !al(a.v)) return false;
  for (int i = 0; i < 3; ++i) {
    if (a.k_strides[i] % 8 != 0 || a.v_strides[i] % 8 != 0) return false;
  }
  return true;
}

// Splits per k/v head: WICK_DECODE_BLOCKS_PER_SM (default 1) blocks per multiprocessor in all.
int decode_blocks_per_sm() {
  static int n = [] {
    const char* e = std::getenv("WICK_DECODE_BLOCKS_PER_SM");
    int v = e != nullptr ? std::atoi(e) : 0;
    return v > 0 ? v : 1;
  }();
  return n;
}

template <class T>
void run_decode(const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
  DecodeArgs p{};
  p.q = static_cast<const uint16_t*>(a.q);
  p.k = static_cast<const uint16_t*>(a.k);
  p.v = static_cast<const uint16_t*>(a.v);
  p.out = static_cast<uint16_t*>(a.out);
  for (int i = 0; i < 3; ++i) {
    p.qs[i] = a.q_strides[i];
    p.ks[i] = a.k_strides[i];
    p.vs[i] = a.v_strides[i];
  }
  p.h = a.h;
  p.h_kv = a.h_kv;
  p.s_kv = a.s_kv;
  p.scale_log2 = a.scale * kLog2e;
  const int heads = a.b * a.h_kv;
  // Keys per split: a multiple of one pass of the block's key streams, at least one pass.
  constexpr int kPass = 64;
  int splits = 1;
  if (heads <= kDecCounterSlots) {
    int64_t want = (static_cast<int64_t>(decode_blocks_per_sm()) * sm_count() + heads - 1) / heads;
    splits = static_cast<int>(std::clamp<int64_t>(want, 1, kDecMaxSplits));
  }
  int kps = (a.s_kv + splits - 1) / splits;
  kps = std::max(kPass, (kps + kPass - 1) / kPass * kPass);
  p.keys_per_split = kps;
  p.splits = (a.s_kv + kps - 1) / kps;
  if (p.splits > 1) {
    size_t rows = static_cast<size_t>(a.b) * a.h * p.splits;
    p.part_ml = static_cast<float*>(temp(rows * 2 * sizeof(float)));
    p.part_o = static_cast<float*>(temp(rows * a.d * sizeof(float)));
  }
  dim3 grid(p.splits, heads);
  auto go = [&]<int D>() {
    switch (a.h / a.h_kv) {
      case 1:
        return attn_decode_kernel<T, D, 1><<<grid, kDecThreads, 0, s>>>(p);
      case 2:
        return attn_decode_kernel<T, D, 2><<<grid, kDecThreads, 0, s>>>(p);
      case 4:
        return attn_decode_kernel<T, D, 4><<<grid, kDecThreads, 0, s>>>(p);
      default:
        return attn_decode_kernel<T, D, 8><<<grid, kDecThreads, 0, s>>>(p);
    }
  };
  if (a.d == 64) {
    go.template operator()<64>();
  } else {
    go.template operator()<128>();
  }
  WICK_CUDA_CHECK_LAUNCH();
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
  p.q_vec = reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.q_strides[0] % 8 == 0 &&
            a.q_strides[1] % 8 == 0 && a.q_strides[2] % 8 == 0;
  dim3 grid(a.h, (a.s + kMmaRows - 1) / kMmaRows, a.b);
  auto launch = [&](auto kernel, int d) {
    // Q, and two stages of K and V tiles.
    int smem = (kMmaRows + 2 * 2 * kMmaKeys) * (d + kPad) * 2;
    if (smem > 48 * 1024) {
      WICK_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
    kernel<<<grid, kMmaWarps * 32, smem, s>>>(p);
  };
  if (a.d == 64) {
    launch(flash_mma_kernel<T, 64>, 64);
  } else {
    launch(flash_mma_kernel<T, 128>, 128);
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
  if (decode_fits(dtype, a)) {
    if (dtype == DType::BF16) return run_decode<__nv_bfloat16>(a, temp, s);
    return run_decode<__half>(a, temp, s);
  }
  if (dtype == DType::BF16 && mma_fits(a)) return run_mma<__nv_bfloat16>(a, s);
  if (dtype == DType::F16 && mma_fits(a)) return run_mma<__half>(a, s);
  if (a.s_kv == 0) {
    // No keys: zeros, as the CPU.
    WICK_CUDA_CHECK(cudaMemsetAsync(
        a.out, 0, static_cast<size_t>(a.b) * a.h * a.s * a.d * size_in_bytes(dtype), s));
    return;
  }
  dispatch_float<DeviceTypes>(dtype, "scaled_dot_product_attention",
                              [&]<class T>() { run_split<T>(a, temp, s); });
}

}  // namespace wick::cuda
