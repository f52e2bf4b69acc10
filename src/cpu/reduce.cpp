// CPU reductions (sum, max, min, argmax, argmin over any dims of any strided layout) and the
// last-dim softmax.
//
// A reduction is planned once: size-1 dims are dropped, the kept dims (output order) and the
// reduced dims are each merged where their strides allow, and the reduced dims of order-free ops
// are sorted by stride so that e.g. the sum of a transposed tensor walks memory in order. Then one
// of two loops runs:
// - inner: each output reduces a run of the input (rows when the innermost reduced dim is
//   unit-stride); threads split the outputs, or split the run when there are few outputs;
// - outer: the innermost kept dim is the one that moves fastest in memory, so whole rows of
//   outputs are accumulated together (column sums of a row-major matrix).

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
#include "cpu/strided.h"
#include "cpu/vec_exp.h"
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

// ---- accumulators of the inner loop: row() folds in a run, merge() a later partial ----

template <class T>
struct SumAcc {
  using A = sum_acc_t<T>;
  using Out = T;
  A sum = 0, comp = 0;
  void row(const T* p, size_t n, size_t s, size_t) {
    compensated_add(sum, comp,
                    s == 1 ? pairwise_sum<A, true>(p, n, 1) : pairwise_sum<A, false>(p, n, s));
  }
  void merge(const SumAcc& o) {
    compensated_add(sum, comp, o.sum);
    comp += o.comp;
  }
  Out result() const { return from_acc<T>(compensated_result(sum, comp)); }
};

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

template <class C>
constexpr C nan_of() {
  if constexpr (std::is_floating_point_v<C>) {
    return std::numeric_limits<C>::quiet_NaN();
  } else {
    return C{};
  }
}

template <class T, bool Max>
struct MinMaxAcc {
  using C = compute_t<T>;
  using Out = T;
  C best = identity<C, Max>();
  void row(const T* p, size_t n, size_t s, size_t) {
    if (s == 1) {
      auto [b, nan] = extreme_run<T, Max>(p, n);
      take(nan ? nan_of<C>() : b);
    } else {
      for (size_t i = 0; i < n; ++i) take(static_cast<C>(p[i * s]));
    }
  }
  void take(C x) { best = takes<C, Max>(x, best) ? x : best; }
  void merge(const MinMaxAcc& o) { take(o.best); }
  Out result() const { return from_acc<T>(best); }
};

// Arg: strictly better wins, so the first index wins ties; the first nan wins over numbers.
template <class C, bool Max>
inline bool better(C x, C best) {
  if constexpr (std::is_floating_point_v<C>) {
    return (Max ? x > best : x < best) || (x != x && best == best);
  } else {
    return Max ? x > best : x < best;
  }
}

template <class T, bool Max>
struct ArgAcc {
  using C = compute_t<T>;
  using Out = uint32_t;
  static constexpr size_t kNone = ~size_t{0};
  // Contiguous runs go block by block: a vector pass finds the block's extreme, and only a block
  // that beats the best so far is searched (in L1) for the first index holding it.
  static constexpr size_t kBlock = 2048;
  C best{};
  size_t idx = kNone;
  void row(const T* p, size_t n, size_t s, size_t idx0) {
    if (s == 1) {
      for (size_t b0 = 0; b0 < n; b0 += kBlock) {
        size_t len = std::min(kBlock, n - b0);
        const T* q = p + b0;
        auto [bx, nan] = extreme_run<T, Max>(q, len);
        if (nan) bx = nan_of<C>();
        if (idx != kNone && !better<C, Max>(bx, best)) continue;
        size_t i = 0;
        if constexpr (std::is_floating_point_v<C>) {
          if (nan) {
            while (!std::isnan(static_cast<C>(q[i]))) ++i;
          } else {
            while (static_cast<C>(q[i]) != bx) ++i;
          }
        } else {
          while (static_cast<C>(q[i]) != bx) ++i;
        }
        best = bx;
        idx = idx0 + b0 + i;
      }
      return;
    }
    size_t i = 0;
    if (idx == kNone && n > 0) {
      best = static_cast<C>(p[0]);
      idx = idx0;
      i = 1;
    }
    for (; i < n; ++i) {
      C x = static_cast<C>(p[i * s]);
      if (better<C, Max>(x, best)) {
        best = x;
        idx = idx0 + i;
      }
    }
  }
  void merge(const ArgAcc& o) {
    if (o.idx != kNone && (idx == kNone || better<C, Max>(o.best, best))) *this = o;
  }
  Out result() const { return static_cast<Out>(idx == kNone ? 0 : idx); }
};

