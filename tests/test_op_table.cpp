// The op table (include/wick/unary_ops.def) end to end: every entry, with nothing written for it
// here, has its Tensor method, runs on every dtype it lists against the float64 reference under
// its own tolerance row, refuses the others, has a gradient that matches finite differences, and
// appears in docs/NUMERICS.md (generated from the table: WICK_UPDATE_DOCS=1 rewrites it). The
// values are checked against an oracle written here from <cmath> in long double, one per entry and
// independent of the table's formula: a new entry fails until it has one.

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "wick/autograd.h"
#include "wick/numerics.h"
#include "wick/wick.h"

namespace wick {
namespace {

using testing::within_bounds;

// One entry of the table, as the tests see it.
struct Entry {
  const char* name;
  const char* dtypes;  // "Floats", "FloatsI64" or "Any"
  const char* doc;
  double rel_cpu, rel_cuda, abs;
  const char* why;
  double lo, hi;
  Tensor (Tensor::*method)() const;  // null for the ops with parameters
};

const std::vector<Entry>& table() {
  static const std::vector<Entry> entries{
#define WICK_UNARY_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, ...) \
  {#name, #dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, &Tensor::name},
#define WICK_UNARY_PARAM_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, ...) \
  {#name, #dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, nullptr},
#include "wick/unary_ops.def"
  };
  return entries;
}

bool takes(const Entry& e, DType dt) {
  std::string d = e.dtypes;
  return is_float(dt) || d == "Any" || (d == "FloatsI64" && dt == DType::I64);
}

Tensor input(const Shape& shape, DType dt, double lo, double hi) {
  return testing::tensor_from(testing::random_values(shape.elem_count(), lo, hi), shape, dt);
}

// The op's mathematical definition in long double (<cmath>), written from its documentation and
// not from the table's formula.
using Oracle = long double (*)(long double);
constexpr long double kPi = 3.141592653589793238462643383279502884L;

const std::map<std::string, Oracle>& oracles() {
  static const std::map<std::string, Oracle> m{
      {"neg", [](long double x) { return -x; }},
      {"abs", [](long double x) { return std::fabs(x); }},
      {"exp", [](long double x) { return std::exp(x); }},
      {"log", [](long double x) { return std::log(x); }},
      {"sqrt", [](long double x) { return std::sqrt(x); }},
      {"sqr", [](long double x) { return x * x; }},
      {"recip", [](long double x) { return 1.0L / x; }},
      {"tanh", [](long double x) { return std::tanh(x); }},
      {"sin", [](long double x) { return std::sin(x); }},
      {"cos", [](long double x) { return std::cos(x); }},
      {"tan", [](long double x) { return std::sin(x) / std::cos(x); }},
      {"relu", [](long double x) { return x > 0 ? x : 0.0L; }},
      {"silu", [](long double x) { return x / (1.0L + std::exp(-x)); }},
      {"sigmoid", [](long double x) { return 1.0L / (1.0L + std::exp(-x)); }},
      // The tanh approximation (PyTorch's approximate="tanh").
      {"gelu",
       [](long double x) {
         return 0.5L * x * (1.0L + std::tanh(std::sqrt(2.0L / kPi) * (x + 0.044715L * x * x * x)));
       }},
      {"gelu_erf", [](long double x) { return 0.5L * x * (1.0L + std::erf(x / std::sqrt(2.0L))); }},
      {"erf", [](long double x) { return std::erf(x); }},
      {"floor", [](long double x) { return std::floor(x); }},
      {"ceil", [](long double x) { return std::ceil(x); }},
      // Halves away from zero.
      {"round", [](long double x) { return x < 0 ? -std::floor(0.5L - x) : std::floor(x + 0.5L); }},
      {"sign", [](long double x) { return x > 0 ? 1.0L : (x < 0 ? -1.0L : 0.0L); }},
      {"softplus", [](long double x) { return std::log(1.0L + std::exp(x)); }},
      {"log1p", [](long double x) { return std::log1p(x); }},
      {"expm1", [](long double x) { return std::expm1(x); }},
  };
  return m;
}

TEST(OpTable, EveryEntryHasItsToleranceRow) {
  for (const Entry& e : table()) {
    const numerics::ElementwiseRow* row = numerics::elementwise_row(e.name);
    ASSERT_NE(row, nullptr) << e.name;
    EXPECT_EQ(row->cpu_rel, e.rel_cpu) << e.name;
    EXPECT_EQ(row->why, e.why) << e.name;
    EXPECT_LT(e.lo, e.hi) << e.name;
  }
}

TEST(OpTable, EveryOpAgainstFloat64OnEveryFloatDType) {
  for (const Entry& e : table()) {
    if (!e.method) continue;
    for (DType dt : testing::float_dtypes()) {
      // Contiguous, and a transposed view (the strided loops).
      for (bool transposed : {false, true}) {
        SCOPED_TRACE(std::string(e.name) + " " + dtype_name(dt) + (transposed ? " t" : ""));
        Tensor x =
            transposed ? input({53, 37}, dt, e.lo, e.hi).t() : input({37, 53}, dt, e.lo, e.hi);
        std::vector<double> xv = x.to_vec_f64(), want(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) {
          auto it = oracles().find(e.name);
          ASSERT_NE(it, oracles().end()) << "no oracle for " << e.name << ": add one above";
          want[i] = static_cast<double>(it->second(xv[i]));
        }
        testing::poison_allocations(x.elem_count(), dt, Device::cpu());
        Tensor got = (x.*e.method)();
        ASSERT_EQ(got.dtype(), dt);
        ASSERT_EQ(got.shape(), x.shape());
        EXPECT_TRUE(within_bounds(got.to_vec_f64(), want, [&](size_t i, double w) {
          return numerics::elementwise_bound(e.name, dt, numerics::Backend::Cpu, w,
                                             std::abs(xv[i]));
        }));
      }
    }
  }
}

// within_bounds refuses a check whose bounds would let zero pass for more than 10% of the
// non-zero reference values, however close the output is.
TEST(OpTable, WithinBoundsRefusesBoundsThatAcceptZero) {
  std::vector<double> want(20, 1.0);
  want[0] = 0;  // zeros of the reference are not counted
  auto loose_for = [](size_t n) {
    return [n](size_t i, double) { return i >= 1 && i <= n ? 2.0 : 1e-9; };
  };
  EXPECT_TRUE(within_bounds(want, want, loose_for(1)));   // 1 of 19
  EXPECT_FALSE(within_bounds(want, want, loose_for(2)));  // 2 of 19: more than 10%
  EXPECT_FALSE(within_bounds(want, want, loose_for(19)));
  std::vector<double> off = want;
  off[5] = 1.1;
  EXPECT_FALSE(within_bounds(off, want, loose_for(0)));
}

TEST(OpTable, UnknownOpHasNoBound) {
  EXPECT_THROW(numerics::elementwise_bound("no_such_op", DType::F32, numerics::Backend::Cpu, 1.0),
               std::invalid_argument);
}

TEST(OpTable, OtherDTypesThrowNamingTheOp) {
  for (const Entry& e : table()) {
    if (!e.method) continue;
    for (DType dt : {DType::U8, DType::U32, DType::I64}) {
      Tensor x = Tensor::zeros({2, 3}, dt, Device::cpu());
      if (takes(e, dt)) {
        EXPECT_EQ((x.*e.method)().dtype(), dt) << e.name;
        continue;
      }
      try {
        (x.*e.method)();
        ADD_FAILURE() << e.name << " " << dtype_name(dt) << ": no exception";
      } catch (const UnsupportedDType& err) {
        EXPECT_EQ(std::string(err.what()).rfind(e.name, 0), 0u) << err.what();
        EXPECT_NE(std::string(err.what()).find(dtype_name(dt)), std::string::npos) << err.what();
      }
    }
  }
}

// For an element-wise op, d out_i / d x_i is the central difference of the op applied to the
// whole shifted tensor: one pair of calls checks every element.
TEST(OpTable, EveryGradientMatchesFiniteDifferences) {
  const double h = 1e-6;
  for (const Entry& e : table()) {
    if (!e.method) continue;
    for (bool transposed : {false, true}) {
      SCOPED_TRACE(std::string(e.name) + (transposed ? " t" : ""));
      Tensor x0 = transposed ? input({5, 4}, DType::F64, e.lo, e.hi).t()
                             : input({4, 5}, DType::F64, e.lo, e.hi);
      Tensor w = input({4, 5}, DType::F64, -1.5, 1.5);
      Tensor x = x0.requires_grad();
      GradStore grads = (x.*e.method)().mul(w).sum_all().backward();
      ASSERT_TRUE(grads.get(x).has_value());
      Tensor up = (x0.affine(1, h).*e.method)(), down = (x0.affine(1, -h).*e.method)();
      std::vector<double> fd = up.sub(down).affine(0.5 / h, 0).mul(w).to_vec_f64();
      EXPECT_TRUE(testing::all_close(grads.get(x)->to_vec_f64(), fd, 1e-6, 1e-6));
    }
  }
}

// ---- docs/NUMERICS.md ----

std::string dtype_words(const std::string& dtypes) {
  if (dtypes == "Floats") return "floats";
  if (dtypes == "FloatsI64") return "floats, i64";
  return "all";
}

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A table cell: '|' escaped.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

// The generated section: one row per entry.
std::string unary_section() {
  std::string s =
      "| op | dtypes | what | rel, CPU | rel, CUDA | abs | derivation |\n"
      "|----|--------|------|---------:|----------:|----:|------------|\n";
  for (const Entry& e : table()) {
    s += "| " + std::string(e.name) + " | " + dtype_words(e.dtypes) + " | " + cell(e.doc) + " | " +
         number(e.rel_cpu) + " | " + number(e.rel_cuda) + " | " + number(e.abs) + " | " +
         cell(e.why) + " |\n";
  }
  return s;
}

TEST(OpTable, NumericsDocIsGeneratedFromTheTable) {
  const std::string path = std::string(WICK_SOURCE_DIR) + "/docs/NUMERICS.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream buf;
  buf << in.rdbuf();
  std::string doc = buf.str();
  const std::string begin =
      "<!-- unary ops: generated from include/wick/unary_ops.def by tests/test_op_table.cpp -->\n";
  const std::string end = "<!-- end of the generated unary ops -->\n";
  size_t b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << path << " lacks the line " << begin;
  ASSERT_NE(e, std::string::npos) << path << " lacks the line " << end;
  ASSERT_LT(b, e);
  std::string current = doc.substr(b + begin.size(), e - b - begin.size());
  std::string fresh = unary_section();
  if (current == fresh) return;
  const char* update = std::getenv("WICK_UPDATE_DOCS");
  if (update && std::string(update) == "1") {
    std::ofstream(path) << doc.substr(0, b + begin.size()) + fresh + doc.substr(e);
    return;
  }
  ADD_FAILURE() << path << " is stale: its unary table differs from include/wick/unary_ops.def. "
                << "Rewrite it with: WICK_UPDATE_DOCS=1 tests/test_op_table "
                   "--gtest_filter=OpTable.NumericsDocIsGeneratedFromTheTable";
}

}  // namespace
}  // namespace wick
