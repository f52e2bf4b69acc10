// Scaled dot-product attention on CUDA: launch_attention picks, in order, flash_wgmma_kernel
// (attention_wgmma.cu: sm_90 prefill, f16/bf16, d 128, no mask), attn_rounded_kernel (f16/bf16
// rounded as transformers' eager attention, WICK_ATTENTION_ROUNDING=transformers),
// attn_decode_kernel (flash-decoding for s = 1 with tensor cores, split-KV over the whole GPU,
// merged by the last block of each head group), flash_mma_kernel (FlashAttention-2 style prefill
// with mma.sync, f16/ bf16, d 64 or 128) and attn_split_kernel (every float dtype, d <= 256: the
// warps of a block are the query heads sharing a k/v head, keys split across blocks). History:
// docs/perf/.

#include <algorithm>
#include <cmath>

#include "cuda/attention_operands.h"
#include "cuda/attention_wgmma.h"
#include "cuda/device_timeline.cuh"
#include "cuda/fused_kernels.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"
#include "util.h"

WICK_TIMELINE_TU(attention)

namespace wick::cuda {
namespace {

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

template <class T>
__device__ __forceinline__ float bits_to_float(uint16_t b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(__ushort_as_bfloat16(b));
  } else {
    return __half2float(__ushort_as_half(b));
  }
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
// Two 8x8 b16 matrices; lanes 0..15 give the row addresses.
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
// An 8x8 b16 matrix held as mma fragments (lane 4g + t: row g, columns 2t and 2t + 1),
// transposed across the warp.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

struct MmaArgs : HalfOperands {
  float scale_log2;  // scale * log2(e): the softmax runs in base 2
  bool q_vec;        // q rows 16-byte aligned: cp.async to shared memory
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
struct SplitArgs : Operands<T> {
  float* part_ml;  // (rows, splits, 2): max and sum per split, when splits > 1
  float* part_o;   // (rows, splits, d): unnormalised outputs
  int* counters;   // per (b, h_kv, row, head chunk): splits done; zero before the launch
  int d;
  int splits, keys_per_split, head_chunks;
  int row0;  // first query row of this launch (grid.y is limited to 65535)
  compute_t<T> scale;
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
// Decode path (flash-decoding): one query (s = 1) per head against a long KV cache; f16/bf16, d 16,
// 32, 64, 96 or 128, any number of query heads per k/v head, an optional additive mask. Grid
// (splits, b x h_kv x head chunks): a block reads K and V of one k/v head once for up to 8 of its
// query heads, the columns of an m16n8k16 tensor-core tile whose 16 rows are keys (missing heads
// are zeros: keys as the rows take half the mma instructions of heads as the rows). Keys come in
// tiles of 16, dealt round-robin to the blocks of a head and within a block to its warps, so that
// any prefix of visible keys is spread evenly: the graph-captured Llama step hides the cache rows
// past its position (a device last key, or a mask of -inf), and tiles with no visible key are
// neither read nor computed. Each warp streams its tiles through its own shared-memory ring
// (cp.async, kDecStages deep, no block barrier), keeps S^T = K Q^T, the online softmax and
// O^T += V^T P^T in registers (P's fragments transposed by movmatrix), then the warps merge in
// shared memory. With several splits each block leaves (max, sum, output) and the last block of
// its head group (an atomic count) merges them: one kernel. In the graph-captured decode step the
// cache rows before the position start loading before pdl_wait.

constexpr int kDecKeys = 16;   // keys per tile: one k-step of P V
constexpr int kDecStages = 3;  // tiles in flight per warp
constexpr int kDecRows = 8;    // query heads per block: the mma's N
constexpr int kDecWarps = 8;   // a block: one a multiprocessor
constexpr int kDecMaxSplits = 128;
constexpr int kDecMerge = 16;  // splits merged per round trip by the last block
constexpr int kDecCounterSlots = 4096;

// Blocks done per (b, k/v head, head chunk). Zero at load; the merging block sets its slot back
// to zero, so no memset is needed per call (one attention at a time on the device's stream).
__device__ unsigned int g_decode_done[kDecCounterSlots];

// What a decode kernel is compiled for: without a mask or a last key (Plain), with a last key and
// no mask (LastKey: the graph-captured decode step), with a mask (Masked, a last key or not): each
// compiles out what it is not asked for.
enum class DecodeMode { Plain, LastKey, Masked };

struct DecodeArgs {
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  const uint16_t* mask;      // null when absent
  const uint32_t* last_key;  // null when absent: keys after it are hidden
  uint16_t* out;
  float* part_ml;  // (b, h, splits, 2): max (base 2) and sum per split, when splits > 1
  float* part_o;   // (b, h, splits, d): unnormalised outputs
  int64_t qs[3], ks[3], vs[3], ms[4];
  int h, h_kv, group, chunks, s_kv, splits;
  float scale_log2;        // scale * log2(e): the softmax runs in base 2
  bool launch_next_early;  // AttentionArgs::launch_next_early
  bool q_pairs;            // q's rows 4-byte aligned: read 32 bits at a time
};

template <class T, int D, DecodeMode M>
__global__ void __launch_bounds__(kDecWarps * 32) attn_decode_kernel(DecodeArgs p) {
  constexpr int LD = D + kPad;              // halves per shared row (no ldmatrix conflicts)
  constexpr int KSTEPS = D / 16;            // k-steps of Q K^T
  constexpr int PIECES = D / 8;             // 16-byte pieces per K or V row
  constexpr int STAGE = 2 * kDecKeys * LD;  // halves per ring stage: K tile, then V tile
  constexpr int OLD = D + 8;                // floats per row of the merge buffer
  extern __shared__ __align__(16) unsigned char dec_smem[];
  auto q_tile = reinterpret_cast<uint16_t(*)[LD]>(dec_smem);
  uint16_t* ring = reinterpret_cast<uint16_t*>(dec_smem + kDecRows * LD * 2);
  __shared__ float s_m[kDecWarps][kDecRows], s_l[kDecWarps][kDecRows];
  __shared__ bool s_last;

  WICK_TL_START();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, tg = lane & 3, mi = lane >> 3, ri = lane & 7;
  const int split = blockIdx.x, unit = blockIdx.y;
  const int chunk = unit % p.chunks, bkv = unit / p.chunks;
  const int bi = bkv / p.h_kv, hk = bkv % p.h_kv;
  const int head0 = hk * p.group + chunk * kDecRows;  // this block's first query head
  const int rows = min(kDecRows, p.group - chunk * kDecRows);
  const uint16_t* kb = p.k + bi * p.ks[0] + hk * p.ks[1];
  const uint16_t* vb = p.v + bi * p.vs[0] + hk * p.vs[1];
  constexpr bool masked = M == DecodeMode::Masked;
  const uint16_t* mb = masked ? p.mask + bi * p.ms[0] + head0 * p.ms[1] : nullptr;
  const int mask_rows = p.ms[1] == 0 ? 1 : rows;  // a mask shared by the heads is read once

  // This warp's tiles: first + step * i for i < count.
  const int first = split + p.splits * warp, step = p.splits * kDecWarps;
  // With a device last key and no mask (the graph-captured decode step), the key itself and the
  // cache rows before it were written before the kernel before this one (the caller's promise,
  // AttentionArgs::last_key): they are read before pdl_wait, and only q, the last key's row and
  // a mask wait for that kernel.
  constexpr bool rows_before = M == DecodeMode::LastKey;
  if (!rows_before) {
    pdl_wait();
    WICK_TL_WAITED();
  }
  // Keys [0, keys) are read: all, or up to the last visible one.
  const int keys = M == DecodeMode::Plain || p.last_key == nullptr
                       ? p.s_kv
                       : static_cast<int>(min(*p.last_key, static_cast<uint32_t>(p.s_kv - 1))) + 1;
  const int tiles = (keys + kDecKeys - 1) / kDecKeys;
  const int count = first < tiles ? (tiles - 1 - first) / step + 1 : 0;
  uint16_t* my_ring = ring + warp * kDecStages * STAGE;

  // Whether this lane sees a visible key of tile t (a mask value of -inf hides a key); a tile is
  // loaded and computed when some lane does. Without a mask every tile is, with no warp vote or
  // record of the loaded stages (compiled out).
  auto lane_sees = [&](int t) {
    if constexpr (!masked) return true;
    const int key = t * kDecKeys + (lane & 15);
    bool vis = false;
    if (key < keys) {
      for (int r = lane >> 4; r < mask_rows; r += 2) {
        vis = vis || bits_to_float<T>(mb[r * p.ms[1] + key * p.ms[3]]) != neg_inf();
      }
    }
    return vis;
  };
  auto visible = [&](int t) { return !masked || __any_sync(0xffffffffu, lane_sees(t)) != 0; };
  // Tile t into ring stage st: 16-byte copies, zeros past the last key (0 * garbage could be nan).
  // A lane copies the same 16-byte piece of every RSTEP-th row of a tile (d other than 96): its
  // addresses step by a stride fixed at the start, and only the last tile checks its rows
  // (fewer instructions a tile than an address computed per copy).
  constexpr int RSTEP = 32 % PIECES == 0 ? 32 / PIECES : 1;
  const int lane_row = lane / PIECES, lane_col = (lane % PIECES) * 8;
  const int64_t k_step = RSTEP * p.ks[2], v_step = RSTEP * p.vs[2];
  auto issue = [&](int st, int t) {
    uint16_t* kt = my_ring + st * STAGE;
    uint16_t* vt = kt + kDecKeys * LD;
    const int k0 = t * kDecKeys;
    if constexpr (32 % PIECES == 0) {
      const uint16_t* ksrc = kb + static_cast<int64_t>(k0 + lane_row) * p.ks[2] + lane_col;
      const uint16_t* vsrc = vb + static_cast<int64_t>(k0 + lane_row) * p.vs[2] + lane_col;
      const bool whole = k0 + kDecKeys <= keys;
#pragma unroll
      for (int j = 0; j < kDecKeys / RSTEP; ++j) {
        const int r = lane_row + RSTEP * j;
        const bool valid = whole || k0 + r < keys;
        cp_async16(kt + r * LD + lane_col, valid ? ksrc + j * k_step : kb, valid);
        cp_async16(vt + r * LD + lane_col, valid ? vsrc + j * v_step : vb, valid);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kDecKeys * PIECES / 32; ++j) {
        const int i = lane + 32 * j, r = i / PIECES, c = (i % PIECES) * 8;
        const bool valid = k0 + r < keys;
        const int64_t key = valid ? k0 + r : 0;
        cp_async16(kt + r * LD + c, kb + key * p.ks[2] + c, valid);
        cp_async16(vt + r * LD + c, vb + key * p.vs[2] + c, valid);
      }
    }
  };
  // The first tiles start streaming before anything else, ring stages [from, to). Every lane
  // commits one group per tile slot, loaded or not, so that cp.async.wait_group counts tiles.
  unsigned live = 0;  // bit st: the tile in ring stage st was loaded (it has a visible key)
  auto start_tiles = [&](int from, int to) {
    bool sees[kDecStages - 1];  // the mask reads of these tiles are in flight together
#pragma unroll
    for (int st = 0; st < kDecStages - 1; ++st) {
      sees[st] = st >= from && st < to && st < count && lane_sees(first + step * st);
    }
#pragma unroll
    for (int st = 0; st < kDecStages - 1; ++st) {
      if (st < from || st >= to) continue;
      if (st < count && (!masked || __any_sync(0xffffffffu, sees[st]))) {
        issue(st, first + step * st);
        live |= 1u << st;
      }
      cp_async_commit();
    }
  };
  // The tile of the last key (the last tile) waits for the kernel before, in the one warp whose
  // first tiles hold it.
  int early_stages = kDecStages - 1;
  if (rows_before && count > 0 && count - 1 < kDecStages - 1 &&
      first + step * (count - 1) == tiles - 1) {
    early_stages = count - 1;
  }
  // The query rows, zeros past this block's heads, 32 bits at a time.
  auto q_word = [&](int i) {
    const int r = i / (D / 2), c = (i % (D / 2)) * 2;
    if (r >= rows) return 0u;
    const uint16_t* qr = p.q + bi * p.qs[0] + (head0 + r) * p.qs[1] + c;
    if (p.q_pairs) return *reinterpret_cast<const uint32_t*>(qr);
    return static_cast<uint32_t>(qr[0]) | (static_cast<uint32_t>(qr[1]) << 16);
  };
  auto store_q = [&](int i, uint32_t word) {
    *reinterpret_cast<uint32_t*>(&q_tile[i / (D / 2)][(i % (D / 2)) * 2]) = word;
  };
  // Where the kernel waits first, q goes into registers before any tile is asked for, so that it
  // does not queue behind them. With rows read before pdl_wait, q is loaded after the last key's
  // tile, as a plain loop.
  constexpr int Q_WORDS = kDecRows * (D / 2);
  constexpr int Q_PER_THREAD = (Q_WORDS + kDecWarps * 32 - 1) / (kDecWarps * 32);
  uint32_t q_words[Q_PER_THREAD];
  if (!rows_before) {
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      q_words[j] = i < Q_WORDS ? q_word(i) : 0u;
    }
  }
  start_tiles(0, early_stages);
  if (p.launch_next_early) pdl_launch_dependents();
  if (rows_before) {  // q and the last key's row come from the kernel before
    pdl_wait();
    WICK_TL_WAITED();
  }
  start_tiles(early_stages, kDecStages - 1);

