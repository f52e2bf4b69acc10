// wick-conform: runs every op of the tensor core on one device against a float64 CPU reference
// and prints, per op and dtype, the largest error measured beside the bound of the numerical
// contract (wick/numerics.h, docs/NUMERICS.md). Exits 1 when any result breaches its bound, so a
// user can check their own GPU: `wick-conform cuda`.
//
// `wick-conform --determinism` checks bitwise reproducibility instead (tools/conform_determinism.h,
// docs/NUMERICS.md "Determinism"): on the CPU every op family forward and backward in child
// processes of 1 and 2 threads (and 2 again: run to run), each row alone against the same row
// inside batches of 1..64 rows, matmul rows and MiniLM sentences (WICK_MINILM_DIR or --minilm)
// with WICK_BATCH_INVARIANT=1; on CUDA the suite twice (run to run) and the rows CUDA keeps
// batch-invariant (norms, softmax, reductions, attention), matmul rows printed as INFO only. Every
// difference is printed (op, dtype, shape, elements, max difference, ulps); exits 1 on any.
//
// Every reference is computed here, in long double loops over the inputs' values (the same,
// already rounded inputs), from the op's definition: no wick op computes a reference, so an op
// that is wrong on the CPU is wrong against its reference on the CPU too. Float results are held
// to the bounds of wick/numerics.h; integer results (which wrap in their dtype by definition),
// comparisons, selections and copies must equal their reference exactly. Public API only.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "conform_determinism.h"
#include "wick/wick.h"

namespace {

using namespace wick;
using numerics::Backend;

// Per element: the bound on |got - want| for reference value `want` at index i.
using BoundFn = std::function<double(size_t i, double want)>;

struct Outcome {
  std::string op;
  DType dtype = DType::F32;
  size_t count = 0;
  double max_error = 0;  // largest |got - want| over all elements
  double error = 0;      // |got - want| at the worst element: the one nearest to (or furthest
  double bound = 0;      // past) its bound, and that element's bound
  double ratio = 0;      // error / bound there (0 / 0 = 0)
  std::string note;      // why it breached, when it did
  bool ok() const { return note.empty() && ratio <= 1; }
};

class Conform {
 public:
  Conform(Device device, uint64_t seed, std::string filter)
      : device_(device), gen_(seed), filter_(std::move(filter)) {}

  const std::vector<Outcome>& outcomes() const { return outcomes_; }
  Backend backend() const { return device_.is_cuda() ? Backend::Cuda : Backend::Cpu; }
  const Device& device() const { return device_; }

  bool wanted(const std::string& op) const {
    return filter_.empty() || std::regex_search(op, std::regex(filter_));
  }

  /// A CPU tensor of `dtype` from uniform values in [lo, hi) (integers: floor of |x|).
  Tensor input(const Shape& shape, DType dtype, double lo, double hi) {
    std::uniform_real_distribution<double> dist(lo, hi);
    std::vector<double> v(shape.elem_count());
    for (auto& x : v) x = is_float(dtype) ? dist(gen_) : std::floor(std::abs(dist(gen_)));
    return Tensor::from_vec(v, shape, Device::cpu()).to_dtype(dtype);
  }

  /// Records how `got` (computed on the device) compares with the reference `want`.
  void check(const std::string& op, DType dtype, const Tensor& got, const Tensor& want,
             const BoundFn& bound) {
    Outcome o;
    o.op = op;
    o.dtype = dtype;
    if (got.shape() != want.shape()) {
      o.note = "shape differs from the reference";
    } else if (got.device() != device_) {
      o.note = "result not on the device";
    } else {
      auto g = got.to_vec_f64(), w = want.to_vec_f64();
      o.count = g.size();
      for (size_t i = 0; i < g.size(); ++i) {
        double b = bound(i, w[i]);
        if (std::isnan(w[i]) && std::isnan(g[i])) continue;
        if (std::isinf(w[i]) && g[i] == w[i]) continue;
        double err = std::abs(g[i] - w[i]);
        if (std::isnan(err)) err = std::numeric_limits<double>::infinity();
        double ratio = err == 0 ? 0 : (b > 0 ? err / b : std::numeric_limits<double>::infinity());
        o.max_error = std::max(o.max_error, err);
        if (ratio >= o.ratio) {
          o.ratio = ratio;
          o.error = err;
          o.bound = b;
        }
      }
    }
    outcomes_.push_back(o);
  }

  /// Exact comparison (bound 0).
  void check_exact(const std::string& op, DType dtype, const Tensor& got, const Tensor& want) {
    check(op, dtype, got, want, [](size_t, double) { return 0.0; });
  }

  void record_error(const std::string& op, DType dtype, const std::string& what) {
    Outcome o;
    o.op = op;
    o.dtype = dtype;
    o.note = what;
    o.ratio = std::numeric_limits<double>::infinity();
    outcomes_.push_back(o);
  }

