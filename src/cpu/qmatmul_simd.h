#pragma once
// What the qmatmul tile kernels (src/cpu/qmatmul_kernels.cpp, qmatmul_kernels_k.cpp) share:
// the integer dots of one block of 32 activations against 16 weight rows, and the loop over a
// range of tiles and groups of activation rows. Included after cpu/isa_begin.h, so that it is
// compiled for the including file's instruction set (AVX2, or AVX-512 with VNNI); the including
// file includes what it uses (<immintrin.h>, <algorithm>, <cstring>, cpu/qmatmul.h,
// ops/ggml_blocks.h) before
// cpu/isa_begin.h, so that no standard header is compiled for AVX-512.

namespace wick::cpu {
inline namespace WICK_ISA_NS {
namespace {

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

constexpr int kMaxX = 4;  // activation rows that share one pass over a tile

// IQ4_NL's and IQ4_XS's 16 levels (offset by `bias`) as 16 bytes, the table of the byte shuffles
// that turn their 4-bit indices into values.
inline __m128i iq4_levels(int bias) {
  alignas(16) int8_t levels[16];
  for (unsigned i = 0; i < 16; ++i) levels[i] = static_cast<int8_t>(ops::iq4_level(i) + bias);
  return _mm_load_si128(reinterpret_cast<const __m128i*>(levels));
}

#if defined(WICK_ISA_VNNI)

// 255 a + b in i32 lanes.
inline __m512i digits(__m512i a, __m512i b) {
  return _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(a, 8), a), b);
}

// Eight groups of four u8 weights (group g: values 4g .. 4g + 3) against 32 activations: two
// chains.
inline __m512i q8_block_dot(const __m512i (&w)[8], const int8_t* xb) {
  __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
  for (int g = 0; g < 8; g += 2) {
    d0 = _mm512_dpbusd_epi32(d0, w[g], _mm512_set1_epi32(load_i32(xb + 4 * g)));
    d1 = _mm512_dpbusd_epi32(d1, w[g + 1], _mm512_set1_epi32(load_i32(xb + 4 * g + 4)));
  }
  return _mm512_add_epi32(d0, d1);
}

// Nibble-ordered u8 weights (lo[c]: values 8c .. 8c + 3, hi[c]: 8c + 4 .. 8c + 7) against 32
// activations.
inline __m512i q4_block_dot(const __m512i (&lo)[4], const __m512i (&hi)[4], const int8_t* xb) {
  __m512i d0 = _mm512_setzero_si512(), d1 = _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    d0 = _mm512_dpbusd_epi32(d0, lo[c], _mm512_set1_epi32(load_i32(xb + 8 * c)));
    d1 = _mm512_dpbusd_epi32(d1, hi[c], _mm512_set1_epi32(load_i32(xb + 8 * c + 4)));
  }
  return _mm512_add_epi32(d0, d1);
}

// Two dots of 16 values (groups 0..3 and 4..7) of one activation block against u8 weights.
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

// 5-bit weights: group g's nibbles (nib, Q4_0's order) ORed with their fifth bits (bit i of
// byte 4r + j of `high` belongs to row r's value 4i + j).
inline __m512i q5_group(const __m512i (&nib)[4], __m512i high, int g) {
  const __m512i m4 = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
  __m512i v = nib[g / 2];
  __m512i low =
      g % 2 == 0 ? _mm512_and_si512(v, m4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  __m512i h = g < 4 ? _mm512_sll_epi16(high, _mm_cvtsi32_si128(4 - g))
                    : _mm512_srl_epi16(high, _mm_cvtsi32_si128(g - 4));
  return _mm512_or_si512(low, _mm512_and_si512(h, m10));
}

// The 8 groups of 5-bit weights of one tile-block: nibbles at p, fifth bits at p + 256.
inline void q5_weights(const uint8_t* p, __m512i (&w)[8]) {
  __m512i nib[4];
  for (int c = 0; c < 4; ++c) nib[c] = _mm512_loadu_si512(p + 64 * c);
  __m512i high = _mm512_loadu_si512(p + 256);
  for (int g = 0; g < 8; ++g) w[g] = q5_group(nib, high, g);
}

// 16 f16 values as f32.
inline __m512 load_f16x16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
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

// The dots of 16 values (groups 0..3, then 4..7) of one activation block against u8 weights of
// at most 63: maddubs lanes of 63 * 127 * 2, two of them still fit in i16.
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

// 5-bit weights of 8 rows (half h of the tile): group g's nibbles (at p, Q4_0's order) ORed with
// their fifth bits (at p + 256).
inline __m256i q5_group(const uint8_t* p, int h, int g) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * (g / 2) + 32 * h));
  __m256i low =
      g % 2 == 0 ? _mm256_and_si256(v, m4) : _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 256 + 32 * h));
  hb = g < 4 ? _mm256_sll_epi16(hb, _mm_cvtsi32_si128(4 - g))
             : _mm256_srl_epi16(hb, _mm_cvtsi32_si128(g - 4));
  return _mm256_or_si256(low, _mm256_and_si256(hb, m10));
}