  // The query rows into shared memory, then their B fragments, kept in registers.
  if (rows_before) {
    for (int i = threadIdx.x; i < Q_WORDS; i += blockDim.x) store_q(i, q_word(i));
  } else {
#pragma unroll
    for (int j = 0; j < Q_PER_THREAD; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < Q_WORDS) store_q(i, q_words[j]);
    }
  }
  __syncthreads();
  // Q^T is the B operand of S^T = K Q^T (8 heads, 16 dims a k-step); the keys are the A's rows.
  uint32_t qf[KSTEPS][2];
#pragma unroll
  for (int kk = 0; kk + 1 < KSTEPS; kk += 2) {
    uint32_t r[4];
    ldmatrix_x4(r, &q_tile[lane & 7][kk * 16 + (lane >> 3) * 8]);
    qf[kk][0] = r[0];
    qf[kk][1] = r[1];
    qf[kk + 1][0] = r[2];
    qf[kk + 1][1] = r[3];
  }
  if constexpr (KSTEPS % 2 == 1) {
    uint32_t r[2];
    ldmatrix_x2(r, &q_tile[lane & 7][(KSTEPS - 1) * 16 + ((lane >> 3) & 1) * 8]);
    qf[KSTEPS - 1][0] = r[0];
    qf[KSTEPS - 1][1] = r[1];
  }
  WICK_TL_MARK(0);

