// The cross-backend oracle: every op of the tensor core on every dtype it supports, run on CUDA
// from inputs laid out in every way (contiguous, transposed, narrowed, broadcast, permuted, deeper
// than the kernels' 8 dims, empty). Float results are compared with a float64 CPU reference under
// the bounds of wick/numerics.h (docs/NUMERICS.md); integer results, selections and copies must
// equal the CPU's exactly. Results are allocated in poisoned memory (testing::poison_allocations).

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "test_util.h"

namespace wick {
namespace {

using numerics::Backend;
using testing::all_close;
using testing::random_values;
using testing::tensor_from;
using testing::within_bounds;

const Device cpu = Device::cpu();
const Device gpu = Device::cuda(0);

// One way of presenting a [3, 4, 5] operand: builds the CPU tensor from fresh values and applies
// the same view to it and to its copy on the GPU.
struct Case {
  std::string name;
  std::function<Tensor(const Tensor&)> view;  // from the base tensor to a [3, 4, 5] view
  Shape base;
};

const std::vector<Case>& view_cases() {
  static const std::vector<Case> cases{
      {"contiguous", [](const Tensor& t) { return t; }, {3, 4, 5}},
      {"transposed", [](const Tensor& t) { return t.transpose(0, 2); }, {5, 4, 3}},
      {"narrowed", [](const Tensor& t) { return t.narrow(2, 2, 5).narrow(0, 1, 3); }, {4, 4, 9}},
      {"broadcast",
       [](const Tensor& t) {
         return t.broadcast_as({3, 4, 5});
       },
       {4, 1}},
      {"permuted",
       [](const Tensor& t) {
         return t.permute({2, 0, 1});
       },
       {4, 5, 3}},
      {"offset-row", [](const Tensor& t) { return t.get(1).narrow(2, 1, 5); }, {2, 3, 4, 6}},
  };
  return cases;
}

// A [2]*9 tensor permuted so that no two dims merge: 9 dims, one more than the kernels index.
Tensor deep_view(const Tensor& t) {
  return t.permute({8, 6, 4, 2, 0, 1, 3, 5, 7});
}
const Shape kDeep{2, 2, 2, 2, 2, 2, 2, 2, 2};

bool is_int(DType dt) {
  return !is_float(dt);
}

// Values of `dtype` for an operand: small non-negative integers for integer dtypes, `lo..hi`
// for floats.
Tensor make_input(const Shape& shape, DType dtype, double lo, double hi) {
  auto v = random_values(shape.elem_count(), lo, hi);
  if (is_int(dtype)) {
    for (auto& x : v) x = std::floor(std::abs(x) * 10);
  }
  return tensor_from(v, shape, dtype);
}

// Values 0..3 only, in any dtype.
Tensor discrete_input(const Shape& shape, DType dtype) {
  auto v = random_values(shape.elem_count(), 0, 4);
  for (auto& x : v) x = std::floor(x);
  return tensor_from(v, shape, dtype);
}

// Same dtype, same shape, same values within rtol/atol.
::testing::AssertionResult same(const Tensor& on_gpu, const Tensor& on_cpu, double rtol,
                                double atol) {
  if (on_gpu.device() != gpu) return ::testing::AssertionFailure() << "result not on cuda:0";
  if (on_gpu.dtype() != on_cpu.dtype()) {
    return ::testing::AssertionFailure()
           << "dtype " << on_gpu.dtype() << " != cpu " << on_cpu.dtype();
  }
  if (on_gpu.shape() != on_cpu.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << on_gpu.shape() << " != cpu " << on_cpu.shape();
  }
  return all_close(on_gpu.to_vec_f64(), on_cpu.to_vec_f64(), rtol, atol);
}

// A float GPU result against the float64 reference `want64`: `bound(i, want)` per element.
template <class Bound>
::testing::AssertionResult near_f64(const Tensor& on_gpu, DType dtype, const Tensor& want64,
                                    Bound bound) {
  if (on_gpu.device() != gpu) return ::testing::AssertionFailure() << "result not on cuda:0";
  if (on_gpu.dtype() != dtype) {
    return ::testing::AssertionFailure() << "dtype " << on_gpu.dtype() << " != " << dtype;
  }
  if (on_gpu.shape() != want64.shape()) {
    return ::testing::AssertionFailure()
           << "shape " << on_gpu.shape() << " != reference " << want64.shape();
  }
  return within_bounds(on_gpu.to_vec_f64(), want64.to_vec_f64(), bound);
}

Tensor f64(const Tensor& t) {
  return t.to_dtype(DType::F64);
}

// Poisons the next GPU allocations of `like`'s size (see testing::poison_allocations).
void poison_like(const Tensor& like) {
  testing::poison_allocations(like.elem_count(), like.dtype(), gpu);
}

// ---- unary ----

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  bool every_dtype;  // else floats (and i64 where `i64` is set)
  bool i64 = false;
  double lo = -2, hi = 2;
};

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases{
  // Every op without parameters, on its domain, from the op table (wick/unary_ops.def); those
  // with parameters at sample values.
#define WICK_UNARY_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, ...) \
  {#name,                                                                             \
   [](const Tensor& t) { return t.name(); },                                          \
   std::string(#dtypes) == "Any",                                                     \
   std::string(#dtypes) == "FloatsI64",                                               \
   lo,                                                                                \
   hi},
#define WICK_UNARY_PARAM_OP(...)
#include "wick/unary_ops.def"
      {"affine", [](const Tensor& t) { return t.affine(1.5, 0.25); }, true},
      {"powf", [](const Tensor& t) { return t.powf(1.7); }, false, false, 0.1, 3},
      {"clamp", [](const Tensor& t) { return t.clamp(-0.5, 7); }, true},
      {"elu", [](const Tensor& t) { return t.elu(0.7); }, false},
  };
  return cases;
}

TEST(CudaOracle, UnaryEveryDTypeAndView) {
  WICK_REQUIRE_GPU();
  for (const auto& op : unary_cases()) {
    for (DType dt : testing::all_dtypes()) {
      bool supported = op.every_dtype || is_float(dt) || (op.i64 && dt == DType::I64);
      if (!supported) continue;
      for (const auto& c : view_cases()) {
        Tensor base = make_input(c.base, dt, op.lo, op.hi);
        Tensor x = c.view(base);
        Tensor want = op.f(is_float(dt) ? f64(x) : x);
        poison_like(x);
        Tensor got = op.f(c.view(base.to_device(gpu)));
        if (!is_float(dt)) {
          EXPECT_TRUE(same(got, want, 0, 0)) << op.name << " " << dtype_name(dt) << " " << c.name;
          continue;
        }
        auto xv = x.to_vec_f64();
        EXPECT_TRUE(near_f64(got, dt, want,
                             [&](size_t i, double w) {
                               return numerics::elementwise_bound(op.name, dt, Backend::Cuda, w,
                                                                  std::abs(xv[i]));
                             }))
            << op.name << " " << dtype_name(dt) << " " << c.name;
      }
    }
  }
}

TEST(CudaOracle, UnaryDeepAndEmpty) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::I64}) {
    Tensor base = make_input(kDeep, dt, -2, 2);
    Tensor want = deep_view(base).abs().sqr();  // one rounding: equal to the CPU's
    poison_like(base);
    EXPECT_TRUE(same(deep_view(base.to_device(gpu)).abs().sqr(), want, 0, 0)) << dtype_name(dt);
    Tensor empty = Tensor::zeros({0, 3}, dt, gpu);
    EXPECT_EQ(empty.abs().shape(), Shape({0, 3}));
    EXPECT_TRUE(empty.abs().to_vec_f64().empty());
  }
}

