// The last-dim softmax on the CPU, compiled once per instruction set. f32 rows: each row is read
// from memory once (the max pass brings it into L1, the exponentials go to a per-thread scratch
// row with their sum, the scaled row is written in one pass), the next row is prefetched during
// the exponential pass, and large outputs are written with non-temporal stores. f16/bf16 keep
// the exponentials in f32 and round once. A NaN anywhere makes its row NaN.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "cpu/cpu_storage.h"
#include "cpu/isa_begin.h"  // last
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/reduce_common.h"
#include "cpu/vec_exp.h"
#include "dispatch.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {
namespace {

// ---- f32 softmax ----
//
// Each row is read from memory once: the max pass brings it into L1, the exponentials go to a
// per-thread scratch row (L1/L2) with their sum, and the scaled row is written to the output in one
// pass. Large outputs are written with non-temporal stores (no read-for-ownership of lines about
// to be overwritten, no eviction of the input from the cache), and the next row is prefetched
// during the exponential pass, so that its memory read overlaps this row's arithmetic.

// Rows up to this many floats use the scratch row (64 KB: L2-resident beside the input row);
// longer ones build the exponentials in the output itself.
constexpr size_t kSoftmaxScratch = size_t{1} << 14;
// Outputs of at least this many bytes are streamed past the cache: beyond a few MB they would
// not stay there for the next op anyway.
constexpr size_t kStreamBytes = size_t{4} << 20;
constexpr size_t kFloatsPerLine = 64 / sizeof(float);

// e[i] = exp(x[i] - mx) for i < n, returning their sum, while prefetching next[0, n) (the next
// row, or this one at the last row). Four vectors of lane sums, folded into a double every 4096
// elements: as accurate as a pairwise sum at these lengths.
[[maybe_unused]] inline float exp_sum_f32(const float* x, float mx, float* e, const float* next,
                                          size_t n) {
  typedef float V __attribute__((vector_size(kVecBytes)));
  constexpr size_t kW = kVecBytes / sizeof(float), kAcc = 4, kBlock = kAcc * kW;
  constexpr size_t kFoldBlocks = 4096 / kBlock;
  V acc[kAcc] = {};
  double total = 0;
  size_t i = 0, blocks = 0;
  auto fold = [&] {
    V s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    float f = 0;
    for (size_t k = 0; k < kW; ++k) f += s[k];
    total += f;
    for (auto& a : acc) a = V{};
  };
  for (; i + kBlock <= n; i += kBlock) {
    for (size_t k = 0; k < kBlock; k += kFloatsPerLine) __builtin_prefetch(next + i + k, 0, 3);
    for (size_t k = 0; k < kBlock; ++k) e[i + k] = exp_nonpositive(x[i + k] - mx);
    for (size_t a = 0; a < kAcc; ++a) {
      V v;
      std::memcpy(&v, e + i + a * kW, sizeof(V));
      acc[a] += v;
    }
    if (++blocks == kFoldBlocks) {
      fold();
      blocks = 0;
    }
  }
  fold();
  for (size_t k = i; k < n; k += kFloatsPerLine) __builtin_prefetch(next + k, 0, 3);
  float tail = 0;
  for (; i < n; ++i) {
    e[i] = exp_nonpositive(x[i] - mx);
    tail += e[i];
  }
  return static_cast<float>(total + tail);
}

#if defined(WICK_ISA_AVX512)
// Horizontal max and sum through memory: GCC 12's _mm512_reduce_* trip -Wmaybe-uninitialized
// (its _mm512_undefined_ps).
inline float hmax16(__m512 v) {
  alignas(64) float lane[16];
  _mm512_store_ps(lane, v);
  float m = lane[0];
  for (size_t k = 1; k < 16; ++k) m = std::max(m, lane[k]);
  return m;
}
inline float hsum16(__m512 v) {
  alignas(64) float lane[16];
  _mm512_store_ps(lane, v);
  float s = 0;
  for (size_t k = 0; k < 16; ++k) s += lane[k];
  return s;
}

// The AVX-512 forms of the two passes. The max is a plain vmaxps (no nan bookkeeping: a nan
// anywhere makes the sum of exponentials nan, which the caller checks instead), and the
// exponential is exp_nonpositive's formula with the masks as mask registers.

// vmaxps; the masked intrinsic because the plain one trips the same warning in GCC 12.
inline __m512 max16(__m512 a, __m512 b) {
  return _mm512_mask_max_ps(a, 0xffff, a, b);
}

inline float max_f32(const float* x, size_t n) {
  const __m512 lowest = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m0 = lowest, m1 = lowest, m2 = lowest, m3 = lowest;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    m0 = max16(m0, _mm512_loadu_ps(x + i));
    m1 = max16(m1, _mm512_loadu_ps(x + i + 16));
    m2 = max16(m2, _mm512_loadu_ps(x + i + 32));
    m3 = max16(m3, _mm512_loadu_ps(x + i + 48));
  }
  for (; i + 16 <= n; i += 16) m0 = max16(m0, _mm512_loadu_ps(x + i));
  if (i < n) {
    __mmask16 rest = static_cast<__mmask16>((1u << (n - i)) - 1);
    m1 = max16(m1, _mm512_mask_loadu_ps(lowest, rest, x + i));
  }
  return hmax16(max16(max16(m0, m1), max16(m2, m3)));
}

