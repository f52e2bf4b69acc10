// Prefill attention on sm_90a with wgmma (warpgroup MMA) and TMA, f16/bf16, d = 128:
// flash_wgmma_kernel, FlashAttention-3's warp specialization and ping-pong: a producer warpgroup
// issues TMA copies of K and V tiles, two consumer warpgroups take turns at the tensor cores so
// that one's softmax runs under the other's GEMMs. This file alone is compiled for sm_90a
// (src/CMakeLists.txt): wgmma and setmaxnreg exist on no other target, and sm_90a code runs on
// compute capability 9.0 only, which flash_wgmma_fits checks. History:
// docs/perf/prefill-attention.md.

#include <cuda.h>  // CUtensorMap and its enums; the encoder comes from the runtime's entry point
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/attention_operands.h"
#include "cuda/attention_wgmma.h"
#include "cuda/check.h"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"

namespace wick::cuda {
namespace {

constexpr int kD = 128;                     // head dim
constexpr int kRows = 128;                  // queries per block, 64 per consumer warpgroup
constexpr int kKeys = 128;                  // keys per K/V tile
constexpr int kThreads = 384;               // producer warpgroup + 2 consumer warpgroups
constexpr int kStages = 2;                  // K/V tiles in flight
constexpr int kTileBytes = kKeys * kD * 2;  // 32 KB: a K or V tile, and Q (kRows == kKeys)
constexpr int kHalfBytes = kTileBytes / 2;  // 16 KB: 64 dims of every row of a tile
constexpr int kBarriers = 1 + 4 * kStages;  // q_full, then k_full, k_empty, v_full, v_empty
// Q, the K and V stages, room to align to 1024 bytes (the swizzle's period), the mbarriers.
constexpr int kSmem = (1 + 2 * kStages) * kTileBytes + 1024 + 8 * kBarriers;
constexpr int kConsumerWarps = 8;  // arrivals that release a stage
// A block's registers are fixed at launch (65536 / 384 = 168 a thread); setmaxnreg moves them.
constexpr int kProducerRegs = 24, kConsumerRegs = 240;
static_assert(kProducerRegs + 2 * kConsumerRegs <= 3 * 168, "register pool of a block");
static_assert(kRows == kKeys, "Q is loaded as a K/V tile");

struct WgmmaArgs : HalfOperands {  // no mask: flash_wgmma_fits
  float scale_log2;                // scale * log2(e): the softmax runs in base 2
};

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

// Keeps the compiler from moving reads or writes of registers an asynchronous wgmma owns across
// the asm statements that issue it and wait for it.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
__device__ __forceinline__ void fence_regs(uint32_t (&r)[8][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}

// Half a tile (64 dims x 128 rows of one head and batch) of a tensor map at dims offset c0 into
// shared memory at dst (1024-byte aligned, 16 KB), completing on mbarrier bar.
__device__ __forceinline__ void tma_half(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0,
                                         int row, int head, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(row), "r"(head), "r"(batch)
      : "memory");
}
// A whole 128 x 128 tile: its two 64-dim halves, kHalfBytes apart.
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                         int row, int head, int batch) {
  tma_half(dst, map, bar, 0, row, head, batch);
  tma_half(dst + kHalfBytes, map, bar, 64, row, head, batch);
}

// S = Q K^T of one warpgroup: A = its 64 rows of Q at q_rows, B = the 128 keys of the tile at
// k_tile; k-steps of 16 dims, 4 in each swizzled half (32 bytes apart within a 128-byte row).
template <class T>
__device__ __forceinline__ void mma_qk(float (&s)[64], uint32_t q_rows, uint32_t k_tile) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t in_half = (kk / 4) * kHalfBytes + (kk % 4) * 32;
    wgmma_ss<T>(s, desc_sw128(q_rows + in_half, 16, 1024), desc_sw128(k_tile + in_half, 16, 1024),
                kk > 0);
  }
}
// O += P V: B = V's 16 keys of each k-step (2 KB apart), N = 128 dims over the two halves (16 KB
// apart: the leading byte offset of an N-major operand), 8-key groups 1 KB apart.
template <class T>
__device__ __forceinline__ void mma_pv(float (&o)[64], const uint32_t (&pa)[8][4],
                                       uint32_t v_tile) {
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) {
    wgmma_rs_bt<T>(o, pa[kk], desc_sw128(v_tile + kk * 16 * 128, kHalfBytes, 1024));
  }
}

