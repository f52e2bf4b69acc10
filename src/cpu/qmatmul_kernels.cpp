// The integer tile kernels of qmatmul for the types of blocks of 32 (Q4_0, Q4_1, Q8_0, Q5_0,
// Q5_1, IQ4_NL), and the dispatch over every tiled type; the super-block types are in
// qmatmul_kernels_k.cpp. Compiled once per instruction set (src/CMakeLists.txt): AVX2 (maddubs:
// u8 x s8 pairs summed to i16, then to i32) and AVX-512 VNNI (dpbusd: four u8 x s8 products
// summed into each i32 lane, no intermediate saturation). One 512-bit dot (two 256-bit ones)
// multiplies four values of 16 weight rows by the same four activations, broadcast from memory;
// each block's integer sum is then scaled in f32. 16-bit activations (two base-255 digits of 8
// bits) take one such dot per digit (AVX2's Q8_0: one madd_epi16 dot of the values whole). The
// AVX2 kernels pass over a tile twice (8 rows each) and prefetch the next tile during the second
// pass. 5-bit weights are put together from their nibbles and fifth bits once per tile-block
// (shared by the activation rows), IQ4_NL's levels from their 4-bit indices by a byte shuffle.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/qmatmul.h"
#include "ops/ggml_blocks.h"

// clang-format off
#include "cpu/isa_begin.h"  // last: the code below is compiled for this file's instruction set
// clang-format on

#if defined(WICK_ISA_VNNI)
#pragma GCC target("avx512vnni")
#endif

#include "cpu/qmatmul_simd.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

#if defined(WICK_ISA_VNNI)

// 16 rows x NX activation rows over all blocks of one tile; out[i][r] = row r's dot with x row i.
// Wide: x's values are 255 qs + lo (two 8-bit digits), each digit one set of dots.
template <GgmlType T, int NX, bool Wide>
void tile_kernel(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr size_t kBytes = T == GgmlType::Q8_0 ? 544 : T == GgmlType::Q4_1 ? 320 : 288;
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  // IQ4_NL: the indices looked up as level + 128 (u8, for dpbusd).
  const __m512i levels =
      T == GgmlType::IQ4_NL ? _mm512_broadcast_i32x4(iq4_levels(128)) : _mm512_setzero_si512();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * kBytes;
    __m512 dw = load_f16x16(p);
    if constexpr (T == GgmlType::Q8_0) {
      const uint8_t* q = p + 32;
      __m512i w[8];
      for (int g = 0; g < 8; ++g) w[g] = _mm512_loadu_si512(q + 64 * g);
      for (int i = 0; i < NX; ++i) {
        const size_t at = (x0 + i) * k + 32 * b;
        __m512i dot = q8_block_dot(w, x.qs.data() + at);
        if constexpr (Wide) dot = digits(dot, q8_block_dot(w, x.lo.data() + at));
        size_t xi = (x0 + i) * nb + b;
        // The weights carry +128: subtract 128 * (sum of the activations).
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * x.s[xi]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                 _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xi])), acc[i]);
      }
    } else {
      __m512 mw = _mm512_setzero_ps();
      if constexpr (T == GgmlType::Q4_1) mw = load_f16x16(p + 32);
      const uint8_t* q = p + (T == GgmlType::Q4_1 ? 64 : 32);
      __m512i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        __m512i v = _mm512_loadu_si512(q + 64 * c);
        lo[c] = _mm512_and_si512(v, m4);
        hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        if constexpr (T == GgmlType::IQ4_NL) {
          lo[c] = _mm512_shuffle_epi8(levels, lo[c]);
          hi[c] = _mm512_shuffle_epi8(levels, hi[c]);
        }
      }
      for (int i = 0; i < NX; ++i) {
        const size_t at = (x0 + i) * k + 32 * b;
        __m512i dot = q4_block_dot(lo, hi, x.qs.data() + at);
        if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
        size_t xi = (x0 + i) * nb + b;
        if constexpr (T == GgmlType::Q4_0) {
          dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(8 * x.s[xi]));  // Q4_0's offset 8
        } else if constexpr (T == GgmlType::IQ4_NL) {
          dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * x.s[xi]));  // the levels' 128
        }
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                 _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xi])), acc[i]);
        if constexpr (T == GgmlType::Q4_1) {
          acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.ds[xi]), acc[i]);
        }
      }
    }
  }
  for (int i = 0; i < NX; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

// Q5_0 (offset 16, taken off as 16 times the block's activation sum) and Q5_1 (d q + m, the min
// term as Q4_1's).
template <GgmlType T, int NX, bool Wide>
void tile_kernel_q5(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr bool kMin = T == GgmlType::Q5_1;
  constexpr size_t kBytes = kMin ? kQ51TileBlock : kQ5TileBlock;
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * kBytes;
    __m512 dw = load_f16x16(p);
    __m512 mw = _mm512_setzero_ps();
    if constexpr (kMin) mw = load_f16x16(p + 32);
    __m512i w[8];
    q5_weights(p + (kMin ? 64 : 32), w);
    for (int i = 0; i < NX; ++i) {
      const size_t at = (x0 + i) * k + 32 * b;
      __m512i dot = q8_block_dot(w, x.qs.data() + at);
      if constexpr (Wide) dot = digits(dot, q8_block_dot(w, x.lo.data() + at));
      size_t xi = (x0 + i) * nb + b;
      if constexpr (!kMin) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(16 * x.s[xi]));
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xi])),
                               acc[i]);
      if constexpr (kMin) acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.ds[xi]), acc[i]);
    }
  }
  for (int i = 0; i < NX; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

#else

// Signed weights (u8 + 128) against 32 activations: |w| times x carrying w's sign keeps maddubs
// from saturating (|x| <= 127).
inline __m256i q8_block_dot(const uint8_t* q, const int8_t* xb, __m256i bias) {
  __m256i sum = _mm256_setzero_si256();
  for (int g = 0; g < 8; ++g) {
    __m256i w =
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * g)), bias);
    __m256i xv = _mm256_set1_epi32(load_i32(xb + 4 * g));
    sum = _mm256_add_epi32(
        sum, pair_sums(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w))));
  }
  return sum;
}

