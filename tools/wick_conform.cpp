// wick-conform: runs every op of the tensor core on one device against a float64 CPU reference
// and prints, per op and dtype, the largest error measured beside the bound of the numerical
// contract (wick/numerics.h, docs/NUMERICS.md). Exits 1 when any result breaches its bound, so a
// user can check their own GPU: `wick-conform cuda`.
//
// Float results are compared with the op computed in float64 on the CPU from the same (already
// rounded) inputs. Integer results, comparisons, selections and copies are exact: they must equal
// the reference exactly (for integer dtypes the reference is the CPU in that dtype, since integer
// arithmetic wraps by definition). Public API only.

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <random>
#include <regex>
#include <string>
#include <vector>

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

Tensor f64(const Tensor& t) {
  return t.to_dtype(DType::F64);
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
        Tensor want = Tensor::cat({op.f(f64(x)), op.f(f64(xt).t())}, 1);
        Tensor got =
            Tensor::cat({op.f(x.to_device(c.device())), op.f(xt.to_device(c.device()).t())}, 1);
        auto xv = Tensor::cat({x, xt.t()}, 1).to_vec_f64();
        c.check(op.name, dt, got, want, [&](size_t i, double w) {
          return numerics::elementwise_bound(op.name, dt, c.backend(), w, std::abs(xv[i]));
        });
      });
    }
    if (!op.ints) continue;
    for (DType dt : kInts) {
      guarded(c, op.name, dt, [&] {
        Tensor x = c.input({67, 129}, dt, 0, 12);
        c.check_exact(op.name, dt, op.f(x.to_device(c.device())), op.f(x));
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
        Tensor want = f(f64(a), f64(b));
        Tensor got = f(a.to_device(c.device()), b.to_device(c.device()));
        c.check(name, dt, got, want, [&](size_t, double w) {
          return numerics::elementwise_bound(name, dt, c.backend(), w);
        });
      });
    }
    for (DType dt : kInts) {
      guarded(c, name, dt, [&] {
        Tensor a = c.input({67, 129}, dt, 0, 20), b = c.input({67, 129}, dt, 0, 20).affine(1, 1);
        c.check_exact(name, dt, f(a.to_device(c.device()), b.to_device(c.device())), f(a, b));
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
      for (auto [name, f] :
           std::vector<std::pair<const char*, Tensor (Tensor::*)(const Tensor&) const>>{
               {"eq", &Tensor::eq},
               {"ne", &Tensor::ne},
               {"lt", &Tensor::lt},
               {"le", &Tensor::le},
               {"gt", &Tensor::gt},
               {"ge", &Tensor::ge}}) {
        c.check_exact(name, dt, (da.*f)(db), (f64(a).*f)(f64(b)));
      }
      c.check_exact("where_cond", dt, da.lt(db).where_cond(da, db), a.lt(b).where_cond(a, b));
    });
  }
}