// ---- planning ----

struct Dims {
  std::vector<size_t> sizes, strides;
  size_t count() const {
    size_t n = 1;
    for (size_t s : sizes) n *= s;
    return n;
  }
  bool empty() const { return sizes.empty(); }
  // Merges neighbours where the outer one steps exactly over the inner one.
  void coalesce() {
    std::vector<size_t> s, st;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!s.empty() && st.back() == strides[i] * sizes[i]) {
        s.back() *= sizes[i];
        st.back() = strides[i];
      } else {
        s.push_back(sizes[i]);
        st.push_back(strides[i]);
      }
    }
    sizes = std::move(s);
    strides = std::move(st);
  }
  // Storage offsets (relative) of every element, in row-major order.
  std::vector<size_t> offsets() const {
    std::vector<size_t> out(count());
    for_each_offset(Layout(Shape(sizes), strides, 0), 0, out.size(),
                    [&](size_t i, size_t off) { out[i] = off; });
    return out;
  }
};

struct Plan {
  Dims kept, red;
  size_t start = 0;
  bool empty_output = false;
  bool empty_reduction = false;
};

Plan make_plan(const Layout& layout, const std::vector<size_t>& dims, bool order_free) {
  Plan p;
  p.start = layout.start_offset();
  size_t next = 0;
  for (size_t i = 0; i < layout.rank(); ++i) {
    bool reduced = next < dims.size() && dims[next] == i;
    if (reduced) ++next;
    size_t size = layout.dims()[i];
    if (size == 0) (reduced ? p.empty_reduction : p.empty_output) = true;
    if (size == 1) continue;
    Dims& d = reduced ? p.red : p.kept;
    d.sizes.push_back(size);
    d.strides.push_back(layout.strides()[i]);
  }
  if (order_free && p.red.sizes.size() > 1) {
    // Largest stride outermost; broadcast (stride 0) dims outermost of all.
    std::vector<size_t> order(p.red.sizes.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto key = [&](size_t i) {
      size_t s = p.red.strides[i];
      return s == 0 ? std::numeric_limits<size_t>::max() : s;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key(a) > key(b); });
    Dims sorted;
    for (size_t i : order) {
      sorted.sizes.push_back(p.red.sizes[i]);
      sorted.strides.push_back(p.red.strides[i]);
    }
    p.red = std::move(sorted);
  }
  p.kept.coalesce();
  if (order_free) p.red.coalesce();
  return p;
}

// ---- the inner loop ----