// exp(x) for x <= 0 or nan, as exp_nonpositive: 0 below -87.
inline __m512 exp_le0_v16(__m512 x) {
  const __m512 shift = _mm512_set1_ps(12582912.0f);
  __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_NLT_UQ);
  __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shift);
  __m512 n = _mm512_sub_ps(t, shift);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  // 2^n from t's low bits (vector extensions: GCC 12's _mm512_slli_epi32 warns as above).
  typedef int32_t I16 __attribute__((vector_size(64)));
  I16 scale = (reinterpret_cast<I16>(t) + (127 - 0x4B400000)) << 23;
  return _mm512_maskz_mul_ps(keep, p, reinterpret_cast<__m512>(scale));
}

// exp_sum_f32 with exp_le0_v16.
inline float exp_sum_v16(const float* x, float mx, float* e, const float* next, size_t n) {
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  double total = 0;
  size_t i = 0, blocks = 0;
  auto fold = [&] {
    total += hsum16(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    for (auto& a : acc) a = _mm512_setzero_ps();
  };
  for (; i + 64 <= n; i += 64) {
    for (size_t a = 0; a < 4; ++a) {
      __builtin_prefetch(next + i + 16 * a, 0, 3);
      __m512 v = exp_le0_v16(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16 * a), vmx));
      _mm512_storeu_ps(e + i + 16 * a, v);
      acc[a] = _mm512_add_ps(acc[a], v);
    }
    if (++blocks == 64) {  // 4096 elements
      fold();
      blocks = 0;
    }
  }
  for (; i < n; i += 16) {
    __builtin_prefetch(next + i, 0, 3);
    __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 v = exp_le0_v16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vmx));
    _mm512_mask_storeu_ps(e + i, m, v);
    acc[0] = _mm512_mask_add_ps(acc[0], m, acc[0], v);
  }
  fold();
  return static_cast<float>(total);
}
#endif

#if !defined(WICK_ISA_AVX512) && defined(__AVX2__) && defined(__FMA__)
// The same two passes with AVX2 (the baseline): vmaxps, and exp_nonpositive's formula on eight
// lanes; the tails (under eight) are scalar.

inline float max_f32(const float* x, size_t n) {
  const __m256 lowest = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m0 = lowest, m1 = lowest, m2 = lowest, m3 = lowest;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
    m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + i + 8));
    m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + i + 16));
    m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + i + 24));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + i));
  alignas(32) float lane[8];
  _mm256_store_ps(lane, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  float m = lane[0];
  for (size_t k = 1; k < 8; ++k) m = std::max(m, lane[k]);
  for (; i < n; ++i) m = std::max(m, x[i]);  // a nan here shows in the sum
  return m;
}

inline __m256 exp_le0_v8(__m256 x) {
  const __m256 shift = _mm256_set1_ps(12582912.0f);
  __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_NLT_UQ);
  __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shift);
  __m256 n = _mm256_sub_ps(t, shift);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  __m256i scale = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127 - 0x4B400000)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(scale)), keep);
}

inline float exp_sum_v8(const float* x, float mx, float* e, const float* next, size_t n) {
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  double total = 0;
  size_t i = 0, blocks = 0;
  auto fold = [&] {
    alignas(32) float lane[8];
    _mm256_store_ps(lane,
                    _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    float f = 0;
    for (size_t k = 0; k < 8; ++k) f += lane[k];
    total += f;
    for (auto& a : acc) a = _mm256_setzero_ps();
  };
  for (; i + 32 <= n; i += 32) {
    __builtin_prefetch(next + i, 0, 3);
    __builtin_prefetch(next + i + 16, 0, 3);
    for (size_t a = 0; a < 4; ++a) {
      __m256 v = exp_le0_v8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * a), vmx));
      _mm256_storeu_ps(e + i + 8 * a, v);
      acc[a] = _mm256_add_ps(acc[a], v);
    }
    if (++blocks == 128) {  // 4096 elements
      fold();
      blocks = 0;
    }
  }
  fold();
  for (size_t k = i; k < n; k += kFloatsPerLine) __builtin_prefetch(next + k, 0, 3);
  float tail = 0;
  for (; i < n; ++i) {
    e[i] = exp_nonpositive(x[i] - mx);
    tail += e[i];
  }
  return static_cast<float>(total + tail);
}
#endif

