// row_matmul's kernels (cpu/row_matmul.h), compiled once per instruction set: y (m, n) = x (m, k)
// w^T for f32 activations and an f32, f16 or bf16 weight (n, k) stored row-major, whose rows do not
// depend on each other. Every y[i][j] is one dot product in one fixed order, whichever tile
// computes it: L lanes of fused multiply-adds over k in steps of L (L = 8 in the AVX2 build, 16 in
// the AVX-512 one), the lanes added in a fixed tree, then the k % L tail in order. So a row's
// result is the same bits for any m and any other rows on one instruction set (BLAS picks its
// kernels and splits by the problem's shape). Tiles of R rows of x by C weight rows (R * C
// accumulators: 4 x 3 in AVX2's 16 registers, 4 x 6 in AVX-512's 32) read each weight row once per
// kRowBlock rows of x; the weight rows are split across the workers.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define WICK_ROW_MATMUL_SIMD 1
#endif

#include "cpu/load8.h"
#include "cpu/row_matmul.h"
#include "wick/half.h"
// Last: the code below is compiled for this file's instruction set.
#include "cpu/isa_begin.h"
#include "cpu/parallel.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

constexpr size_t kRowBlock = 128;

template <class W>
float widen(W w) {
  return static_cast<float>(w);
}

#if defined(WICK_ROW_MATMUL_SIMD)

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
inline float reduce8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

#if defined(WICK_ISA_AVX512)
constexpr size_t kLanes = 16, kRowsPerTile = 4, kColsPerTile = 6;
using Vec = __m512;
inline Vec zero() {
  return _mm512_setzero_ps();
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return _mm512_fmadd_ps(a, b, c);
}
inline Vec load_x(const float* p) {
  return _mm512_loadu_ps(p);
}
template <class W>
Vec load_w(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm512_loadu_ps(p);
  } else if constexpr (std::is_same_v<W, f16>) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i v =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
}
inline void store(float* p, Vec v) {
  _mm512_storeu_ps(p, v);
}
// Lane l + lane l + 8, then reduce8.
inline float reduce(Vec v) {
  return reduce8(_mm256_add_ps(_mm512_castps512_ps256(v),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
// reduce() of four vectors at once, the same additions of the same pairs: each 128-bit quarter of
// the vectors below holds one input's partial sums in reduce8's order.
inline void reduce4(const Vec* v, float* out) {
  const Vec ab = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(v[0], v[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const Vec cd = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(v[2], v[3], _MM_SHUFFLE(3, 2, 3, 2)));
  const Vec u = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                              _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const Vec t = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(1, 0, 3, 2)));
  const Vec r = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, r);
  for (size_t i = 0; i < 4; ++i) out[i] = lanes[4 * i];
}
#else
constexpr size_t kLanes = 8, kRowsPerTile = 4, kColsPerTile = 3;
using Vec = __m256;
inline Vec zero() {
  return _mm256_setzero_ps();
}
inline Vec fma(Vec a, Vec b, Vec c) {
  return _mm256_fmadd_ps(a, b, c);
}
inline Vec load_x(const float* p) {
  return _mm256_loadu_ps(p);
}
inline void store(float* p, Vec v) {
  _mm256_storeu_ps(p, v);
}
template <class W>
Vec load_w(const W* p) {
  return load8(p);
}
inline float reduce(Vec v) {
  return reduce8(v);
}
#endif

#else  // no SIMD: the AVX2 order in scalar code
constexpr size_t kLanes = 8, kRowsPerTile = 4, kColsPerTile = 3;
#endif

// y[r][c] for rows [r0, r0 + R) of x and weight rows [c0, c0 + C) (w: row c0): the fixed-order
// dot products.
template <class W, size_t R, size_t C>
void tile(const float* x, const W* w, size_t k, size_t n, size_t r0, size_t c0, float* y) {
  const size_t kv = k / kLanes * kLanes;
  float sums[R][C];
#if defined(WICK_ROW_MATMUL_SIMD)
  Vec acc[R][C];
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) acc[r][c] = zero();
  }
  for (size_t e = 0; e < kv; e += kLanes) {
    Vec wv[C];
    for (size_t c = 0; c < C; ++c) wv[c] = load_w(w + c * k + e);
    for (size_t r = 0; r < R; ++r) {
      const Vec xv = load_x(x + (r0 + r) * k + e);
      for (size_t c = 0; c < C; ++c) acc[r][c] = fma(xv, wv[c], acc[r][c]);
    }
  }
#if defined(WICK_ISA_AVX512)
  constexpr size_t kGroups = R * C / 4;
  for (size_t g = 0; g < kGroups; ++g) {
    Vec group[4];
    float out[4];
    for (size_t j = 0; j < 4; ++j) group[j] = acc[(4 * g + j) / C][(4 * g + j) % C];
    reduce4(group, out);
    for (size_t j = 0; j < 4; ++j) sums[(4 * g + j) / C][(4 * g + j) % C] = out[j];
  }
  for (size_t i = 4 * kGroups; i < R * C; ++i) sums[i / C][i % C] = reduce(acc[i / C][i % C]);