// The same dot with 16-bit activations (Q8Rows::q16) in one pass instead of one per digit: the
// signed weights widened to i16, products summed in pairs to i32 (|w q| <= 127 * 32512, so a
// block's 32 fit). madd_epi16 leaves rows 0-3 (from the low 16 weight bytes) and 4-7 two partial
// sums each; one hadd and a permute put the eight rows' sums in order. The same integers as
// 255 dot(qs) + dot(lo).
inline __m256i q8_block_dot16(const uint8_t* q, const int16_t* xb, __m256i bias) {
  __m256i rows03 = _mm256_setzero_si256(), rows47 = _mm256_setzero_si256();
  for (int g = 0; g < 8; ++g) {
    __m256i w =
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * g)), bias);
    int64_t four;
    std::memcpy(&four, xb + 4 * g, 8);
    const __m256i xv = _mm256_set1_epi64x(four);
    rows03 = _mm256_add_epi32(
        rows03, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)), xv));
    rows47 = _mm256_add_epi32(
        rows47, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)), xv));
  }
  // hadd: rows 0, 1, 4, 5 | 2, 3, 6, 7.
  return _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(rows03, rows47),
                                     _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

// As above, each half of 8 rows in turn (16 ymm registers do not hold both halves).
template <GgmlType T, int NX, bool Wide>
void tile_kernel(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr size_t kBytes = T == GgmlType::Q8_0 ? 544 : T == GgmlType::Q4_1 ? 320 : 288;
  const size_t k = x.k;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  // IQ4_NL: the indices looked up as their signed levels.
  const __m256i levels =
      T == GgmlType::IQ4_NL ? _mm256_broadcastsi128_si256(iq4_levels(0)) : _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* p = tile + b * kBytes;
      if (h == 1) prefetch_next_tile(p + nb * kBytes, kBytes);
      __m256 dw = load_f16x8(p + 16 * h);
      if constexpr (T == GgmlType::Q8_0) {
        const uint8_t* q = p + 32 + 32 * h;
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i dot = Wide ? q8_block_dot16(q, x.q16.data() + at, bias)
                             : q8_block_dot(q, x.qs.data() + at, bias);
          size_t xi = (x0 + i) * nb + b;
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
        }
      } else {
        const uint8_t* q = p + (T == GgmlType::Q4_1 ? 64 : 32) + 32 * h;
        __m256i lo[4], hi[4];
        for (int c = 0; c < 4; ++c) {
          __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
          lo[c] = _mm256_and_si256(v, m4);
          hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          if constexpr (T == GgmlType::IQ4_NL) {
            lo[c] = _mm256_shuffle_epi8(levels, lo[c]);
            hi[c] = _mm256_shuffle_epi8(levels, hi[c]);
          }
        }
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i dot;
          if constexpr (T == GgmlType::IQ4_NL) {
            dot = iq4_block_dot(lo, hi, x.qs.data() + at);
            if constexpr (Wide) dot = digits(dot, iq4_block_dot(lo, hi, x.lo.data() + at));
          } else {
            dot = q4_block_dot(lo, hi, x.qs.data() + at);
            if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
          }
          size_t xi = (x0 + i) * nb + b;
          if constexpr (T == GgmlType::Q4_0) {
            dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(8 * x.s[xi]));
          }
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
          if constexpr (T == GgmlType::Q4_1) {
            acc[i] = _mm256_fmadd_ps(load_f16x8(p + 32 + 16 * h), _mm256_set1_ps(x.ds[xi]), acc[i]);
          }
        }
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