 private:
  Device device_;
  std::mt19937_64 gen_;
  std::string filter_;
  std::vector<Outcome> outcomes_;
};

const std::vector<DType> kFloats{DType::BF16, DType::F16, DType::F32, DType::F64};
const std::vector<DType> kInts{DType::U8, DType::U32, DType::I64};

// ---- the references: long double loops over values in row-major order ----

using Values = std::vector<double>;

/// A CPU f64 tensor holding `v` (the reference, compared element by element).
Tensor host(const Values& v, const Shape& shape) {
  return Tensor::from_vec(v, shape, Device::cpu());
}

/// `v` wrapped to an integer dtype as its arithmetic wraps (modulo 2^bits; i64 as is).
double wrap_int(long double v, DType dt) {
  auto i = static_cast<int64_t>(v);
  if (dt == DType::U8) return static_cast<double>(static_cast<uint8_t>(i));
  if (dt == DType::U32) return static_cast<double>(static_cast<uint32_t>(i));
  return static_cast<double>(i);
}

/// to_dtype to an integer dtype: truncation toward zero, saturation, NaN to 0.
double saturate_int(long double v, DType dt) {
  if (std::isnan(v)) return 0;
  long double t = std::trunc(v);
  long double lo = dt == DType::I64 ? -0x1p63L : 0.0L;
  long double hi = dt == DType::U8 ? 255.0L : dt == DType::U32 ? 4294967295.0L : 0x1p63L - 1;
  return static_cast<double>(std::min(std::max(t, lo), hi));
}

using Fn = std::function<long double(long double)>;
constexpr long double kPi = 3.141592653589793238462643383279502884L;

/// Each unary op's definition from <cmath> (the sample parameters of unary_ops below).
const std::map<std::string, Fn>& unary_oracles() {
  static const std::map<std::string, Fn> m{
      {"neg", [](long double x) { return -x; }},
      {"abs", [](long double x) { return std::fabs(x); }},
      {"exp", [](long double x) { return std::exp(x); }},
      {"log", [](long double x) { return std::log(x); }},
      {"sqrt", [](long double x) { return std::sqrt(x); }},
      {"sqr", [](long double x) { return x * x; }},
      {"recip", [](long double x) { return 1 / x; }},
      {"tanh", [](long double x) { return std::tanh(x); }},
      {"sin", [](long double x) { return std::sin(x); }},
      {"cos", [](long double x) { return std::cos(x); }},
      {"tan", [](long double x) { return std::sin(x) / std::cos(x); }},
      {"relu", [](long double x) { return x > 0 ? x : 0.0L; }},
      {"silu", [](long double x) { return x / (1 + std::exp(-x)); }},
      {"sigmoid", [](long double x) { return 1 / (1 + std::exp(-x)); }},
      {"gelu",
       [](long double x) {
         return 0.5L * x * (1 + std::tanh(std::sqrt(2 / kPi) * (x + 0.044715L * x * x * x)));
       }},
      {"gelu_erf", [](long double x) { return 0.5L * x * (1 + std::erf(x / std::sqrt(2.0L))); }},
      {"erf", [](long double x) { return std::erf(x); }},
      {"floor", [](long double x) { return std::floor(x); }},
      {"ceil", [](long double x) { return std::ceil(x); }},
      {"round", [](long double x) { return x < 0 ? -std::floor(0.5L - x) : std::floor(x + 0.5L); }},
      {"sign", [](long double x) { return x > 0 ? 1.0L : (x < 0 ? -1.0L : 0.0L); }},
      {"softplus", [](long double x) { return std::log(1 + std::exp(x)); }},
      {"log1p", [](long double x) { return std::log1p(x); }},
      {"expm1", [](long double x) { return std::expm1(x); }},
      {"affine", [](long double x) { return x * 1.5L - 0.25L; }},
      {"powf", [](long double x) { return std::pow(x, 1.7L); }},
      {"clamp", [](long double x) { return std::min(std::max(x, -0.5L), 1.25L); }},
      {"elu", [](long double x) { return x > 0 ? x : 0.7L * std::expm1(x); }},
  };
  return m;
}

/// An integer op's definition (wrapping; affine saturates as to_dtype; clamp's bounds truncate).
double unary_int(const std::string& op, double x, DType dt) {
  if (op == "affine") return saturate_int(x * 1.5L - 0.25L, dt);
  if (op == "clamp") return std::min(std::max(x, 0.0), 1.0);
  return wrap_int(unary_oracles().at(op)(x), dt);
}

using Fn2 = std::function<long double(long double, long double)>;

const std::map<std::string, Fn2>& binary_oracles() {
  static const std::map<std::string, Fn2> m{
      {"add", [](long double a, long double b) { return a + b; }},
      {"sub", [](long double a, long double b) { return a - b; }},
      {"mul", [](long double a, long double b) { return a * b; }},
      {"div", [](long double a, long double b) { return a / b; }},
      {"maximum", [](long double a, long double b) { return std::max(a, b); }},
      {"minimum", [](long double a, long double b) { return std::min(a, b); }},
  };
  return m;
}

/// Per output of a reduction of a (rows, cols) matrix along `dim`: the sum, the sum of |x|, the
/// max, the min and the first index of each.
struct Reduced {
  Values sum, abs_sum, max, min, argmax, argmin;
};

Reduced reduce(const Values& x, size_t rows, size_t cols, size_t dim) {
  size_t outs = dim ? rows : cols, k = dim ? cols : rows;
  Reduced r;
  for (size_t o = 0; o < outs; ++o) {
    long double s = 0, a = 0;
    double mx = 0, mn = 0;
    size_t imx = 0, imn = 0;
    for (size_t j = 0; j < k; ++j) {
      double v = dim ? x[o * cols + j] : x[j * cols + o];
      s += v;
      a += std::fabs(static_cast<long double>(v));
      if (j == 0 || v > mx) mx = v, imx = j;
      if (j == 0 || v < mn) mn = v, imn = j;
    }
    r.sum.push_back(static_cast<double>(s));
    r.abs_sum.push_back(static_cast<double>(a));
    r.max.push_back(mx);
    r.min.push_back(mn);
    r.argmax.push_back(static_cast<double>(imx));
    r.argmin.push_back(static_cast<double>(imn));
  }
  return r;
}

/// softmax of a (rows, cols) matrix along `dim`, and each output's row spread.
std::pair<Values, Values> softmax_of(const Values& x, size_t rows, size_t cols, size_t dim) {
  size_t outs = dim ? rows : cols, k = dim ? cols : rows;
  Values y(x.size()), spread(x.size());
  auto at = [&](size_t o, size_t j) { return dim ? o * cols + j : j * cols + o; };
  for (size_t o = 0; o < outs; ++o) {
    long double mx = x[at(o, 0)], mn = mx, sum = 0;
    for (size_t j = 0; j < k; ++j) {
      mx = std::max<long double>(mx, x[at(o, j)]);
      mn = std::min<long double>(mn, x[at(o, j)]);
    }
    for (size_t j = 0; j < k; ++j) sum += std::exp(x[at(o, j)] - mx);
    for (size_t j = 0; j < k; ++j) {
      y[at(o, j)] = static_cast<double>(std::exp(x[at(o, j)] - mx) / sum);
      spread[at(o, j)] = static_cast<double>(mx - mn);
    }
  }
  return {y, spread};
}

// Runs `body`, turning a thrown error into a breach of `op` rather than the end of the program.
void guarded(Conform& c, const std::string& op, DType dt, const std::function<void()>& body) {
  if (!c.wanted(op)) return;
  try {
    body();
  } catch (const std::exception& e) {
    c.record_error(op, dt, e.what());
  }
}

struct UnarySpec {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  double lo, hi;
  bool ints;  // also on integer dtypes (exact)
};

void unary_ops(Conform& c) {
  const std::vector<UnarySpec> ops{
  // Every op without parameters, on its domain, from the op table; those with parameters at
  // sample values.
#define WICK_UNARY_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, ...) \
  {#name, [](const Tensor& t) { return t.name(); }, lo, hi, std::string(#dtypes) == "Any"},
#define WICK_UNARY_PARAM_OP(...)
#include "wick/unary_ops.def"
      {"affine", [](const Tensor& t) { return t.affine(1.5, -0.25); }, -2, 2, true},
      {"powf", [](const Tensor& t) { return t.powf(1.7); }, 0.05, 4, false},
      {"clamp", [](const Tensor& t) { return t.clamp(-0.5, 1.25); }, -2, 2, true},
      {"elu", [](const Tensor& t) { return t.elu(0.7); }, -4, 4, false},
  };
  for (const auto& op : ops) {
    for (DType dt : kFloats) {
      guarded(c, op.name, dt, [&] {
        // A contiguous input and a transposed view, so that the strided kernels run too.
        Tensor x = c.input({67, 129}, dt, op.lo, op.hi);
        Tensor xt = c.input({129, 67}, dt, op.lo, op.hi);
        Tensor got =
            Tensor::cat({op.f(x.to_device(c.device())), op.f(xt.to_device(c.device()).t())}, 1);
        auto xv = Tensor::cat({x, xt.t()}, 1).to_vec_f64();
        Values w(xv.size());
        const Fn& f = unary_oracles().at(op.name);
        for (size_t i = 0; i < xv.size(); ++i) w[i] = static_cast<double>(f(xv[i]));
        Tensor want = host(w, got.shape());
        c.check(op.name, dt, got, want, [&](size_t i, double w) {
          return numerics::elementwise_bound(op.name, dt, c.backend(), w, std::abs(xv[i]));
        });
      });
    }
    if (!op.ints) continue;
    for (DType dt : kInts) {
      guarded(c, op.name, dt, [&] {
        Tensor x = c.input({67, 129}, dt, 0, 12);
        Values xv = x.to_vec_f64(), w(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) w[i] = unary_int(op.name, xv[i], dt);
        c.check_exact(op.name, dt, op.f(x.to_device(c.device())), host(w, x.shape()));
      });
    }
  }
}

void binary_ops(Conform& c) {
  using F = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<const char*, F>> ops{
      {"add", [](const Tensor& a, const Tensor& b) { return a.add(b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a.sub(b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a.mul(b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return a.div(b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return a.maximum(b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return a.minimum(b); }},
  };
  for (const auto& [name, f] : ops) {
    bool div = std::string(name) == "div";
    for (DType dt : kFloats) {
      guarded(c, name, dt, [&] {
        Tensor a = c.input({67, 129}, dt, -3, 3);
        // Divisors away from zero; the right operand broadcast along rows.
        Tensor b = c.input({129}, dt, div ? 0.25 : -3, 3).broadcast_as({67, 129});
        Values av = a.to_vec_f64(), bv = b.to_vec_f64(), w(av.size());
        const Fn2& g = binary_oracles().at(name);
        for (size_t i = 0; i < av.size(); ++i) w[i] = static_cast<double>(g(av[i], bv[i]));
        Tensor want = host(w, a.shape());
        Tensor got = f(a.to_device(c.device()), b.to_device(c.device()));
        c.check(name, dt, got, want, [&](size_t, double w) {
          return numerics::elementwise_bound(name, dt, c.backend(), w);
        });
      });
    }
    for (DType dt : kInts) {
      guarded(c, name, dt, [&] {
        Tensor a = c.input({67, 129}, dt, 0, 20), b = c.input({67, 129}, dt, 1, 21);
        Values av = a.to_vec_f64(), bv = b.to_vec_f64(), w(av.size());
        const Fn2& g = binary_oracles().at(name);
        for (size_t i = 0; i < av.size(); ++i) {
          // Integer division truncates toward zero.
          w[i] = div ? wrap_int(std::trunc(static_cast<long double>(av[i]) / bv[i]), dt)
                     : wrap_int(g(av[i], bv[i]), dt);
        }
        c.check_exact(name, dt, f(a.to_device(c.device()), b.to_device(c.device())),
                      host(w, a.shape()));
      });
    }
  }
}

void compare_ops(Conform& c) {
  for (DType dt : {DType::BF16, DType::F32, DType::U8, DType::I64}) {
    guarded(c, "cmp+where", dt, [&] {
      // Few distinct values, so that ties happen.
      Tensor a = c.input({33, 40}, dt, 0, 4).to_dtype(DType::I64).to_dtype(dt);
      Tensor b = c.input({33, 40}, dt, 0, 4).to_dtype(DType::I64).to_dtype(dt);
      Tensor da = a.to_device(c.device()), db = b.to_device(c.device());
      Values av = a.to_vec_f64(), bv = b.to_vec_f64();
      using Cmp = std::function<bool(double, double)>;
      for (auto [name, f, cmp] :
           std::vector<std::tuple<const char*, Tensor (Tensor::*)(const Tensor&) const, Cmp>>{
               {"eq", &Tensor::eq, std::equal_to<double>()},
               {"ne", &Tensor::ne, std::not_equal_to<double>()},
               {"lt", &Tensor::lt, std::less<double>()},
               {"le", &Tensor::le, std::less_equal<double>()},
               {"gt", &Tensor::gt, std::greater<double>()},
               {"ge", &Tensor::ge, std::greater_equal<double>()}}) {
        Values w(av.size());
        for (size_t i = 0; i < av.size(); ++i) w[i] = cmp(av[i], bv[i]) ? 1 : 0;
        c.check_exact(name, dt, (da.*f)(db), host(w, a.shape()));
      }
      Values sel(av.size());
      for (size_t i = 0; i < av.size(); ++i) sel[i] = av[i] < bv[i] ? av[i] : bv[i];
      c.check_exact("where_cond", dt, da.lt(db).where_cond(da, db), host(sel, a.shape()));
    });
  }
}

void reductions(Conform& c) {
  for (DType dt : kFloats) {
    Tensor x;
    guarded(c, "sum", dt, [&] {
      x = c.input({61, 1031}, dt, -2, 2);
      Tensor dx = x.to_device(c.device());
      Values xv = x.to_vec_f64();
      for (size_t dim : {0, 1}) {
        size_t k = x.dims()[dim];
        Reduced r = reduce(xv, 61, 1031, dim);
        Shape s{r.sum.size()};
        Values mean = r.sum;
        for (auto& m : mean) m /= static_cast<double>(k);
        c.check(dim ? "sum (rows)" : "sum (columns)", dt, dx.sum({dim}), host(r.sum, s),
                [&](size_t i, double w) { return numerics::sum_bound(dt, k, w, r.abs_sum[i]); });
        c.check(dim ? "mean (rows)" : "mean (columns)", dt, dx.mean({dim}), host(mean, s),
                [&](size_t i, double w) { return numerics::mean_bound(dt, k, w, r.abs_sum[i]); });
        c.check_exact(dim ? "max (rows)" : "max (columns)", dt, dx.max(dim), host(r.max, s));
        c.check_exact(dim ? "min (rows)" : "min (columns)", dt, dx.min(dim), host(r.min, s));
        c.check_exact(dim ? "argmax (rows)" : "argmax (columns)", dt, dx.argmax(dim),
                      host(r.argmax, s));
        c.check_exact(dim ? "argmin (rows)" : "argmin (columns)", dt, dx.argmin(dim),
                      host(r.argmin, s));
      }
      Reduced all = reduce(xv, 1, xv.size(), 1);
      c.check("sum_all", dt, dx.sum_all(), host(all.sum, Shape{}), [&](size_t, double w) {
        return numerics::sum_bound(dt, x.elem_count(), w, all.abs_sum[0]);
      });
    });
    guarded(c, "softmax", dt, [&] {
      Tensor s = c.input({37, 2049}, dt, -8, 8);
      Tensor ds = s.to_device(c.device());
      Values sv = s.to_vec_f64();
      auto [rows, rows_spread] = softmax_of(sv, 37, 2049, 1);
      auto [cols, cols_spread] = softmax_of(sv, 37, 2049, 0);
      c.check(
          "softmax (last dim)", dt, ds.softmax(1), host(rows, s.shape()),
          [&](size_t i, double w) { return numerics::softmax_bound(dt, 2049, w, rows_spread[i]); });
      c.check("softmax (dim 0)", dt, ds.softmax(0), host(cols, s.shape()), [&](size_t i, double w) {
        return numerics::softmax_bound(dt, 37, w, cols_spread[i]);
      });
    });
  }
  for (DType dt : kInts) {
    guarded(c, "sum", dt, [&] {
      Tensor x = c.input({61, 1031}, dt, 0, 20), dx = x.to_device(c.device());
      Values xv = x.to_vec_f64();
      Reduced rows = reduce(xv, 61, 1031, 1), cols = reduce(xv, 61, 1031, 0);
      for (auto& v : rows.sum) v = wrap_int(v, dt);
      c.check_exact("sum (rows)", dt, dx.sum({1}), host(rows.sum, Shape{61}));
      c.check_exact("max (columns)", dt, dx.max(0), host(cols.max, Shape{1031}));
      c.check_exact("argmin (rows)", dt, dx.argmin(1), host(rows.argmin, Shape{61}));
    });
  }
}

void matmuls(Conform& c) {
  bool tf32 = c.device().is_cuda() && cuda_tf32_allowed();
  struct Case {
    const char* name;
    Shape a, b;
    bool transpose_a;
  };
  const std::vector<Case> cases{{"matmul", {67, 131}, {131, 45}, false},
                                {"matmul (batched)", {3, 33, 257}, {3, 257, 17}, false},
                                {"matmul (transposed lhs)", {131, 67}, {131, 45}, true},
                                {"matmul (k = 2048)", {16, 2048}, {2048, 24}, false}};
  for (const auto& mc : cases) {
    for (DType dt : kFloats) {
      guarded(c, mc.name, dt, [&] {
        Tensor a = c.input(mc.a, dt, -2, 2), b = c.input(mc.b, dt, -2, 2);
        auto prep = [&](const Tensor& t) { return mc.transpose_a ? t.t() : t; };
        size_t k = prep(a).dims().back();
        // a (batch, m, k) in logical order (transposed when the case says so), b (batch, k, n).
        Values av = prep(a).to_vec_f64(), bv = b.to_vec_f64();
        Shape as = prep(a).shape();
        size_t r = as.rank(), m = as[r - 2], n = b.dims().back();
        size_t batch = as.elem_count() / (m * k);
        Values w(batch * m * n), abs_sum(w.size());
        for (size_t p = 0; p < batch; ++p) {
          for (size_t i = 0; i < m; ++i) {
            for (size_t j = 0; j < n; ++j) {
              long double acc = 0, acc_abs = 0;
              for (size_t q = 0; q < k; ++q) {
                long double t =
                    static_cast<long double>(av[(p * m + i) * k + q]) * bv[(p * k + q) * n + j];
                acc += t;
                acc_abs += std::fabs(t);
              }
              w[(p * m + i) * n + j] = static_cast<double>(acc);
              abs_sum[(p * m + i) * n + j] = static_cast<double>(acc_abs);
            }
          }
        }
        Tensor got = prep(a.to_device(c.device())).matmul(b.to_device(c.device()));
        Tensor want = host(w, got.shape());
        c.check(mc.name, dt, got, want, [&](size_t i, double w) {
          return numerics::matmul_bound(dt, k, w, abs_sum[i], tf32);
        });
      });
    }
  }
}

void indexing(Conform& c) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64, DType::U8, DType::I64}) {
    guarded(c, "index", dt, [&] {
      Tensor x = c.input({23, 41}, dt, -2, 2), dx = x.to_device(c.device());
      const std::vector<uint32_t> id{3, 0, 22, 3, 7, 1, 22};
      Tensor ids = Tensor::from_vec<uint32_t>(id, {7}, Device::cpu());
      Tensor dids = ids.to_device(c.device());
      Values xv = x.to_vec_f64(), sel(7 * 41);
      for (size_t r = 0; r < 7; ++r) {
        for (size_t j = 0; j < 41; ++j) sel[r * 41 + j] = xv[id[r] * 41 + j];
      }
      c.check_exact("index_select", dt, dx.index_select(dids, 0), host(sel, {7, 41}));
      c.check_exact("embedding", dt, dx.embedding(dids), host(sel, {7, 41}));
      Tensor gids = c.input({23, 5}, DType::I64, 0, 4.1);  // floor(|x|) in 0..4
      Values gv = gids.to_vec_f64(), gat(23 * 5);
      for (size_t i = 0; i < 23; ++i) {
        for (size_t j = 0; j < 5; ++j)
          gat[i * 5 + j] = xv[i * 41 + static_cast<size_t>(gv[i * 5 + j])];
      }
      c.check_exact("gather", dt, dx.gather(gids.to_device(c.device()), 1), host(gat, {23, 5}));
      // Id 3 and 22 repeat: up to 3 terms land on one row (a 3-long sum with the destination).
      Tensor src = c.input({7, 41}, dt, -2, 2);
      Values srcv = src.to_vec_f64();
      std::vector<long double> acc(xv.begin(), xv.end()), acc_abs(xv.size());
      for (size_t i = 0; i < xv.size(); ++i)
        acc_abs[i] = std::fabs(static_cast<long double>(xv[i]));
      for (size_t r = 0; r < 7; ++r) {
        for (size_t j = 0; j < 41; ++j) {
          acc[id[r] * 41 + j] += srcv[r * 41 + j];
          acc_abs[id[r] * 41 + j] += std::fabs(static_cast<long double>(srcv[r * 41 + j]));
        }
      }
      Values added(xv.size()), added_abs(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        added[i] = is_float(dt) ? static_cast<double>(acc[i]) : wrap_int(acc[i], dt);
        added_abs[i] = static_cast<double>(acc_abs[i]);
      }
      Tensor got = dx.index_add(dids, src.to_device(c.device()), 0);
      c.check("index_add", dt, got, host(added, x.shape()), [&](size_t i, double w) {
        return numerics::index_add_bound(dt, 3, w, added_abs[i]);
      });
      Tensor ssrc = c.input({23, 5}, dt, -2, 2);
      Values sv = ssrc.to_vec_f64();
      std::vector<long double> sacc(xv.begin(), xv.end()), sacc_abs(acc_abs.size());
      for (size_t i = 0; i < xv.size(); ++i)
        sacc_abs[i] = std::fabs(static_cast<long double>(xv[i]));
      for (size_t i = 0; i < 23; ++i) {
        for (size_t j = 0; j < 5; ++j) {
          size_t to = i * 41 + static_cast<size_t>(gv[i * 5 + j]);
          sacc[to] += sv[i * 5 + j];
          sacc_abs[to] += std::fabs(static_cast<long double>(sv[i * 5 + j]));
        }
      }
      Values scattered(xv.size()), scattered_abs(xv.size());
      for (size_t i = 0; i < xv.size(); ++i) {
        scattered[i] = is_float(dt) ? static_cast<double>(sacc[i]) : wrap_int(sacc[i], dt);
        scattered_abs[i] = static_cast<double>(sacc_abs[i]);
      }
      Tensor sgot = dx.scatter_add(gids.to_device(c.device()), ssrc.to_device(c.device()), 1);
      c.check("scatter_add", dt, sgot, host(scattered, x.shape()), [&](size_t i, double w) {
        return numerics::index_add_bound(dt, 6, w, scattered_abs[i]);
      });
    });
  }
}

void copies(Conform& c) {
  for (DType to : {DType::BF16, DType::F16, DType::F32, DType::F64, DType::U8, DType::I64}) {
    guarded(c, "to_dtype", to, [&] {
      // From float64 values: the conversion is the only rounding.
      Tensor x = c.input({67, 129}, DType::F64, 0, 200);
      Tensor got = x.to_device(c.device()).to_dtype(to);
      if (is_float(to)) {
        c.check("to_dtype (from f64)", to, got, x,
                [&](size_t, double w) { return numerics::convert_bound(to, w); });
      } else {
        Values xv = x.to_vec_f64(), w(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) w[i] = saturate_int(xv[i], to);
        c.check_exact("to_dtype (from f64)", to, got, host(w, x.shape()));
      }
    });
    guarded(c, "copy", to, [&] {
      Tensor x = c.input({31, 2, 45}, to, -2, 2), dx = x.to_device(c.device());
      Values xv = x.to_vec_f64(), perm(xv.size()), cat(31 * 2 * 52);
      for (size_t i = 0; i < 31; ++i) {
        for (size_t j = 0; j < 2; ++j) {
          for (size_t l = 0; l < 45; ++l) perm[(l * 31 + i) * 2 + j] = xv[(i * 2 + j) * 45 + l];
          for (size_t l = 0; l < 52; ++l) {
            cat[(i * 2 + j) * 52 + l] = xv[(i * 2 + j) * 45 + (l < 45 ? l : 3 + (l - 45))];
          }
        }
      }
      c.check_exact("contiguous (permuted)", to, dx.permute({2, 0, 1}).contiguous(),
                    host(perm, {45, 31, 2}));
      c.check_exact("cat", to, Tensor::cat({dx, dx.narrow(2, 3, 7)}, 2), host(cat, {31, 2, 52}));
    });
  }
}

std::string fmt(double v) {
  if (std::isinf(v)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, v == 0 ? "%.0f" : "%.2g", v);
  return buf;
}

// ---- --determinism ----

template <class... A>
std::string str(const A&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

std::string self_exe() {
  std::vector<char> buf(4096);
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string("wick-conform");
}

std::string diff_line(const determinism::Diff& d) {
  return str("DIFF ", d.op, " ", dtype_name(d.dtype), " ", determinism::shape_str(d.shape), ": ",
             d.count, " elements differ, max ", fmt(d.max_abs), " (", d.max_ulps, " ulps)");
}

// Runs this program with `args` and `env` ("NAME=value ..."), passing its DIFF lines through;
// how many there were, and whether it exited 0 or 1 (1 when it found differences).
size_t run_child(const std::string& env, const std::string& args, bool* failed) {
  std::string cmd = env + " '" + self_exe() + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  size_t diffs = 0;
  *failed = p == nullptr;
  if (p == nullptr) return 0;
  char line[4096];
  std::string others;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    if (std::string(line).rfind("DIFF ", 0) == 0) {
      ++diffs;
      std::fputs(line, stdout);
    } else {
      others += line;
    }
  }
  int rc = pclose(p);
  if (rc != 0 && diffs == 0) {
    std::printf("FAILED %s: %s\n", cmd.c_str(), others.c_str());
    *failed = true;
  }
  return diffs;
}

// The child processes' work: "threads:N:PATH" (the thread suite with N threads, its results
// written to PATH), "matmul" (matmul rows alone vs batches, attention queries alone vs in their
// prefill), "embed:DIR" (MiniLM sentences).
int determinism_child(const std::string& spec) {
  try {
    if (spec.rfind("threads:", 0) == 0) {
      size_t colon = spec.find(':', 8);
      wick::set_cpu_threads(std::stoul(spec.substr(8, colon - 8)));
      determinism::write_results(spec.substr(colon + 1), determinism::thread_suite());
      return 0;
    }
    std::vector<determinism::Diff> diffs;
    if (spec == "matmul") {
      diffs = determinism::batch_suite_switched(64);
    } else if (spec.rfind("embed:", 0) == 0) {
      diffs = determinism::embedding_suite(spec.substr(6), Device::cpu(), 128);
    } else {
      std::fprintf(stderr, "wick-conform: unknown --determinism-child '%s'\n", spec.c_str());
      return 2;
    }
    for (const auto& d : diffs) std::printf("%s\n", diff_line(d).c_str());
    return diffs.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wick-conform: %s\n", e.what());
    return 2;
  }
}

int run_determinism(const Device& device, const std::string& minilm) {
  size_t diffs = 0;
  bool failed = false;
  auto report = [&](const std::vector<determinism::Diff>& found, const std::string& what) {
    for (const auto& d : found) std::printf("%s\n", diff_line(d).c_str());
    std::printf("%-58s %s\n", what.c_str(),
                found.empty() ? "ok" : str(found.size(), " differ").c_str());
    diffs += found.size();
  };
  std::printf("wick-conform --determinism on %s\n", device.is_cuda() ? "cuda" : "cpu");
  try {
    if (device.is_cuda()) {
      // Matmuls on cuBLASLt in both runs: under the default path the ones made while its warm-up
      // runs take wick's GEMM, the one choice that follows timing (docs/NUMERICS.md).
      const CudaMatmulPath path = cuda_matmul_path();
      cuda_set_matmul_path(CudaMatmulPath::Cublas);
      auto a = determinism::thread_suite(52, device);
      auto b = determinism::thread_suite(52, device);
      cuda_set_matmul_path(path);
      report(determinism::compare_runs(a, b, "run to run"),
             str("every op, forward and backward, twice (", a.size(), " results, cuBLASLt)"));
      report(determinism::batch_suite_cuda(64, 56, device),
             "rows alone vs batches of 1..64 (norms, softmax, reductions, attention)");
      // Not promised on CUDA (docs/NUMERICS.md): printed, never counted.
      auto info = determinism::batch_suite_cuda_unpromised(64, 57, device);
      for (const auto& d : info) std::printf("INFO %s\n", diff_line(d).substr(5).c_str());
      std::printf("%-58s %s\n", "matmul, qmatmul rows alone vs batches (not promised)",
                  info.empty() ? "same bits" : str(info.size(), " differ (not counted)").c_str());
      // Promised under the switch: wick's GEMM and the quantized kernel for every row count.
      const bool was = wick::batch_invariant();
      wick::set_batch_invariant(true);
      auto switched = determinism::batch_suite_cuda_unpromised(64, 57, device);
      wick::set_batch_invariant(was);
      report(switched, "matmul, qmatmul rows alone vs batches (WICK_BATCH_INVARIANT=1)");
    } else {
      std::string dir = std::filesystem::temp_directory_path().string() + "/wick_conform_" +
                        std::to_string(getpid());
      std::vector<std::vector<determinism::Result>> runs;
      for (auto [threads, tag] : {std::pair<int, const char*>{1, "1"}, {2, "2"}, {2, "2b"}}) {
        std::string path = dir + "_" + tag + ".bin";
        bool f = false;
        run_child("", str("--determinism-child threads:", threads, ":", path), &f);
        failed |= f;
        if (f) return 1;
        runs.push_back(determinism::read_results(path));
        std::remove(path.c_str());
      }
      report(determinism::compare_runs(runs[0], runs[1], "1 vs 2 threads"),
             str("every op, forward and backward, 1 vs 2 threads (", runs[0].size(), " results)"));
      report(determinism::compare_runs(runs[1], runs[2], "run to run"),
             "every op, forward and backward, run to run");
      report(determinism::batch_suite(64), "rows alone vs batches of 1..64");
      size_t n = run_child("WICK_BATCH_INVARIANT=1", "--determinism-child matmul", &failed);
      std::printf("%-58s %s\n", "matmul rows, attention queries (WICK_BATCH_INVARIANT=1)",
                  n == 0 && !failed ? "ok" : str(n, " differ").c_str());
      diffs += n;
      if (!minilm.empty()) {
        n = run_child("WICK_BATCH_INVARIANT=1", "--determinism-child 'embed:" + minilm + "'",
                      &failed);
        std::printf("%-58s %s\n", "MiniLM sentence alone vs batches of 1..128 (switch on)",
                    n == 0 && !failed ? "ok" : str(n, " differ").c_str());
        diffs += n;
      } else {
        std::printf("%-58s %s\n", "MiniLM sentences", "skipped (no --minilm, WICK_MINILM_DIR)");
      }
    }
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  std::printf("%zu differences\n", diffs);
  return diffs == 0 && !failed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wick-conform: every op on one device against the float64 CPU reference, under the bounds "
      "of docs/NUMERICS.md. Prints op, dtype, the largest error measured, the bound at the "
      "worst element and ok/BREACH; exits 1 on a breach."};
  std::string device_name = "cpu";
  uint64_t seed = 1;
  std::string filter;
  bool breaches_only = false;
  app.add_option("device", device_name, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--seed", seed, "seed of the random inputs")->capture_default_str();
  app.add_option("--ops", filter, "only ops whose name matches this regular expression");
  app.add_flag("--breaches", breaches_only, "print only the rows that breach");
  bool determinism = false;
  std::string determinism_child_spec, minilm;
  app.add_flag("--determinism", determinism,
               "check bitwise reproducibility instead (thread counts, run to run, rows alone vs "
               "in batches); exits 1 on any difference");
  app.add_option("--minilm", minilm,
                 "--determinism: all-MiniLM-L6-v2 folder for the sentence check (default: "
                 "WICK_MINILM_DIR)");
  app.add_option("--determinism-child", determinism_child_spec)->group("");
  CLI11_PARSE(app, argc, argv);
  if (!determinism_child_spec.empty()) return determinism_child(determinism_child_spec);
  if (minilm.empty()) {
    if (const char* env = std::getenv("WICK_MINILM_DIR")) minilm = env;
  }

  wick::Device device = wick::Device::cpu();
  try {
    if (device_name == "cuda") {
      device = wick::Device::cuda(0);
    } else if (device_name.rfind("cuda:", 0) == 0) {
      device = wick::Device::cuda(std::stoi(device_name.substr(5)));
    } else if (device_name != "cpu") {
      std::fprintf(stderr, "wick-conform: unknown device '%s' (cpu, cuda, cuda:N)\n",
                   device_name.c_str());
      return 2;
    }
    if (device.is_cuda()) wick::Tensor::zeros({1}, wick::DType::F32, device).to_vec1<float>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wick-conform: %s\n", e.what());
    return 2;
  }

  if (determinism) return run_determinism(device, minilm);

  Conform c(device, seed, filter);
  unary_ops(c);
  binary_ops(c);
  compare_ops(c);
  reductions(c);
  matmuls(c);
  indexing(c);
  copies(c);

  size_t breaches = 0;
  std::printf("wick-conform on %s (seed %llu)\n", device_name.c_str(),
              static_cast<unsigned long long>(seed));
  // error and tolerance are those of the element with the largest ratio error / tolerance.
  std::printf("%-24s %-5s %9s %9s %6s %9s  %s\n", "op", "dtype", "error", "tolerance", "ratio",
              "max error", "result");
  for (const auto& o : c.outcomes()) {
    bool ok = o.ok();
    breaches += !ok;
    if (breaches_only && ok) continue;
    std::printf("%-24s %-5s %9s %9s %6s %9s  %s%s%s\n", o.op.c_str(), wick::dtype_name(o.dtype),
                fmt(o.error).c_str(), fmt(o.bound).c_str(), fmt(o.ratio).c_str(),
                fmt(o.max_error).c_str(), ok ? "ok" : "BREACH", o.note.empty() ? "" : ": ",
                o.note.c_str());
  }
  std::printf("%zu checks, %zu breaches\n", c.outcomes().size(), breaches);
  return breaches ? 1 : 0;
}
