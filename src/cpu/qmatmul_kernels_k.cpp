// The integer tile kernels of qmatmul for the types of super-blocks of 256 values (Q4_K, Q5_K,
// Q6_K, Q2_K, IQ4_XS), compiled once per instruction set as qmatmul_kernels.cpp (which
// dispatches here). Each block of 32 activations is one integer dot per digit against 16 weight
// rows (two dots of 16 where the weights' sub-blocks are 16 long: Q6_K, Q2_K), scaled in f32 by
// the rows' super-block scale times their sub-block scale (exact in f32) and the activations'
// block scale; the mins of Q4_K, Q5_K and Q2_K are subtracted as min times the activations'
// block (or half-block) sum. IQ4_XS's 4-bit indices become their int8 levels through a byte
// shuffle.

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

// 16 u8 (or i8) sub-block scales as f32.
inline __m512 u8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline __m512 i8x16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Q4_K and Q5_K: each block of 32 is one of the super-block's sub-blocks: the integer dot of its
// 4- or 5-bit values times d sc (exact in f32: 11 by 6 bits) and the activations' d, less
// dmin m times the activations' d s.
template <GgmlType T, int NX, bool Wide>
void tile_kernel_q45k(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0,
                      float (*out)[16]) {
  constexpr bool kFive = T == GgmlType::Q5_K;
  constexpr size_t kSuper = kFive ? kQ5KTileSuper : kQ4KTileSuper;
  constexpr size_t kBlock = kFive ? kQ5KTileBlock : kQ4KTileBlock;
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = tile + sb * kSuper;
    __m512 d = load_f16x16(p), dmin = load_f16x16(p + 32);
    for (size_t j = 0; j < 8; ++j) {
      const uint8_t* blk = p + kQ4KTileHeader + j * kBlock;
      const size_t b = 8 * sb + j;
      __m512 dw = _mm512_mul_ps(d, u8x16(blk));
      __m512 mw = _mm512_mul_ps(dmin, u8x16(blk + 16));
      __m512i lo[4], hi[4], w[8];
      if constexpr (kFive) {
        q5_weights(blk + 32, w);
      } else {
        for (int c = 0; c < 4; ++c) {
          __m512i v = _mm512_loadu_si512(blk + 32 + 64 * c);
          lo[c] = _mm512_and_si512(v, m4);
          hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        }
      }
      for (int i = 0; i < NX; ++i) {
        const size_t at = (x0 + i) * k + 32 * b;
        __m512i dot;
        if constexpr (kFive) {
          dot = q8_block_dot(w, x.qs.data() + at);
          if constexpr (Wide) dot = digits(dot, q8_block_dot(w, x.lo.data() + at));
        } else {
          dot = q4_block_dot(lo, hi, x.qs.data() + at);
          if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
        }
        size_t xi = (x0 + i) * nb + b;
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                 _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xi])), acc[i]);
        acc[i] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(x.ds[xi]), acc[i]);
      }
    }
  }
  for (int i = 0; i < NX; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

// Q6_K: each block of 32 holds two sub-blocks of 16 with their own scales. Group g (values
// 4g .. 4g + 3) of the 6-bit weights: its nibbles ORed with its 2 high bits (bits 4, 5).
inline __m512i q6k_group(const __m512i (&nib)[4], const __m512i (&high)[2], int g) {
  const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
  __m512i v = nib[g / 2];
  __m512i low =
      g % 2 == 0 ? _mm512_and_si512(v, m4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  __m512i h = high[g / 4];
  switch (g % 4) {
    case 0:
      h = _mm512_slli_epi16(h, 4);
      break;
    case 1:
      h = _mm512_slli_epi16(h, 2);
      break;
    case 3:
      h = _mm512_srli_epi16(h, 2);
      break;
    default:
      break;
  }
  return _mm512_or_si512(low, _mm512_and_si512(h, m30));
}

// Q2_K's 2-bit weights of group g: bits 2 (g % 4), + 1 of chunk g / 4.
inline __m512i q2k_group(const __m512i (&crumbs)[2], int g) {
  return _mm512_and_si512(_mm512_srl_epi16(crumbs[g / 4], _mm_cvtsi32_si128(2 * (g % 4))),
                          _mm512_set1_epi8(3));
}

// Q6_K (6-bit values, offset 32 taken off as 32 times each half's activation sum) and Q2_K
// (2-bit values, its mins taken off as dmin m times each half's d s): two sub-blocks of 16 per
// block, each with its scale.
template <GgmlType T, int NX, bool Wide>
void tile_kernel_q16(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr bool kTwo = T == GgmlType::Q2_K;
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = tile + sb * (kTwo ? kQ2KTileSuper : kQ6KTileSuper);
    __m512 d = load_f16x16(p);
    __m512 dmin = _mm512_setzero_ps();
    if constexpr (kTwo) dmin = load_f16x16(p + 32);
    for (size_t j = 0; j < 8; ++j) {
      const size_t b = 8 * sb + j;
      // d sc: exact in f32 (11 by 8 bits).
      __m512 sc0, sc1, m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
      __m512i w[8];
      if constexpr (kTwo) {
        const uint8_t* blk = p + kQ2KTileHeader + j * kQ2KTileBlock;
        sc0 = _mm512_mul_ps(d, u8x16(blk));
        sc1 = _mm512_mul_ps(d, u8x16(blk + 16));
        m0 = _mm512_mul_ps(dmin, u8x16(blk + 32));
        m1 = _mm512_mul_ps(dmin, u8x16(blk + 48));
        __m512i crumbs[2];
        for (int h = 0; h < 2; ++h) crumbs[h] = _mm512_loadu_si512(blk + 64 + 64 * h);
        for (int g = 0; g < 8; ++g) w[g] = q2k_group(crumbs, g);
      } else {
        const uint8_t* blk = p + kQ6KTileHeader + j * kQ6KTileBlock;
        sc0 = _mm512_mul_ps(d, i8x16(blk));
        sc1 = _mm512_mul_ps(d, i8x16(blk + 16));
        __m512i nib[4], high[2];
        for (int c = 0; c < 4; ++c) nib[c] = _mm512_loadu_si512(blk + 32 + 64 * c);
        for (int h = 0; h < 2; ++h) high[h] = _mm512_loadu_si512(blk + 288 + 64 * h);
        for (int g = 0; g < 8; ++g) w[g] = q6k_group(nib, high, g);
      }
      for (int i = 0; i < NX; ++i) {
        __m512i first, second;
        q6k_dots(w, x.qs.data() + (x0 + i) * k + 32 * b, &first, &second);
        if constexpr (Wide) {
          __m512i lo_first, lo_second;
          q6k_dots(w, x.lo.data() + (x0 + i) * k + 32 * b, &lo_first, &lo_second);
          first = digits(first, lo_first);
          second = digits(second, lo_second);
        }
        size_t xi = (x0 + i) * nb + b;
        const int32_t s0 = x.s16[xi], s1 = x.s[xi] - x.s16[xi];
        if constexpr (!kTwo) {
          first = _mm512_sub_epi32(first, _mm512_set1_epi32(32 * s0));
          second = _mm512_sub_epi32(second, _mm512_set1_epi32(32 * s1));
        }
        __m512 dx = _mm512_set1_ps(x.d[xi]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first), _mm512_mul_ps(sc0, dx), acc[i]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second), _mm512_mul_ps(sc1, dx), acc[i]);
        if constexpr (kTwo) {
          acc[i] = _mm512_fnmadd_ps(m0, _mm512_set1_ps(x.d[xi] * static_cast<float>(s0)), acc[i]);
          acc[i] = _mm512_fnmadd_ps(m1, _mm512_set1_ps(x.d[xi] * static_cast<float>(s1)), acc[i]);
        }
      }
    }
  }
  for (int i = 0; i < NX; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

// IQ4_XS: the indices looked up as level + 128 (u8, for dpbusd), the 128 taken off as 128 times
// the block's activation sum; the block's dot times d sc (11 by 6 bits, exact) and x's d.
template <int NX, bool Wide>
void tile_kernel_iq4xs(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0,
                       float (*out)[16]) {
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i table = _mm512_broadcast_i32x4(iq4_levels(128));
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = tile + sb * kIQ4XSTileSuper;
    __m512 d = load_f16x16(p);
    for (size_t j = 0; j < 8; ++j) {
      const uint8_t* blk = p + kIQ4XSTileHeader + j * kIQ4XSTileBlock;
      const size_t b = 8 * sb + j;
      __m512 dw = _mm512_mul_ps(d, i8x16(blk));
      __m512i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        __m512i v = _mm512_loadu_si512(blk + 16 + 64 * c);
        lo[c] = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
        hi[c] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
      }
      for (int i = 0; i < NX; ++i) {
        const size_t at = (x0 + i) * k + 32 * b;
        __m512i dot = q4_block_dot(lo, hi, x.qs.data() + at);
        if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
        size_t xi = (x0 + i) * nb + b;
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * x.s[xi]));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                 _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xi])), acc[i]);
      }
    }
  }
  for (int i = 0; i < NX; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

#else

// 8 u8 (or i8) sub-block scales as f32.
inline __m256 u8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 i8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Q4_K and Q5_K as in the AVX-512 kernel, each half of 8 rows in turn.
template <GgmlType T, int NX, bool Wide>
void tile_kernel_q45k(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0,
                      float (*out)[16]) {
  constexpr bool kFive = T == GgmlType::Q5_K;
  constexpr size_t kSuper = kFive ? kQ5KTileSuper : kQ4KTileSuper;
  constexpr size_t kBlock = kFive ? kQ5KTileBlock : kQ4KTileBlock;
  const size_t k = x.k;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nb / 8; ++sb) {
      const uint8_t* p = tile + sb * kSuper;
      if (h == 1) prefetch_next_tile(p + nb / 8 * kSuper, kSuper);
      __m256 d = load_f16x8(p + 16 * h), dmin = load_f16x8(p + 32 + 16 * h);
      for (size_t j = 0; j < 8; ++j) {
        const uint8_t* blk = p + kQ4KTileHeader + j * kBlock;
        const size_t b = 8 * sb + j;
        __m256 dw = _mm256_mul_ps(d, u8x8(blk + 8 * h));
        __m256 mw = _mm256_mul_ps(dmin, u8x8(blk + 16 + 8 * h));
        __m256i lo[4], hi[4], w[8];
        if constexpr (kFive) {
          for (int g = 0; g < 8; ++g) w[g] = q5_group(blk + 32, h, g);
        } else {
          const uint8_t* q = blk + 32 + 32 * h;
          for (int c = 0; c < 4; ++c) {
            __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
            lo[c] = _mm256_and_si256(v, m4);
            hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
          }
        }
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i dot;
          if constexpr (kFive) {
            dot = q5_block_dot(w, x.qs.data() + at);
            if constexpr (Wide) dot = digits(dot, q5_block_dot(w, x.lo.data() + at));
          } else {
            dot = q4_block_dot(lo, hi, x.qs.data() + at);
            if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
          }
          size_t xi = (x0 + i) * nb + b;
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
          acc[i] = _mm256_fnmadd_ps(mw, _mm256_set1_ps(x.ds[xi]), acc[i]);
        }
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

// Group g (values 4g .. 4g + 3) of Q6_K's 6-bit weights for 8 rows.
inline __m256i q6k_group(const uint8_t* blk, int h, int g) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  __m256i v =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 64 * (g / 2) + 32 * h));
  __m256i low =
      g % 2 == 0 ? _mm256_and_si256(v, m4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  __m256i hb =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 288 + 64 * (g / 4) + 32 * h));
  switch (g % 4) {
    case 0:
      hb = _mm256_slli_epi16(hb, 4);
      break;
    case 1:
      hb = _mm256_slli_epi16(hb, 2);
      break;
    case 3:
      hb = _mm256_srli_epi16(hb, 2);
      break;
    default:
      break;
  }
  return _mm256_or_si256(low, _mm256_and_si256(hb, m30));
}

