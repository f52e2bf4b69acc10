// The bf16 GEMM on AMX tiles, or with AVX512-BF16's dot products where the CPU has those and no
// AMX: c = act(round_bf16(a) w^T + bias), a f32 activations, w bf16 weights (out x in, as
// nn.Linear stores them).
// Layout: the weights are packed once per call into 16-column x 32-k tiles in the VNNI order
// TDPBF16PS reads (a 16 x 16 block of k pairs per 1 KiB, zero-padded to whole tiles); each work
// item rounds 32 rows of a to bf16 into 16 x 32 tiles (padded with zero rows and k), then runs a
// 2 x 2 block of 16 x 16 f32 accumulator tiles along k for every 32 output columns, and applies the
// bias and the activation while writing the valid part. Without AMX the same packed tiles feed
// VDPBF16PS: each 16-column row of a packed weight tile is one vector of k pairs, each row's k pair
// of a is broadcast, 8 rows x 32 columns of accumulators at a time. Every output is one k-ordered
// f32 sum, whatever m, the split or the thread count. The code is compiled for AVX-512 + AMX +
// AVX512-BF16 and lives in namespace wick::cpu::avx512bf16 (scripts/check-isa.sh); it only runs
// once bf16_gemm_kernel() has found its instructions usable.

// The exact GELU's float compares (in vec_erff) only vectorise when GCC may assume they raise no
// visible FP exceptions, as in dense.cpp; nothing in wick reads the FP flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "cpu/gemm_bf16.h"
#include "cpu/parallel.h"
#include "ops/unary_math.h"
#include "wick/cpu.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(WICK_NO_AVX512_KERNELS) && defined(__linux__)
#define WICK_AMX_KERNELS 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace wick::cpu {

