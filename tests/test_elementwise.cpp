// Element-wise unary and binary ops, comparisons and where_cond through the public API, checked
// against a double-precision reference on fresh random inputs, every supported dtype, contiguous
// and non-contiguous (transposed, narrowed, broadcast, permuted) operands, and empty tensors.

#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace wick {
namespace {

using testing::all_dtypes;
using testing::float_dtypes;
using testing::random_values;
using testing::tensor_from;

const Device kCpu = Device::cpu();

// Random inputs of `dtype`: floats uniform in [lo, hi); integers uniform in [ilo, ihi] (u8 and
// u32 take max(ilo, 0)). With `nonzero`, values near zero are pushed away from it.
struct Domain {
  double lo = -2.0, hi = 2.0;
  int64_t ilo = -1000, ihi = 1000;
  bool nonzero = false;
};

std::vector<double> values(size_t n, DType dtype, const Domain& d) {
  std::vector<double> v;
  if (is_float(dtype)) {
    v = random_values(n, d.lo, d.hi);
    if (d.nonzero) {
      for (auto& x : v)
        if (std::abs(x) < 0.25) x += x < 0 ? -0.5 : 0.5;
    }
  } else {
    double ilo = dtype == DType::I64 ? double(d.ilo) : std::max(0.0, double(d.ilo));
    double ihi = dtype == DType::U8 ? std::min(255.0, double(d.ihi)) : double(d.ihi);
    v = random_values(n, ilo, ihi + 1.0);
    for (auto& x : v) {
      x = std::floor(x);
      if (d.nonzero && x == 0) x = 1;
    }
  }
  return v;
}

Tensor input(const Shape& shape, DType dtype, const Domain& d = {}) {
  return tensor_from(values(shape.elem_count(), dtype, d), shape, dtype);
}

// Ways to lay out an operand of a given shape: a function from (dtype, domain) to a view.
struct LayoutCase {
  const char* name;
  Shape shape;  // the view's shape
  std::function<Tensor(DType, const Domain&)> make;
};

const std::vector<LayoutCase>& unary_layouts() {
  static const std::vector<LayoutCase> cases{
      {"contiguous",
       {4, 5, 6},
       [](DType t, const Domain& d) {
         return input({4, 5, 6}, t, d);
       }},
      {"transposed",
       {5, 7},
       [](DType t, const Domain& d) {
         return input({7, 5}, t, d).t();
       }},
      {"narrowed",
       {4, 5},
       [](DType t, const Domain& d) {
         return input({6, 9}, t, d).narrow(1, 2, 5).narrow(0, 1, 4);
       }},
      {"broadcast",
       {3, 4, 7},
       [](DType t, const Domain& d) {
         return input({4, 1}, t, d).broadcast_as({3, 4, 7});
       }},
      {"permuted",
       {5, 3, 4},
       [](DType t, const Domain& d) {
         return input({3, 4, 5}, t, d).permute({2, 0, 1});
       }},
      {"large_contiguous",
       {300, 257},
       [](DType t, const Domain& d) {
         return input({300, 257}, t, d);
       }},
      {"large_transposed",
       {300, 257},
       [](DType t, const Domain& d) {
         return input({257, 300}, t, d).t();
       }},
      {"batched_transposed",
       {2, 36, 40},
       [](DType t, const Domain& d) {
         return input({4, 40, 36}, t, d).narrow(0, 1, 2).transpose(1, 2);
       }},
      {"scalar", {}, [](DType t, const Domain& d) { return input({}, t, d); }},
      {"empty",
       {0, 5},
       [](DType t, const Domain& d) {
         return input({5, 0}, t, d).t();
       }},
  };
  return cases;
}

// `got` against the float64 reference `want` element by element under the bound of `op`'s row of
// wick/numerics.h (integers: exact); `scale[i]` is the input's magnitude at element i (the row's
// absolute term), empty for 1. `rounded_want`: the reference was itself rounded to the dtype (so
// that overflow and underflow are expected), which adds one rounding.
::testing::AssertionResult within_op(const std::vector<double>& got,
                                     const std::vector<double>& want, const std::string& op,
                                     DType dt, const std::vector<double>& scale = {},
                                     bool rounded_want = false) {
  return testing::within_bounds(got, want, [&](size_t i, double w) {
    double x = scale.empty() || !std::isfinite(scale[i]) ? 1.0 : std::abs(scale[i]);
    double b = numerics::elementwise_bound(op, dt, numerics::Backend::Cpu, w, x);
    return rounded_want ? b + numerics::convert_bound(dt, w) : b;
  });
}

// ---------------------------------------------------------------------------------------------
// Unary

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;  // on doubles; integer dtypes get exact integer results
  Domain domain;
  bool ints;  // also defined on u8, u32, i64
  bool i64_only = false;
};

double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