  // O^T, tile n: dims 16n + g (elements 0, 1) and 16n + g + 8 (2, 3) of heads 2tg and 2tg + 1.
  constexpr int NT = D / 16;
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  // Heads 2tg (j = 0) and 2tg + 1 (j = 1): running max (base 2) and this lane's sum.
  float m[2] = {neg_inf(), neg_inf()}, l[2] = {0.f, 0.f};
  for (int i = 0; i < count; ++i) {
    {
      const int ahead = i + kDecStages - 1, st = ahead % kDecStages;
      live &= ~(1u << st);
      if (ahead < count && visible(first + step * ahead)) {
        issue(st, first + step * ahead);
        live |= 1u << st;
      }
      cp_async_commit();
    }
    cp_async_wait<kDecStages - 1>();  // tile i has landed (this lane's copies)
    __syncwarp();                     // ... and every lane's
    const int st = i % kDecStages;
    if (!masked || ((live >> st) & 1u)) {
      const uint16_t* kt = my_ring + st * STAGE;
      const uint16_t* vt = kt + kDecKeys * LD;
      const int k0 = (first + step * i) * kDecKeys;
      // S^T = K Q^T, 16 keys x 8 heads: lane (g, tg) holds keys g and g + 8 of heads 2tg and
      // 2tg + 1. Even and odd k-steps accumulate apart (shorter chains).
      float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < KSTEPS; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, kt + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8);
        mma_16816<T>(sc[kk & 1], a, qf[kk][0], qf[kk][1]);
      }
      // Scale, mask, online softmax per head (j: head 2tg + j).
      float s4[4], mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = (sc[0][e] + sc[1][e]) * p.scale_log2;
        const int key = k0 + g + 8 * (e >> 1);
        const int r = 2 * tg + (e & 1);
        if (key >= keys) {
          x = neg_inf();
        } else if (masked && r < rows) {
          x += bits_to_float<T>(mb[r * p.ms[1] + key * p.ms[3]]) * kLog2e;
        }
        s4[e] = x;
        mx[e & 1] = fmaxf(mx[e & 1], x);
      }
      float corr[2], m_use[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int sh = 4; sh < 32; sh <<= 1) {
          mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], sh));
        }
        const float m_new = fmaxf(m[j], mx[j]);
        m_use[j] = m_new == neg_inf() ? 0.f : m_new;  // no visible key yet: exp2(-inf) = 0
        corr[j] = exp2_approx(m[j] - m_use[j]);
        m[j] = m_new;
        l[j] *= corr[j];
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s4[e] = exp2_approx(s4[e] - m_use[e & 1]);
        l[e & 1] += s4[e];
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        o[n][0] *= corr[0];
        o[n][1] *= corr[1];
        o[n][2] *= corr[0];
        o[n][3] *= corr[1];
      }
      // O^T += V^T P^T: P^T's B fragments are P's (keys 0-7, then 8-15) transposed in
      // registers; V^T's A fragments come by transposed ldmatrix, 16 dims at a time.
      const uint32_t b0 = movmatrix_trans(pack2<T>(s4[0], s4[1]));
      const uint32_t b1 = movmatrix_trans(pack2<T>(s4[2], s4[3]));
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, vt + ((mi >> 1) * 8 + ri) * LD + n * 16 + (mi & 1) * 8);
        mma_16816<T>(o[n], a, b0, b1);
      }
    }
    __syncwarp();  // the next iteration refills stage (i + kDecStages) % kDecStages = this one
  }
  cp_async_wait<0>();  // no copy outlives the loop (tiles that were not computed)
  WICK_TL_MARK(1);
  pdl_launch_dependents();

  // Merge the warps: each leaves (max, sum, output) of its rows; the ring becomes the buffer.
  __syncthreads();
  float* s_o = reinterpret_cast<float*>(ring);  // [kDecWarps][kDecRows][OLD]
