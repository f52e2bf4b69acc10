// The integer tile kernels of qmatmul, compiled once per instruction set (src/CMakeLists.txt):
// AVX2 (maddubs: u8 x s8 pairs summed to i16, then to i32) and AVX-512 VNNI (dpbusd: four
// u8 x s8 products summed into each i32 lane, no intermediate saturation). One 512-bit dot
// (two 256-bit ones) multiplies four values of 16 weight rows by the same four activations,
// broadcast from memory; each block's integer sum is then scaled in f32. 16-bit activations
// (two base-255 digits of 8 bits) take one such dot per digit. Q5_0's and Q6_K's 5- and 6-bit
// weights are put together from their nibbles and high bits once per tile-block (shared by the
// activation rows); the K-quants' sub-block scales apply per block of 32, in f32.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/qmatmul.h"

// clang-format off
#include "cpu/isa_begin.h"  // last: the code below is compiled for this file's instruction set
// clang-format on

#if defined(WICK_ISA_VNNI)
#pragma GCC target("avx512vnni")
#endif

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

constexpr int kMaxX = 4;  // activation rows that share one pass over a tile

#if defined(WICK_ISA_VNNI)

// 255 a + b in i32 lanes.
inline __m512i digits(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(a, 8), a), b);
}

// Eight groups of four u8 weights (Q8_0 biased by 128, Q5_0) against 32 activations: two chains.
inline __m512i q8_block_dot(const __m512i (&w)[8], const int8_t* xb) {
  __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
  for (int g = 0; g < 8; g += 2) {
    d0 = _mm512_dpbusd_epi32(d0, w[g], _mm512_set1_epi32(load_i32(xb + 4 * g)));
    d1 = _mm512_dpbusd_epi32(d1, w[g + 1], _mm512_set1_epi32(load_i32(xb + 4 * g + 4)));
  }
  return _mm512_add_epi32(d0, d1);
}

// Nibbles (0..15; lo: values 0..15 of the block, hi: 16..31) against 32 activations.
inline __m512i q4_block_dot(const __m512i (&lo)[4], const __m512i (&hi)[4], const int8_t* xb) {
  __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    d0 = _mm512_dpbusd_epi32(d0, lo[c], _mm512_set1_epi32(load_i32(xb + 8 * c)));
    d1 = _mm512_dpbusd_epi32(d1, hi[c], _mm512_set1_epi32(load_i32(xb + 8 * c + 4)));
  }
  return _mm512_add_epi32(d0, d1);
}