template <class Acc, class T>
void inner_reduce(const T* x, typename Acc::Out* out, const Plan& plan) {
  // The reduced elements of one output: rows of `len` elements `step` apart, at `row_off`.
  size_t len = 1, step = 0;
  Dims outer_red;
  if (!plan.red.empty()) {
    len = plan.red.sizes.back();
    step = plan.red.strides.back();
    outer_red.sizes.assign(plan.red.sizes.begin(), plan.red.sizes.end() - 1);
    outer_red.strides.assign(plan.red.strides.begin(), plan.red.strides.end() - 1);
  }
  std::vector<size_t> row_off = outer_red.offsets();
  size_t seq = len * row_off.size();
  // Elements [b, e) of one output's run, starting at storage offset `base`.
  auto reduce_range = [&](size_t base, size_t b, size_t e, Acc& acc) {
    size_t r = b / len, c = b % len;
    while (b < e) {
      size_t n = std::min(len - c, e - b);
      acc.row(x + base + row_off[r] + c * step, n, step, c);
      b += n;
      ++r;
      c = 0;
    }
  };
  Layout kept(Shape(plan.kept.sizes), plan.kept.strides, plan.start);
  size_t n_out = kept.elem_count();
  size_t threads = num_threads();
  if (n_out >= threads || seq < 2 * kParallelWork || threads == 1) {
    size_t grain = std::max<size_t>(1, kParallelWork / std::max<size_t>(seq, 1));
    parallel_for(n_out, grain, [&](size_t b, size_t e) {
      StridedIndex it(kept, b);
      for (size_t o = b; o < e; ++o, it.next()) {
        Acc acc;
        reduce_range(it.offset(), 0, seq, acc);
        out[o] = acc.result();
      }
    });
    return;
  }
  // Few long runs: split each run between the threads and merge the partials in order.
  size_t chunks = std::min(threads, seq / kParallelWork);
  StridedIndex it(kept);
  for (size_t o = 0; o < n_out; ++o, it.next()) {
    std::vector<Acc> parts(chunks);
    size_t base = it.offset();
    parallel_for(chunks, 1, [&](size_t cb, size_t ce) {
      for (size_t c = cb; c < ce; ++c) {
        reduce_range(base, c * seq / chunks, (c + 1) * seq / chunks, parts[c]);
      }
    });
    for (size_t c = 1; c < chunks; ++c) parts[0].merge(parts[c]);
    out[o] = parts[0].result();
  }
}

// ---- the outer loop: columns j of the innermost kept dim, rows r of the reduced dims ----
//
// A task owns a chunk of columns and a range of rows; rows are read whole (as wide as the chunk),
// so memory streams in order. When there are fewer column tasks than threads the rows are split
// too, and the partial states are merged in row order.

// Branch-free a-or-b for the column loops (see pick).
template <class C>
inline C select(bool c, C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    using U = std::conditional_t<sizeof(C) == 4, uint32_t, uint64_t>;
    U m = U(0) - static_cast<U>(c);
    return std::bit_cast<C>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & ~m));
  } else {
    return c ? a : b;
  }
}

template <class T>
struct SumCols {
  using A = sum_acc_t<T>;
  using Out = T;
  std::vector<A> sum, comp, block;
  explicit SumCols(size_t m) : sum(m), comp(m), block(m) {}
  template <bool Unit>
  void run(const T* x, size_t sk, const size_t* off, size_t r0, size_t r1) {
    size_t m = sum.size();
    A* bl = block.data();
    // Plain sums over kSumBlock rows, folded into a compensated total (Neumaier, branch-free).
    for (size_t b = r0; b < r1; b += kSumBlock) {
      std::fill(block.begin(), block.end(), A(0));
      for (size_t r = b; r < std::min(r1, b + kSumBlock); ++r) {
        const T* p = x + off[r];
        for (size_t j = 0; j < m; ++j) bl[j] += to_acc<A>(p[Unit ? j : j * sk]);
      }
      add_all(bl, nullptr);
    }
  }
  void add_all(const A* v, const A* c) {
    A* s = sum.data();
    A* k = comp.data();
    for (size_t j = 0; j < sum.size(); ++j) {
      if constexpr (std::is_floating_point_v<A>) {
        A t = s[j] + v[j];
        bool ge = std::abs(s[j]) >= std::abs(v[j]);
        k[j] += (select(ge, s[j], v[j]) - t) + select(ge, v[j], s[j]);
        if (c) k[j] += c[j];
        s[j] = t;
      } else {
        s[j] += v[j];
      }
    }
  }
  void merge(const SumCols& later) { add_all(later.sum.data(), later.comp.data()); }
  void write(Out* out) const {
    for (size_t j = 0; j < sum.size(); ++j)
      out[j] = from_acc<T>(compensated_result(sum[j], comp[j]));
  }
};