// The online softmax of key tile n0.. for this thread's rows row_a and row_a + 8: raw scores in
// s, probabilities (base 2, unnormalized) out; m_run (raw units) and l_run updated; corr is what
// O must be scaled by. s[4n + e]: key n0 + 8n + 2t + (e & 1), row row_a + 8 (e >> 1).
__device__ __forceinline__ void online_softmax(float (&s)[64], float (&m_run)[2], float (&l_run)[2],
                                               float (&corr)[2], const WgmmaArgs& p, int n0,
                                               int row_a, int t, bool edge) {
  const int shift = p.s_kv - p.s;  // causal: query i sees keys <= i + shift
  if (edge) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int key = n0 + (i / 4) * 8 + 2 * t + (i & 1);
      const int row = row_a + 8 * ((i >> 1) & 1);
      if (key >= p.s_kv || (p.causal && key > row + shift)) s[i] = -INFINITY;
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 64; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  float m_scaled[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r]);
    // A row with no visible key so far keeps exp2(-inf - 0) = 0 instead of nan.
    m_scaled[r] = m_new == -INFINITY ? 0.f : m_new * p.scale_log2;
    corr[r] = exp2_approx(m_run[r] * p.scale_log2 - m_scaled[r]);
    m_run[r] = m_new;
    l_run[r] *= corr[r];
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int r = (i >> 1) & 1;
    const float e = exp2_approx(fmaf(s[i], p.scale_log2, -m_scaled[r]));
    s[i] = e;
    l_run[r] += e;
  }
}