const std::vector<UnaryCase>& unary_cases() {
  const Domain any{};
  const Domain positive{0.1, 3.0};
  const Domain nonzero{-2.0, 2.0, -1000, 1000, true};
  const Domain wide{-6.0, 6.0};
  const Domain above_minus_one{-0.9, 3.0};
  static const std::vector<UnaryCase> cases{
      {"neg", [](const Tensor& t) { return t.neg(); }, [](double x) { return -x; }, any, true,
       true},
      {"abs", [](const Tensor& t) { return t.abs(); }, [](double x) { return std::abs(x); }, any,
       true},
      {"exp", [](const Tensor& t) { return t.exp(); }, [](double x) { return std::exp(x); }, any,
       false},
      {"log", [](const Tensor& t) { return t.log(); }, [](double x) { return std::log(x); },
       positive, false},
      {"sqrt", [](const Tensor& t) { return t.sqrt(); }, [](double x) { return std::sqrt(x); },
       positive, false},
      {"sqr", [](const Tensor& t) { return t.sqr(); }, [](double x) { return x * x; }, any, true},
      {"recip", [](const Tensor& t) { return t.recip(); }, [](double x) { return 1 / x; }, nonzero,
       false},
      {"tanh", [](const Tensor& t) { return t.tanh(); }, [](double x) { return std::tanh(x); }, any,
       false},
      {"sin", [](const Tensor& t) { return t.sin(); }, [](double x) { return std::sin(x); }, any,
       false},
      {"cos", [](const Tensor& t) { return t.cos(); }, [](double x) { return std::cos(x); }, any,
       false},
      {"relu", [](const Tensor& t) { return t.relu(); }, [](double x) { return x > 0 ? x : 0; },
       any, true},
      {"silu", [](const Tensor& t) { return t.silu(); },
       [](double x) { return x / (1 + std::exp(-x)); }, any, false},
      {"sigmoid", [](const Tensor& t) { return t.sigmoid(); },
       [](double x) { return 1 / (1 + std::exp(-x)); }, any, false},
      {"gelu", [](const Tensor& t) { return t.gelu(); }, gelu_tanh_ref, any, false},
      {"gelu_erf", [](const Tensor& t) { return t.gelu_erf(); },
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, any, false},
      {"affine", [](const Tensor& t) { return t.affine(1.75, -0.5); },
       [](double x) { return x * 1.75 - 0.5; }, any, true},
      {"powf", [](const Tensor& t) { return t.powf(2.5); },
       [](double x) { return std::pow(x, 2.5); }, positive, false},
      // Bounds every float dtype holds exactly: clamp's result is then exact (numerics.h).
      {"clamp", [](const Tensor& t) { return t.clamp(-0.75, 1.25); },
       [](double x) { return std::min(std::max(x, -0.75), 1.25); }, any, true},
      // Added as entries of wick/unary_ops.def only: the CPU loops
      // and CUDA kernels come from the table.
      {"erf", [](const Tensor& t) { return t.erf(); }, [](double x) { return std::erf(x); }, any,
       false},
      {"floor", [](const Tensor& t) { return t.floor(); }, [](double x) { return std::floor(x); },
       wide, false},
      {"ceil", [](const Tensor& t) { return t.ceil(); }, [](double x) { return std::ceil(x); },
       wide, false},
      {"round", [](const Tensor& t) { return t.round(); }, [](double x) { return std::round(x); },
       wide, false},
      {"sign", [](const Tensor& t) { return t.sign(); },
       [](double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0); }, any, false},
      {"softplus", [](const Tensor& t) { return t.softplus(); },
       [](double x) { return std::log1p(std::exp(x)); }, wide, false},
      {"log1p", [](const Tensor& t) { return t.log1p(); }, [](double x) { return std::log1p(x); },
       above_minus_one, false},
      {"expm1", [](const Tensor& t) { return t.expm1(); }, [](double x) { return std::expm1(x); },
       any, false},
      {"elu", [](const Tensor& t) { return t.elu(0.7); },
       [](double x) { return x > 0 ? x : 0.7 * std::expm1(x); }, any, false},
  };
  return cases;
}

// Integer reference for the ops defined on integers (exact, with the documented wrap-around and
// saturation).
double int_ref(const std::string& op, double x, DType dtype) {
  auto wrap = [&](double v) {
    if (dtype == DType::U8) return double(static_cast<uint8_t>(static_cast<int64_t>(v)));
    if (dtype == DType::U32) return double(static_cast<uint32_t>(static_cast<int64_t>(v)));
    return v;
  };
  auto saturate = [&](double v) {
    v = std::trunc(v);
    double hi = dtype == DType::U8 ? 255.0 : dtype == DType::U32 ? 4294967295.0 : 9.2e18;
    double lo = dtype == DType::I64 ? -9.2e18 : 0.0;
    return std::min(std::max(v, lo), hi);
  };
  if (op == "neg") return -x;
  if (op == "abs") return std::abs(x);
  if (op == "sqr") return wrap(x * x);
  if (op == "relu") return x > 0 ? x : 0;
  if (op == "affine") return saturate(x * 1.75 - 0.5);
  if (op == "clamp") return std::min(std::max(x, 0.0), 1.0);  // bounds truncate to 0 and 1
  ADD_FAILURE() << "no integer reference for " << op;
  return 0;
}