template <class T, bool Max>
struct MinMaxCols {
  using C = compute_t<T>;
  using Out = T;
  std::vector<C> best;
  std::vector<uint32_t> nan;
  explicit MinMaxCols(size_t m) : best(m, identity<C, Max>()), nan(m, 0) {}
  template <bool Unit>
  void run(const T* x, size_t sk, const size_t* off, size_t r0, size_t r1) {
    size_t m = best.size();
    C* b = best.data();
    uint32_t* n = nan.data();
    for (size_t r = r0; r < r1; ++r) {
      const T* p = x + off[r];
      for (size_t j = 0; j < m; ++j) {
        C v = static_cast<C>(p[Unit ? j : j * sk]);
        b[j] = pick<C, Max>(v, b[j]);
        if constexpr (std::is_floating_point_v<C>) n[j] |= v != v;
      }
    }
  }
  void merge(const MinMaxCols& later) {
    for (size_t j = 0; j < best.size(); ++j) {
      best[j] = pick<C, Max>(later.best[j], best[j]);
      nan[j] |= later.nan[j];
    }
  }
  void write(Out* out) const {
    for (size_t j = 0; j < best.size(); ++j) out[j] = from_acc<T>(nan[j] ? nan_of<C>() : best[j]);
  }
};

template <class T, bool Max>
struct ArgCols {
  using C = compute_t<T>;
  using Out = uint32_t;
  std::vector<C> best;
  std::vector<uint32_t> idx;
  bool empty = true;
  explicit ArgCols(size_t m) : best(m), idx(m, 0) {}
  template <bool Unit>
  void run(const T* x, size_t sk, const size_t* off, size_t r0, size_t r1) {
    if (r0 >= r1) return;
    size_t m = best.size();
    C* b = best.data();
    uint32_t* ix = idx.data();
    for (size_t j = 0; j < m; ++j) {
      b[j] = static_cast<C>(x[off[r0] + (Unit ? j : j * sk)]);
      ix[j] = static_cast<uint32_t>(r0);
    }
    empty = false;
    for (size_t r = r0 + 1; r < r1; ++r) {
      const T* p = x + off[r];
      for (size_t j = 0; j < m; ++j) {
        C v = static_cast<C>(p[Unit ? j : j * sk]);
        bool take = better<C, Max>(v, b[j]);
        b[j] = select(take, v, b[j]);
        ix[j] = take ? static_cast<uint32_t>(r) : ix[j];
      }
    }
  }
  void merge(const ArgCols& later) {
    if (later.empty) return;
    for (size_t j = 0; j < best.size(); ++j) {
      if (empty || better<C, Max>(later.best[j], best[j])) {
        best[j] = later.best[j];
        idx[j] = later.idx[j];
      }
    }
    empty = false;
  }
  void write(Out* out) const { std::copy(idx.begin(), idx.end(), out); }
};

template <class Cols, class T>
void outer_reduce(const T* x, typename Cols::Out* out, const Plan& plan) {
  size_t m = plan.kept.sizes.back(), sk = plan.kept.strides.back();
  Dims outer_kept;
  outer_kept.sizes.assign(plan.kept.sizes.begin(), plan.kept.sizes.end() - 1);
  outer_kept.strides.assign(plan.kept.strides.begin(), plan.kept.strides.end() - 1);
  std::vector<size_t> kept_off = outer_kept.offsets();
  std::vector<size_t> red_off = plan.red.offsets();
  size_t nr = red_off.size();
  size_t col_chunks = (m + kColumnChunk - 1) / kColumnChunk;
  size_t col_tasks = kept_off.size() * col_chunks;
  size_t threads = num_threads();
  size_t row_parts = 1;
  if (col_tasks < threads && nr * m >= 2 * kParallelWork) {
    row_parts = std::min(threads, std::max<size_t>(1, nr / kSumBlock));
  }
  size_t work = std::max<size_t>(1, nr / row_parts * std::min(m, kColumnChunk));
  auto run_task = [&](size_t t, Cols& state, size_t part) {
    size_t o = t / col_chunks, j0 = (t % col_chunks) * kColumnChunk;
    const T* base = x + plan.start + kept_off[o] + j0 * sk;
    size_t r0 = part * nr / row_parts, r1 = (part + 1) * nr / row_parts;
    if (sk == 1) {
      state.template run<true>(base, sk, red_off.data(), r0, r1);
    } else {
      state.template run<false>(base, sk, red_off.data(), r0, r1);
    }
  };
  auto chunk_width = [&](size_t t) {
    size_t j0 = (t % col_chunks) * kColumnChunk;
    return std::min(kColumnChunk, m - j0);
  };
  auto dst = [&](size_t t) { return out + (t / col_chunks) * m + (t % col_chunks) * kColumnChunk; };
  if (row_parts == 1) {
    parallel_for(col_tasks, std::max<size_t>(1, kParallelWork / work), [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        Cols state(chunk_width(t));
        run_task(t, state, 0);
        state.write(dst(t));
      }
    });
    return;
  }
  for (size_t t = 0; t < col_tasks; ++t) {
    std::vector<Cols> parts(row_parts, Cols(chunk_width(t)));
    parallel_for(row_parts, 1, [&](size_t b, size_t e) {
      for (size_t part = b; part < e; ++part) run_task(t, parts[part], part);
    });
    for (size_t part = 1; part < row_parts; ++part) parts[0].merge(parts[part]);
    parts[0].write(dst(t));
  }
}