#else
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) sums[r][c] = reduce(acc[r][c]);
  }
#endif
#else
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) {
      float l[8] = {};
      const float* xr = x + (r0 + r) * k;
      const W* wr = w + c * k;
      for (size_t e = 0; e < kv; e += 8) {
        for (size_t i = 0; i < 8; ++i) l[i] = std::fma(xr[e + i], widen(wr[e + i]), l[i]);
      }
      sums[r][c] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    }
  }
#endif
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) {
      float s = sums[r][c];
      const float* xr = x + (r0 + r) * k;
      const W* wr = w + c * k;
      for (size_t e = kv; e < k; ++e) s = std::fma(xr[e], widen(wr[e]), s);
      y[(r0 + r) * n + c0 + c] = s;
    }
  }
}

// Rows [r0, r1) of x against weight rows [c0, c0 + C) (w: row c0).
template <class W, size_t C>
void rows_against(const float* x, const W* w, size_t k, size_t n, size_t r0, size_t r1, size_t c0,
                  float* y) {
  size_t r = r0;
  for (; r + kRowsPerTile <= r1; r += kRowsPerTile) tile<W, kRowsPerTile, C>(x, w, k, n, r, c0, y);
  for (; r < r1; ++r) tile<W, 1, C>(x, w, k, n, r, c0, y);
}

// Rows of x from which a worker widens its f16/bf16 weight rows to f32 once (exactly) and runs
// the f32 tiles over them: below, each tile widens as it loads (fewer rows reuse the rows less).
constexpr size_t kWidenMinRows = 32;
constexpr size_t kWidenBytes = size_t{1} << 20;

// count values of w, widened to f32 (exact: the kernels' own loads).
template <class W>
void widen_into(const W* w, size_t count, float* out) {
  size_t i = 0;
#if defined(WICK_ROW_MATMUL_SIMD)
  for (; i + kLanes <= count; i += kLanes) store(out + i, load_w(w + i));
#endif
  for (; i < count; ++i) out[i] = widen(w[i]);
}

// Weight rows [c_lo, c_hi) against every row of x, w: row c_lo.
template <class W>
void column_range(const float* x, size_t m, const W* w, size_t n, size_t k, size_t c_lo,
                  size_t c_hi, float* y) {
  for (size_t r0 = 0; r0 < m; r0 += kRowBlock) {
    const size_t r1 = std::min(m, r0 + kRowBlock);
    for (size_t c0 = c_lo; c0 < c_hi; c0 += kColsPerTile) {
      const W* wr = w + (c0 - c_lo) * k;
      if (c0 + kColsPerTile <= n) {
        rows_against<W, kColsPerTile>(x, wr, k, n, r0, r1, c0, y);
      } else {
        for (size_t c = c0; c < n; ++c)
          rows_against<W, 1>(x, wr + (c - c0) * k, k, n, r0, r1, c, y);
      }
    }
  }
}

template <class W>
void row_matmul_typed(const float* x, size_t m, const W* w, size_t n, size_t k, float* y) {
  const size_t col_tiles = (n + kColsPerTile - 1) / kColsPerTile;
  const size_t grain = std::max<size_t>(1, 32768 / (kColsPerTile * k * std::min(m, kRowBlock) + 1));
  parallel_for(col_tiles, grain, [&](size_t lo, size_t hi) {
    const size_t c_lo = lo * kColsPerTile, c_hi = std::min(n, hi * kColsPerTile);
    if constexpr (!std::is_same_v<W, float>) {
      if (m >= kWidenMinRows) {
        // The same products: each tile multiplies the widened values either way. At most about
        // kWidenBytes of widened rows at a time.
        const size_t step =
            std::max<size_t>(1, kWidenBytes / (4 * k * kColsPerTile)) * kColsPerTile;
        thread_local std::vector<float> wide;
        for (size_t a = c_lo; a < c_hi; a += step) {
          const size_t b = std::min(c_hi, a + step);
          wide.resize((b - a) * k);
          widen_into(w + a * k, wide.size(), wide.data());
          column_range(x, m, wide.data(), n, k, a, b, y);
        }
        return;
      }
    }
    column_range(x, m, w + c_lo * k, n, k, c_lo, c_hi, y);
  });
}

void run_f32(const float* x, size_t m, const float* w, size_t n, size_t k, float* y) {
  row_matmul_typed(x, m, w, n, k, y);
}
void run_f16(const float* x, size_t m, const f16* w, size_t n, size_t k, float* y) {
  row_matmul_typed(x, m, w, n, k, y);
}
void run_bf16(const float* x, size_t m, const bf16* w, size_t n, size_t k, float* y) {
  row_matmul_typed(x, m, w, n, k, y);
}

}  // namespace

}  // namespace WICK_ISA_NS

#if defined(WICK_ISA_AVX512)
const RowMatmulKernels kAvx512RowMatmul{"avx512 16-lane", &run_f32, &run_f16, &run_bf16};
#else
const RowMatmulKernels kAvx2RowMatmul{"avx2 8-lane", &run_f32, &run_f16, &run_bf16};
#endif

}  // namespace wick::cpu
