// The integer tile kernels of qmatmul, compiled once per instruction set (src/CMakeLists.txt):
// AVX2 (maddubs: u8 x s8 pairs summed to i16, then to i32) and AVX-512 VNNI (dpbusd: four
// u8 x s8 products summed into each i32 lane, no intermediate saturation). One 512-bit dot
// (two 256-bit ones) multiplies four values of 16 weight rows by the same four activations,
// broadcast from memory; each block's integer sum is then scaled in f32. 16-bit activations
// (two base-255 digits of 8 bits) take one such dot per digit.

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
        const int8_t* xb = x.qs.data() + (x0 + i) * k + 32 * b;
        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
        for (int g = 0; g < 8; g += 2) {
          d0 = _mm512_dpbusd_epi32(d0, w[g], _mm512_set1_epi32(load_i32(xb + 4 * g)));
          d1 = _mm512_dpbusd_epi32(d1, w[g + 1], _mm512_set1_epi32(load_i32(xb + 4 * g + 4)));
        }
        __m512i dot = _mm512_add_epi32(d0, d1);
        if constexpr (Wide) {
          const int8_t* xl = x.lo.data() + (x0 + i) * k + 32 * b;
          __m512i e0 = _mm512_setzero_si512(), e1 = _mm512_setzero_si512();
          for (int g = 0; g < 8; g += 2) {
            e0 = _mm512_dpbusd_epi32(e0, w[g], _mm512_set1_epi32(load_i32(xl + 4 * g)));
            e1 = _mm512_dpbusd_epi32(e1, w[g + 1], _mm512_set1_epi32(load_i32(xl + 4 * g + 4)));
          }
          dot = digits(dot, _mm512_add_epi32(e0, e1));
        }
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
        const int8_t* xb = x.qs.data() + (x0 + i) * k + 32 * b;
        __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
          d0 = _mm512_dpbusd_epi32(d0, lo[c], _mm512_set1_epi32(load_i32(xb + 8 * c)));
          d1 = _mm512_dpbusd_epi32(d1, hi[c], _mm512_set1_epi32(load_i32(xb + 8 * c + 4)));
        }
        __m512i dot = _mm512_add_epi32(d0, d1);
        if constexpr (Wide) {
          const int8_t* xl = x.lo.data() + (x0 + i) * k + 32 * b;
          __m512i e0 = _mm512_setzero_si512(), e1 = _mm512_setzero_si512();
          for (int c = 0; c < 4; ++c) {
            e0 = _mm512_dpbusd_epi32(e0, lo[c], _mm512_set1_epi32(load_i32(xl + 8 * c)));
            e1 = _mm512_dpbusd_epi32(e1, hi[c], _mm512_set1_epi32(load_i32(xl + 8 * c + 4)));
          }
          dot = digits(dot, _mm512_add_epi32(e0, e1));
        }
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

#endif

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
          tile_kernel<T, 1, Wide>(tile, nb, x, x0, out);
          break;
        case 2:
          tile_kernel<T, 2, Wide>(tile, nb, x, x0, out);
          break;
        case 3:
          tile_kernel<T, 3, Wide>(tile, nb, x, x0, out);
          break;
        default:
          tile_kernel<T, 4, Wide>(tile, nb, x, x0, out);
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