TEST(Unary, EveryOpEveryDTypeEveryLayout) {
  for (const auto& op : unary_cases()) {
    for (DType dt : all_dtypes()) {
      bool supported = is_float(dt) || (op.ints && (!op.i64_only || dt == DType::I64));
      if (!supported) continue;
      for (const auto& lc : unary_layouts()) {
        SCOPED_TRACE(std::string(op.name) + " " + dtype_name(dt) + " " + lc.name);
        Tensor x = lc.make(dt, op.domain);
        ASSERT_EQ(x.shape(), lc.shape);
        Tensor y = op.op(x);
        ASSERT_EQ(y.shape(), lc.shape);
        ASSERT_EQ(y.dtype(), dt);
        EXPECT_TRUE(y.is_contiguous());
        std::vector<double> xs = x.to_vec_f64(), expected(xs.size());
        for (size_t i = 0; i < xs.size(); ++i) {
          expected[i] = is_float(dt) ? op.ref(xs[i]) : int_ref(op.name, xs[i], dt);
        }
        EXPECT_TRUE(within_op(y.to_vec_f64(), expected, op.name, dt, xs));
      }
    }
  }
}

TEST(Unary, FloatEdgeValues) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> v{-200.0, -104.5, -90.0, -87.5, 0.0,  -0.0,        1e-30,
                        88.5,   88.8,   100.0, inf,   -inf, std::nan("")};
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = tensor_from(v, {v.size()}, dt);
    std::vector<double> xs = x.to_vec_f64(), e(xs.size()), s(xs.size()), r(xs.size());
    for (size_t i = 0; i < xs.size(); ++i) {
      e[i] = std::exp(xs[i]);
      s[i] = 1 / (1 + std::exp(-xs[i]));
      r[i] = xs[i] > 0 ? xs[i] : 0;
    }
    // References rounded to dt, so that underflow to 0 and overflow to inf are expected.
    auto rounded = [&](const std::vector<double>& r) {
      return tensor_from(r, {r.size()}, dt).to_vec_f64();
    };
    // Element by element (most of these results are tiny, 0 or inf: the all-zero guard of
    // within_bounds does not apply to a handful of edge values).
    using numerics::Backend;
    for (const auto& [op, got, want] :
         {std::tuple{"exp", x.exp().to_vec_f64(), rounded(e)},
          std::tuple{"sigmoid", x.sigmoid().to_vec_f64(), rounded(s)}}) {
      for (size_t i = 0; i + 1 < xs.size(); ++i) {
        if (std::isinf(want[i])) {
          EXPECT_EQ(got[i], want[i]) << op << "(" << xs[i] << ")";
          continue;
        }
        double x_abs = std::isfinite(xs[i]) ? std::abs(xs[i]) : 1.0;
        double b = numerics::elementwise_bound(op, dt, Backend::Cpu, want[i], x_abs) +
                   numerics::convert_bound(dt, want[i]);
        EXPECT_NEAR(got[i], want[i], b) << op << "(" << xs[i] << ")";
      }
    }
    std::vector<double> relu = x.relu().to_vec_f64();
    for (size_t i = 0; i + 1 < xs.size(); ++i) EXPECT_EQ(relu[i], r[i]) << xs[i];
    EXPECT_TRUE(std::isnan(x.exp().to_vec_f64().back()));
  }
  // exp in f32 near the bottom of the range keeps subnormal results.
  Tensor sub = Tensor::from_vec(std::vector<float>{-100.0f, -103.0f, -104.0f}, {3}, kCpu);
  std::vector<float> got = sub.exp().to_vec1<float>();
  for (size_t i = 0; i < 3; ++i) {
    float want = std::exp(std::vector<float>{-100.0f, -103.0f, -104.0f}[i]);
    EXPECT_NEAR(got[i], want, 2 * std::numeric_limits<float>::denorm_min());
  }
}

TEST(Unary, F32ExpAccuracyOverItsRange) {
  // The vectorised exp: within a few ulp everywhere it gives a normal result.
  std::vector<double> v = random_values(100000, -87.0, 88.0);
  Tensor x = Tensor::from_vec(v, {v.size()}, kCpu).to_dtype(DType::F32);
  std::vector<double> xs = x.to_vec_f64(), expected(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) expected[i] = std::exp(xs[i]);
  EXPECT_TRUE(within_op(x.exp().to_vec_f64(), expected, "exp", DType::F32, xs));
}

