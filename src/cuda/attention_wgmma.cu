// Prefill attention on sm_90a with wgmma (warpgroup MMA), f16/bf16, d = 128: flash_wgmma_kernel.
// This file alone is compiled for sm_90a (src/CMakeLists.txt): wgmma exists on no other target,
// and sm_90a code runs on compute capability 9.0 only, which flash_wgmma_fits checks.
//
// A block of two warpgroups (256 threads) owns 128 queries of one head, 64 a warpgroup. Q (128 x
// 128) and two stages of K and V tiles (128 keys each) sit in shared memory in the 128-byte
// swizzled layout wgmma reads: each tile as two halves of 64 dims, a row of a half 128 bytes, its
// 16-byte chunk c stored at chunk c ^ (row % 8). All 256 threads copy with cp.async (no TMA, no
// producer warpgroup). Per key tile: S = Q K^T (8 wgmma m64n128k16, both operands K-major), the
// online softmax on S's registers, P (rounded to the dtype) as the A operand in registers of
// O += P V (8 wgmma, V stored with d contiguous: B transposed). Causal blocks stop at their last
// visible key and run longest-first. The semantics are flash_mma_kernel's (attention.cu): the
// causal diagonal aligned to the last key when s != s_kv, rows without a visible key are zeros,
// P and the output rounded once each from f32.
//
// Measured on an H200 (b 1, h 32, d 128, bf16, causal; bench_nn_cuda): 0.055 / 0.496 / 6.375 ms
// at s = 1k / 4k / 16k (155 / 277 / 345 TFLOP/s), 1.4-1.7x flash_mma_kernel, 0.51-0.58x
// PyTorch. What FlashAttention-3 adds and this kernel lacks: TMA copies by a producer
// warpgroup, two consumer warpgroups taking turns (one's softmax under the other's wgmma), and
// S of the next tile issued before the softmax of this one.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/attention_operands.h"
#include "cuda/attention_wgmma.h"
#include "cuda/check.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"

namespace wick::cuda {
namespace {

constexpr int kD = 128;                       // head dim
constexpr int kRows = 128;                    // queries per block, 64 per warpgroup
constexpr int kKeys = 128;                    // keys per K/V tile
constexpr int kThreads = 256;                 // two warpgroups
constexpr int kTileBytes = kKeys * kD * 2;    // 32 KB: a K or V tile, and Q (kRows == kKeys)
constexpr int kHalfBytes = kTileBytes / 2;    // 16 KB: 64 dims of every row of a tile
constexpr int kSmem = 5 * kTileBytes + 1024;  // Q, 2 K, 2 V, and room to align to 1024 bytes
static_assert(kRows == kKeys, "Q is loaded as a K/V tile");

struct WgmmaArgs : HalfOperands {  // no mask: flash_wgmma_fits
  float scale_log2;                // scale * log2(e): the softmax runs in base 2
};

// 16 bytes global -> shared (a shared-window address), zero-filled when !valid.
__device__ __forceinline__ void cp_async16_to(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory written by cp.async (the generic proxy) made visible to wgmma (the async proxy).
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A wgmma shared-memory descriptor, 128-byte swizzle: start address, leading and stride byte
// offsets (all >> 4), layout type 1 in bits 62-63.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr >> 4) & 0x3fff);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3fff) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3fff) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

// Copies the 128 rows of a (128 x 128) tile at src (row stride `stride` elements) into the
// swizzled layout at dst (1024-byte aligned); rows at or past `valid_rows` are zeros (0 * garbage
// could be nan).
__device__ __forceinline__ void load_tile(uint32_t dst, const uint16_t* src, int64_t stride,
                                          int valid_rows) {
  // 16 chunks of 16 bytes a row: chunk c of row r is in half c / 8, chunk c % 8 of it.
  for (int i = threadIdx.x; i < kKeys * 16; i += kThreads) {
    const int r = i / 16, c = i % 16, half = c / 8, chunk = c % 8;
    const uint32_t off = half * kHalfBytes + r * 128 + ((chunk ^ (r & 7)) << 4);
    const bool valid = r < valid_rows;
    cp_async16_to(dst + off, valid ? src + r * stride + c * 8 : src, valid);
  }
}

// The 64 f32 accumulators of a thread in an m64n128 wgmma: registers {%0..%63}.
#define WICK_WGMMA_D_REGS                                                                       \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"    \
  "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"
#define WICK_WGMMA_D8(i)                                                                      \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define WICK_WGMMA_D_OPERANDS                                                                  \
  WICK_WGMMA_D8(0), WICK_WGMMA_D8(8), WICK_WGMMA_D8(16), WICK_WGMMA_D8(24), WICK_WGMMA_D8(32), \
      WICK_WGMMA_D8(40), WICK_WGMMA_D8(48), WICK_WGMMA_D8(56)

// D (64 f32 a thread) = A B + (scale_d ? D : 0), A and B in shared memory (descriptors), both
// K-major.
template <class T>
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WICK_WGMMA_D_REGS
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WICK_WGMMA_D_OPERANDS
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WICK_WGMMA_D_REGS
        ", %64, %65, p, 1, 1, 0, 0;\n}\n"
        : WICK_WGMMA_D_OPERANDS
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
  }
}

// D += A B, A in registers (the m16n8k16 A fragment of the warp's 16 rows), B in shared memory
// (descriptor), N-major: transposed.
template <class T>
__device__ __forceinline__ void wgmma_rs_bt(float (&d)[64], const uint32_t (&a)[4],
                                            uint64_t desc_b) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WICK_WGMMA_D_REGS
        ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
        : WICK_WGMMA_D_OPERANDS
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " WICK_WGMMA_D_REGS
        ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
        : WICK_WGMMA_D_OPERANDS
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
  }
}