#pragma unroll
  for (int r2 = 0; r2 < 2; ++r2) {
    float lr = l[r2];  // this lane's keys' part of the head's sum: finish across the warp
    for (int sh = 4; sh < 32; sh <<= 1) lr += __shfl_xor_sync(0xffffffffu, lr, sh);
    const int r = 2 * tg + r2;
    if (r < rows) {
      if (g == 0) {
        s_m[warp][r] = m[r2];
        s_l[warp][r] = lr;
      }
      float* orow = s_o + (warp * kDecRows + r) * OLD;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        orow[n * 16 + g] = o[n][r2];
        orow[n * 16 + g + 8] = o[n][2 + r2];
      }
    }
  }
  __syncthreads();
  const int64_t out_row0 = static_cast<int64_t>(bi) * p.h + head0;
  for (int idx = threadIdx.x; idx < rows * (D / 2); idx += blockDim.x) {
    const int r = idx / (D / 2), c = (idx % (D / 2)) * 2;
    // Unrolled over the block's warps, so that the shared-memory loads go out together.
    float mw[kDecWarps];
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      mw[w] = s_m[w][r];
      mx = fmaxf(mx, mw[w]);
    }
    float sum = 0.f, a0 = 0.f, a1 = 0.f;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) {
      const float f = mw[w] == neg_inf() ? 0.f : exp2_approx(mw[w] - mx);  // 0: saw no key
      const float2 ov = *reinterpret_cast<const float2*>(s_o + (w * kDecRows + r) * OLD + c);
      sum += f * s_l[w][r];
      a0 += f * ov.x;
      a1 += f * ov.y;
    }
    if (p.splits == 1) {
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      *reinterpret_cast<uint32_t*>(p.out + (out_row0 + r) * D + c) = pack2<T>(a0 * inv, a1 * inv);
    } else {
      const int64_t part = (out_row0 + r) * p.splits + split;
      *reinterpret_cast<float2*>(p.part_o + part * D + c) = make_float2(a0, a1);
      if (c == 0) {
        p.part_ml[part * 2] = mx;
        p.part_ml[part * 2 + 1] = sum;
      }
    }
  }
  WICK_TL_MARK(2);
  if (p.splits == 1) {
    WICK_TL_END(3u << 28 | 1u);
    WICK_TL_END_MARKS(5u << 28);
    return;
  }

  // The last block of this head group merges the splits. One acquire-release count by thread 0
  // after the block's barrier: release is cumulative (it publishes the partials every thread
  // wrote before the barrier) and the barrier after it passes the other blocks' partials on to
  // this block's threads (one fence, not one a thread).
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned done;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;"
                 : "=r"(done)
                 : "l"(&g_decode_done[unit])
                 : "memory");
    s_last = done == static_cast<unsigned>(p.splits) - 1;
    if (s_last) g_decode_done[unit] = 0;  // ready for the next call
  }
  __syncthreads();
  if (!s_last) {
    WICK_TL_END(3u << 28 | static_cast<uint32_t>(p.splits));
    WICK_TL_END_MARKS(5u << 28);
    return;
  }
  // Each thread merges four outputs of a row: the (max, sum) pairs and outputs of kDecMerge
  // splits are loaded at once (one round trip to the L2 per chunk), the running sums rescaled
  // to each chunk's max.
  for (int idx = threadIdx.x; idx < rows * (D / 4); idx += blockDim.x) {
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
    const float* po = p.part_o + (out_row0 + r) * p.splits * D + c;
    const float2* ml = reinterpret_cast<const float2*>(p.part_ml + (out_row0 + r) * p.splits * 2);
    float mx = neg_inf(), sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i0 = 0; i0 < p.splits; i0 += kDecMerge) {
      float4 v[kDecMerge];
      float2 mls[kDecMerge];
#pragma unroll
      for (int i = 0; i < kDecMerge; ++i) {
        if (i0 + i < p.splits) {
          v[i] = __ldcg(reinterpret_cast<const float4*>(po + (i0 + i) * D));
          mls[i] = __ldcg(ml + i0 + i);
        } else {
          v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
          mls[i] = make_float2(neg_inf(), 0.f);
        }
      }
      float cmx = mx;
#pragma unroll
      for (int i = 0; i < kDecMerge; ++i) cmx = fmaxf(cmx, mls[i].x);
      const float f = mx == neg_inf() ? 0.f : exp2_approx(mx - cmx);  // sums so far are 0 then
      mx = cmx;
      sum *= f;
      acc.x *= f;
      acc.y *= f;
      acc.z *= f;
      acc.w *= f;
#pragma unroll
      for (int i = 0; i < kDecMerge; ++i) {
        const float wgt = mls[i].x == neg_inf() ? 0.f : exp2_approx(mls[i].x - mx);
        sum += wgt * mls[i].y;
        acc.x += wgt * v[i].x;
        acc.y += wgt * v[i].y;
        acc.z += wgt * v[i].z;
        acc.w += wgt * v[i].w;
      }
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    *reinterpret_cast<uint2*>(p.out + (out_row0 + r) * D + c) =
        make_uint2(pack2<T>(acc.x * inv, acc.y * inv), pack2<T>(acc.z * inv, acc.w * inv));
  }
  WICK_TL_END(3u << 28 | 1u << 16 | static_cast<uint32_t>(p.splits));
  WICK_TL_END_MARKS(5u << 28 | 1u << 16);
}