// Group g of Q2_K's 2-bit weights for 8 rows: bits 2 (g % 4), + 1 of chunk g / 4.
inline __m256i q2k_group(const uint8_t* blk, int h, int g) {
  __m256i c =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 + 64 * (g / 4) + 32 * h));
  return _mm256_and_si256(_mm256_srl_epi16(c, _mm_cvtsi32_si128(2 * (g % 4))), _mm256_set1_epi8(3));
}

// Q6_K and Q2_K as in the AVX-512 kernel.
template <GgmlType T, int NX, bool Wide>
void tile_kernel_q16(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr bool kTwo = T == GgmlType::Q2_K;
  constexpr size_t kSuper = kTwo ? kQ2KTileSuper : kQ6KTileSuper;
  const size_t k = x.k;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nb / 8; ++sb) {
      const uint8_t* p = tile + sb * kSuper;
      if (h == 1) prefetch_next_tile(p + nb / 8 * kSuper, kSuper);
      __m256 d = load_f16x8(p + 16 * h);
      __m256 dmin = _mm256_setzero_ps();
      if constexpr (kTwo) dmin = load_f16x8(p + 32 + 16 * h);
      for (size_t j = 0; j < 8; ++j) {
        const size_t b = 8 * sb + j;
        __m256 sc0, sc1, m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
        __m256i w[8];
        if constexpr (kTwo) {
          const uint8_t* blk = p + kQ2KTileHeader + j * kQ2KTileBlock;
          sc0 = _mm256_mul_ps(d, u8x8(blk + 8 * h));
          sc1 = _mm256_mul_ps(d, u8x8(blk + 16 + 8 * h));
          m0 = _mm256_mul_ps(dmin, u8x8(blk + 32 + 8 * h));
          m1 = _mm256_mul_ps(dmin, u8x8(blk + 48 + 8 * h));
          for (int g = 0; g < 8; ++g) w[g] = q2k_group(blk, h, g);
        } else {
          const uint8_t* blk = p + kQ6KTileHeader + j * kQ6KTileBlock;
          sc0 = _mm256_mul_ps(d, i8x8(blk + 8 * h));
          sc1 = _mm256_mul_ps(d, i8x8(blk + 16 + 8 * h));
          for (int g = 0; g < 8; ++g) w[g] = q6k_group(blk, h, g);
        }
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i first, second;
          q6k_dots(w, x.qs.data() + at, &first, &second);
          if constexpr (Wide) {
            __m256i lo_first, lo_second;
            q6k_dots(w, x.lo.data() + at, &lo_first, &lo_second);
            first = digits(first, lo_first);
            second = digits(second, lo_second);
          }
          size_t xi = (x0 + i) * nb + b;
          const int32_t s0 = x.s16[xi], s1 = x.s[xi] - x.s16[xi];
          if constexpr (!kTwo) {
            first = _mm256_sub_epi32(first, _mm256_set1_epi32(32 * s0));
            second = _mm256_sub_epi32(second, _mm256_set1_epi32(32 * s1));
          }
          __m256 dx = _mm256_set1_ps(x.d[xi]);
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first), _mm256_mul_ps(sc0, dx), acc[i]);
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second), _mm256_mul_ps(sc1, dx), acc[i]);
          if constexpr (kTwo) {
            acc[i] = _mm256_fnmadd_ps(m0, _mm256_set1_ps(x.d[xi] * static_cast<float>(s0)), acc[i]);
            acc[i] = _mm256_fnmadd_ps(m1, _mm256_set1_ps(x.d[xi] * static_cast<float>(s1)), acc[i]);
          }
        }
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