#undef WICK_WGMMA_D_OPERANDS
#undef WICK_WGMMA_D8
#undef WICK_WGMMA_D_REGS

template <class T>
__global__ void __launch_bounds__(kThreads, 1) flash_wgmma_kernel(WgmmaArgs p) {
  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  // The 128-byte swizzle repeats every 1024 bytes: tiles start on such a boundary.
  const uint32_t base = (smem_addr(wgmma_smem) + 1023) & ~1023u;
  const uint32_t q_s = base, k_s = base + kTileBytes, v_s = base + 3 * kTileBytes;
  const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // Longest blocks first (causal): the last query tiles have the most keys.
  const int m_tiles = (p.s + kRows - 1) / kRows;
  const int mt = p.causal ? m_tiles - 1 - static_cast<int>(blockIdx.x) : blockIdx.x;
  const int hi = blockIdx.y, bi = blockIdx.z, hk = hi / p.group;
  const int m0 = mt * kRows;
  const uint16_t* q = p.q + bi * p.qs[0] + hi * p.qs[1];
  const uint16_t* k = p.k + bi * p.ks[0] + hk * p.ks[1];
  const uint16_t* v = p.v + bi * p.vs[0] + hk * p.vs[1];
  const int shift = p.s_kv - p.s;  // causal: query i sees keys <= i + shift
  const int key_end = p.causal ? min(p.s_kv, m0 + kRows + shift) : p.s_kv;
  const int n_tiles = key_end > 0 ? (key_end + kKeys - 1) / kKeys : 0;

  load_tile(q_s, q + m0 * p.qs[2], p.qs[2], p.s - m0);
  if (n_tiles > 0) {
    load_tile(k_s, k, p.ks[2], p.s_kv);
    load_tile(v_s, v, p.vs[2], p.s_kv);
  }
  cp_async_commit();

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  // This thread's rows within the block: r0 (accumulators 4n, 4n + 1) and r0 + 8 (4n + 2, 4n + 3).
  const int r0 = wg * 64 + warp * 16 + g;

  for (int j = 0; j < n_tiles; ++j) {
    const int st = j % 2;
    if (j + 1 < n_tiles) {
      const int n1 = (j + 1) * kKeys;
      load_tile(k_s + (st ^ 1) * kTileBytes, k + n1 * p.ks[2], p.ks[2], p.s_kv - n1);
      load_tile(v_s + (st ^ 1) * kTileBytes, v + n1 * p.vs[2], p.vs[2], p.s_kv - n1);
    }
    cp_async_commit();
    cp_async_wait<1>();          // tile j (and Q) landed: this thread's copies
    fence_proxy_async_shared();  // ... visible to wgmma (the async proxy)
    __syncthreads();             // ... every thread's

    // S = Q K^T: A = this warpgroup's 64 rows of Q, B = the tile's 128 keys; k-steps of 16 dims,
    // 4 in each swizzled half (32 bytes apart within a 128-byte row).
    float s[64];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t in_half = (kk / 4) * kHalfBytes + (kk % 4) * 32;
      const uint64_t da = desc_sw128(q_s + in_half + wg * 64 * 128, 16, 1024);
      const uint64_t db = desc_sw128(k_s + st * kTileBytes + in_half, 16, 1024);
      wgmma_ss<T>(s, da, db, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();

    // Scale (base 2), mask, online softmax. s[4n + e]: key 8n + 2t + (e & 1), row r0 + 8 (e >> 1).
    const int n0 = j * kKeys;
    const bool edge = (p.causal && n0 + kKeys > m0 + shift) || n0 + kKeys > p.s_kv;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      float x = s[i] * p.scale_log2;
      if (edge) {
        const int key = n0 + (i / 4) * 8 + 2 * t + (i & 1);
        const int row = m0 + r0 + 8 * ((i >> 1) & 1);
        if (key >= p.s_kv || (p.causal && key > row + shift)) x = -INFINITY;
      }
      s[i] = x;
      mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], x);
    }
    float corr[2], m_use[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      // A row with no visible key so far keeps exp2(-inf - 0) = 0 instead of nan.
      m_use[r] = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = exp2_approx(m_run[r] - m_use[r]);
      m_run[r] = m_new;
      l_run[r] *= corr[r];
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const float e = exp2_approx(s[i] - m_use[(i >> 1) & 1]);
      s[i] = e;
      l_run[(i >> 1) & 1] += e;
    }
    uint32_t pa[8][4];  // P as the A operand of 8 k-steps of 16 keys
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
      pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] *= corr[(i >> 1) & 1];

    // O += P V: B = V's 16 keys of each k-step (2 KB apart), N = 128 dims over the two halves
    // (16 KB apart: the leading byte offset of an N-major operand), 8-key groups 1 KB apart.
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint64_t db = desc_sw128(v_s + st * kTileBytes + kk * 16 * 128, kHalfBytes, 1024);
      wgmma_rs_bt<T>(o, pa[kk], db);
    }
    wgmma_commit();
    wgmma_wait<0>();
    __syncthreads();  // every warpgroup is done with stage st before it is refilled
  }
  cp_async_wait<0>();  // no copy outlives the block (n_tiles = 0)

  // O / l, rows r0 and r0 + 8; o[4n + e]: dim 8n + 2t + (e & 1). Each thread summed a quarter
  // of its rows' probabilities: finish across the quad.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = m0 + r0 + 8 * r;
    if (row >= p.s) continue;
    uint16_t* out = p.out + ((static_cast<int64_t>(bi) * p.h + hi) * p.s + row) * kD;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) =
          pack2<T>(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
    }
  }
}