// 16 rows x NX activation rows over all blocks of one tile; out[i][r] = row r's dot with x row i.
// Wide: x's values are 255 qs + lo (two 8-bit digits), each digit one set of dots.
template <GgmlType T, int NX, bool Wide>
void tile_kernel(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr size_t kBytes = T == GgmlType::Q8_0 ? 544 : T == GgmlType::Q4_1 ? 320 : 288;
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * kBytes;
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
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
      if constexpr (T == GgmlType::Q4_1) {
        mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
      }
      const uint8_t* q = p + (T == GgmlType::Q4_1 ? 64 : 32);
      __m512i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        __m512i v = _mm512_loadu_si512(q + 64 * c);
        lo[c] = _mm512_and_si512(v, m4);
        hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      for (int i = 0; i < NX; ++i) {
        const size_t at = (x0 + i) * k + 32 * b;
        __m512i dot = q4_block_dot(lo, hi, x.qs.data() + at);
        if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
        size_t xi = (x0 + i) * nb + b;
        if constexpr (T == GgmlType::Q4_0) {
          dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(8 * x.s[xi]));  // Q4_0's offset 8
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

// Q4_K: each block of 32 is one of the super-block's sub-blocks: the integer dot of its nibbles
// times d sc (exact in f32: 11 by 6 bits) and the activations' d, less dmin m times the
// activations' d s.
template <int NX, bool Wide>
void tile_kernel_q4k(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = tile + sb * kQ4KTileSuper;
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
    for (size_t j = 0; j < 8; ++j) {
      const uint8_t* blk = p + kQ4KTileHeader + j * kQ4KTileBlock;
      const size_t b = 8 * sb + j;
      __m512 dw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)))));
      __m512 mw = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(
                                          reinterpret_cast<const __m128i*>(blk + 16)))));
      __m512i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        __m512i v = _mm512_loadu_si512(blk + 32 + 64 * c);
        lo[c] = _mm512_and_si512(v, m4);
        hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      for (int i = 0; i < NX; ++i) {
        const size_t at = (x0 + i) * k + 32 * b;
        __m512i dot = q4_block_dot(lo, hi, x.qs.data() + at);
        if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
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

// Two dots of 16 values (groups 0..3 and 4..7) of one activation block against the 6-bit weights.
inline void q6k_dots(const __m512i (&w)[8], const int8_t* xb, __m512i* first, __m512i* second) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  __m512i b0 = _mm512_setzero_si512(), b1 = _mm512_setzero_si512();
  a0 = _mm512_dpbusd_epi32(a0, w[0], _mm512_set1_epi32(load_i32(xb)));
  a1 = _mm512_dpbusd_epi32(a1, w[1], _mm512_set1_epi32(load_i32(xb + 4)));
  b0 = _mm512_dpbusd_epi32(b0, w[4], _mm512_set1_epi32(load_i32(xb + 16)));
  b1 = _mm512_dpbusd_epi32(b1, w[5], _mm512_set1_epi32(load_i32(xb + 20)));
  a0 = _mm512_dpbusd_epi32(a0, w[2], _mm512_set1_epi32(load_i32(xb + 8)));
  a1 = _mm512_dpbusd_epi32(a1, w[3], _mm512_set1_epi32(load_i32(xb + 12)));
  b0 = _mm512_dpbusd_epi32(b0, w[6], _mm512_set1_epi32(load_i32(xb + 24)));
  b1 = _mm512_dpbusd_epi32(b1, w[7], _mm512_set1_epi32(load_i32(xb + 28)));
  *first = _mm512_add_epi32(a0, a1);
  *second = _mm512_add_epi32(b0, b1);
}

template <int NX, bool Wide>
void tile_kernel_q6k(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t sb = 0; sb < nb / 8; ++sb) {
    const uint8_t* p = tile + sb * kQ6KTileSuper;
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    for (size_t j = 0; j < 8; ++j) {
      const uint8_t* blk = p + kQ6KTileHeader + j * kQ6KTileBlock;
      const size_t b = 8 * sb + j;
      // d sc: exact in f32 (11 by 8 bits).
      __m512 sc0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)))));
      __m512 sc1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                        reinterpret_cast<const __m128i*>(blk + 16)))));
      __m512i nib[4], high[2], w[8];
      for (int c = 0; c < 4; ++c) nib[c] = _mm512_loadu_si512(blk + 32 + 64 * c);
      for (int h = 0; h < 2; ++h) high[h] = _mm512_loadu_si512(blk + 288 + 64 * h);
      for (int g = 0; g < 8; ++g) w[g] = q6k_group(nib, high, g);
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
        // The offset 32: less 32 times each half's activation sum.
        first = _mm512_sub_epi32(first, _mm512_set1_epi32(32 * x.s16[xi]));
        second = _mm512_sub_epi32(second, _mm512_set1_epi32(32 * (x.s[xi] - x.s16[xi])));
        __m512 dx = _mm512_set1_ps(x.d[xi]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(first), _mm512_mul_ps(sc0, dx), acc[i]);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(second), _mm512_mul_ps(sc1, dx), acc[i]);
      }
    }
  }
  for (int i = 0; i < NX; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

// Q5_0: the nibbles ORed with the fifth bit (bit 4) of group g's values, offset 16.
inline __m512i q5_group(const __m512i (&nib)[4], __m512i high, int g) {
  const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
  __m512i v = nib[g / 2];
  __m512i low =
      g % 2 == 0 ? _mm512_and_si512(v, m4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  __m512i h = g < 4 ? _mm512_sll_epi16(high, _mm_cvtsi32_si128(4 - g))
                    : _mm512_srl_epi16(high, _mm_cvtsi32_si128(g - 4));
  return _mm512_or_si512(low, _mm512_and_si512(h, m10));
}

template <int NX, bool Wide>
void tile_kernel_q5_0(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0,
                      float (*out)[16]) {
  const size_t k = x.k;
  __m512 acc[NX];
  for (int i = 0; i < NX; ++i) acc[i] = _mm512_setzero_ps();
  for (size_t b = 0; b < nb; ++b) {
    const uint8_t* p = tile + b * kQ5TileBlock;
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    __m512i nib[4], w[8];
    for (int c = 0; c < 4; ++c) nib[c] = _mm512_loadu_si512(p + 32 + 64 * c);
    __m512i high = _mm512_loadu_si512(p + 288);
    for (int g = 0; g < 8; ++g) w[g] = q5_group(nib, high, g);
    for (int i = 0; i < NX; ++i) {
      const size_t at = (x0 + i) * k + 32 * b;
      __m512i dot = q8_block_dot(w, x.qs.data() + at);
      if constexpr (Wide) dot = digits(dot, q8_block_dot(w, x.lo.data() + at));
      size_t xi = (x0 + i) * nb + b;
      dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(16 * x.s[xi]));  // the offset 16
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(x.d[xi])),
                               acc[i]);
    }
  }
  for (int i = 0; i < NX; ++i) _mm512_storeu_ps(out[i], acc[i]);
}