// IQ4_XS as in the AVX-512 kernel, with the signed levels.
template <int NX, bool Wide>
void tile_kernel_iq4xs(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0,
                       float (*out)[16]) {
  const size_t k = x.k;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i table = _mm256_broadcastsi128_si256(iq4_levels(0));
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nb / 8; ++sb) {
      const uint8_t* p = tile + sb * kIQ4XSTileSuper;
      if (h == 1) prefetch_next_tile(p + nb / 8 * kIQ4XSTileSuper, kIQ4XSTileSuper);
      __m256 d = load_f16x8(p + 16 * h);
      for (size_t j = 0; j < 8; ++j) {
        const uint8_t* blk = p + kIQ4XSTileHeader + j * kIQ4XSTileBlock;
        const size_t b = 8 * sb + j;
        __m256 dw = _mm256_mul_ps(d, i8x8(blk + 8 * h));
        const uint8_t* q = blk + 16 + 32 * h;
        __m256i lo[4], hi[4];
        for (int c = 0; c < 4; ++c) {
          __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
          lo[c] = _mm256_shuffle_epi8(table, _mm256_and_si256(v, m4));
          hi[c] = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
        }
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i dot = iq4_block_dot(lo, hi, x.qs.data() + at);
          if constexpr (Wide) dot = digits(dot, iq4_block_dot(lo, hi, x.lo.data() + at));
          size_t xi = (x0 + i) * nb + b;
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
        }
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

#endif

template <GgmlType T>
struct KernelK {
  template <int NX, bool Wide>
  static void run(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
    if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
      tile_kernel_q45k<T, NX, Wide>(tile, nb, x, x0, out);
    } else if constexpr (T == GgmlType::Q6_K || T == GgmlType::Q2_K) {
      tile_kernel_q16<T, NX, Wide>(tile, nb, x, x0, out);
    } else {
      tile_kernel_iq4xs<NX, Wide>(tile, nb, x, x0, out);
    }
  }
};

}  // namespace

void q_gemm_tiles_k(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1) {
  switch (w.type) {
    case GgmlType::Q4_K:
      return gemm_tiles_with<KernelK<GgmlType::Q4_K>>(w, x, y, t0, t1);
    case GgmlType::Q5_K:
      return gemm_tiles_with<KernelK<GgmlType::Q5_K>>(w, x, y, t0, t1);
    case GgmlType::Q6_K:
      return gemm_tiles_with<KernelK<GgmlType::Q6_K>>(w, x, y, t0, t1);
    case GgmlType::Q2_K:
      return gemm_tiles_with<KernelK<GgmlType::Q2_K>>(w, x, y, t0, t1);
    default:
      return gemm_tiles_with<KernelK<GgmlType::IQ4_XS>>(w, x, y, t0, t1);
  }
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
