#pragma once
// Walking several same-shape operands together for element-wise kernels. Dims are coalesced and
// the innermost dim is handed to a kernel as segments (pointers, length, strides) so that
// contiguous rows run a vectorised loop; operands read across the innermost dim (transposed views)
// are gathered tile by tile into a small buffer first, so the kernel still reads them with stride
// 1; work is split between threads above a size threshold.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "cpu/isa_ns.h"
#include "cpu/parallel.h"
// The op tables' math, here so that it is included before cpu/isa_begin.h: its inline functions
// keep the baseline instruction set (see isa_begin.h).
#include "ops/binary_math.h"
#include "ops/unary_math.h"
#include "wick/half.h"
#include "wick/layout.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

/// Element count below which element-wise kernels stay on the calling thread.
inline constexpr size_t kElementwiseGrain = 32768;
/// Side of the square tiles used when an operand's fastest dim is not the innermost one.
inline constexpr size_t kTile = 64;

/// One operand of a walk: its layout, its storage (element 0) and its element size in bytes.
struct Operand {
  const Layout* layout;
  const void* data;
  size_t elem;
};

/// N operands of one shape (operand 0 is the output): coalesced dims, each operand's strides (in
/// elements) and the address of its first element.
template <size_t N>
struct Walk {
  std::vector<size_t> dims;  // rank >= 1, no dim of size 1 unless the shape has one element
  std::array<std::vector<size_t>, N> strides;
  std::array<char*, N> base{};
  std::array<size_t, N> elem{};
};

/// Builds the walk of `ops` (all with the same dims). Adjacent dims merge when every operand can
/// step over both with one stride; dims of size 1 are dropped.
template <size_t N>
Walk<N> make_walk(const std::array<Operand, N>& ops) {
  Walk<N> w;
  const auto& dims = ops[0].layout->dims();
  for (size_t k = 0; k < N; ++k) {
    w.elem[k] = ops[k].elem;
    // Inputs are only read; one pointer type keeps the segment interface uniform.
    w.base[k] = const_cast<char*>(static_cast<const char*>(ops[k].data)) +
                ops[k].layout->start_offset() * ops[k].elem;
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] == 1) continue;
    bool merge = !w.dims.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = w.strides[k].back() == ops[k].layout->strides()[d] * dims[d];
    }
    if (merge) {
      w.dims.back() *= dims[d];
      for (size_t k = 0; k < N; ++k) w.strides[k].back() = ops[k].layout->strides()[d];
    } else {
      w.dims.push_back(dims[d]);
      for (size_t k = 0; k < N; ++k) w.strides[k].push_back(ops[k].layout->strides()[d]);
    }
  }
  if (w.dims.empty()) {  // one element
    w.dims.push_back(1);
    for (size_t k = 0; k < N; ++k) w.strides[k].push_back(0);
  }
  return w;
}