// ---------------------------------------------------------------------------------------------
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
  static_cast<Operands<T>&>(p) = operands<T>(a);
  p.d = a.d;
  p.scale = static_cast<C>(a.scale);
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

// Shared memory of a decode block: the query rows, then each warp's ring of K and V tiles.
size_t decode_smem(int d) {
  return static_cast<size_t>(kDecRows + kDecWarps * kDecStages * 2 * kDecKeys) *
         static_cast<size_t>(d + kPad) * 2;
}

// The decode kernel: s = 1, f16/bf16, d 16/32/64/96/128, 16-byte aligned k/v rows, an 8-byte
// aligned output (any group, with or without a mask; causal is moot for one end-aligned query).
bool decode_fits(DType dtype, const AttentionArgs& a) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (a.s != 1 || a.s_kv == 0) return false;
  if (a.d != 16 && a.d != 32 && a.d != 64 && a.d != 96 && a.d != 128) return false;
  const int64_t chunks = (a.h / a.h_kv + kDecRows - 1) / kDecRows;
  if (static_cast<int64_t>(a.b) * a.h_kv * chunks > 65535) return false;  // grid.y
  auto al = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (!al(a.k, 16) || !al(a.v, 16) || !al(a.out, 8)) return false;
  for (int i = 0; i < 3; ++i) {
    if (a.k_strides[i] % 8 != 0 || a.v_strides[i] % 8 != 0) return false;
  }
  // Its shared memory (d = 128, 8 warps: 213 KB) on GPUs that have less.
  return decode_smem(a.d) <= shared_per_block_optin();
}

