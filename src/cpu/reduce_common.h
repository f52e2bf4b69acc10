#pragma once
// Pieces shared by the CPU reductions (reduce.cpp) and softmax (softmax.cpp), compiled once per
// instruction set in the includer's ISA namespace (include it after cpu/isa_begin.h): work
// sizes, the accumulator types and compensated / pairwise sums, and the NaN-aware max and min of
// a run.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "cpu/isa_ns.h"
#include "dispatch.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {
namespace {

// Elements of work below which a loop stays on the calling thread.
constexpr size_t kParallelWork = size_t{1} << 15;
// Columns per task in the outer loop: rows are read this wide (whole pages), and the
// accumulators still fit in L2.
constexpr size_t kColumnChunk = 4096;
// Rows summed plainly before being folded into the compensated total (outer loop).
constexpr size_t kSumBlock = 64;
// Elements of one piece of a reduction: long runs (inner loop) and tall column blocks (outer
// loop) are reduced piece by piece and the pieces merged in order, whatever the thread count.
constexpr size_t kReducePiece = size_t{1} << 15;

// ---- element types ----

// Sums accumulate in float for f16/bf16/f32, double for f64, and wrap in uint64 for integers
// (cast back at the end, which wraps in the element's own dtype).
template <class T>
using sum_acc_t = std::conditional_t<std::is_integral_v<T>, uint64_t, compute_t<T>>;

template <class A, class T>
inline A to_acc(T x) {
  if constexpr (std::is_integral_v<A>) {
    return static_cast<A>(x);
  } else {
    return static_cast<A>(static_cast<compute_t<T>>(x));
  }
}

template <class T, class A>
inline T from_acc(A x) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(x);
  } else {
    return T(x);
  }
}

// Adds v to sum with a Neumaier compensation term (floats); integers add plainly.
template <class A>
inline void compensated_add(A& sum, A& comp, A v) {
  if constexpr (std::is_floating_point_v<A>) {
    A t = sum + v;
    if (std::abs(sum) >= std::abs(v)) {
      comp += (sum - t) + v;
    } else {
      comp += (v - t) + sum;
    }
    sum = t;
  } else {
    sum += v;
  }
}

template <class A>
inline A compensated_result(A sum, A comp) {
  if constexpr (std::is_floating_point_v<A>) {
    // Once the sum is inf or nan the compensation is meaningless (inf - inf).
    return std::isfinite(sum) ? sum + comp : sum;
  } else {
    return sum;
  }
}

// Pairwise sum of p[0], p[s], ... p[(n-1)s]: error grows with log(n), not n. The leaves keep
// 32 independent accumulators (four vectors of eight floats: the adds of one vector wait on each
// other, four hide that latency) and add them up as a tree.
template <class A, bool Unit, class T>
A pairwise_sum(const T* p, size_t n, size_t s) {
  constexpr size_t kLeaf = 256, kLanes = 32;
  if (n <= kLeaf) {
    A lanes[kLanes] = {};
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (size_t k = 0; k < kLanes; ++k) lanes[k] += to_acc<A>(p[Unit ? i + k : (i + k) * s]);
    }
    for (size_t width = kLanes / 2; width > 0; width /= 2) {
      for (size_t k = 0; k < width; ++k) lanes[k] += lanes[k + width];
    }
    A r = lanes[0];
    for (; i < n; ++i) r += to_acc<A>(p[Unit ? i : i * s]);
    return r;
  }
  size_t half = (n / 2) & ~(kLanes - 1);
  return pairwise_sum<A, Unit>(p, half, s) + pairwise_sum<A, Unit>(p + half * s, n - half, s);
}

// Max/Min propagate nan: once a nan is seen it stays.
template <class C, bool Max>
inline bool takes(C x, C best) {
  if constexpr (std::is_floating_point_v<C>) {
    return (Max ? x > best : x < best) || x != x;
  } else {
    return Max ? x > best : x < best;
  }
}

template <class C, bool Max>
constexpr C identity() {
  if constexpr (std::is_floating_point_v<C>) {
    return Max ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
  } else {
    return Max ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
  }
}