TEST(Unary, F32ErfAndGeluErfWithinNumericsBounds) {
  // The CPU's vectorised erf (ops::math::vec_erff) switches formulas at |x| = 1.25 and stops at 4:
  // a sweep of f32 values (every 2^11th pattern from 1e-30 to 8, both signs), edge values, and
  // random inputs in GELU's usual range, against double erf under numerics.h's rows.
  std::vector<float> xf{0.0f,
                        -0.0f,
                        1e-40f,
                        -1e-40f,
                        1.25f,
                        -1.25f,
                        1.2499999f,
                        4.0f,
                        3.999999f,
                        4.000001f,
                        10.0f,
                        -10.0f,
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  for (float f = 1e-30f; f < 8.0f;) {
    xf.push_back(f);
    xf.push_back(-f);
    f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) + 2048);
  }
  for (double v : random_values(20000, -8.0, 8.0)) xf.push_back(static_cast<float>(v));
  Tensor x = Tensor::from_vec(xf, {xf.size()}, kCpu);
  std::vector<double> want_erf(xf.size()), want_gelu(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) {
    double v = xf[i];
    want_erf[i] = std::erf(v);
    want_gelu[i] = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  }
  using numerics::Backend;
  EXPECT_TRUE(testing::within_bounds(x.erf().to_vec_f64(), want_erf, [&](size_t, double e) {
    return numerics::elementwise_bound("erf", DType::F32, Backend::Cpu, e);
  }));
  // gelu(-inf) is 0.5 * -inf * 0: NaN in float arithmetic; the reference says the same.
  // (gelu_erf only where |x| >= 2^-10: below, its absolute term, for the cancellation of
  // 1 + erf at negative x, exceeds the result itself.)
  std::vector<double> got_gelu = x.gelu_erf().to_vec_f64(), g, w, xs;
  for (size_t i = 0; i < xf.size(); ++i) {
    if (!(std::abs(xf[i]) >= 0x1p-10)) continue;
    g.push_back(got_gelu[i]);
    w.push_back(want_gelu[i]);
    xs.push_back(xf[i]);
  }
  EXPECT_TRUE(testing::within_bounds(g, w, [&](size_t i, double e) {
    return numerics::elementwise_bound("gelu_erf", DType::F32, Backend::Cpu, e, std::abs(xs[i]));
  }));
  std::vector<float> nan =
      Tensor::from_vec(std::vector<float>{std::nanf("")}, {1}, kCpu).erf().to_vec1<float>();
  EXPECT_TRUE(std::isnan(nan[0]));
  // Odd, with the sign of zero kept.
  std::vector<float> y = x.erf().to_vec1<float>();
  EXPECT_TRUE(std::signbit(y[1]) && !std::signbit(y[0]));
  for (size_t i = 14; i + 1 < xf.size() && xf[i + 1] == -xf[i]; i += 2) {
    ASSERT_EQ(y[i + 1], -y[i]) << xf[i];
  }
}