template <class T>
void launch_typed(const AttentionArgs& a, cudaStream_t s) {
  const WgmmaArgs p{operands<uint16_t>(a), a.scale * kLog2e};
  auto kernel = flash_wgmma_kernel<T>;
  // Above 48 KB of shared memory only by this attribute (per device: set at every launch).
  WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((a.s + kRows - 1) / kRows, a.h, a.b);
  kernel<<<grid, kThreads, kSmem, s>>>(p);
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_wgmma_fits(DType dtype, const AttentionArgs& a) {
  if (!flash_wgmma_enabled()) return false;
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (a.d != kD || a.mask != nullptr || a.last_key != nullptr) return false;
  if (a.b > 65535 || a.h > 65535) return false;  // grid.z, grid.y
  auto al = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (!al(a.q, 16) || !al(a.k, 16) || !al(a.v, 16) || !al(a.out, 4)) return false;
  for (int i = 0; i < 3; ++i) {
    if (a.q_strides[i] % 8 != 0 || a.k_strides[i] % 8 != 0 || a.v_strides[i] % 8 != 0) {
      return false;
    }
  }
  // sm_90a machine code runs on 9.0 alone; its Q and K/V stages need 161 KB of shared memory.
  return compute_capability() == 90 && static_cast<size_t>(kSmem) <= shared_per_block_optin();
}

void launch_flash_wgmma(DType dtype, const AttentionArgs& a, cudaStream_t s) {
  if (dtype == DType::BF16) return launch_typed<__nv_bfloat16>(a, s);
  return launch_typed<__half>(a, s);
}

}  // namespace wick::cuda