template <class T, int D>
void run_decode(const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
  DecodeArgs p{};
  p.q = static_cast<const uint16_t*>(a.q);
  p.k = static_cast<const uint16_t*>(a.k);
  p.v = static_cast<const uint16_t*>(a.v);
  p.mask = static_cast<const uint16_t*>(a.mask);
  p.last_key = a.last_key;
  p.out = static_cast<uint16_t*>(a.out);
  for (int i = 0; i < 3; ++i) {
    p.qs[i] = a.q_strides[i];
    p.ks[i] = a.k_strides[i];
    p.vs[i] = a.v_strides[i];
  }
  for (int i = 0; i < 4; ++i) p.ms[i] = a.mask != nullptr ? a.mask_strides[i] : 0;
  p.h = a.h;
  p.h_kv = a.h_kv;
  p.group = a.h / a.h_kv;
  p.chunks = (p.group + kDecRows - 1) / kDecRows;
  p.s_kv = a.s_kv;
  const int64_t tiles = (a.s_kv + kDecKeys - 1) / kDecKeys;
  p.scale_log2 = a.scale * kLog2e;
  p.launch_next_early = a.launch_next_early && a.last_key != nullptr;
  p.q_pairs = reinterpret_cast<uintptr_t>(a.q) % 4 == 0 && a.q_strides[0] % 2 == 0 &&
              a.q_strides[1] % 2 == 0;

  auto kernel = a.mask != nullptr       ? attn_decode_kernel<T, D, DecodeMode::Masked>
                : a.last_key != nullptr ? attn_decode_kernel<T, D, DecodeMode::LastKey>
                                        : attn_decode_kernel<T, D, DecodeMode::Plain>;
  const size_t smem = decode_smem(D);
  // Above 48 KB of shared memory only by this attribute (per device: set at every launch).
  WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
  // Blocks resident per multiprocessor (shared memory decides, the same for every mode), asked
  // once.
  static const int per_sm = [&] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kDecWarps * 32, smem) !=
        cudaSuccess) {
      (void)cudaGetLastError();  // not left for the launch check below
      n = 1;
    }
    return std::max(n, 1);
  }();
  // Splits: one wave of blocks over the GPU at most (WICK_DECODE_SPLITS forces a count up to
  // kDecMaxSplits and the tiles).
  const int units = a.b * a.h_kv * p.chunks;
  int splits = 1;
  if (units <= kDecCounterSlots) {
    static const int forced = config().decode_splits;
    int64_t want = forced > 0 ? forced : static_cast<int64_t>(sm_count()) * per_sm / units;
    // Splits beyond one merge round trip only when fewer would leave a tenth of the GPU idle.
    if (forced == 0 && want > kDecMerge &&
        static_cast<int64_t>(units) * kDecMerge * 10 >= 9 * static_cast<int64_t>(sm_count())) {
      want = kDecMerge;
    }
    // One block reads up to two tiles a warp; more go to splits of a tile a warp (a warp's tile
    // costs about as much as merging the splits once).
    const int64_t useful = forced > 0               ? tiles
                           : tiles <= 2 * kDecWarps ? 1
                                                    : (tiles + kDecWarps - 1) / kDecWarps;
    splits =
        static_cast<int>(std::clamp<int64_t>(want, 1, std::min<int64_t>(kDecMaxSplits, useful)));
  }
  p.splits = splits;
  if (splits > 1) {
    const size_t rows = static_cast<size_t>(a.b) * a.h * splits;
    p.part_ml = static_cast<float*>(temp(rows * 2 * sizeof(float)));
    p.part_o = static_cast<float*>(temp(rows * D * sizeof(float)));
  }
  launch_pdl_carveout(kCarveoutMaxShared, kernel, dim3(splits, units), dim3(kDecWarps * 32), smem,
                      s, p);
}