TEST(Unary, IntegerWrapAndSaturation) {
  const int64_t mn = std::numeric_limits<int64_t>::min();
  Tensor i = Tensor::from_vec(std::vector<int64_t>{mn, -5, 7}, {3}, kCpu);
  EXPECT_EQ(i.abs().to_vec1<int64_t>(), (std::vector<int64_t>{mn, 5, 7}));  // |MIN| wraps
  EXPECT_EQ(i.neg().to_vec1<int64_t>(), (std::vector<int64_t>{mn, 5, -7}));
  EXPECT_EQ(i.sqr().to_vec1<int64_t>(), (std::vector<int64_t>{0, 25, 49}));  // MIN^2 wraps to 0
  Tensor u = Tensor::from_vec(std::vector<uint8_t>{16, 250, 3}, {3}, kCpu);
  EXPECT_EQ(u.sqr().to_vec1<uint8_t>(), (std::vector<uint8_t>{0, 36, 9}));
  EXPECT_EQ(u.affine(2.0, 0.0).to_vec1<uint8_t>(), (std::vector<uint8_t>{32, 255, 6}));
  EXPECT_EQ(u.affine(-1.0, 0.0).to_vec1<uint8_t>(), (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(u.clamp(4.9, 200.0).to_vec1<uint8_t>(), (std::vector<uint8_t>{16, 200, 4}));
  Tensor w = Tensor::from_vec(std::vector<uint32_t>{70000, 1}, {2}, kCpu);
  EXPECT_EQ(w.sqr().to_vec1<uint32_t>(), (std::vector<uint32_t>{605032704u, 1}));  // mod 2^32
}

TEST(Unary, UnsupportedDTypesThrow) {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> float_only{
      {"exp", [](const Tensor& t) { return t.exp(); }},
      {"log", [](const Tensor& t) { return t.log(); }},
      {"sqrt", [](const Tensor& t) { return t.sqrt(); }},
      {"recip", [](const Tensor& t) { return t.recip(); }},
      {"tanh", [](const Tensor& t) { return t.tanh(); }},
      {"sin", [](const Tensor& t) { return t.sin(); }},
      {"cos", [](const Tensor& t) { return t.cos(); }},
      {"silu", [](const Tensor& t) { return t.silu(); }},
      {"sigmoid", [](const Tensor& t) { return t.sigmoid(); }},
      {"gelu", [](const Tensor& t) { return t.gelu(); }},
      {"gelu_erf", [](const Tensor& t) { return t.gelu_erf(); }},
      {"powf", [](const Tensor& t) { return t.powf(2.0); }},
      {"erf", [](const Tensor& t) { return t.erf(); }},
      {"floor", [](const Tensor& t) { return t.floor(); }},
      {"ceil", [](const Tensor& t) { return t.ceil(); }},
      {"round", [](const Tensor& t) { return t.round(); }},
      {"sign", [](const Tensor& t) { return t.sign(); }},
      {"softplus", [](const Tensor& t) { return t.softplus(); }},
      {"log1p", [](const Tensor& t) { return t.log1p(); }},
      {"expm1", [](const Tensor& t) { return t.expm1(); }},
      {"elu", [](const Tensor& t) { return t.elu(1.0); }},
  };
  for (DType dt : {DType::U8, DType::U32, DType::I64}) {
    Tensor x = input({2, 3}, dt);
    for (const auto& [name, op] : float_only) {
      SCOPED_TRACE(std::string(name) + " " + dtype_name(dt));
      try {
        op(x);
        ADD_FAILURE() << "no exception";
      } catch (const UnsupportedDType& e) {
        EXPECT_EQ(std::string(e.what()).rfind(name, 0), 0u) << e.what();
        EXPECT_NE(std::string(e.what()).find(dtype_name(dt)), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_THROW(input({3}, DType::U8).neg(), UnsupportedDType);
  EXPECT_THROW(input({3}, DType::U32).neg(), UnsupportedDType);
  EXPECT_THROW(-input({3}, DType::U8), UnsupportedDType);
}

// ---------------------------------------------------------------------------------------------
// Binary

// Pairs of operands; `broadcast` pairs have different shapes and use the broadcast_* forms.
struct BinaryLayout {
  const char* name;
  std::function<std::pair<Tensor, Tensor>(DType, const Domain&, const Domain&)> make;
};

const std::vector<BinaryLayout>& binary_layouts() {
  using P = std::pair<Tensor, Tensor>;
  static const std::vector<BinaryLayout> cases{
      {"contiguous",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({7, 9}, t, a), input({7, 9}, t, b)};
       }},
      {"lhs_transposed",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({9, 7}, t, a).t(), input({7, 9}, t, b)};
       }},
      {"rhs_narrowed",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({6, 4}, t, a), input({6, 10}, t, b).narrow(1, 3, 4)};
       }},
      {"both_permuted",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({3, 4, 5}, t, a).permute({2, 0, 1}),
                  input({5, 4, 3}, t, b).transpose(1, 2)};
       }},
      {"row_broadcast",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({6, 33}, t, a), input({33}, t, b)};
       }},
      {"col_broadcast",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({5, 1}, t, a), input({5, 6}, t, b)};
       }},
      {"scalar_rhs",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({10}, t, a), input({}, t, b)};
       }},
      {"outer_product",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({4, 1}, t, a), input({1, 5}, t, b)};
       }},
      {"large_contiguous",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({300, 260}, t, a), input({300, 260}, t, b)};
       }},
      {"large_row_broadcast",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({400, 300}, t, a), input({300}, t, b)};
       }},
      {"large_both_transposed",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({260, 300}, t, a).t(), input({260, 300}, t, b).t()};
       }},
      {"large_mixed_transposed",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({300, 260}, t, a), input({260, 300}, t, b).t()};
       }},
      {"empty",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({0, 3}, t, a), input({0, 3}, t, b)};
       }},
      {"empty_broadcast",
       [](DType t, const Domain& a, const Domain& b) {
         return P{input({0, 3}, t, a), input({3}, t, b)};
       }},
  };
  return cases;
}

// Numpy-style broadcast shape of two operands (test-side, independent of the front end's).
Shape common_shape(const Tensor& a, const Tensor& b) {
  size_t rank = std::max(a.rank(), b.rank());
  std::vector<size_t> shape(rank);
  for (size_t i = 0; i < rank; ++i) {
    size_t da = i + a.rank() >= rank ? a.dims()[i + a.rank() - rank] : 1;
    size_t db = i + b.rank() >= rank ? b.dims()[i + b.rank() - rank] : 1;
    shape[i] = (da == 0 || db == 0) ? 0 : std::max(da, db);
  }
  return Shape(shape);
}

// The row-major elements of a and b broadcast to their common shape.
void broadcast_values(const Tensor& a, const Tensor& b, std::vector<double>& av,
                      std::vector<double>& bv) {
  Shape shape = common_shape(a, b);
  av = a.broadcast_as(shape).to_vec_f64();
  bv = b.broadcast_as(shape).to_vec_f64();
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> same_shape;
  std::function<Tensor(const Tensor&, const Tensor&)> broadcast;
  std::function<double(double, double)> ref;
  bool nonzero_rhs = false;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases{
      {"add", [](const Tensor& a, const Tensor& b) { return a.add(b); },
       [](const Tensor& a, const Tensor& b) { return a + b; },
       [](double a, double b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a.sub(b); },
       [](const Tensor& a, const Tensor& b) { return a.broadcast_sub(b); },
       [](double a, double b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a.mul(b); },
       [](const Tensor& a, const Tensor& b) { return a * b; },
       [](double a, double b) { return a * b; }},
      {"div", [](const Tensor& a, const Tensor& b) { return a.div(b); },
       [](const Tensor& a, const Tensor& b) { return a.broadcast_div(b); },
       [](double a, double b) { return a / b; }, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return a.maximum(b); },
       [](const Tensor& a, const Tensor& b) { return a.broadcast_maximum(b); },
       [](double a, double b) { return std::max(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return a.minimum(b); },
       [](const Tensor& a, const Tensor& b) { return a.broadcast_minimum(b); },
       [](double a, double b) { return std::min(a, b); }},
  };
  return cases;
}

