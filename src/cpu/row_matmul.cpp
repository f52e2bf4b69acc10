// A linear layer's product whose rows do not depend on each other: y (m, n) = x (m, k) w^T for
// f32 activations and an f32, f16 or bf16 weight (n, k) stored row-major. Every y[i][j] is one
// dot product in one fixed order (8 lanes of fused multiply-adds over k in steps of 8, the lanes
// added pairwise, then the k % 8 tail), whichever tile computes it: a row's result is the same
// bits for any m and any other rows (BLAS picks its kernels and splits by the problem's shape).
// Tiles of 4 x rows by 3 weight rows (12 accumulators) read each weight row once per 64 rows of
// x; the weight rows are split across the workers.

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define WICK_ROW_MATMUL_AVX2 1
#endif

#include "cpu/cpu_storage.h"
#include "cpu/parallel.h"
#include "cpu/row_matmul.h"
#include "tensor_internal.h"
#include "util.h"
#include "wick/error.h"
#include "wick/half.h"

namespace wick::cpu {

namespace {

constexpr size_t kRowsPerTile = 4, kColsPerTile = 3, kRowBlock = 64;

template <class W>
float widen(W w) {
  return static_cast<float>(w);
}

#if defined(WICK_ROW_MATMUL_AVX2)
template <class W>
__m256 load8(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm256_loadu_ps(p);
  } else if constexpr (std::is_same_v<W, f16>) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
}

float reduce8(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
#endif

// y[r][c] for rows [r0, r0 + R) of x and weight rows [c0, c0 + C): the fixed-order dot products.
template <class W, size_t R, size_t C>
void tile(const float* x, const W* w, size_t k, size_t n, size_t r0, size_t c0, float* y) {
  const size_t k8 = k / 8 * 8;
  float sums[R][C];
#if defined(WICK_ROW_MATMUL_AVX2)
  __m256 acc[R][C];
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  for (size_t e = 0; e < k8; e += 8) {
    __m256 wv[C];
    for (size_t c = 0; c < C; ++c) wv[c] = load8(w + (c0 + c) * k + e);
    for (size_t r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + (r0 + r) * k + e);
      for (size_t c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) sums[r][c] = reduce8(acc[r][c]);
  }
#else
  for (size_t r = 0; r < R; ++r) {
    for (size_t c = 0; c < C; ++c) {
      float l[8] = {};
      const float* xr = x + (r0 + r) * k;
      const W* wr = w + (c0 + c) * k;
      for (size_t e = 0; e < k8; e += 8) {
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
      const W* wr = w + (c0 + c) * k;
      for (size_t e = k8; e < k; ++e) s = std::fma(xr[e], widen(wr[e]), s);
      y[(r0 + r) * n + c0 + c] = s;
    }
  }
}

// Rows [r0, r1) of x against weight rows [c0, c1).
template <class W, size_t C>
void rows_against(const float* x, const W* w, size_t k, size_t n, size_t r0, size_t r1, size_t c0,
                  float* y) {
  size_t r = r0;
  for (; r + kRowsPerTile <= r1; r += kRowsPerTile) tile<W, kRowsPerTile, C>(x, w, k, n, r, c0, y);
  for (; r < r1; ++r) tile<W, 1, C>(x, w, k, n, r, c0, y);
}

template <class W>
void row_matmul_typed(const float* x, size_t m, const W* w, size_t n, size_t k, float* y) {
  const size_t col_tiles = (n + kColsPerTile - 1) / kColsPerTile;
  const size_t grain = std::max<size_t>(1, 32768 / (kColsPerTile * k * std::min(m, kRowBlock) + 1));
  parallel_for(col_tiles, grain, [&](size_t lo, size_t hi) {
    for (size_t r0 = 0; r0 < m; r0 += kRowBlock) {
      const size_t r1 = std::min(m, r0 + kRowBlock);
      for (size_t t = lo; t < hi; ++t) {
        const size_t c0 = t * kColsPerTile;
        if (c0 + kColsPerTile <= n) {
          rows_against<W, kColsPerTile>(x, w, k, n, r0, r1, c0, y);
        } else {
          for (size_t c = c0; c < n; ++c) rows_against<W, 1>(x, w, k, n, r0, r1, c, y);
        }
      }
    }
  });
}

}  // namespace

Tensor row_matmul(const Tensor& x, const Tensor& w) {
  using namespace wick::detail;
  if (x.rank() != 2 || w.rank() != 2 || x.dims()[1] != w.dims()[1] || x.dtype() != DType::F32 ||
      !x.is_contiguous() || !w.is_contiguous() || !x.device().is_cpu() || !w.device().is_cpu()) {
    throw ShapeMismatch(str("row_matmul: x ", x.shape(), " ", x.dtype(), " and w ", w.shape(), " ",
                            w.dtype(), " must be contiguous CPU (m, k) f32 and (n, k)"));
  }
  const size_t m = x.dims()[0], k = x.dims()[1], n = w.dims()[0];
  auto out = std::make_unique<CpuStorage>(m * n, DType::F32);
  auto locks = read_locks({&x, &w});
  const float* xp = as_cpu(backend_of(x)).as<float>() + x.impl()->layout.start_offset();
  float* yp = out->as<float>();
  const size_t off = w.impl()->layout.start_offset();
  switch (w.dtype()) {
    case DType::F32:
      row_matmul_typed(xp, m, as_cpu(backend_of(w)).as<float>() + off, n, k, yp);
      break;
    case DType::F16:
      row_matmul_typed(xp, m, as_cpu(backend_of(w)).as<f16>() + off, n, k, yp);
      break;
    case DType::BF16:
      row_matmul_typed(xp, m, as_cpu(backend_of(w)).as<bf16>() + off, n, k, yp);
      break;
    default:
      throw UnsupportedDType(str("row_matmul: weight ", w.dtype(), " (f32, f16 or bf16)"));
  }
  return from_storage(std::move(out), Shape{m, n});
}

}  // namespace wick::cpu
