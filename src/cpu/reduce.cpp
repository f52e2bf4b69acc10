// CPU reductions (sum, max, min, argmax, argmin over any dims of any strided layout); the
// last-dim softmax is softmax.cpp. A reduction is planned once: size-1 dims are dropped, the kept
// dims (output order) and the reduced dims are each merged where their strides allow, and the
// reduced dims of order-free ops are sorted by stride so that e.g. the sum of a transposed tensor
// walks memory in order. Then one of two loops runs:
// - inner: each output reduces a run of the input (rows when the innermost reduced dim is
//   unit-stride) in pieces of kReducePiece merged in order; threads split the outputs, or share
//   a run's pieces when there are few outputs;
// - outer: the innermost kept dim is the one that moves fastest in memory, so whole rows of
//   outputs are accumulated together (column sums of a row-major matrix).
// Either way the pieces depend on the problem's shape only, never on the thread count or on how
// many outputs there are: the bits do not change with WICK_NUM_THREADS or the batch.

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
#include "cpu/strided.h"
#include "dispatch.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {
namespace {

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
  // A run is reduced in pieces of kReducePiece elements merged in order: the same tree whether
  // one thread walks an output's pieces or the threads share them, so the bits depend on the
  // problem only (not on the thread count, nor on how many outputs there are).
  const size_t pieces = std::max<size_t>(1, (seq + kReducePiece - 1) / kReducePiece);
  auto piece = [&](size_t base, size_t c, Acc& acc) {
    reduce_range(base, c * kReducePiece, std::min(seq, (c + 1) * kReducePiece), acc);
  };
  size_t threads = num_threads();
  if (n_out >= threads || pieces == 1 || threads == 1) {
    size_t grain = std::max<size_t>(1, kParallelWork / std::max<size_t>(seq, 1));
    parallel_for(n_out, grain, [&](size_t b, size_t e) {
      StridedIndex it(kept, b);
      for (size_t o = b; o < e; ++o, it.next()) {
        Acc acc;
        piece(it.offset(), 0, acc);
        for (size_t c = 1; c < pieces; ++c) {
          Acc part;
          piece(it.offset(), c, part);
          acc.merge(part);
        }
        out[o] = acc.result();
      }
    });
    return;
  }
  // Few long runs: the threads share each run's pieces.
  StridedIndex it(kept);
  for (size_t o = 0; o < n_out; ++o, it.next()) {
    std::vector<Acc> parts(pieces);
    size_t base = it.offset();
    parallel_for(pieces, 1, [&](size_t cb, size_t ce) {
      for (size_t c = cb; c < ce; ++c) piece(base, c, parts[c]);
    });
    for (size_t c = 1; c < pieces; ++c) parts[0].merge(parts[c]);
    out[o] = parts[0].result();
  }
}

// ---- the outer loop: columns j of the innermost kept dim, rows r of the reduced dims ----
//
// A task owns a chunk of columns and a range of rows; rows are read whole (as wide as the chunk),
// so memory streams in order. Tall reductions go in row parts of a fixed height whose partial
// states are merged in row order; when there are fewer column tasks than threads, the threads
// share the row parts.

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
  // Rows in parts of a fixed count (from the width only), each part's state merged in order:
  // the same tree whether the threads split the columns or the rows.
  const size_t part_rows =
      std::max(kSumBlock, kReducePiece / std::min(m, kColumnChunk) / kSumBlock * kSumBlock);
  const size_t row_parts = (nr + part_rows - 1) / part_rows;
  auto run_task = [&](size_t t, Cols& state, size_t part) {
    size_t o = t / col_chunks, j0 = (t % col_chunks) * kColumnChunk;
    const T* base = x + plan.start + kept_off[o] + j0 * sk;
    size_t r0 = part * part_rows, r1 = std::min(nr, (part + 1) * part_rows);
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
  size_t threads = num_threads();
  if (row_parts == 1 || col_tasks >= threads || nr * m < 2 * kParallelWork) {
    size_t work = std::max<size_t>(1, nr * std::min(m, kColumnChunk));
    parallel_for(col_tasks, std::max<size_t>(1, kParallelWork / work), [&](size_t b, size_t e) {
      for (size_t t = b; t < e; ++t) {
        Cols state(chunk_width(t));
        run_task(t, state, 0);
        for (size_t part = 1; part < row_parts; ++part) {
          Cols later(chunk_width(t));
          run_task(t, later, part);
          state.merge(later);
        }
        state.write(dst(t));
      }
    });
    return;
  }
  // Few column tasks: the threads share each one's row parts.
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

}  // namespace

StoragePtr reduce(const CpuStorage& in, ReduceKind op, const Layout& layout,
                  const std::vector<size_t>& dims) {
  return dispatch(in.dtype(), [&]<class T>() { return reduce_typed<T>(in, op, layout, dims); });
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