// The documented integer results: wrap-around modulo 2^bits, truncating division.
double int_binary_ref(const std::string& op, double a, double b, DType dtype) {
  int64_t x = static_cast<int64_t>(a), y = static_cast<int64_t>(b), r = 0;
  if (op == "add") r = x + y;
  if (op == "sub") r = x - y;
  if (op == "mul") r = x * y;
  if (op == "div") r = y == 0 ? 0 : x / y;
  if (op == "maximum") r = std::max(x, y);
  if (op == "minimum") r = std::min(x, y);
  if (dtype == DType::U8) return static_cast<uint8_t>(r);
  if (dtype == DType::U32) return static_cast<uint32_t>(r);
  return static_cast<double>(r);
}

TEST(Binary, EveryOpEveryDTypeEveryLayout) {
  for (const auto& op : binary_cases()) {
    for (DType dt : all_dtypes()) {
      Domain lhs_domain{-2.0, 2.0, -1000, 1000};
      Domain rhs_domain = lhs_domain;
      if (op.nonzero_rhs) rhs_domain = {-2.0, 2.0, -20, 20, true};
      if (dt == DType::U8) lhs_domain.ihi = rhs_domain.ihi = 200;  // sums and products wrap
      for (const auto& lc : binary_layouts()) {
        SCOPED_TRACE(std::string(op.name) + " " + dtype_name(dt) + " " + lc.name);
        auto [a, b] = lc.make(dt, lhs_domain, rhs_domain);
        Tensor c = a.shape() == b.shape() ? op.same_shape(a, b) : op.broadcast(a, b);
        ASSERT_EQ(c.dtype(), dt);
        EXPECT_TRUE(c.is_contiguous());
        std::vector<double> av, bv;
        broadcast_values(a, b, av, bv);
        ASSERT_EQ(c.elem_count(), av.size());
        std::vector<double> expected(av.size());
        for (size_t i = 0; i < av.size(); ++i) {
          expected[i] =
              is_float(dt) ? op.ref(av[i], bv[i]) : int_binary_ref(op.name, av[i], bv[i], dt);
        }
        EXPECT_TRUE(within_op(c.to_vec_f64(), expected, op.name, dt));
      }
    }
  }
}

TEST(Binary, EveryBufferSizeClass) {
  // CPU buffers of up to 64 bytes live inside the storage object, up to 4 KiB come from malloc,
  // larger ones are 64-byte aligned; small dense operands skip the walk. Every class, its edges
  // and a narrowed (offset) operand give exact sums and products against f64.
  for (size_t n : {size_t{1}, size_t{16}, size_t{17}, size_t{1024}, size_t{1025}, size_t{40000}}) {
    for (DType dt : {DType::F32, DType::F64, DType::U8}) {
      SCOPED_TRACE(std::to_string(n) + " " + dtype_name(dt));
      Tensor a = testing::random_tensor({n + 1}, dt), b = testing::random_tensor({n}, dt);
      Tensor a_view = a.narrow(0, 1, n);  // starts one element in
      std::vector<double> av = a_view.to_vec_f64(), bv = b.to_vec_f64(), sum(n), prod(n);
      for (size_t i = 0; i < n; ++i) {
        sum[i] = av[i] + bv[i];
        prod[i] = av[i] * bv[i];
        if (dt == DType::U8) {
          sum[i] = static_cast<uint8_t>(static_cast<int>(sum[i]));
          prod[i] = static_cast<uint8_t>(static_cast<int>(prod[i]));
        }
      }
      EXPECT_TRUE(within_op(a_view.add(b).to_vec_f64(), sum, "add", dt));
      EXPECT_TRUE(within_op((a_view * b).to_vec_f64(), prod, "mul", dt));
      if (is_float(dt)) {
        std::vector<double> neg(av);
        for (auto& x : neg) x = -x;
        EXPECT_TRUE(testing::all_close(a_view.neg().to_vec_f64(), neg, 0, 0));
      }
    }
  }
}

TEST(Binary, ScalarOperators) {
  for (DType dt : float_dtypes()) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor a = input({3, 40}, dt).t();
    std::vector<double> av = a.to_vec_f64();
    auto check = [&](const Tensor& got, const char* op, std::function<double(double)> f) {
      std::vector<double> e(av.size());
      for (size_t i = 0; i < av.size(); ++i) e[i] = f(av[i]);
      EXPECT_TRUE(within_op(got.to_vec_f64(), e, op, dt)) << op;
    };
    check(a + 2.5, "add", [](double x) { return x + 2.5; });
    check(2.5 - a, "sub", [](double x) { return 2.5 - x; });
    check(a * -1.5, "mul", [](double x) { return x * -1.5; });
    check(a / 4.0, "div", [](double x) { return x / 4.0; });
    check(-a, "neg", [](double x) { return -x; });
  }
}