// Signed int8 weights (IQ4_NL's and IQ4_XS's levels, |w| <= 127) against 32 activations: |w| times
// x carrying w's sign keeps maddubs from saturating; each maddubs is widened to i32 at once (two
// would overflow i16).
inline __m256i iq4_block_dot(const __m256i (&lo)[4], const __m256i (&hi)[4], const int8_t* xb) {
  __m256i sum = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    __m256i xl = _mm256_set1_epi32(load_i32(xb + 8 * c));
    __m256i xh = _mm256_set1_epi32(load_i32(xb + 8 * c + 4));
    sum = _mm256_add_epi32(
        sum, pair_sums(_mm256_maddubs_epi16(_mm256_abs_epi8(lo[c]), _mm256_sign_epi8(xl, lo[c]))));
    sum = _mm256_add_epi32(
        sum, pair_sums(_mm256_maddubs_epi16(_mm256_abs_epi8(hi[c]), _mm256_sign_epi8(xh, hi[c]))));
  }
  return sum;
}

// One block's dot of 5-bit weights (q5_group's) with 32 activations.
inline __m256i q5_block_dot(const __m256i (&w)[8], const int8_t* xb) {
  __m256i first, second;
  q6k_dots(w, xb, &first, &second);
  return _mm256_add_epi32(first, second);
}

// 8 f16 values as f32.
inline __m256 load_f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// The AVX2 kernels pass over a tile twice, 8 rows each time, and the second pass reads only lines
// the first one brought in: during it each kernel asks for the next tile's lines of the part it
// is at (`bytes` at `next`; tiles are contiguous, and a prefetch past the last one is harmless),
// so that memory stays busy through both passes.
inline void prefetch_next_tile(const uint8_t* next, size_t bytes) {
  for (size_t at = 0; at < bytes; at += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T0);
  }
}

#endif

// Tiles [t0, t1) of w against every activation row, kMaxX rows at a time:
// Kernel::run<NX, Wide>(tile, nb, x, x0, out) writes out[i][r], row r's dot with x row x0 + i.
template <class Kernel, bool Wide>
void gemm_tiles_with(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1) {
  const size_t nb = w.k / 32, n = w.n;
  alignas(64) float out[kMaxX][16];
  for (size_t t = t0; t < t1; ++t) {
    const uint8_t* tile = w.tile(t);
    size_t rows = std::min(kQTileRows, n - t * kQTileRows);
    for (size_t x0 = 0; x0 < x.m; x0 += kMaxX) {
      size_t nx = std::min<size_t>(kMaxX, x.m - x0);
      switch (nx) {
        case 1:
          Kernel::template run<1, Wide>(tile, nb, x, x0, out);
          break;
        case 2:
          Kernel::template run<2, Wide>(tile, nb, x, x0, out);
          break;
        case 3:
          Kernel::template run<3, Wide>(tile, nb, x, x0, out);
          break;
        default:
          Kernel::template run<4, Wide>(tile, nb, x, x0, out);
          break;
      }
      for (size_t i = 0; i < nx; ++i) {
        std::memcpy(y + (x0 + i) * n + t * kQTileRows, out[i], rows * sizeof(float));
      }
    }
  }
}

template <class Kernel>
void gemm_tiles_with(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1) {
  if (x.wide) return gemm_tiles_with<Kernel, true>(w, x, y, t0, t1);
  gemm_tiles_with<Kernel, false>(w, x, y, t0, t1);
}

}  // namespace
}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