#else

// i32 lanes: sums of adjacent i16 pairs.
inline __m256i pair_sums(__m256i v) {
  return _mm256_madd_epi16(v, _mm256_set1_epi16(1));
}

// 255 a + b in i32 lanes.
inline __m256i digits(__m256i a, __m256i b) {
  return _mm256_add_epi32(_mm256_sub_epi32(_mm256_slli_epi32(a, 8), a), b);
}

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

// Nibbles (0..15) against 32 activations: 15 * 127 * 2 per maddubs lane, so eight of them
// still fit in i16.
inline __m256i q4_block_dot(const __m256i (&lo)[4], const __m256i (&hi)[4], const int8_t* xb) {
  __m256i s16 = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    s16 =
        _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[c], _mm256_set1_epi32(load_i32(xb + 8 * c))));
    s16 = _mm256_add_epi16(
        s16, _mm256_maddubs_epi16(hi[c], _mm256_set1_epi32(load_i32(xb + 8 * c + 4))));
  }
  return pair_sums(s16);
}

// As above, each half of 8 rows in turn (16 ymm registers do not hold both halves).
template <GgmlType T, int NX, bool Wide>
void tile_kernel(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  constexpr size_t kBytes = T == GgmlType::Q8_0 ? 544 : T == GgmlType::Q4_1 ? 320 : 288;
  const size_t k = x.k;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* p = tile + b * kBytes;
      __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      if constexpr (T == GgmlType::Q8_0) {
        const uint8_t* q = p + 32 + 32 * h;
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i dot = q8_block_dot(q, x.qs.data() + at, bias);
          if constexpr (Wide) dot = digits(dot, q8_block_dot(q, x.lo.data() + at, bias));
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
        }
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i dot = q4_block_dot(lo, hi, x.qs.data() + at);
          if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
          size_t xi = (x0 + i) * nb + b;
          if constexpr (T == GgmlType::Q4_0) {
            dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(8 * x.s[xi]));
          }
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                   _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
          if constexpr (T == GgmlType::Q4_1) {
            __m256 mw =
                _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * h)));
            acc[i] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.ds[xi]), acc[i]);
          }
        }
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