TEST(Binary, IntegerSemanticsAreDefined) {
  const int64_t mn = std::numeric_limits<int64_t>::min(), mx = std::numeric_limits<int64_t>::max();
  Tensor a = Tensor::from_vec(std::vector<int64_t>{7, -7, mn, mx, 5}, {5}, kCpu);
  Tensor b = Tensor::from_vec(std::vector<int64_t>{0, 2, -1, 1, -2}, {5}, kCpu);
  EXPECT_EQ(a.div(b).to_vec1<int64_t>(), (std::vector<int64_t>{0, -3, mn, mx, -2}));
  EXPECT_EQ(a.add(b).to_vec1<int64_t>(), (std::vector<int64_t>{7, -5, mx, mn, 3}));
  EXPECT_EQ(a.sub(b).to_vec1<int64_t>(), (std::vector<int64_t>{7, -9, mn + 1, mx - 1, 7}));
  EXPECT_EQ(a.mul(b).to_vec1<int64_t>(), (std::vector<int64_t>{0, -14, mn, mx, -10}));
  Tensor u = Tensor::from_vec(std::vector<uint8_t>{200, 3, 9}, {3}, kCpu);
  Tensor v = Tensor::from_vec(std::vector<uint8_t>{100, 5, 0}, {3}, kCpu);
  EXPECT_EQ(u.add(v).to_vec1<uint8_t>(), (std::vector<uint8_t>{44, 8, 9}));
  EXPECT_EQ(u.sub(v).to_vec1<uint8_t>(), (std::vector<uint8_t>{100, 254, 9}));
  EXPECT_EQ(u.mul(v).to_vec1<uint8_t>(), (std::vector<uint8_t>{32, 15, 0}));
  EXPECT_EQ(u.div(v).to_vec1<uint8_t>(), (std::vector<uint8_t>{2, 0, 0}));
  Tensor p = Tensor::from_vec(std::vector<uint32_t>{0, 4000000000u}, {2}, kCpu);
  Tensor q = Tensor::from_vec(std::vector<uint32_t>{1, 0}, {2}, kCpu);
  EXPECT_EQ(p.sub(q).to_vec1<uint32_t>(), (std::vector<uint32_t>{4294967295u, 4000000000u}));
  EXPECT_EQ(p.div(q).to_vec1<uint32_t>(), (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(p.add(p).to_vec1<uint32_t>(), (std::vector<uint32_t>{0, 3705032704u}));
}

// A scalar operand outside an integer tensor's dtype is refused (numpy 2 and PyTorch refuse it
// too): saturating it and wrapping the sum would give u8 [0, 1] + 300 = [255, 0].
TEST(Binary, IntegerTensorAndOutOfRangeScalarThrow) {
  Tensor u = Tensor::from_vec(std::vector<uint8_t>{0, 1}, {2}, kCpu);
  auto expect_refused = [](const std::function<Tensor()>& fn, const std::string& op,
                           const std::string& value, const std::string& dtype) {
    try {
      fn();
      ADD_FAILURE() << op << " " << value << ": no exception";
    } catch (const Error& e) {
      std::string msg = e.what();
      for (const std::string& part : {op, value, dtype}) {
        EXPECT_NE(msg.find(part), std::string::npos) << msg << " lacks " << part;
      }
    }
  };
  expect_refused([&] { return u + 300.0; }, "operator+", "300", "u8");
  expect_refused([&] { return 300.0 + u; }, "operator+", "300", "u8");
  expect_refused([&] { return u - (-1.0); }, "operator-", "-1", "u8");
  expect_refused([&] { return u * 256.0; }, "operator*", "256", "u8");
  expect_refused([&] { return 1e10 / u; }, "operator/", "10000000000", "u8");
  expect_refused([&] { return u + std::nan(""); }, "operator+", "nan", "u8");
  Tensor w = Tensor::from_vec(std::vector<uint32_t>{1}, {1}, kCpu);
  expect_refused([&] { return w + 4294967296.0; }, "operator+", "4294967296", "u32");
  Tensor i = Tensor::from_vec(std::vector<int64_t>{1}, {1}, kCpu);
  expect_refused([&] { return i * 1e19; }, "operator*", "1e+19", "i64");
  expect_refused([&] { return i - (-1e19); }, "operator-", "-1e+19", "i64");
  // In range: the tensor's own arithmetic, which wraps; a fraction truncates toward zero.
  EXPECT_EQ((u + 255.0).to_vec1<uint8_t>(), (std::vector<uint8_t>{255, 0}));
  EXPECT_EQ((u + 2.7).to_vec1<uint8_t>(), (std::vector<uint8_t>{2, 3}));
  EXPECT_EQ((i - 5.0).to_vec1<int64_t>(), (std::vector<int64_t>{-4}));
}

TEST(Binary, FloatMaximumMinimumPropagateNan) {
  const float nan = std::nanf("");
  for (DType dt : float_dtypes()) {
    Tensor a = Tensor::from_vec(std::vector<float>{nan, 1.0f, 2.0f}, {3}, kCpu).to_dtype(dt);
    Tensor b = Tensor::from_vec(std::vector<float>{1.0f, nan, 3.0f}, {3}, kCpu).to_dtype(dt);
    for (const Tensor& r : {a.maximum(b), a.minimum(b), b.maximum(a), b.minimum(a)}) {
      std::vector<double> v = r.to_vec_f64();
      EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1])) << dtype_name(dt);
    }
    EXPECT_EQ(a.maximum(b).to_vec_f64()[2], 3.0);
    EXPECT_EQ(a.minimum(b).to_vec_f64()[2], 2.0);
  }
}