void reductions(Conform& c) {
  for (DType dt : kFloats) {
    Tensor x;
    guarded(c, "sum", dt, [&] {
      x = c.input({61, 1031}, dt, -2, 2);
      Tensor dx = x.to_device(c.device()), x64 = f64(x);
      for (size_t dim : {0, 1}) {
        size_t k = x.dims()[dim];
        auto abs_sum = x64.abs().sum({dim}).to_vec_f64();
        c.check(dim ? "sum (rows)" : "sum (columns)", dt, dx.sum({dim}), x64.sum({dim}),
                [&](size_t i, double w) { return numerics::sum_bound(dt, k, w, abs_sum[i]); });
        c.check(dim ? "mean (rows)" : "mean (columns)", dt, dx.mean({dim}), x64.mean({dim}),
                [&](size_t i, double w) { return numerics::mean_bound(dt, k, w, abs_sum[i]); });
        c.check_exact(dim ? "max (rows)" : "max (columns)", dt, dx.max(dim), x64.max(dim));
        c.check_exact(dim ? "min (rows)" : "min (columns)", dt, dx.min(dim), x64.min(dim));
        c.check_exact(dim ? "argmax (rows)" : "argmax (columns)", dt, dx.argmax(dim),
                      x64.argmax(dim));
        c.check_exact(dim ? "argmin (rows)" : "argmin (columns)", dt, dx.argmin(dim),
                      x64.argmin(dim));
      }
      double abs_all = x64.abs().sum_all().to_scalar<double>();
      c.check("sum_all", dt, dx.sum_all(), x64.sum_all(), [&](size_t, double w) {
        return numerics::sum_bound(dt, x.elem_count(), w, abs_all);
      });
    });
    guarded(c, "softmax", dt, [&] {
      Tensor s = c.input({37, 2049}, dt, -8, 8);
      Tensor ds = s.to_device(c.device()), s64 = f64(s);
      c.check("softmax (last dim)", dt, ds.softmax(1), s64.softmax(1),
              [&](size_t, double w) { return numerics::softmax_bound(dt, 2049, w, 16); });
      c.check("softmax (dim 0)", dt, ds.softmax(0), s64.softmax(0),
              [&](size_t, double w) { return numerics::softmax_bound(dt, 37, w, 16); });
    });
  }
  for (DType dt : kInts) {
    guarded(c, "sum", dt, [&] {
      Tensor x = c.input({61, 1031}, dt, 0, 20), dx = x.to_device(c.device());
      c.check_exact("sum (rows)", dt, dx.sum({1}), x.sum({1}));
      c.check_exact("max (columns)", dt, dx.max(0), x.max(0));
      c.check_exact("argmin (rows)", dt, dx.argmin(1), x.argmin(1));
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
        Tensor want = prep(f64(a)).matmul(f64(b));
        auto abs_sum = prep(f64(a).abs()).matmul(f64(b).abs()).to_vec_f64();
        Tensor got = prep(a.to_device(c.device())).matmul(b.to_device(c.device()));
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
      Tensor ids = Tensor::from_vec<uint32_t>({3, 0, 22, 3, 7, 1, 22}, {7}, Device::cpu());
      Tensor dids = ids.to_device(c.device());
      c.check_exact("index_select", dt, dx.index_select(dids, 0), x.index_select(ids, 0));
      c.check_exact("embedding", dt, dx.embedding(dids), x.embedding(ids));
      Tensor gids = c.input({23, 5}, DType::I64, 0, 4.1);  // floor(|x|) in 0..4
      c.check_exact("gather", dt, dx.gather(gids.to_device(c.device()), 1), x.gather(gids, 1));
      // Id 3 and 22 repeat: up to 3 terms land on one row (a 3-long sum with the destination).
      Tensor src = c.input({7, 41}, dt, -2, 2);
      Tensor got = dx.index_add(dids, src.to_device(c.device()), 0);
      if (is_float(dt)) {
        auto abs_sum = f64(x).abs().index_add(ids, f64(src).abs(), 0).to_vec_f64();
        c.check("index_add", dt, got, f64(x).index_add(ids, f64(src), 0), [&](size_t i, double w) {
          return numerics::index_add_bound(dt, 3, w, abs_sum[i]);
        });
      } else {
        c.check_exact("index_add", dt, got, x.index_add(ids, src, 0));
      }
      Tensor ssrc = c.input({23, 5}, dt, -2, 2);
      Tensor sgot = dx.scatter_add(gids.to_device(c.device()), ssrc.to_device(c.device()), 1);
      if (is_float(dt)) {
        auto abs_sum = f64(x).abs().scatter_add(gids, f64(ssrc).abs(), 1).to_vec_f64();
        c.check(
            "scatter_add", dt, sgot, f64(x).scatter_add(gids, f64(ssrc), 1),
            [&](size_t i, double w) { return numerics::index_add_bound(dt, 6, w, abs_sum[i]); });
      } else {
        c.check_exact("scatter_add", dt, sgot, x.scatter_add(gids, ssrc, 1));
      }
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
        c.check_exact("to_dtype (from f64)", to, got, x.to_dtype(to));
      }
    });
    guarded(c, "copy", to, [&] {
      Tensor x = c.input({31, 2, 45}, to, -2, 2), dx = x.to_device(c.device());
      c.check_exact("contiguous (permuted)", to, dx.permute({2, 0, 1}).contiguous(),
                    x.permute({2, 0, 1}));
      c.check_exact("cat", to, Tensor::cat({dx, dx.narrow(2, 3, 7)}, 2),
                    Tensor::cat({x, x.narrow(2, 3, 7)}, 2));
    });
  }
}

std::string fmt(double v) {
  if (std::isinf(v)) return "inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, v == 0 ? "%.0f" : "%.2g", v);
  return buf;
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
  CLI11_PARSE(app, argc, argv);

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