// Q4_K as in the AVX-512 kernel: the block's integer dot times d sc and the activations' d, less
// dmin m times the activations' d s.
template <int NX, bool Wide>
void tile_kernel_q4k(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  const size_t k = x.k;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nb / 8; ++sb) {
      const uint8_t* p = tile + sb * kQ4KTileSuper;
      __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      __m256 dmin =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * h)));
      for (size_t j = 0; j < 8; ++j) {
        const uint8_t* blk = p + kQ4KTileHeader + j * kQ4KTileBlock;
        const size_t b = 8 * sb + j;
        __m256 dw = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                         reinterpret_cast<const __m128i*>(blk + 8 * h)))));
        __m256 mw = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                            reinterpret_cast<const __m128i*>(blk + 16 + 8 * h)))));
        const uint8_t* q = blk + 32 + 32 * h;
        __m256i lo[4], hi[4];
        for (int c = 0; c < 4; ++c) {
          __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
          lo[c] = _mm256_and_si256(v, m4);
          hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        for (int i = 0; i < NX; ++i) {
          size_t at = (x0 + i) * k + 32 * b;
          __m256i dot = q4_block_dot(lo, hi, x.qs.data() + at);
          if constexpr (Wide) dot = digits(dot, q4_block_dot(lo, hi, x.lo.data() + at));
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

// The dots of 16 values (groups 0..3, then 4..7) of one activation block: maddubs lanes of
// 63 * 127 * 2, two of them still fit in i16.
inline void q6k_dots(const __m256i (&w)[8], const int8_t* xb, __m256i* first, __m256i* second) {
  __m256i r[4];
  for (int pair = 0; pair < 4; ++pair) {
    int g = 2 * pair;
    r[pair] = pair_sums(_mm256_add_epi16(
        _mm256_maddubs_epi16(w[g], _mm256_set1_epi32(load_i32(xb + 4 * g))),
        _mm256_maddubs_epi16(w[g + 1], _mm256_set1_epi32(load_i32(xb + 4 * g + 4)))));
  }
  *first = _mm256_add_epi32(r[0], r[1]);
  *second = _mm256_add_epi32(r[2], r[3]);
}

template <int NX, bool Wide>
void tile_kernel_q6k(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  const size_t k = x.k;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t sb = 0; sb < nb / 8; ++sb) {
      const uint8_t* p = tile + sb * kQ6KTileSuper;
      __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      for (size_t j = 0; j < 8; ++j) {
        const uint8_t* blk = p + kQ6KTileHeader + j * kQ6KTileBlock;
        const size_t b = 8 * sb + j;
        __m256 sc0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                          reinterpret_cast<const __m128i*>(blk + 8 * h)))));
        __m256 sc1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                          reinterpret_cast<const __m128i*>(blk + 16 + 8 * h)))));
        __m256i w[8];
        for (int g = 0; g < 8; ++g) w[g] = q6k_group(blk, h, g);
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
          first = _mm256_sub_epi32(first, _mm256_set1_epi32(32 * x.s16[xi]));
          second = _mm256_sub_epi32(second, _mm256_set1_epi32(32 * (x.s[xi] - x.s16[xi])));
          __m256 dx = _mm256_set1_ps(x.d[xi]);
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(first), _mm256_mul_ps(sc0, dx), acc[i]);
          acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(second), _mm256_mul_ps(sc1, dx), acc[i]);
        }
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

// Q5_0 as in the AVX-512 kernel: group g's nibbles ORed with their fifth bit, offset 16.
inline __m256i q5_group(const uint8_t* p, int h, int g) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 64 * (g / 2) + 32 * h));
  __m256i low =
      g % 2 == 0 ? _mm256_and_si256(v, m4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 288 + 32 * h));
  hb = g < 4 ? _mm256_sll_epi16(hb, _mm_cvtsi32_si128(4 - g))
             : _mm256_srl_epi16(hb, _mm_cvtsi32_si128(g - 4));
  return _mm256_or_si256(low, _mm256_and_si256(hb, m10));
}