template <class T>
StoragePtr reduce_typed(const CpuStorage& in, ReduceKind op, const Layout& layout,
                        const std::vector<size_t>& dims) {
  bool arg = op == ReduceKind::ArgMax || op == ReduceKind::ArgMin;
  Plan plan = make_plan(layout, dims, !arg);
  size_t n_out = plan.kept.count();
  auto result =
      std::make_unique<CpuStorage>(plan.empty_output ? 0 : n_out, arg ? DType::U32 : in.dtype());
  if (plan.empty_output) return result;
  const T* x = in.as<T>();

  if (plan.empty_reduction) {
    // Only sum reaches here from the front end; the others get their identities.
    if (arg) {
      std::fill_n(result->as<uint32_t>(), n_out, 0u);
    } else {
      using C = compute_t<T>;
      T v = op == ReduceKind::Sum   ? from_acc<T>(C(0))
            : op == ReduceKind::Max ? from_acc<T>(identity<C, true>())
                                    : from_acc<T>(identity<C, false>());
      std::fill_n(result->as<T>(), n_out, v);
    }
    return result;
  }

  // The outer loop pays when the innermost kept dim moves through memory faster than any
  // reduced dim.
  bool outer = false;
  if (!plan.kept.empty() && !plan.red.empty()) {
    size_t sk = plan.kept.strides.back();
    size_t sr = plan.red.strides.back();  // the smallest nonzero one, after sorting
    outer = sk != 0 && (sr == 0 || sk < sr);
  }

  if (outer) {
    switch (op) {
      case ReduceKind::Sum:
        outer_reduce<SumCols<T>>(x, result->as<T>(), plan);
        break;
      case ReduceKind::Max:
        outer_reduce<MinMaxCols<T, true>>(x, result->as<T>(), plan);
        break;
      case ReduceKind::Min:
        outer_reduce<MinMaxCols<T, false>>(x, result->as<T>(), plan);
        break;
      case ReduceKind::ArgMax:
        outer_reduce<ArgCols<T, true>>(x, result->as<uint32_t>(), plan);
        break;
      case ReduceKind::ArgMin:
        outer_reduce<ArgCols<T, false>>(x, result->as<uint32_t>(), plan);
        break;
    }
    return result;
  }

  switch (op) {
    case ReduceKind::Sum:
      inner_reduce<SumAcc<T>>(x, result->as<T>(), plan);
      break;
    case ReduceKind::Max:
      inner_reduce<MinMaxAcc<T, true>>(x, result->as<T>(), plan);
      break;
    case ReduceKind::Min:
      inner_reduce<MinMaxAcc<T, false>>(x, result->as<T>(), plan);
      break;
    case ReduceKind::ArgMax:
      inner_reduce<ArgAcc<T, true>>(x, result->as<uint32_t>(), plan);
      break;
    case ReduceKind::ArgMin:
      inner_reduce<ArgAcc<T, false>>(x, result->as<uint32_t>(), plan);
      break;
  }
  return result;
}

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

StoragePtr reduce(const CpuStorage& in, ReduceKind op, const Layout& layout,
                  const std::vector<size_t>& dims) {
  return dispatch(in.dtype(), [&]<class T>() { return reduce_typed<T>(in, op, layout, dims); });
}

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