// A block owns 128 queries of one head: three warpgroups (384 threads). Warpgroup 0 produces: it
// gives its registers to the others (setmaxnreg 24) and one of its threads issues the TMA copies
// of Q once and of K and V tiles (128 keys) into two stages, each with a full and an empty
// mbarrier. Warpgroups 1 and 2 consume (setmaxnreg 240), 64 queries each. Every tile sits in
// shared memory in the 128-byte swizzled layout wgmma reads, which the tensor maps' swizzle
// writes: two halves of 64 dims, a row of a half 128 bytes, its 16-byte chunk c at c ^ (row % 8);
// rows past the sequence arrive as zeros. Per key tile a consumer runs S = Q K^T (8 wgmma
// m64n128k16, both operands K-major), the online softmax on S's registers, and O += P V with P
// (rounded to the dtype) as the A operand in registers (8 wgmma, V stored with d contiguous: B
// transposed). The two consumers take turns issuing their GEMMs (named barriers 1 and 2), so one's
// softmax runs under the other's tensor-core work. Causal blocks stop at their last visible key
// and run longest-first. The semantics are flash_mma_kernel's (attention.cu): the causal diagonal
// aligned to the last key when s != s_kv, rows without a visible key are zeros, P and the output
// rounded once each from f32.
//
// tq: Q as (128 dims, s, h, b); tk, tv: K and V as (128 dims, s_kv, h_kv, b); boxes of 64 dims x
// 128 rows, 128-byte swizzle, zeros outside.
template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    flash_wgmma_kernel(const __grid_constant__ CUtensorMap tq,
                       const __grid_constant__ CUtensorMap tk,
                       const __grid_constant__ CUtensorMap tv, WgmmaArgs p) {
  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  const uint32_t base = (smem_addr(wgmma_smem) + 1023) & ~1023u;
  const uint32_t q_s = base, k_s = base + kTileBytes, v_s = base + (1 + kStages) * kTileBytes;
  const uint32_t bars = base + (1 + 2 * kStages) * kTileBytes;
  const uint32_t q_full = bars;
  auto k_full = [&](int st) { return bars + 8 * (1 + st); };
  auto k_empty = [&](int st) { return bars + 8 * (1 + kStages + st); };
  auto v_full = [&](int st) { return bars + 8 * (1 + 2 * kStages + st); };
  auto v_empty = [&](int st) { return bars + 8 * (1 + 3 * kStages + st); };

  const int wg = threadIdx.x / 128;
  // Longest blocks first (causal): the last query tiles have the most keys.
  const int m_tiles = (p.s + kRows - 1) / kRows;
  const int mt = p.causal ? m_tiles - 1 - static_cast<int>(blockIdx.x) : blockIdx.x;
  const int hi = blockIdx.y, bi = blockIdx.z, hk = hi / p.group;
  const int m0 = mt * kRows;
  const int shift = p.s_kv - p.s;  // causal: query i sees keys <= i + shift
  const int key_end = p.causal ? min(p.s_kv, m0 + kRows + shift) : p.s_kv;
  const int n_tiles = key_end > 0 ? (key_end + kKeys - 1) / kKeys : 0;

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, 1);
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(k_full(st), 1);
      mbarrier_init(v_full(st), 1);
      mbarrier_init(k_empty(st), kConsumerWarps);
      mbarrier_init(v_empty(st), kConsumerWarps);
    }
    fence_mbarrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: one thread issues every copy; the warpgroup's other threads are done.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (threadIdx.x != 0 || n_tiles == 0) return;
    mbarrier_arrive_expect_bytes(q_full, kTileBytes);
    tma_tile(q_s, &tq, q_full, m0, hi, bi);
    // Tile j uses stage j % kStages for the (j / kStages)-th time: it waits for the consumers to
    // have released the previous use (parity starts at 1: the first pass does not wait).
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % kStages;
      const uint32_t parity = ((j / kStages) & 1) ^ 1;
      mbarrier_wait_parity(k_empty(st), parity);
      mbarrier_arrive_expect_bytes(k_full(st), kTileBytes);
      tma_tile(k_s + st * kTileBytes, &tk, k_full(st), j * kKeys, hk, bi);
      mbarrier_wait_parity(v_empty(st), parity);
      mbarrier_arrive_expect_bytes(v_full(st), kTileBytes);
      tma_tile(v_s + st * kTileBytes, &tv, v_full(st), j * kKeys, hk, bi);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int cwg = wg - 1;  // consumer 0 or 1: rows cwg * 64 .. + 63 of the block
  const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int r0 = cwg * 64 + warp * 16 + g;  // rows r0 (registers 4n, 4n + 1) and r0 + 8
  const int row_a = m0 + r0;
  const uint32_t q_rows = q_s + cwg * 64 * 128;

  // Turns: barrier 1 + w is consumer w's turn to issue GEMMs; it syncs on it (its 128 threads)
  // and the other consumer arrives on it (128 more) once it has issued its own. Consumer 0's
  // first turn is granted by its own arrival, so consumer 1 skips its very last arrival and both
  // barriers end balanced.
  auto take_turn = [&]() { named_barrier_sync(1 + cwg, 256); };
  auto pass_turn = [&](bool last) {
    if (cwg == 0 || !last) named_barrier_arrive(2 - cwg, 256);
  };
  auto release = [&](uint32_t bar) {
    if (lane == 0) mbarrier_arrive(bar);
  };
  // The wait loop may leave a warp's lanes apart; the wgmma that follow are .sync.aligned.
  auto wait_full = [&](uint32_t bar, uint32_t parity) {
    mbarrier_wait_parity(bar, parity);
    __syncwarp();
  };

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  if (n_tiles > 0) {
    float s[64], corr[2];
    uint32_t pa[8][4];  // P as the A operand of 8 k-steps of 16 keys
    if (cwg == 0) named_barrier_arrive(1, 256);
    wait_full(q_full, 0);
    // Turns: [S(0)], [P V(0), S(1)], ..., [P V(n - 1)].
    take_turn();
    for (int j = 0; j < n_tiles; ++j) {
      const int st = j % kStages;
      const uint32_t parity = (j / kStages) & 1;
      wait_full(k_full(st), parity);
      fence_regs(s);
      wgmma_fence();
      mma_qk<T>(s, q_rows, k_s + st * kTileBytes);
      wgmma_commit();
      pass_turn(false);
      wgmma_wait<0>();
      fence_regs(s);
      release(k_empty(st));
      const int n0 = j * kKeys;
      const bool edge = (p.causal && n0 + kKeys > m0 + shift) || n0 + kKeys > p.s_kv;
      online_softmax(s, m_run, l_run, corr, p, n0, row_a, t, edge);
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        pa[kk][0] = pack2<T>(s[8 * kk + 0], s[8 * kk + 1]);
        pa[kk][1] = pack2<T>(s[8 * kk + 2], s[8 * kk + 3]);
        pa[kk][2] = pack2<T>(s[8 * kk + 4], s[8 * kk + 5]);
        pa[kk][3] = pack2<T>(s[8 * kk + 6], s[8 * kk + 7]);
      }
#pragma unroll
      for (int i = 0; i < 64; ++i) o[i] *= corr[(i >> 1) & 1];
      wait_full(v_full(st), parity);
      take_turn();
      fence_regs(o);
      fence_regs(pa);
      wgmma_fence();
      mma_pv<T>(o, pa, v_s + st * kTileBytes);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pa);
      release(v_empty(st));
    }
    pass_turn(true);
  }

  // O / l, rows r0 and r0 + 8; o[4n + e]: dim 8n + 2t + (e & 1). Each thread summed a quarter
  // of its rows' probabilities: finish across the quad.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float l = l_run[r];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int row = row_a + 8 * r;
    if (row >= p.s) continue;
    uint16_t* out = p.out + ((static_cast<int64_t>(bi) * p.h + hi) * p.s + row) * kD;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      *reinterpret_cast<uint32_t*>(out + n * 8 + 2 * t) =
          pack2<T>(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
    }
  }
}