namespace {

// Whether the CPU has AMX-TILE and AMX-BF16, the OS saves the tile registers (XCR0 bits 17 and
// 18) and grants the process their state (Linux asks each process to request it).
bool amx_usable() {
#if defined(WICK_AMX_KERNELS)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// Whether the CPU has AVX512-BF16 (VDPBF16PS) beside the AVX-512 the kernels need.
bool avx512_bf16_usable() {
#if defined(WICK_AMX_KERNELS)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

}  // namespace

const char* bf16_gemm_kernel() {
  // Both kernels pack a with AVX-512: a CPU (or a WICK_CPU_ISA) without it gets none.
  static const char* kernel = cpu_isa() != "avx512"  ? ""
                              : amx_usable()         ? "amx-bf16"
                              : avx512_bf16_usable() ? "avx512-bf16"
                                                     : "";
  return kernel;
}

#if defined(WICK_AMX_KERNELS)

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,amx-tile,amx-bf16")

namespace avx512bf16 {
namespace {

constexpr size_t kRows = 16;  // rows of a tile (and columns of an f32 accumulator tile)
constexpr size_t kK = 32;     // bf16 per tile row: 64 bytes
constexpr size_t kTileElems = kRows * kK;
constexpr size_t kBlock = 32;  // rows and columns of one 2 x 2 block of accumulators

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

size_t round_up(size_t x, size_t to) {
  return (x + to - 1) / to * to;
}

// Sixteen floats to bf16 bits (nearest even, NaN kept quiet), as wick::bf16 rounds.
__m256i to_bf16(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i high = _mm512_srli_epi32(b, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}

// Rows [r0, r0 + 32) of a (zero past m and past k) as bf16 tiles: tile t (rows r0 + 16 t ...),
// k block kb at dst + (t * kb_count + kb) * kTileElems, 16 rows of 32.
[[gnu::noinline]] void pack_a(size_t m, size_t k, const float* a, size_t lda, size_t r0,
                              size_t kb_count, uint16_t* dst) {
  for (size_t i = 0; i < kBlock; ++i) {
    const size_t r = r0 + i;
    uint16_t* row = dst + (i / kRows) * kb_count * kTileElems + (i % kRows) * kK;
    for (size_t kb = 0; kb < kb_count; ++kb) {
      uint16_t* out = row + kb * kTileElems;
      const size_t k0 = kb * kK;
      if (r >= m) {
        std::memset(out, 0, kK * sizeof(uint16_t));
        continue;
      }
      const float* src = a + r * lda + k0;
      const size_t left = k - k0;
      const __mmask16 m0 = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      const __mmask16 m1 = left >= 32   ? __mmask16(0xffff)
                           : left <= 16 ? __mmask16(0)
                                        : __mmask16((1u << (left - 16)) - 1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), to_bf16(_mm512_maskz_loadu_ps(m0, src)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16),
                          to_bf16(_mm512_maskz_loadu_ps(m1, src + 16)));
    }
  }
}

// Columns [16 nb, 16 nb + 16) of w^T as VNNI tiles: k block kb at dst + kb * kTileElems, row kk
// holding (w[j][2 kk], w[j][2 kk + 1]) for the 16 columns j; zero past n and past k. A pair of
// bf16 moves as one 32-bit word.
[[gnu::noinline]] void pack_b(size_t n, size_t k, const bf16* w, size_t ldw, size_t nb,
                              size_t kb_count, uint16_t* dst) {
  const size_t full_kb = k / kK;
  for (size_t j = 0; j < kRows; ++j) {
    const size_t col = nb * kRows + j;
    if (col >= n) {
      for (size_t kb = 0; kb < kb_count; ++kb) {
        for (size_t p = 0; p < kRows; ++p) {
          std::memset(dst + kb * kTileElems + p * kK + j * 2, 0, 2 * sizeof(uint16_t));
        }
      }
      continue;
    }
    const bf16* src = w + col * ldw;
    for (size_t kb = 0; kb < full_kb; ++kb) {
      uint32_t pairs[kRows];
      std::memcpy(pairs, src + kb * kK, sizeof(pairs));
      uint16_t* out = dst + kb * kTileElems + j * 2;
      for (size_t p = 0; p < kRows; ++p) std::memcpy(out + p * kK, &pairs[p], sizeof(uint32_t));
    }
    for (size_t kb = full_kb; kb < kb_count; ++kb) {
      uint16_t* out = dst + kb * kTileElems + j * 2;
      for (size_t kk = 0; kk < kK; ++kk) {
        const size_t kx = kb * kK + kk;
        out[(kk / 2) * kK + kk % 2] = kx < k ? src[kx].bits : 0;
      }
    }
  }
}

// bias, then the exact GELU when `gelu`, then the residual (when not null) over the valid rows x
// cols of one 32 x 32 accumulator block, written to c (whole rows in place, a partial one through
// a row buffer). Separate loops: one with the branches inside would evaluate erf for every
// projection.
[[gnu::noinline]] void finish_block(const float* __restrict acc, const float* __restrict bias,
                                    bool gelu, const float* residual, size_t ldr, size_t rows,
                                    size_t cols, float* c, size_t ldc) {
  alignas(64) float row[kBlock];
  for (size_t i = 0; i < rows; ++i) {
    const float* __restrict a = acc + i * kBlock;
    float* __restrict out = cols == kBlock ? c + i * ldc : row;
    if (gelu) {
      for (size_t j = 0; j < kBlock; ++j) {
        const float v = a[j] + bias[j];
        out[j] = 0.5f * v * (1.0f + ops::math::vec_erff(v * 0.7071067811865476f));
      }
    } else {
      for (size_t j = 0; j < kBlock; ++j) out[j] = a[j] + bias[j];
    }
    if (residual != nullptr) {
      const float* __restrict r = residual + i * ldr;
      if (cols == kBlock) {
        for (size_t j = 0; j < kBlock; ++j) out[j] += r[j];
      } else {
        for (size_t j = 0; j < cols; ++j) out[j] += r[j];
      }
    }
    if (cols != kBlock) std::memcpy(c + i * ldc, row, cols * sizeof(float));
  }
}

// One 32 x 32 block of accumulators (row stride kBlock) from the packed rows of a (pa: rows 0-15,
// pa1: rows 16-31) and the packed columns of w (pb0: 0-15, pb1: 16-31), with VDPBF16PS: the sums
// of the AMX tiles, k pair by k pair.
[[gnu::noinline]] void dot_block(const uint16_t* pa, const uint16_t* pa1, const uint16_t* pb0,
                                 const uint16_t* pb1, size_t kb_count, float* acc) {
  constexpr size_t kGroup = 8;  // rows a pass: 16 accumulators
  for (size_t g = 0; g < kBlock; g += kGroup) {
    const uint16_t* rows = (g < kRows ? pa : pa1) + (g % kRows) * kK;
    __m512 c0[kGroup], c1[kGroup];
    for (size_t r = 0; r < kGroup; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
    for (size_t kb = 0; kb < kb_count; ++kb) {
      const size_t off = kb * kTileElems;
      for (size_t kk = 0; kk < kK / 2; ++kk) {
        const __m512bh b0 = (__m512bh)_mm512_load_si512(pb0 + off + kk * kK);
        const __m512bh b1 = (__m512bh)_mm512_load_si512(pb1 + off + kk * kK);
#pragma GCC unroll 8
        for (size_t r = 0; r < kGroup; ++r) {
          uint32_t pair;
          std::memcpy(&pair, rows + off + r * kK + 2 * kk, sizeof(pair));
          const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
          c0[r] = _mm512_dpbf16_ps(c0[r], x, b0);
          c1[r] = _mm512_dpbf16_ps(c1[r], x, b1);
        }
      }
    }
    for (size_t r = 0; r < kGroup; ++r) {
      _mm512_store_ps(acc + (g + r) * kBlock, c0[r]);
      _mm512_store_ps(acc + (g + r) * kBlock + kRows, c1[r]);
    }
  }
}

}  // namespace

void gemm(size_t m, size_t n, size_t k, const float* a, size_t lda, const bf16* w, size_t ldw,
          const float* bias, bool gelu, const float* residual, size_t ldr, float* c, size_t ldc,
          bool tiles) {
  const size_t kb_count = round_up(k, kK) / kK;
  const size_t n_pad = round_up(n, kBlock), m_blocks = round_up(m, kBlock) / kBlock;
  const size_t n_blocks = n_pad / kBlock;
  auto packed_b = std::make_unique<uint16_t[]>(n_pad * kb_count * kK + 32);
  uint16_t* pb =
      reinterpret_cast<uint16_t*>(round_up(reinterpret_cast<uintptr_t>(packed_b.get()), 64));
  parallel_for(n_pad / kRows, 4, [&](size_t begin, size_t end) {
    for (size_t nb = begin; nb < end; ++nb)
      pack_b(n, k, w, ldw, nb, kb_count, pb + nb * kb_count * kTileElems);
  });
  auto bias_pad = std::make_unique<float[]>(n_pad);
  for (size_t j = 0; j < n_pad; ++j) bias_pad[j] = bias != nullptr && j < n ? bias[j] : 0.0f;

  // Few row blocks: the columns are split too, so that every thread has work.
  const size_t n_groups = m_blocks >= 8 ? 1 : std::min(n_blocks, (8 + m_blocks - 1) / m_blocks);
  const size_t group_span = (n_blocks + n_groups - 1) / n_groups;
  parallel_for(m_blocks * n_groups, 1, [&](size_t begin, size_t end) {
    TileConfig config;
    for (size_t t = 0; t < 8; ++t) {
      config.rows[t] = kRows;
      config.colsb[t] = kK * sizeof(uint16_t);
    }
    if (tiles) _tile_loadconfig(&config);
    auto a_buf = std::make_unique<uint16_t[]>(2 * kb_count * kTileElems + 32);
    uint16_t* pa =
        reinterpret_cast<uint16_t*>(round_up(reinterpret_cast<uintptr_t>(a_buf.get()), 64));
    alignas(64) float acc[kBlock * kBlock];
    for (size_t item = begin; item < end; ++item) {
      const size_t mb = item / n_groups, group = item % n_groups;
      const size_t r0 = mb * kBlock;
      pack_a(m, k, a, lda, r0, kb_count, pa);
      const uint16_t* pa1 = pa + kb_count * kTileElems;
      const size_t nb_end = std::min(n_blocks, (group + 1) * group_span);
      for (size_t nb = group * group_span; nb < nb_end; ++nb) {
        const uint16_t* pb0 = pb + 2 * nb * kb_count * kTileElems;
        const uint16_t* pb1 = pb0 + kb_count * kTileElems;
        if (tiles) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (size_t kb = 0; kb < kb_count; ++kb) {
            const size_t off = kb * kTileElems;
            _tile_loadd(4, pa + off, 64);
            _tile_loadd(5, pa1 + off, 64);
            _tile_loadd(6, pb0 + off, 64);
            _tile_loadd(7, pb1 + off, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
          _tile_stored(0, acc, kBlock * sizeof(float));
          _tile_stored(1, acc + kRows, kBlock * sizeof(float));
          _tile_stored(2, acc + kRows * kBlock, kBlock * sizeof(float));
          _tile_stored(3, acc + kRows * kBlock + kRows, kBlock * sizeof(float));
        } else {
          dot_block(pa, pa1, pb0, pb1, kb_count, acc);
        }
        const size_t c0 = nb * kBlock;
        finish_block(acc, bias_pad.get() + c0, gelu,
                     residual == nullptr ? nullptr : residual + r0 * ldr + c0, ldr,
                     std::min(kBlock, m - r0), std::min(kBlock, n - c0), c + r0 * ldc + c0, ldc);
      }
    }
    if (tiles) _tile_release();
  });
}

}  // namespace avx512bf16

#pragma GCC pop_options

#endif  // WICK_AMX_KERNELS

void gemm_bf16(size_t m, size_t n, size_t k, const float* a, size_t lda, const bf16* w, size_t ldw,
               const float* bias, bool gelu, const float* residual, size_t ldr, float* c,
               size_t ldc) {
#if defined(WICK_AMX_KERNELS)
  if (m == 0 || n == 0) return;
  avx512bf16::gemm(m, n, k, a, lda, w, ldw, bias, gelu, residual, ldr, c, ldc,
                   std::strcmp(bf16_gemm_kernel(), "amx-bf16") == 0);
#else
  (void)m, (void)n, (void)k, (void)a, (void)lda, (void)w, (void)ldw, (void)bias, (void)gelu,
      (void)residual, (void)ldr, (void)c, (void)ldc;
#endif
}

}  // namespace wick::cpu

namespace wick {

std::string cpu_bf16_gemm() {
  return cpu::bf16_gemm_kernel();
}

}  // namespace wick