// (Max ? x > l : x < l) ? x : l for floats as a bit-mask select: GCC will not if-convert float
// selects under -ftrapping-math, masks it vectorises.
template <class C, bool Max>
inline C pick(C x, C l) {
  if constexpr (std::is_floating_point_v<C>) {
    using U = std::conditional_t<sizeof(C) == 4, uint32_t, uint64_t>;
    U m = U(0) - static_cast<U>(Max ? x > l : x < l);
    return std::bit_cast<C>((std::bit_cast<U>(x) & m) | (std::bit_cast<U>(l) & ~m));
  } else {
    return (Max ? x > l : x < l) ? x : l;
  }
}

// Native vector width: AVX-512 or AVX registers where the build has them, else 16 bytes (SSE,
// NEON).
#if defined(WICK_ISA_AVX512)
constexpr size_t kVecBytes = 64;
#elif defined(__AVX__)
constexpr size_t kVecBytes = 32;
#else
constexpr size_t kVecBytes = 16;
#endif

// The max (or min) of f32/f64 p[0..n) ignoring nan, and whether a nan was seen, with GCC/Clang
// vector types (the compiler does not vectorise a float max reduction without fast-math).
template <class C, bool Max>
std::pair<C, bool> extreme_floats(const C* p, size_t n) {
  using I = std::conditional_t<sizeof(C) == 4, int32_t, int64_t>;
  typedef C V __attribute__((vector_size(kVecBytes)));
  typedef I M __attribute__((vector_size(kVecBytes)));
  constexpr size_t kW = kVecBytes / sizeof(C);
  constexpr size_t kAcc = 4;  // independent accumulators hide the compare latency
  V best[kAcc];
  M nan[kAcc];
  for (size_t a = 0; a < kAcc; ++a) {
    for (size_t k = 0; k < kW; ++k) best[a][k] = identity<C, Max>();
    nan[a] = M{};
  }
  size_t i = 0;
  for (; i + kAcc * kW <= n; i += kAcc * kW) {
    for (size_t a = 0; a < kAcc; ++a) {
      V x;
      std::memcpy(&x, p + i + a * kW, sizeof(V));
      M m = Max ? x > best[a] : x < best[a];
      best[a] =
          reinterpret_cast<V>((reinterpret_cast<M>(x) & m) | (reinterpret_cast<M>(best[a]) & ~m));
      nan[a] |= x != x;
    }
  }
  C out = identity<C, Max>();
  bool any_nan = false;
  for (size_t a = 0; a < kAcc; ++a) {
    for (size_t k = 0; k < kW; ++k) {
      out = pick<C, Max>(best[a][k], out);
      any_nan |= nan[a][k] != 0;
    }
  }
  for (; i < n; ++i) {
    out = pick<C, Max>(p[i], out);
    any_nan |= p[i] != p[i];
  }
  return {out, any_nan};
}

// The max (or min) of p[0..n) ignoring nan, and whether a nan was seen.
template <class T, bool Max>
std::pair<compute_t<T>, bool> extreme_run(const T* p, size_t n) {
  using C = compute_t<T>;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return extreme_floats<T, Max>(p, n);
  } else if constexpr (std::is_floating_point_v<C>) {
    // f16/bf16: widen a block at a time.
    constexpr size_t kBlock = 256;
    float buf[kBlock];
    C best = identity<C, Max>();
    bool any_nan = false;
    for (size_t b = 0; b < n; b += kBlock) {
      size_t len = std::min(kBlock, n - b);
      for (size_t i = 0; i < len; ++i) buf[i] = static_cast<float>(p[b + i]);
      auto [x, nan] = extreme_floats<float, Max>(buf, len);
      best = pick<C, Max>(x, best);
      any_nan |= nan;
    }
    return {best, any_nan};
  } else {
    C best = identity<C, Max>();
    for (size_t i = 0; i < n; ++i) best = pick<C, Max>(p[i], best);
    return {best, false};
  }
}

}  // namespace
}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