// cuTensorMapEncodeTiled through the runtime (no link to the driver library); null when the
// driver lacks it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t status = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                                cudaEnableDefault, &found);
#else  // toolkits before 12.5 have only the unversioned query
    const cudaError_t status =
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &found);
#endif
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();  // not sticky; leave no error for the next check to find
      return PFN_cuTensorMapEncodeTiled_v12000{};
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return encoder;
}

// 16-bit elements at ptr as a (128 dims, rows, heads, batch) tensor map with these element
// strides for rows, heads and batch; boxes of 64 dims (128 bytes: the swizzle's span) x 128 rows.
// A dimension of size 1 takes any stride: it gets a legal one.
CUtensorMap tensor_map(const void* ptr, int rows, int heads, int batch, const int64_t (&st)[3],
                       const char* name) {
  const cuuint64_t dims[4] = {kD, static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(batch)};
  auto bytes = [](int64_t stride, int size) {
    return static_cast<cuuint64_t>(size == 1 ? 16 : stride * 2);
  };
  const cuuint64_t strides[3] = {bytes(st[2], rows), bytes(st[1], heads), bytes(st[0], batch)};
  const cuuint32_t box[4] = {64, kRows, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult r = tensor_map_encoder()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(ptr), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw BackendError("attention (flash_wgmma_kernel): cuTensorMapEncodeTiled failed (" +
                       std::to_string(static_cast<int>(r)) + ") for " + name + " of " +
                       std::to_string(rows) + " rows, " + std::to_string(heads) + " heads, " +
                       std::to_string(batch) + " batches, element strides (" +
                       std::to_string(st[0]) + ", " + std::to_string(st[1]) + ", " +
                       std::to_string(st[2]) + ")");
  }
  return map;
}

template <class T>
void launch_typed(const AttentionArgs& a, cudaStream_t s) {
  const WgmmaArgs p{operands<uint16_t>(a), a.scale * kLog2e};
  const CUtensorMap tq = tensor_map(a.q, a.s, a.h, a.b, p.qs, "q");
  const CUtensorMap tk = tensor_map(a.k, a.s_kv, a.h_kv, a.b, p.ks, "k");
  const CUtensorMap tv = tensor_map(a.v, a.s_kv, a.h_kv, a.b, p.vs, "v");
  auto kernel = flash_wgmma_kernel<T>;
  // Above 48 KB of shared memory only by this attribute (per device: set at every launch).
  WICK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const dim3 grid((a.s + kRows - 1) / kRows, a.h, a.b);
  kernel<<<grid, kThreads, kSmem, s>>>(tq, tk, tv, p);
  WICK_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_wgmma_fits(DType dtype, const AttentionArgs& a) {
  if (!flash_wgmma_enabled()) return false;
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if (a.d != kD || a.mask != nullptr || a.last_key != nullptr) return false;
  if (a.b > 65535 || a.h > 65535) return false;  // grid.z, grid.y
  if (a.s == 0 || a.s_kv == 0) return false;     // a tensor map's dims are not empty
  auto al = [](const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (!al(a.q, 16) || !al(a.k, 16) || !al(a.v, 16) || !al(a.out, 4)) return false;
  // Tensor-map strides: multiples of 16 bytes below 2^40 bytes (a size-1 dimension's is moot).
  const int sizes[3] = {a.b, a.h, a.s}, kv_sizes[3] = {a.b, a.h_kv, a.s_kv};
  auto legal = [](int64_t stride, int size) {
    return size == 1 || (stride > 0 && stride % 8 == 0 && stride < (int64_t{1} << 39));
  };
  for (int i = 0; i < 3; ++i) {
    if (!legal(a.q_strides[i], sizes[i]) || !legal(a.k_strides[i], kv_sizes[i]) ||
        !legal(a.v_strides[i], kv_sizes[i])) {
      return false;
    }
  }
  // sm_90a machine code runs on 9.0 alone; Q and the K/V stages need 161 KB of shared memory.
  return compute_capability() == 90 && static_cast<size_t>(kSmem) <= shared_per_block_optin() &&
         tensor_map_encoder() != nullptr;
}

void launch_flash_wgmma(DType dtype, const AttentionArgs& a, cudaStream_t s) {
  if (dtype == DType::BF16) return launch_typed<__nv_bfloat16>(a, s);
  return launch_typed<__half>(a, s);
}

}  // namespace wick::cuda