// Q5_0 and Q5_1 as in the AVX-512 kernel.
template <GgmlType T, int NX, bool Wide>
void tile_kernel_q5(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr bool kMin = T == GgmlType::Q5_1;
  constexpr size_t kBytes = kMin ? kQ51TileBlock : kQ5TileBlock;
  const size_t k = x.k;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* p = tile + b * kBytes;
      if (h == 1) prefetch_next_tile(p + nb * kBytes, kBytes);
      __m256 dw = load_f16x8(p + 16 * h);
      __m256 mw = _mm256_setzero_ps();
      if constexpr (kMin) mw = load_f16x8(p + 32 + 16 * h);
      __m256i w[8];
      for (int g = 0; g < 8; ++g) w[g] = q5_group(p + (kMin ? 64 : 32), h, g);
      for (int i = 0; i < NX; ++i) {
        size_t at = (x0 + i) * k + 32 * b;
        __m256i dot = q5_block_dot(w, x.qs.data() + at);
        if constexpr (Wide) dot = digits(dot, q5_block_dot(w, x.lo.data() + at));
        size_t xi = (x0 + i) * nb + b;
        if constexpr (!kMin) dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(16 * x.s[xi]));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                 _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
        if constexpr (kMin) acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.ds[xi]), acc[i]);
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

#endif

template <GgmlType T>
struct Kernel32 {
  template <int NX, bool Wide>
  static void run(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
    if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
      tile_kernel_q5<T, NX, Wide>(tile, nb, x, x0, out);
    } else {
      tile_kernel<T, NX, Wide>(tile, nb, x, x0, out);
    }
  }
};

}  // namespace

void q_gemm_tiles(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1) {
  switch (w.type) {
    case GgmlType::Q4_0:
      return gemm_tiles_with<Kernel32<GgmlType::Q4_0>>(w, x, y, t0, t1);
    case GgmlType::Q4_1:
      return gemm_tiles_with<Kernel32<GgmlType::Q4_1>>(w, x, y, t0, t1);
    case GgmlType::Q8_0:
      return gemm_tiles_with<Kernel32<GgmlType::Q8_0>>(w, x, y, t0, t1);
    case GgmlType::Q5_0:
      return gemm_tiles_with<Kernel32<GgmlType::Q5_0>>(w, x, y, t0, t1);
    case GgmlType::Q5_1:
      return gemm_tiles_with<Kernel32<GgmlType::Q5_1>>(w, x, y, t0, t1);
    case GgmlType::IQ4_NL:
      return gemm_tiles_with<Kernel32<GgmlType::IQ4_NL>>(w, x, y, t0, t1);
    default:
      return q_gemm_tiles_k(w, x, y, t0, t1);
  }
}

}  // namespace WICK_ISA_NS

#if defined(WICK_ISA_VNNI)
const QKernels kQAvx512VnniKernels
#else
const QKernels kQAvx2Kernels
#endif
    {&q_gemm_tiles};

}  // namespace wick::cpu