namespace detail {

// Element offsets of outer index `index` over dims [0, rank).
template <size_t N>
std::array<size_t, N> outer_offsets(const Walk<N>& w, size_t rank, size_t index) {
  std::array<size_t, N> offs{};
  for (size_t d = rank; d-- > 0;) {
    size_t i = index % w.dims[d];
    index /= w.dims[d];
    for (size_t k = 0; k < N; ++k) offs[k] += i * w.strides[k][d];
  }
  return offs;
}

// In-register transposes of square blocks: dst[c * ld + r] = src[r * ls + c].
#if defined(__AVX__)
inline void transpose_block(const uint32_t* src, size_t ls, uint32_t* dst, size_t ld) {  // 8x8
  const float* s = reinterpret_cast<const float*>(src);
  float* d = reinterpret_cast<float*>(dst);
  __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ls), r2 = _mm256_loadu_ps(s + 2 * ls),
         r3 = _mm256_loadu_ps(s + 3 * ls), r4 = _mm256_loadu_ps(s + 4 * ls),
         r5 = _mm256_loadu_ps(s + 5 * ls), r6 = _mm256_loadu_ps(s + 6 * ls),
         r7 = _mm256_loadu_ps(s + 7 * ls);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(d + ld, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(d + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(d + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(d + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(d + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(d + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(d + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}
inline constexpr size_t block_side(size_t elem) {
  return elem == 4 ? 8 : elem == 8 ? 4 : 0;
}

inline void transpose_block(const uint64_t* src, size_t ls, uint64_t* dst, size_t ld) {  // 4x4
  const double* s = reinterpret_cast<const double*>(src);
  double* d = reinterpret_cast<double*>(dst);
  __m256d r0 = _mm256_loadu_pd(s), r1 = _mm256_loadu_pd(s + ls), r2 = _mm256_loadu_pd(s + 2 * ls),
          r3 = _mm256_loadu_pd(s + 3 * ls);
  __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);
  __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
  _mm256_storeu_pd(d, _mm256_permute2f128_pd(t0, t2, 0x20));
  _mm256_storeu_pd(d + ld, _mm256_permute2f128_pd(t1, t3, 0x20));
  _mm256_storeu_pd(d + 2 * ld, _mm256_permute2f128_pd(t0, t2, 0x31));
  _mm256_storeu_pd(d + 3 * ld, _mm256_permute2f128_pd(t1, t3, 0x31));
}
#else
inline constexpr size_t block_side(size_t) {
  return 0;
}
#endif

template <class U>
void gather_tile(const char* src, size_t si, size_t sj, size_t rows, size_t cols, char* buf) {
  const U* s = reinterpret_cast<const U*>(src);
  U* b = reinterpret_cast<U*>(buf);
  size_t rows_done = 0, cols_done = 0;
  constexpr size_t B = block_side(sizeof(U));
  if constexpr (B != 0) {
    // A source contiguous along i: transpose B x B blocks in registers.
    if (si == 1) {
      rows_done = rows / B * B;
      cols_done = cols / B * B;
      for (size_t j = 0; j < cols_done; j += B)
        for (size_t i = 0; i < rows_done; i += B)
          transpose_block(s + i + j * sj, sj, b + i * kTile + j, kTile);
    }
  }
  // The rest element by element; along i the source is (nearly) contiguous.
  for (size_t j = 0; j < cols; ++j)
    for (size_t i = j < cols_done ? rows_done : 0; i < rows; ++i)
      b[i * kTile + j] = s[i * si + j * sj];
}

// Copies the rows x cols tile at `src` (strides si, sj in elements) into buf, row-major with row
// length kTile.
inline void gather_tile(const char* src, size_t elem, size_t si, size_t sj, size_t rows,
                        size_t cols, char* buf) {
  switch (elem) {
    case 1:
      return gather_tile<uint8_t>(src, si, sj, rows, cols, buf);
    case 2:
      return gather_tile<uint16_t>(src, si, sj, rows, cols, buf);
    case 4:
      return gather_tile<uint32_t>(src, si, sj, rows, cols, buf);
    default:
      return gather_tile<uint64_t>(src, si, sj, rows, cols, buf);
  }
}

}  // namespace detail

/// Calls fn(ptrs, len, strides) on segments covering every element of the walk exactly once (in
/// any order, possibly from several threads): ptrs[k] points at operand k's first element of the
/// segment and strides[k] is its step in elements. The total element count must be > 0.
template <size_t N, class F>
void for_each_segment(const Walk<N>& w, F&& fn) {
  const size_t r = w.dims.size();
  const size_t inner = w.dims[r - 1];
  std::array<size_t, N> is;
  for (size_t k = 0; k < N; ++k) is[k] = w.strides[k][r - 1];
  auto at = [&](size_t k, size_t off) { return w.base[k] + off * w.elem[k]; };

  if (r == 1) {
    parallel_for(inner, kElementwiseGrain, [&](size_t b, size_t e) {
      std::array<char*, N> p;
      for (size_t k = 0; k < N; ++k) p[k] = at(k, b * is[k]);
      fn(p, e - b, is);
    });
    return;
  }

  // Inputs that step faster along the second-to-last dim than along the last one (transposed
  // views): walking them row by row would touch a new cache line for every element.
  std::array<bool, N> gather{};
  bool tile = false;
  if (inner >= 8 && w.dims[r - 2] >= 8) {
    for (size_t k = 1; k < N; ++k) {
      // (Not when that stride is 0: a broadcast row is read from cache anyway.)
      gather[k] = w.strides[k][r - 2] != 0 && w.strides[k][r - 2] < is[k];
      tile |= gather[k];
    }
  }

  if (!tile) {
    size_t rows = 1;
    for (size_t d = 0; d + 1 < r; ++d) rows *= w.dims[d];
    size_t grain = std::max<size_t>(1, kElementwiseGrain / inner);
    parallel_for(rows, grain, [&](size_t b, size_t e) {
      std::vector<size_t> idx(r - 1);
      size_t rem = b;
      for (size_t d = r - 1; d-- > 0;) {
        idx[d] = rem % w.dims[d];
        rem /= w.dims[d];
      }
      std::array<size_t, N> offs = detail::outer_offsets(w, r - 1, b);
      std::array<char*, N> p;
      for (size_t row = b; row < e; ++row) {
        for (size_t k = 0; k < N; ++k) p[k] = at(k, offs[k]);
        fn(p, inner, is);
        for (size_t d = r - 1; d-- > 0;) {  // odometer step over the outer dims
          if (++idx[d] < w.dims[d]) {
            for (size_t k = 0; k < N; ++k) offs[k] += w.strides[k][d];
            break;
          }
          for (size_t k = 0; k < N; ++k) offs[k] -= (w.dims[d] - 1) * w.strides[k][d];
          idx[d] = 0;
        }
      }
    });
    return;
  }

  // Tiles of kTile x kTile over the last two dims; gathered operands are read from their buffer.
  const size_t d2 = w.dims[r - 2];
  const size_t row_blocks = (d2 + kTile - 1) / kTile;
  size_t outer = 1;
  for (size_t d = 0; d + 2 < r; ++d) outer *= w.dims[d];
  std::array<size_t, N> ts = is;  // strides handed to fn
  for (size_t k = 0; k < N; ++k)
    if (gather[k]) ts[k] = 1;
  size_t grain = std::max<size_t>(1, kElementwiseGrain / (kTile * inner));
  parallel_for(outer * row_blocks, grain, [&](size_t b, size_t e) {
    std::array<std::vector<char>, N> bufs;
    for (size_t k = 0; k < N; ++k)
      if (gather[k]) bufs[k].resize(kTile * kTile * w.elem[k]);
    for (size_t item = b; item < e; ++item) {
      std::array<size_t, N> o = detail::outer_offsets(w, r - 2, item / row_blocks);
      size_t i0 = (item % row_blocks) * kTile, rows = std::min(kTile, d2 - i0);
      for (size_t j0 = 0; j0 < inner; j0 += kTile) {
        size_t len = std::min(kTile, inner - j0);
        std::array<char*, N> p;
        for (size_t k = 0; k < N; ++k) {
          char* corner = at(k, o[k] + i0 * w.strides[k][r - 2] + j0 * is[k]);
          if (gather[k]) {
            detail::gather_tile(corner, w.elem[k], w.strides[k][r - 2], is[k], rows, len,
                                bufs[k].data());
            p[k] = bufs[k].data();
          } else {
            p[k] = corner;
          }
        }
        for (size_t i = 0; i < rows; ++i) {
          fn(p, len, ts);
          for (size_t k = 0; k < N; ++k) {
            p[k] += (gather[k] ? kTile : w.strides[k][r - 2]) * w.elem[k];
          }
        }
      }
    }
  });
}

template <class T>
constexpr bool is_half_v = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// double -> float rounding to odd (truncate, then set the last bit when inexact). Rounding that
// float to f16/bf16 to nearest even then gives the correctly rounded result of the double, which
// going through a nearest-even float would not (double rounding).
inline float round_to_odd_float(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::abs(static_cast<double>(f)) > std::abs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

// Float to integer: truncation toward zero like static_cast, but defined everywhere: NaN gives 0
// and values outside the integer's range saturate (as Rust's `as`, so Candle-compatible).
template <class To>
inline To float_to_int(double d) {
  if (std::isnan(d)) return To(0);
  constexpr double lo = static_cast<double>(std::numeric_limits<To>::min());
  // One past the largest value: 2^digits, exactly representable.
  constexpr double hi_excl = static_cast<double>(uint64_t{1} << std::numeric_limits<To>::digits);
  d = std::trunc(d);
  if (d <= lo) return std::numeric_limits<To>::min();
  if (d >= hi_excl) return std::numeric_limits<To>::max();
  return static_cast<To>(d);
}

// ---- runs: the loops a segment hands to an op ----
//
// Element-wise ops keep one vectorised loop per op and dtype: for contiguous operands. Other
// strides are staged through small stack buffers, a chunk at a time, and f16/bf16 are widened to
// float chunks and reuse the float loops (each op compiled for the f16 and bf16 types too would
// double the build time for loops that run in float anyway).

/// Elements per chunk when a run is staged through stack buffers.
inline constexpr size_t kChunk = 256;

/// buf[i] = x[i * s] for i < n (s > 1).
template <class T>
[[gnu::noinline]] WICK_ISA_TARGET void gather_run(const T* x, size_t s, size_t n, T* buf) {
  for (size_t i = 0; i < n; ++i) buf[i] = x[i * s];
}

/// out[i] = float(x[i * s]) for i < n (any stride, 0 included).
template <class T>
[[gnu::noinline]] WICK_ISA_TARGET void widen_run(const T* x, size_t s, size_t n, float* out) {
  if (s == 1) {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i]);
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i * s]);
  }
}

/// out[i] = T(x[i]) for i < n, rounded once.
template <class T>
[[gnu::noinline]] WICK_ISA_TARGET void narrow_run(const float* x, size_t n, T* out) {
  for (size_t i = 0; i < n; ++i) out[i] = T(x[i]);
}

/// d[i] = f(x[i * sx]) for i < n with sx 0 or 1: the contiguous loop, or a fill.
template <class R, class T, class F>
[[gnu::noinline]] WICK_ISA_TARGET void map_unit(R* __restrict d, const T* __restrict x, size_t sx,
                                                size_t n, F f) {
  if (sx == 1) {
    for (size_t i = 0; i < n; ++i) d[i] = f(x[i]);
  } else {
    std::fill_n(d, n, f(x[0]));
  }
}

/// d[i] = f(x[i * sx]) for i < n, any stride: other strides than 0 and 1 are staged in chunks.
template <class R, class T, class F>
void map_run(R* d, const T* x, size_t sx, size_t n, F f) {
  if (sx <= 1 || n == 1) return map_unit(d, x, n == 1 ? 1 : sx, n, f);
  T buf[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    size_t len = std::min(kChunk, n - c);
    gather_run(x + c * sx, sx, len, buf);
    map_unit(d + c, buf, 1, len, f);
  }
}

/// d[i] = f(x[i * sx], y[i * sy]) for i < n with sx, sy 0 or 1: loops for contiguous operands and
/// for one broadcast operand, a fill when both are broadcast.
template <class R, class T, class F>
[[gnu::noinline]] WICK_ISA_TARGET void map_unit2(R* __restrict d, const T* __restrict x, size_t sx,
                                                 const T* __restrict y, size_t sy, size_t n, F f) {
  if (sx == 1 && sy == 1) {
    for (size_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
  } else if (sx == 1) {
    const T yv = y[0];
    for (size_t i = 0; i < n; ++i) d[i] = f(x[i], yv);
  } else if (sy == 1) {
    const T xv = x[0];
    for (size_t i = 0; i < n; ++i) d[i] = f(xv, y[i]);
  } else {
    std::fill_n(d, n, f(x[0], y[0]));
  }
}

/// d[i] = f(x[i * sx], y[i * sy]) for i < n, any strides: others than 0 and 1 are staged in
/// chunks.
template <class R, class T, class F>
void map_run2(R* d, const T* x, size_t sx, const T* y, size_t sy, size_t n, F f) {
  if (n == 1) sx = sy = 1;
  if (sx <= 1 && sy <= 1) return map_unit2(d, x, sx, y, sy, n, f);
  T xb[kChunk], yb[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    size_t len = std::min(kChunk, n - c);
    const T* xc = x + c * sx;
    const T* yc = y + c * sy;
    if (sx > 1) gather_run(xc, sx, len, xb);
    if (sy > 1) gather_run(yc, sy, len, yb);
    map_unit2(d + c, sx > 1 ? xb : xc, std::min<size_t>(sx, 1), sy > 1 ? yb : yc,
              std::min<size_t>(sy, 1), len, f);
  }
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
