// Prefill attention with mma.sync, f16/bf16, d 64 or 128 (flash_mma_kernel): FlashAttention-2
// style. A block of 4 warps owns 128 queries of one head (Q in shared memory); each warp computes
// 32 query rows (two m16 tiles sharing each K/V fragment) with mma.sync m16n8k16, streams 64-key
// tiles of K and V through shared memory (cp.async, two stages, fragments read with ldmatrix),
// keeps the scores and the online softmax (running max and sum per row) in registers and reuses
// the probabilities as the A operand of P V without a trip through shared memory. Causal blocks
// stop at their last visible key and run longest-first. On compute capability 9.0 the wgmma
// kernel (attention_wgmma.cu) takes the cases it applies to.

#include <algorithm>
#include <cmath>

#include "cuda/attention_kernels.h"
#include "cuda/attention_mma.cuh"
#include "cuda/attention_operands.h"
#include "cuda/kernel_utils.cuh"

namespace wick::cuda {
namespace {

using namespace attn;

constexpr int kMmaWarps = 4;
constexpr int kMmaRowTiles = 2;                          // 16-row tiles per warp
constexpr int kMmaRows = 16 * kMmaRowTiles * kMmaWarps;  // queries per block
constexpr int kMmaKeys = 64;                             // keys per tile

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

}  // namespace

bool flash_mma_fits(const AttentionArgs& a) {
  return mma_fits(a);
}

void launch_flash_mma(DType dtype, const AttentionArgs& a, cudaStream_t s) {
  if (dtype == DType::BF16) return run_mma<__nv_bfloat16>(a, s);
  return run_mma<__half>(a, s);
}

}  // namespace wick::cuda