template <int NX, bool Wide>
void tile_kernel_q5_0(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0,
                      float (*out)[16]) {
  const size_t k = x.k;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NX];
    for (int i = 0; i < NX; ++i) acc[i] = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; ++b) {
      const uint8_t* p = tile + b * kQ5TileBlock;
      __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      __m256i w[8];
      for (int g = 0; g < 8; ++g) w[g] = q5_group(p, h, g);
      for (int i = 0; i < NX; ++i) {
        size_t at = (x0 + i) * k + 32 * b;
        __m256i first, second;
        q6k_dots(w, x.qs.data() + at, &first, &second);
        __m256i dot = _mm256_add_epi32(first, second);
        if constexpr (Wide) {
          q6k_dots(w, x.lo.data() + at, &first, &second);
          dot = digits(dot, _mm256_add_epi32(first, second));
        }
        size_t xi = (x0 + i) * nb + b;
        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(16 * x.s[xi]));
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                                 _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
      }
    }
    for (int i = 0; i < NX; ++i) _mm256_storeu_ps(out[i] + 8 * h, acc[i]);
  }
}

#endif

template <GgmlType T, int NX, bool Wide>
void run_tile(const uint8_t* tile, size_t nb, const Q8Rows& x, size_t x0, float (*out)[16]) {
  if constexpr (T == GgmlType::Q4_K) {
    tile_kernel_q4k<NX, Wide>(tile, nb, x, x0, out);
  } else if constexpr (T == GgmlType::Q6_K) {
    tile_kernel_q6k<NX, Wide>(tile, nb, x, x0, out);
  } else if constexpr (T == GgmlType::Q5_0) {
    tile_kernel_q5_0<NX, Wide>(tile, nb, x, x0, out);
  } else {
    tile_kernel<T, NX, Wide>(tile, nb, x, x0, out);
  }
}

template <GgmlType T, bool Wide>
void gemm_tiles_typed(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1) {
  const size_t nb = w.k / 32, n = w.n;
  alignas(64) float out[kMaxX][16];
  for (size_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w.tile(t);
    size_t rows = std::min(kQTileRows, n - t * kQTileRows);
    for (size_t x0 = 0; x0 < x.m; x0 += kMaxX) {
      size_t nx = std::min<size_t>(kMaxX, x.m - x0);
      switch (nx) {
        case 1:
          run_tile<T, 1, Wide>(tile, nb, x, x0, out);
          break;
        case 2:
          run_tile<T, 2, Wide>(tile, nb, x, x0, out);
          break;
        case 3:
          run_tile<T, 3, Wide>(tile, nb, x, x0, out);
          break;
        default:
          run_tile<T, 4, Wide>(tile, nb, x, x0, out);
          break;
      }
      for (size_t i = 0; i < nx; ++i) {
        std::memcpy(y + (x0 + i) * n + t * kQTileRows, out[i], rows * sizeof(float));
      }
    }
  }
}

template <bool Wide>
void gemm_tiles_wide(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1) {
  switch (w.type) {
    case GgmlType::Q4_0:
      return gemm_tiles_typed<GgmlType::Q4_0, Wide>(w, x, y, t0, t1);
    case GgmlType::Q4_1:
      return gemm_tiles_typed<GgmlType::Q4_1, Wide>(w, x, y, t0, t1);
    case GgmlType::Q4_K:
      return gemm_tiles_typed<GgmlType::Q4_K, Wide>(w, x, y, t0, t1);
    case GgmlType::Q6_K:
      return gemm_tiles_typed<GgmlType::Q6_K, Wide>(w, x, y, t0, t1);
    case GgmlType::Q5_0:
      return gemm_tiles_typed<GgmlType::Q5_0, Wide>(w, x, y, t0, t1);
    default:
      return gemm_tiles_typed<GgmlType::Q8_0, Wide>(w, x, y, t0, t1);
  }
}

}  // namespace

void q_gemm_tiles(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1) {
  if (x.wide) return gemm_tiles_wide<true>(w, x, y, t0, t1);
  gemm_tiles_wide<false>(w, x, y, t0, t1);
}

}  // namespace WICK_ISA_NS

#if defined(WICK_ISA_VNNI)
const QKernels kQAvx512VnniKernels
#else
const QKernels kQAvx2Kernels
#endif
    {&q_gemm_tiles};

}  // namespace wick::cpu