// y[i] = e[i] * scale for i < n; with `stream`, whole vectors go to y with non-temporal stores
// from its first vector-aligned element on (the caller fences once its rows are done).
inline void scale_out_f32(const float* e, float scale, float* y, size_t n, bool stream) {
  size_t i = 0;
#if defined(WICK_ISA_AVX512) || defined(__AVX__)
  if (stream) {
    constexpr size_t kW = kVecBytes / sizeof(float);
    size_t head = (0 - reinterpret_cast<uintptr_t>(y)) % kVecBytes / sizeof(float);
    for (head = std::min(head, n); i < head; ++i) y[i] = e[i] * scale;
    for (; i + kW <= n; i += kW) {
#if defined(WICK_ISA_AVX512)
      _mm512_stream_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(e + i), _mm512_set1_ps(scale)));
#else
      _mm256_stream_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(e + i), _mm256_set1_ps(scale)));
#endif
    }
  }
#else
  (void)stream;
#endif
  for (; i < n; ++i) y[i] = e[i] * scale;
}

void softmax_rows_f32(const float* x, float* y, size_t rows, size_t len) {
  bool stream = rows * len * sizeof(float) >= kStreamBytes;
  bool scratch = len <= kSoftmaxScratch;
  // One contiguous range of rows per thread: a jump between interleaved blocks would restart the
  // hardware prefetcher's stream.
  parallel_for(rows, std::max<size_t>(1, kParallelWork / len), [&](size_t r0, size_t r1) {
    std::vector<float> tmp(scratch ? len : 0);
    for (size_t r = r0; r < r1; ++r) {
      const float* xr = x + r * len;
      float* yr = y + r * len;
      float* e = scratch ? tmp.data() : yr;
      const float* next = r + 1 < r1 ? xr + len : xr;
#if defined(WICK_ISA_AVX512) || (defined(__AVX2__) && defined(__FMA__))
#if defined(WICK_ISA_AVX512)
      float sum = exp_sum_v16(xr, max_f32(xr, len), e, next, len);
#else
      float sum = exp_sum_v8(xr, max_f32(xr, len), e, next, len);
#endif
      if (std::isnan(sum)) {  // a nan anywhere (or +inf) makes the whole row nan
        std::fill_n(yr, len, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
#else
      auto [mx, nan] = extreme_floats<float, true>(xr, len);
      if (nan) {  // a nan anywhere makes the whole row nan
        std::fill_n(yr, len, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      float sum = exp_sum_f32(xr, mx, e, next, len);
#endif
      scale_out_f32(e, 1.0f / sum, yr, len, stream && scratch);
    }
#if defined(WICK_ISA_AVX512) || defined(__AVX__)
    if (stream) _mm_sfence();  // the streamed lines reach memory before the caller reads y
#endif
  });
}

}  // namespace

StoragePtr softmax_last_dim(const CpuStorage& in, const Layout& layout) {
  if (!layout.is_contiguous()) {
    // The contract promises a contiguous input; stay correct if a caller forgets.
    auto tmp = std::make_unique<CpuStorage>(layout.elem_count(), in.dtype());
    in.copy_to_host(layout, tmp->data());
    return softmax_last_dim(*tmp, Layout::contiguous(layout.shape()));
  }
  size_t n = layout.elem_count();
  auto result = std::make_unique<CpuStorage>(n, in.dtype());
  if (n == 0) return result;
  size_t len = layout.rank() == 0 ? 1 : layout.dims().back();
  size_t rows = n / len;
  dispatch_float(in.dtype(), "softmax", [&]<class T>() {
    using C = compute_t<T>;
    const T* x = in.as<T>() + layout.start_offset();
    T* y = result->as<T>();
    if constexpr (std::is_same_v<T, float>) {
      softmax_rows_f32(x, y, rows, len);
    } else {
      parallel_for(rows, std::max<size_t>(1, kParallelWork / len), [&](size_t b, size_t e) {
        // f16/bf16 keep the exponentials in f32 and round once.
        std::vector<C> tmp(std::is_same_v<C, T> ? 0 : len);
        for (size_t r = b; r < e; ++r) {
          const T* xr = x + r * len;
          T* yr = y + r * len;
          C* buf;
          if constexpr (std::is_same_v<C, T>) {
            buf = yr;
          } else {
            buf = tmp.data();
          }
          auto [mx, nan] = extreme_run<T, true>(xr, len);
          if (nan) {  // a nan anywhere makes the whole row nan
            std::fill_n(yr, len, T(std::numeric_limits<C>::quiet_NaN()));
            continue;
          }
          for (size_t i = 0; i < len; ++i) buf[i] = exp_le0(static_cast<C>(xr[i]) - mx);
          C inv = C(1) / pairwise_sum<C, true>(buf, len, 1);
          for (size_t i = 0; i < len; ++i) yr[i] = T(buf[i] * inv);
        }
      });
    }
  });
  return result;
}
}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