// Shared memory of flash_mma_kernel: Q, and two stages of K and V tiles.
size_t flash_smem_bytes(int d) {
  return static_cast<size_t>(kMmaRows + 2 * 2 * kMmaKeys) * static_cast<size_t>(d + kPad) * 2;
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
  // Q and two stages of K and V tiles (d = 128: 104 KB) on GPUs that have less.
  return flash_smem_bytes(a.d) <= shared_per_block_optin();
}

template <class T>
void run_mma(const AttentionArgs& a, cudaStream_t s) {
  MmaArgs p{operands<uint16_t>(a), a.scale * kLog2e, false};
  p.q_vec = reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.q_strides[0] % 8 == 0 &&
            a.q_strides[1] % 8 == 0 && a.q_strides[2] % 8 == 0;
  dim3 grid(a.h, (a.s + kMmaRows - 1) / kMmaRows, a.b);
  auto launch = [&](auto kernel, int d) {
    const int smem = static_cast<int>(flash_smem_bytes(d));
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

// The kernels launch_attention chooses from, in the order it asks whether they apply.
enum class AttentionKernel { Rounded, Decode, FlashWgmma, FlashMma, NoKeys, Split };

AttentionKernel choose_kernel(DType dtype, const AttentionArgs& a) {
  if (rounded_fits(dtype, a)) return AttentionKernel::Rounded;
  if (decode_fits(dtype, a)) return AttentionKernel::Decode;
  if ((dtype == DType::BF16 || dtype == DType::F16) && mma_fits(a)) {
    return flash_wgmma_fits(dtype, a) ? AttentionKernel::FlashWgmma : AttentionKernel::FlashMma;
  }
  if (a.s_kv == 0) return AttentionKernel::NoKeys;
  return AttentionKernel::Split;
}

}  // namespace

bool attention_last_key_fits(DType dtype, const AttentionArgs& a) {
  return a.mask == nullptr && !a.causal && choose_kernel(dtype, a) == AttentionKernel::Decode;
}

const char* attention_kernel_name(DType dtype, const AttentionArgs& a) {
  switch (choose_kernel(dtype, a)) {
    case AttentionKernel::Rounded:
      return "attn_rounded_kernel";
    case AttentionKernel::Decode:
      return "attn_decode_kernel";
    case AttentionKernel::FlashWgmma:
      return "flash_wgmma_kernel";
    case AttentionKernel::FlashMma:
      return "flash_mma_kernel";
    case AttentionKernel::NoKeys:
      return "none (no keys: zeros)";
    case AttentionKernel::Split:
      break;
  }
  return "attn_split_kernel";
}

void launch_attention(DType dtype, const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
#ifdef WICK_DEVICE_TIMELINE
  timeline::write_at_exit();
#endif
  if (static_cast<int64_t>(a.b) * a.h * a.s * a.d == 0) return;
  if (a.last_key != nullptr && !attention_last_key_fits(dtype, a)) {
    throw BackendError("scaled_dot_product_attention: a device last key needs the decode kernel");
  }
  if (a.d > 32 * kMaxDimPerLane &&
      !((dtype == DType::BF16 || dtype == DType::F16) && mma_fits(a))) {
    throw UnsupportedDType(
        str("scaled_dot_product_attention: head dim ", a.d, " is above 256 on cuda"));
  }
  switch (choose_kernel(dtype, a)) {
    case AttentionKernel::Rounded:
      if (dtype == DType::BF16) return run_rounded<__nv_bfloat16>(a, s);
      return run_rounded<__half>(a, s);
    case AttentionKernel::Decode: {
      auto by_dim = [&]<class T>() {
        switch (a.d) {
          case 16:
            return run_decode<T, 16>(a, temp, s);
          case 32:
            return run_decode<T, 32>(a, temp, s);
          case 64:
            return run_decode<T, 64>(a, temp, s);
          case 96:
            return run_decode<T, 96>(a, temp, s);
          default:
            return run_decode<T, 128>(a, temp, s);
        }
      };
      if (dtype == DType::BF16) return by_dim.template operator()<__nv_bfloat16>();
      return by_dim.template operator()<__half>();
    }
    case AttentionKernel::FlashWgmma:
      return launch_flash_wgmma(dtype, a, s);
    case AttentionKernel::FlashMma:
      if (dtype == DType::BF16) return run_mma<__nv_bfloat16>(a, s);
      return run_mma<__half>(a, s);
    case AttentionKernel::NoKeys:
      // No keys: zeros, as the CPU.
      WICK_CUDA_CHECK(cudaMemsetAsync(
          a.out, 0, static_cast<size_t>(a.b) * a.h * a.s * a.d * size_in_bytes(dtype), s));
      return;
    case AttentionKernel::Split:
      break;
  }
  dispatch_float<DeviceTypes>(dtype, "scaled_dot_product_attention",
                              [&]<class T>() { run_split<T>(a, temp, s); });
}

}  // namespace wick::cuda