// ---------------------------------------------------------------------------------------------
// Comparisons and where_cond

TEST(Compare, EveryOpEveryDTypeEveryLayout) {
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>>
      ops{{"eq", [](const Tensor& a, const Tensor& b) { return a.eq(b); }},
          {"ne", [](const Tensor& a, const Tensor& b) { return a.ne(b); }},
          {"lt", [](const Tensor& a, const Tensor& b) { return a.lt(b); }},
          {"le", [](const Tensor& a, const Tensor& b) { return a.le(b); }},
          {"gt", [](const Tensor& a, const Tensor& b) { return a.gt(b); }},
          {"ge", [](const Tensor& a, const Tensor& b) { return a.ge(b); }}};
  auto ref = [](const std::string& op, double a, double b) {
    if (op == "eq") return a == b;
    if (op == "ne") return a != b;
    if (op == "lt") return a < b;
    if (op == "le") return a <= b;
    if (op == "gt") return a > b;
    return a >= b;
  };
  // Narrow integer ranges so that equal pairs are common.
  const Domain d{-2.0, 2.0, -3, 3};
  for (DType dt : all_dtypes()) {
    for (const auto& lc : binary_layouts()) {
      auto [a, b] = lc.make(dt, d, d);
      if (is_float(dt) && a.shape() == b.shape()) {
        // Make some elements equal: where a few of b's elements are replaced by a's.
        Tensor mask = input(a.shape(), DType::U8, {0, 0, 0, 1});
        b = mask.where_cond(a, b);
      }
      std::vector<double> av, bv;
      broadcast_values(a, b, av, bv);
      for (const auto& [name, op] : ops) {
        SCOPED_TRACE(std::string(name) + " " + dtype_name(dt) + " " + lc.name);
        Tensor c = op(a, b);
        ASSERT_EQ(c.dtype(), DType::U8);
        std::vector<uint8_t> got = c.flatten_all().to_vec1<uint8_t>();
        ASSERT_EQ(got.size(), av.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i], ref(name, av[i], bv[i]) ? 1 : 0) << av[i] << " vs " << bv[i];
        }
      }
    }
  }
}

TEST(WhereCond, EveryDTypeEveryLayout) {
  for (DType dt : all_dtypes()) {
    for (const auto& lc : binary_layouts()) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + lc.name);
      auto [t, f] = lc.make(dt, {}, {});
      std::vector<double> tv, fv;
      broadcast_values(t, f, tv, fv);
      Shape shape = common_shape(t, f);
      // Conditions with values other than 0/1 (any nonzero selects on_true), transposed.
      std::vector<double> cv = values(shape.elem_count(), DType::U8, {0, 0, 0, 3});
      Tensor cond = tensor_from(cv, shape, DType::U8);
      if (shape.rank() == 2) {
        cond = tensor_from(cv, {shape[1], shape[0]}, DType::U8).t();
        cv = cond.to_vec_f64();
      }
      Tensor r = cond.where_cond(t, f);
      ASSERT_EQ(r.dtype(), dt);
      ASSERT_EQ(r.elem_count(), tv.size());
      std::vector<double> expected(tv.size());
      for (size_t i = 0; i < tv.size(); ++i) expected[i] = cv[i] != 0 ? tv[i] : fv[i];
      EXPECT_EQ(r.to_vec_f64(), expected);
    }
  }
  // A column condition broadcast over rows.
  Tensor c = Tensor::from_vec(std::vector<uint8_t>{1, 0}, {2, 1}, kCpu);
  Tensor x = Tensor::from_vec(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}, kCpu);
  EXPECT_EQ(c.where_cond(x, -x).to_vec_f64(), (std::vector<double>{1, 2, 3, -4, -5, -6}));
}

TEST(WhereCond, Errors) {
  Tensor x = input({2, 3}, DType::F32);
  EXPECT_THROW(input({2, 3}, DType::F32).where_cond(x, x), DTypeMismatch);
  Tensor c = input({2, 3}, DType::U8, {0, 0, 0, 1});
  EXPECT_THROW(c.where_cond(x, input({2, 3}, DType::F64)), DTypeMismatch);
  EXPECT_THROW(c.where_cond(x, input({4, 3}, DType::F32)), ShapeMismatch);
}

}  // namespace
}  // namespace wick