// ---- binary, comparisons, where ----

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> f;
};

TEST(CudaOracle, BinaryEveryDTypeAndViewPair) {
  WICK_REQUIRE_GPU();
  const std::vector<BinaryCase> ops{
      {"add", [](const Tensor& a, const Tensor& b) { return a.add(b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a.sub(b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a.mul(b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return a.div(b); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return a.maximum(b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return a.minimum(b); }},
  };
  const auto& cases = view_cases();
  for (const auto& op : ops) {
    for (DType dt : testing::all_dtypes()) {
      for (size_t i = 0; i < cases.size(); ++i) {
        const Case& lc = cases[i];
        const Case& rc = cases[(i + 2) % cases.size()];  // a different view on the right
        Tensor a = make_input(lc.base, dt, -2, 2);
        // Divisors away from zero (integer division by zero is undefined).
        Tensor b = std::string(op.name) == "div" ? make_input(rc.base, dt, 0.5, 2).affine(1, 1)
                                                 : make_input(rc.base, dt, -2, 2);
        bool fl = is_float(dt);
        Tensor want = fl ? op.f(f64(lc.view(a)), f64(rc.view(b))) : op.f(lc.view(a), rc.view(b));
        poison_like(want);
        Tensor got = op.f(lc.view(a.to_device(gpu)), rc.view(b.to_device(gpu)));
        EXPECT_TRUE(fl ? near_f64(got, dt, want,
                                  [&](size_t, double w) {
                                    return numerics::elementwise_bound(op.name, dt, Backend::Cuda,
                                                                       w);
                                  })
                       : same(got, want, 0, 0))
            << op.name << " " << dtype_name(dt) << " " << lc.name << " x " << rc.name;
      }
    }
  }
}

TEST(CudaOracle, BroadcastingOperatorsAndDeep) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::F16, DType::U32}) {
    Tensor a = make_input({3, 1, 5}, dt, -2, 2), b = make_input({4, 1}, dt, -2, 2);
    Tensor ga = a.to_device(gpu), gb = b.to_device(gpu);
    bool fl = is_float(dt);
    auto check = [&](const Tensor& got, const Tensor& want64, const Tensor& want, const char* op) {
      EXPECT_TRUE(fl ? near_f64(got, dt, want64,
                                [&](size_t, double w) {
                                  return numerics::elementwise_bound(op, dt, Backend::Cuda, w, 2);
                                })
                     : same(got, want, 0, 0))
          << op << " " << dtype_name(dt);
    };
    check(ga.broadcast_add(gb), f64(a).broadcast_add(f64(b)), a.broadcast_add(b), "add");
    check(ga.broadcast_mul(gb), f64(a).broadcast_mul(f64(b)), a.broadcast_mul(b), "mul");
    // x * 2 is exact in binary floats: one rounding, as an affine.
    check(ga * 2.0 + 1.0, f64(a) * 2.0 + 1.0, a * 2.0 + 1.0, "affine");
    Tensor d1 = make_input(kDeep, dt, -2, 2), d2 = make_input(kDeep, dt, -2, 2);
    check(deep_view(d1.to_device(gpu)).add(d2.to_device(gpu)), deep_view(f64(d1)).add(f64(d2)),
          deep_view(d1).add(d2), "add");
  }
}

TEST(CudaOracle, ComparisonsAndWhere) {
  WICK_REQUIRE_GPU();
  const std::vector<BinaryCase> ops{
      {"eq", [](const Tensor& a, const Tensor& b) { return a.eq(b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return a.ne(b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return a.lt(b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return a.le(b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return a.gt(b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return a.ge(b); }},
  };
  const auto& cases = view_cases();
  for (DType dt : testing::all_dtypes()) {
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& lc = cases[i];
      const Case& rc = cases[(i + 1) % cases.size()];
      // Few distinct values, so that ties (eq, le, ge) really happen.
      Tensor a = discrete_input(lc.base, dt), b = discrete_input(rc.base, dt);
      Tensor ga = a.to_device(gpu), gb = b.to_device(gpu);
      for (const auto& op : ops) {
        Tensor want = op.f(lc.view(a), rc.view(b));
        EXPECT_TRUE(same(op.f(lc.view(ga), rc.view(gb)), want, 0, 0))
            << op.name << " " << dtype_name(dt) << " " << lc.name << " x " << rc.name;
      }
      Tensor cond = lc.view(a).lt(rc.view(b));
      Tensor x = make_input({3, 4, 5}, dt, -2, 2), y = make_input({5}, dt, -2, 2);
      Tensor want = cond.where_cond(x.transpose(1, 2).contiguous().transpose(1, 2),
                                    y.broadcast_as({3, 4, 5}));
      Tensor got = lc.view(ga)
                       .lt(rc.view(gb))
                       .where_cond(x.to_device(gpu).transpose(1, 2).contiguous().transpose(1, 2),
                                   y.to_device(gpu).broadcast_as({3, 4, 5}));
      EXPECT_TRUE(same(got, want, 0, 0)) << "where_cond " << dtype_name(dt) << " " << lc.name;
    }
  }
}

// ---- reductions and softmax ----

TEST(CudaOracle, ReductionsEveryDTypeViewAndDims) {
  WICK_REQUIRE_GPU();
  const std::vector<std::vector<size_t>> dim_sets{{0}, {1}, {2}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (DType dt : testing::all_dtypes()) {
    for (const auto& c : view_cases()) {
      Tensor base = make_input(c.base, dt, -2, 2);
      Tensor x = c.view(base), gx = c.view(base.to_device(gpu));
      for (const auto& dims : dim_sets) {
        size_t reduced = 1;
        for (size_t d : dims) reduced *= x.dims()[d];
        if (!is_float(dt)) {
          EXPECT_TRUE(same(gx.sum_keepdim(dims), x.sum_keepdim(dims), 0, 0))
              << "sum " << dtype_name(dt) << " " << c.name << " " << Shape(dims);
          continue;
        }
        // A sum's rounding error scales with the sum of |x|, not with the sum.
        auto abs_sum = f64(x).abs().sum_keepdim(dims).to_vec_f64();
        poison_like(x);
        EXPECT_TRUE(near_f64(
            gx.sum_keepdim(dims), dt, f64(x).sum_keepdim(dims),
            [&](size_t i, double w) { return numerics::sum_bound(dt, reduced, w, abs_sum[i]); }))
            << "sum " << dtype_name(dt) << " " << c.name << " " << Shape(dims);
        EXPECT_TRUE(near_f64(
            gx.mean(dims), dt, f64(x).mean(dims),
            [&](size_t i, double w) { return numerics::mean_bound(dt, reduced, w, abs_sum[i]); }))
            << "mean " << dtype_name(dt) << " " << c.name << " " << Shape(dims);
      }
      for (size_t d = 0; d < 3; ++d) {
        EXPECT_TRUE(same(gx.max(d), x.max(d), 0, 0)) << "max " << dtype_name(dt) << c.name << d;
        EXPECT_TRUE(same(gx.min_keepdim(d), x.min_keepdim(d), 0, 0))
            << "min " << dtype_name(dt) << c.name << d;
        EXPECT_TRUE(same(gx.argmax(d), x.argmax(d), 0, 0))
            << "argmax " << dtype_name(dt) << " " << c.name << " " << d;
        EXPECT_TRUE(same(gx.argmin_keepdim(d), x.argmin_keepdim(d), 0, 0))
            << "argmin " << dtype_name(dt) << " " << c.name << " " << d;
      }
    }
  }
}

TEST(CudaOracle, ReductionsLargeDeepAndEmpty) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::I64}) {
    Tensor big = make_input({37, 1531}, dt, -2, 2);
    Tensor gbig = big.to_device(gpu);
    bool fl = is_float(dt);
    // The float64 reference and each output's sum of |x|, for the bound of a k-long sum.
    auto check_sum = [&](const Tensor& got, const Tensor& want, const Tensor& want64,
                         const Tensor& abs_sum64, size_t k, const char* what) {
      auto abs_sum = abs_sum64.to_vec_f64();
      EXPECT_TRUE(fl ? near_f64(got, dt, want64,
                                [&](size_t i, double w) {
                                  return numerics::sum_bound(dt, k, w, abs_sum[i]);
                                })
                     : same(got, want, 0, 0))
          << what << " " << dtype_name(dt);
    };
    Tensor big64 = f64(big);
    check_sum(gbig.sum_all(), big.sum_all(), big64.sum_all(), big64.abs().sum_all(), 37 * 1531,
              "sum_all");
    check_sum(gbig.t().sum({1}), big.t().sum({1}), big64.t().sum({1}), big64.abs().t().sum({1}), 37,
              "t().sum(1)");
    EXPECT_TRUE(same(gbig.argmax(1), big.argmax(1), 0, 0)) << dtype_name(dt);
    EXPECT_TRUE(same(gbig.t().max(0), big.t().max(0), 0, 0)) << dtype_name(dt);
    Tensor deep = make_input(kDeep, dt, -2, 2);
    Tensor deep64 = deep_view(f64(deep));
    check_sum(deep_view(deep.to_device(gpu)).sum({1, 4, 8}), deep_view(deep).sum({1, 4, 8}),
              deep64.sum({1, 4, 8}), deep64.abs().sum({1, 4, 8}), 8, "deep sum");
    Tensor empty = Tensor::zeros({0, 4}, dt, gpu);
    EXPECT_EQ(empty.sum({0}).to_vec_f64(), std::vector<double>(4, 0.0));
  }
}

TEST(CudaOracle, SoftmaxEveryFloatDTypeAndView) {
  WICK_REQUIRE_GPU();
  for (DType dt : testing::float_dtypes()) {
    for (const auto& c : view_cases()) {
      Tensor base = make_input(c.base, dt, -4, 4);
      for (size_t d = 0; d < 3; ++d) {
        size_t k = c.view(base).dims()[d];
        poison_like(base);
        EXPECT_TRUE(
            near_f64(c.view(base.to_device(gpu)).softmax(d), dt, c.view(f64(base)).softmax(d),
                     [&](size_t, double w) { return numerics::softmax_bound(dt, k, w, 8); }))
            << dtype_name(dt) << " " << c.name << " dim " << d;
      }
    }
    // Inputs within 4 of each other: every probability of a 4099-long row stays above f16's
    // underflow, so no output may be zero.
    Tensor wide = make_input({7, 4099}, dt, -2, 2);
    poison_like(wide);
    EXPECT_TRUE(near_f64(wide.to_device(gpu).softmax(1), dt, f64(wide).softmax(1),
                         [&](size_t, double w) { return numerics::softmax_bound(dt, 4099, w, 4); }))
        << dtype_name(dt);
  }
}

// ---- indexing ----

Tensor ids_tensor(const std::vector<double>& v, DType dt) {
  return tensor_from(v, Shape{v.size()}, dt);
}

TEST(CudaOracle, IndexSelectGatherEmbedding) {
  WICK_REQUIRE_GPU();
  for (DType dt : testing::all_dtypes()) {
    for (DType id_dt : {DType::U32, DType::I64}) {
      for (const auto& c : view_cases()) {
        Tensor base = make_input(c.base, dt, -2, 2);
        Tensor x = c.view(base), gx = c.view(base.to_device(gpu));
        for (size_t d = 0; d < 3; ++d) {
          std::vector<double> iv;
          for (size_t i = 0; i < 7; ++i)
            iv.push_back(static_cast<double>((i * 5 + 1) % x.dims()[d]));
          Tensor ids = ids_tensor(iv, id_dt);
          EXPECT_TRUE(same(gx.index_select(ids.to_device(gpu), d), x.index_select(ids, d), 0, 0))
              << "index_select " << dtype_name(dt) << " " << dtype_name(id_dt) << " " << c.name
              << " dim " << d;
          // gather: ids of x's shape with dim d resized to 2.
          std::vector<size_t> gdims = x.dims();
          gdims[d] = 2;
          auto gv = random_values(Shape(gdims).elem_count(), 0, static_cast<double>(x.dims()[d]));
          for (auto& g : gv) g = std::floor(g);
          Tensor gids = tensor_from(gv, Shape(gdims), id_dt);
          EXPECT_TRUE(same(gx.gather(gids.to_device(gpu), d), x.gather(gids, d), 0, 0))
              << "gather " << dtype_name(dt) << " " << dtype_name(id_dt) << " " << c.name << " dim "
              << d;
        }
      }
      Tensor table = make_input({11, 6}, dt, -2, 2);
      Tensor ids = tensor_from({3, 0, 10, 3, 7, 1}, {2, 3}, id_dt);
      EXPECT_TRUE(
          same(table.to_device(gpu).embedding(ids.to_device(gpu)), table.embedding(ids), 0, 0))
          << "embedding " << dtype_name(dt);
    }
  }
}

TEST(CudaOracle, IndexAddScatterAdd) {
  WICK_REQUIRE_GPU();
  for (DType dt : testing::all_dtypes()) {
    bool fl = is_float(dt);
    // Each output adds at most 1 + 3 terms (id 2 repeats three times): a 4-long sum.
    auto check = [&](const Tensor& got, const Tensor& want, const Tensor& want64,
                     const Tensor& abs_sum64) {
      auto abs_sum = abs_sum64.to_vec_f64();
      return fl ? near_f64(got, dt, want64,
                           [&](size_t i, double w) {
                             return numerics::index_add_bound(dt, 4, w, abs_sum[i]);
                           })
                : same(got, want, 0, 0);
    };
    for (const auto& c : view_cases()) {
      Tensor base = make_input(c.base, dt, -2, 2);
      Tensor x = c.view(base), gx = c.view(base.to_device(gpu));
      for (size_t d = 0; d < 3; ++d) {
        // Repeated ids: the adds into one row must all land.
        std::vector<double> iv{0, 2, 0, 1, 2, 2};
        Tensor ids = ids_tensor(iv, DType::U32);
        std::vector<size_t> sdims = x.dims();
        sdims[d] = iv.size();
        Tensor src = make_input(Shape(sdims), dt, -2, 2);
        EXPECT_TRUE(check(gx.index_add(ids.to_device(gpu), src.to_device(gpu).t().t(), d),
                          x.index_add(ids, src, d), f64(x).index_add(ids, f64(src), d),
                          f64(x).abs().index_add(ids, f64(src).abs(), d)))
            << "index_add " << dtype_name(dt) << " " << c.name << " dim " << d;
        std::vector<size_t> gdims = x.dims();
        gdims[d] = 2;
        auto gv = random_values(Shape(gdims).elem_count(), 0, static_cast<double>(x.dims()[d]));
        for (auto& g : gv) g = std::floor(g);
        Tensor gids = tensor_from(gv, Shape(gdims), DType::I64);
        Tensor gsrc = make_input(Shape(gdims), dt, -2, 2);
        EXPECT_TRUE(check(gx.scatter_add(gids.to_device(gpu), gsrc.to_device(gpu), d),
                          x.scatter_add(gids, gsrc, d), f64(x).scatter_add(gids, f64(gsrc), d),
                          f64(x).abs().scatter_add(gids, f64(gsrc).abs(), d)))
            << "scatter_add " << dtype_name(dt) << " " << c.name << " dim " << d;
      }
    }
  }
}

// ---- copies and conversions ----

TEST(CudaOracle, ToDTypeEveryPair) {
  WICK_REQUIRE_GPU();
  for (DType from : testing::all_dtypes()) {
    for (DType to : testing::all_dtypes()) {
      for (const auto& c : view_cases()) {
        // Non-negative and below 200: representable in every dtype's range, exactly or rounded.
        Tensor base = make_input(c.base, from, 0, 20);
        Tensor want = c.view(base).to_dtype(to);
        Tensor got = c.view(base.to_device(gpu)).to_dtype(to);
        EXPECT_TRUE(same(got, want, 0, 0))
            << dtype_name(from) << " -> " << dtype_name(to) << " " << c.name;
      }
    }
  }
}

TEST(CudaOracle, CopiesCatStackAndDeviceRoundTrip) {
  WICK_REQUIRE_GPU();
  for (DType dt : testing::all_dtypes()) {
    for (const auto& c : view_cases()) {
      Tensor base = make_input(c.base, dt, -2, 2);
      Tensor x = c.view(base), gx = c.view(base.to_device(gpu));
      EXPECT_TRUE(same(gx.contiguous(), x.contiguous(), 0, 0)) << dtype_name(dt) << c.name;
      EXPECT_TRUE(same(gx.copy(), x.copy(), 0, 0)) << dtype_name(dt) << c.name;
      Tensor back = gx.to_device(cpu);
      EXPECT_EQ(back.device(), cpu);
      EXPECT_EQ(back.to_vec_f64(), x.to_vec_f64()) << dtype_name(dt) << c.name;
      EXPECT_TRUE(same(Tensor::cat({gx, gx.narrow(1, 1, 2)}, 1),
                       Tensor::cat({x, x.narrow(1, 1, 2)}, 1), 0, 0))
          << dtype_name(dt) << c.name;
      EXPECT_TRUE(same(Tensor::stack({gx, gx.sqr()}, 2), Tensor::stack({x, x.sqr()}, 2), 0, 0))
          << dtype_name(dt) << c.name;
    }
    Tensor deep = make_input(kDeep, dt, -2, 2);
    EXPECT_EQ(deep_view(deep.to_device(gpu)).contiguous().to_vec_f64(),
              deep_view(deep).contiguous().to_vec_f64())
        << dtype_name(dt);
  }
}

TEST(CudaOracle, CreationOnTheGpu) {
  WICK_REQUIRE_GPU();
  for (DType dt : testing::all_dtypes()) {
    EXPECT_TRUE(same(Tensor::ones({3, 7}, dt, gpu), Tensor::ones({3, 7}, dt, cpu), 0, 0));
    EXPECT_TRUE(same(Tensor::zeros({1000}, dt, gpu), Tensor::zeros({1000}, dt, cpu), 0, 0));
  }
  EXPECT_TRUE(same(Tensor::full<int64_t>(-3, {5}, gpu), Tensor::full<int64_t>(-3, {5}, cpu), 0, 0));
  EXPECT_TRUE(same(Tensor::arange(0.0f, 9.0f, gpu), Tensor::arange(0.0f, 9.0f, cpu), 0, 0));
  EXPECT_EQ(Tensor::scalar(2.5, gpu).to_scalar<double>(), 2.5);
}

TEST(CudaOracle, RandomIsSeededPerDeviceAndDistributed) {
  WICK_REQUIRE_GPU();
  gpu.set_seed(42);
  auto u1 = Tensor::rand(-1.0, 3.0, {1 << 16}, gpu, DType::F64).to_vec1<double>();
  auto n1 = Tensor::randn(0.5, 2.0, {1 << 16}, gpu, DType::F64).to_vec1<double>();
  gpu.set_seed(42);
  EXPECT_EQ(Tensor::rand(-1.0, 3.0, {1 << 16}, gpu, DType::F64).to_vec1<double>(), u1);
  EXPECT_EQ(Tensor::randn(0.5, 2.0, {1 << 16}, gpu, DType::F64).to_vec1<double>(), n1);
  auto u3 = Tensor::rand(-1.0, 3.0, {1 << 16}, gpu, DType::F64).to_vec1<double>();
  EXPECT_NE(u3, u1);
  double mean = 0;
  for (double x : u3) {
    mean += x;
    EXPECT_GE(x, -1.0);
    EXPECT_LT(x, 3.0);
  }
  EXPECT_NEAR(mean / static_cast<double>(u3.size()), 1.0, 0.05);
  double nm = 0, sq = 0;
  for (double x : n1) nm += x;
  nm /= static_cast<double>(n1.size());
  for (double x : n1) sq += (x - nm) * (x - nm);
  EXPECT_NEAR(nm, 0.5, 0.05);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(n1.size())), 2.0, 0.05);
  for (DType dt : testing::float_dtypes()) {
    Tensor r = dt == DType::F32   ? Tensor::rand(0.0f, 1.0f, {4097}, gpu)
               : dt == DType::F64 ? Tensor::rand(0.0, 1.0, {4097}, gpu, DType::F64)
               : dt == DType::F16 ? Tensor::rand(f16(0.0f), f16(1.0f), {4097}, gpu)
                                  : Tensor::rand(bf16(0.0f), bf16(1.0f), {4097}, gpu);
    EXPECT_EQ(r.dtype(), dt);
    auto v = r.to_vec_f64();
    double lo = *std::min_element(v.begin(), v.end()), hi = *std::max_element(v.begin(), v.end());
    EXPECT_GE(lo, 0.0) << dtype_name(dt);
    EXPECT_LE(hi, 1.0) << dtype_name(dt);
    EXPECT_GT(hi - lo, 0.9) << dtype_name(dt);
    Tensor g = dt == DType::F32 ? Tensor::randn(0.0f, 1.0f, {4097}, gpu)
                                : Tensor::randn(0.0, 1.0, {4097}, gpu, DType::F64).to_dtype(dt);
    EXPECT_EQ(g.dtype(), dt);
  }
}

}  // namespace
}  // namespace wick
