// Reductions (sum, mean, max, min, argmax, argmin) and softmax against double-precision
// references, on every dtype where they make sense and on strided views.

#include <cstdint>
#include <limits>
#include <string>

#include "test_util.h"

namespace wick {
namespace {

using testing::random_tensor;
using testing::random_values;
using testing::tensor_from;

const Device cpu = Device::cpu();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class Kind { Sum, Max, Min, ArgMax, ArgMin };

struct Ref {
  std::vector<double> values;
  std::vector<double> scale;  // sum of |x| per output: what a sum's rounding error scales with
};

// Keepdim reduction of a dense row-major array of `dims` over `rdims`, in double (integer sums
// wrap in the dtype's width; max/min propagate nan; arg* take the first max/min, nan first).
Ref reference(const std::vector<double>& v, const std::vector<size_t>& dims,
              const std::vector<size_t>& rdims, Kind kind, DType dtype) {
  std::vector<size_t> out_dims = dims;
  for (size_t d : rdims) out_dims[d] = 1;
  std::vector<size_t> out_strides = Shape(out_dims).contiguous_strides();
  size_t n_out = Shape(out_dims).elem_count();
  Ref r;
  r.values.assign(n_out, 0.0);
  r.scale.assign(n_out, 0.0);
  std::vector<long double> sums(n_out, 0.0L);  // the oracle: more precise than f64 sums
  std::vector<uint64_t> wrapped(n_out, 0);
  std::vector<bool> seen(n_out, false);
  std::vector<double> best(n_out, 0.0);
  std::vector<size_t> idx(dims.size(), 0);
  size_t arg_dim = rdims.empty() ? 0 : rdims[0];
  for (size_t flat = 0; flat < v.size(); ++flat) {
    size_t o = 0;
    for (size_t i = 0; i < dims.size(); ++i) o += (out_dims[i] == 1 ? 0 : idx[i]) * out_strides[i];
    double x = v[flat];
    switch (kind) {
      case Kind::Sum:
        sums[o] += x;
        r.values[o] = static_cast<double>(sums[o]);
        r.scale[o] += std::abs(x);
        if (!is_float(dtype)) wrapped[o] += static_cast<uint64_t>(static_cast<int64_t>(x));
        break;
      case Kind::Max:
      case Kind::Min: {
        bool take = !seen[o] || std::isnan(x) ||
                    (!std::isnan(best[o]) && (kind == Kind::Max ? x > best[o] : x < best[o]));
        if (take && !(seen[o] && std::isnan(best[o]))) best[o] = x;
        r.values[o] = best[o];
        break;
      }
      case Kind::ArgMax:
      case Kind::ArgMin: {
        bool better = !seen[o] || (std::isnan(x) && !std::isnan(best[o])) ||
                      (kind == Kind::ArgMax ? x > best[o] : x < best[o]);
        if (better) {
          best[o] = x;
          r.values[o] = static_cast<double>(idx[arg_dim]);
        }
        break;
      }
    }
    seen[o] = true;
    for (size_t i = dims.size(); i-- > 0;) {
      if (++idx[i] < dims[i]) break;
      idx[i] = 0;
    }
  }
  if (kind == Kind::Sum && !is_float(dtype)) {
    for (size_t o = 0; o < n_out; ++o) {
      uint64_t w = wrapped[o];
      if (dtype == DType::U8) r.values[o] = static_cast<double>(w & 0xffu);
      if (dtype == DType::U32) r.values[o] = static_cast<double>(w & 0xffffffffu);
      if (dtype == DType::I64) r.values[o] = static_cast<double>(static_cast<int64_t>(w));
    }
  }
  return r;
}

// Each output of a k-long sum (`mean`: the sum scaled by 1/k) within its bound of
// wick/numerics.h (docs/NUMERICS.md): the result's rounding and a k-long f32 accumulation scaled
// by the sum of |x| of its terms (ref.scale, not divided by k). Integer sums are exact.
::testing::AssertionResult sum_within(const std::vector<double>& actual, const Ref& ref, DType dt,
                                      size_t k, bool mean = false) {
  return testing::within_bounds(actual, ref.values, [&](size_t i, double want) {
    return mean ? numerics::mean_bound(dt, k, want, ref.scale[i])
                : numerics::sum_bound(dt, k, want, ref.scale[i]);
  });
}

size_t reduced_count(const Shape& s, const std::vector<size_t>& dims) {
  size_t k = 1;
  for (size_t d : dims) k *= s.dims()[d];
  return k;
}

const std::vector<Shape>& shapes() {
  // The last two are large enough for threads; {1, 2000, 40} splits the rows of its columns.
  static const std::vector<Shape> v{{5, 7, 9}, {3, 1, 4}, {4, 257, 130}, {1, 2000, 40}};
  return v;
}

const std::vector<std::vector<size_t>>& dim_sets() {
  static const std::vector<std::vector<size_t>> v{{0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  return v;
}

std::string where(DType dt, const Shape& s, const std::string& name,
                  const std::vector<size_t>& dims) {
  return std::string(dtype_name(dt)) + " " + s.to_string() + " " + name + " dims " +
         Shape(dims).to_string();
}

TEST(Sum, EveryDTypeLayoutAndDimSet) {
  for (DType dt : testing::all_dtypes()) {
    for (const Shape& s : shapes()) {
      for (auto& [name, t] : testing::layout_variants(s, dt)) {
        std::vector<double> in = t.to_vec_f64();
        for (const auto& dims : dim_sets()) {
          Tensor out = t.sum_keepdim(dims);
          Ref ref = reference(in, s.dims(), dims, Kind::Sum, dt);
          std::vector<size_t> keep = s.dims();
          for (size_t d : dims) keep[d] = 1;
          ASSERT_EQ(out.shape(), Shape(keep)) << where(dt, s, name, dims);
          ASSERT_EQ(out.dtype(), dt);
          EXPECT_TRUE(sum_within(out.to_vec_f64(), ref, dt, reduced_count(s, dims)))
              << where(dt, s, name, dims);
        }
      }
    }
  }
}

TEST(Sum, DropsDimsAndSumAll) {
  Tensor t = random_tensor({3, 4, 5}, DType::F64);
  std::vector<double> in = t.to_vec_f64();
  EXPECT_EQ(t.sum({1}).shape(), Shape({3, 5}));
  EXPECT_EQ(t.sum({0, 2}).shape(), Shape({4}));
  Tensor all = t.sum_all();
  EXPECT_EQ(all.rank(), 0u);
  double expected = 0;
  for (double x : in) expected += x;
  EXPECT_NEAR(all.to_scalar<double>(), expected, 1e-12);
  // Order of the dims does not matter; no dims is the identity.
  EXPECT_EQ(t.sum({2, 0}).to_vec_f64(), t.sum({0, 2}).to_vec_f64());
  EXPECT_EQ(t.sum_keepdim({}).to_vec_f64(), in);
  EXPECT_EQ(Tensor::scalar(2.5f, cpu).sum_all().to_scalar<float>(), 2.5f);
}

TEST(Sum, IntegersWrapInTheirDType) {
  auto u8 = Tensor::from_vec<uint8_t>({200, 100, 250, 7}, {2, 2}, cpu);
  EXPECT_EQ(u8.sum({1}).to_vec1<uint8_t>(), (std::vector<uint8_t>{44, 1}));
  EXPECT_EQ(u8.sum({0}).to_vec1<uint8_t>(), (std::vector<uint8_t>{194, 107}));
  auto u32 = Tensor::from_vec<uint32_t>({4000000000u, 4000000000u, 5u}, {3}, cpu);
  EXPECT_EQ(u32.sum_all().to_scalar<uint32_t>(), static_cast<uint32_t>(8000000005ull));
  const int64_t big = std::numeric_limits<int64_t>::max();
  auto i64 = Tensor::from_vec<int64_t>({big, 1, -5, -7}, {2, 2}, cpu);
  EXPECT_EQ(i64.sum({1}).to_vec1<int64_t>(),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), -12}));
}

TEST(Sum, MillionFloatsStayAccurate) {
  // Positive values: a plain running f32 sum drifts by ~1e-4 here, pairwise stays near 1e-7.
  const size_t n = 1 << 20;
  std::vector<double> v = random_values(n, 0.0, 1.0);
  Tensor t = tensor_from(v, {n}, DType::F32);
  std::vector<double> rounded = t.to_vec_f64();
  double expected = 0;
  for (double x : rounded) expected += x;
  EXPECT_NEAR(t.sum_all().to_scalar<float>(), expected, expected * 2e-7);

  // The same values as rows, columns (the outer loop), a transposed view and in f16/bf16.
  Tensor m = t.reshape({1024, 1024});
  EXPECT_NEAR(m.sum({0}).sum_all().to_scalar<float>(), expected, expected * 2e-7);
  EXPECT_NEAR(m.t().sum_all().to_scalar<float>(), expected, expected * 2e-7);
  Tensor cols = t.reshape({n / 4, 4}).sum({0});
  Ref ref = reference(rounded, {n / 4, 4}, {0}, Kind::Sum, DType::F32);
  EXPECT_TRUE(sum_within(cols.to_vec_f64(), ref, DType::F32, n / 4));
  Tensor tall = t.reshape({n, 1}).broadcast_as({n, 3}).sum({0});
  Ref tall_ref{{expected, expected, expected}, {expected, expected, expected}};
  EXPECT_TRUE(sum_within(tall.to_vec_f64(), tall_ref, DType::F32, n));

  for (DType dt : {DType::F16, DType::BF16}) {
    Tensor h = (t * (1.0 / 64)).to_dtype(dt);  // keeps the f16 total (~8192) finite
    double e = 0;
    for (double x : h.to_vec_f64()) e += x;
    // Accumulated in f32, then rounded to the dtype.
    EXPECT_TRUE(sum_within(h.sum_all().to_vec_f64(), Ref{{e}, {e}}, dt, n)) << dtype_name(dt);
  }
}

TEST(Sum, EmptyTensors) {
  Tensor t = Tensor::zeros({0, 3}, DType::F32, cpu);
  Tensor over_empty = t.sum({0});
  EXPECT_EQ(over_empty.shape(), Shape({3}));
  EXPECT_EQ(over_empty.to_vec1<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(t.sum({1}).shape(), Shape({0}));
  EXPECT_EQ(t.sum_all().to_scalar<float>(), 0.0f);
  Tensor i = Tensor::zeros({2, 0}, DType::I64, cpu);
  EXPECT_EQ(i.sum({1}).to_vec1<int64_t>(), (std::vector<int64_t>{0, 0}));
  // A view whose reduced dim was narrowed to nothing.
  Tensor v = random_tensor({4, 5}, DType::F64).narrow(1, 2, 0);
  EXPECT_EQ(v.sum({1}).to_vec1<double>(), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(v.max(0).shape(), Shape({0}));
}

TEST(Mean, FloatDTypes) {
  for (DType dt : testing::float_dtypes()) {
    for (auto& [name, t] : testing::layout_variants({4, 6, 5}, dt)) {
      std::vector<double> in = t.to_vec_f64();
      for (const auto& dims : dim_sets()) {
        Ref ref = reference(in, {4, 6, 5}, dims, Kind::Sum, dt);
        size_t count = reduced_count(t.shape(), dims);
        for (auto& x : ref.values) x /= static_cast<double>(count);
        EXPECT_TRUE(sum_within(t.mean_keepdim(dims).to_vec_f64(), ref, dt, count, true))
            << where(dt, {4, 6, 5}, name, dims);
      }
      EXPECT_EQ(t.mean({0, 2}).shape(), Shape({6}));
    }
  }
  Tensor t = random_tensor({3, 3}, DType::F64);
  double e = 0;
  for (double x : t.to_vec_f64()) e += x / 9;
  EXPECT_NEAR(t.mean_all().to_scalar<double>(), e, 1e-12);
}

TEST(MaxMin, EveryDTypeLayoutAndDim) {
  for (DType dt : testing::all_dtypes()) {
    for (const Shape& s : shapes()) {
      for (auto& [name, t] : testing::layout_variants(s, dt)) {
        std::vector<double> in = t.to_vec_f64();
        for (size_t d = 0; d < 3; ++d) {
          std::string at = where(dt, s, name, {d});
          std::vector<size_t> dropped = s.dims();
          dropped.erase(dropped.begin() + static_cast<std::ptrdiff_t>(d));
          Tensor mx = t.max(d), mn = t.min(d);
          ASSERT_EQ(mx.shape(), Shape(dropped)) << at;
          ASSERT_EQ(mx.dtype(), dt) << at;
          EXPECT_EQ(mx.to_vec_f64(), reference(in, s.dims(), {d}, Kind::Max, dt).values) << at;
          EXPECT_EQ(mn.to_vec_f64(), reference(in, s.dims(), {d}, Kind::Min, dt).values) << at;
          EXPECT_EQ(t.max_keepdim(d).rank(), 3u);
          EXPECT_EQ(t.min_keepdim(d).dims()[d], 1u);
        }
      }
    }
  }
}

TEST(ArgMaxMin, EveryDTypeLayoutAndDim) {
  // Integer inputs hold values 0..19, so ties along a dim are common.
  for (DType dt : testing::all_dtypes()) {
    for (const Shape& s : shapes()) {
      for (auto& [name, t] : testing::layout_variants(s, dt)) {
        std::vector<double> in = t.to_vec_f64();
        for (size_t d = 0; d < 3; ++d) {
          std::string at = where(dt, s, name, {d});
          Tensor am = t.argmax_keepdim(d), an = t.argmin_keepdim(d);
          ASSERT_EQ(am.dtype(), DType::U32) << at;
          std::vector<size_t> keep = s.dims();
          keep[d] = 1;
          ASSERT_EQ(am.shape(), Shape(keep)) << at;
          EXPECT_EQ(am.to_vec_f64(), reference(in, s.dims(), {d}, Kind::ArgMax, dt).values) << at;
          EXPECT_EQ(an.to_vec_f64(), reference(in, s.dims(), {d}, Kind::ArgMin, dt).values) << at;
          EXPECT_EQ(t.argmax(d).rank(), 2u);
        }
      }
    }
  }
}

TEST(ArgMaxMin, FirstIndexOnTies) {
  auto t = Tensor::from_vec<float>({1, 3, 3, 0, 3, 0, 0, 2, 5, 5, 5, 5}, {3, 4}, cpu);
  EXPECT_EQ(t.argmax(1).to_vec1<uint32_t>(), (std::vector<uint32_t>{1, 0, 0}));
  EXPECT_EQ(t.argmin(1).to_vec1<uint32_t>(), (std::vector<uint32_t>{3, 1, 0}));
  EXPECT_EQ(t.argmax(0).to_vec1<uint32_t>(), (std::vector<uint32_t>{2, 2, 2, 2}));
  EXPECT_EQ(t.argmin(0).to_vec1<uint32_t>(), (std::vector<uint32_t>{0, 1, 1, 0}));
  // The same through a transposed view (outer loop) and a long constant row (vector lanes).
  EXPECT_EQ(t.t().argmax(0).to_vec1<uint32_t>(), (std::vector<uint32_t>{1, 0, 0}));
  EXPECT_EQ(t.t().argmin(1).to_vec1<uint32_t>(), (std::vector<uint32_t>{0, 1, 1, 0}));
  auto flat = Tensor::full<int64_t>(9, {1000}, cpu);
  EXPECT_EQ(flat.argmax(0).to_scalar<uint32_t>(), 0u);
  EXPECT_EQ(flat.argmin(0).to_scalar<uint32_t>(), 0u);
  auto inf = Tensor::full(-std::numeric_limits<float>::infinity(), {2, 5}, cpu);
  EXPECT_EQ(inf.argmax(1).to_vec1<uint32_t>(), (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(inf.max(1).to_vec1<float>()[0], -std::numeric_limits<float>::infinity());
}

TEST(MaxMin, NaNPropagates) {
  for (DType dt : testing::float_dtypes()) {
    // Rows of 20 so the vector-lane path and its tail both see a nan.
    std::vector<double> v = random_values(3 * 20);
    v[5] = kNaN;        // row 0, inside the lanes
    v[20 + 18] = kNaN;  // row 1, in the tail
    v[20 + 19] = kNaN;
    Tensor t = tensor_from(v, {3, 20}, dt);
    std::vector<double> in = t.to_vec_f64();
    for (Tensor x : {t, t.t().contiguous().t()}) {
      std::vector<double> mx = x.max(1).to_vec_f64(), mn = x.min(1).to_vec_f64();
      EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]) && !std::isnan(mx[2])) << dtype_name(dt);
      EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]) && !std::isnan(mn[2])) << dtype_name(dt);
      EXPECT_EQ(mx[2], reference(in, {3, 20}, {1}, Kind::Max, dt).values[2]);
      // The first nan is the arg of both.
      EXPECT_EQ(
          x.argmax(1).to_vec1<uint32_t>(),
          (std::vector<uint32_t>{
              5, 18,
              static_cast<uint32_t>(reference(in, {3, 20}, {1}, Kind::ArgMax, dt).values[2])}));
      EXPECT_EQ(x.argmin(1).to_vec1<uint32_t>()[0], 5u);
      // Columns: the outer loop.
      Tensor c = x.t();
      EXPECT_TRUE(std::isnan(c.max(0).to_vec_f64()[1]));
      EXPECT_EQ(c.argmax(0).to_vec1<uint32_t>()[1], 18u);
    }
    // Sums see nan and inf too.
    EXPECT_TRUE(std::isnan(t.sum({1}).to_vec_f64()[0]));
    std::vector<double> w = random_values(40);
    w[3] = std::numeric_limits<double>::infinity();
    EXPECT_EQ(tensor_from(w, {40}, dt).sum_all().to_vec_f64()[0],
              std::numeric_limits<double>::infinity());
  }
}

TEST(MaxMin, NaNInLargeThreadedReductions) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    // Columns whose rows are split between threads, and one long row split between threads.
    std::vector<double> v = random_values(2000 * 40);
    v[1500 * 40 + 3] = kNaN;
    v[1700 * 40 + 3] = kNaN;
    Tensor cols = tensor_from(v, {2000, 40}, dt);
    std::vector<double> mx = cols.max(0).to_vec_f64(), mn = cols.min(0).to_vec_f64();
    EXPECT_TRUE(std::isnan(mx[3]) && std::isnan(mn[3])) << dtype_name(dt);
    EXPECT_FALSE(std::isnan(mx[4]) || std::isnan(mn[2])) << dtype_name(dt);
    EXPECT_EQ(cols.argmax(0).to_vec1<uint32_t>()[3], 1500u) << dtype_name(dt);
    EXPECT_EQ(cols.argmin(0).to_vec1<uint32_t>()[3], 1500u) << dtype_name(dt);
    Tensor row = cols.reshape({1, 2000 * 40});
    EXPECT_TRUE(std::isnan(row.max(1).to_vec_f64()[0])) << dtype_name(dt);
    EXPECT_TRUE(std::isnan(row.min(1).to_vec_f64()[0])) << dtype_name(dt);
    EXPECT_EQ(row.argmax(1).to_vec1<uint32_t>()[0], 1500u * 40 + 3) << dtype_name(dt);
    EXPECT_EQ(row.argmin(1).to_vec1<uint32_t>()[0], 1500u * 40 + 3) << dtype_name(dt);
  }
}

TEST(Reduce, FrontEndErrors) {
  Tensor t = random_tensor({2, 3, 4}, DType::F32);
  EXPECT_THROW(t.sum({3}), IndexOutOfRange);
  EXPECT_THROW(t.sum_keepdim({0, 7}), IndexOutOfRange);
  EXPECT_THROW(t.mean({3}), IndexOutOfRange);
  EXPECT_THROW(t.max(3), IndexOutOfRange);
  EXPECT_THROW(t.min_keepdim(5), IndexOutOfRange);
  EXPECT_THROW(t.argmax(3), IndexOutOfRange);
  EXPECT_THROW(t.argmin_keepdim(4), IndexOutOfRange);
  EXPECT_THROW(t.sum({1, 1}), Error);
  EXPECT_THROW(Tensor::scalar(1.0f, cpu).max(0), IndexOutOfRange);
  // max/min/arg* of an empty dim have no value.
  Tensor e = Tensor::zeros({3, 0}, DType::F32, cpu);
  EXPECT_THROW(e.max(1), ShapeMismatch);
  EXPECT_THROW(e.min_keepdim(1), ShapeMismatch);
  EXPECT_THROW(e.argmax(1), ShapeMismatch);
  EXPECT_THROW(e.argmin(1), ShapeMismatch);
  // mean is for float dtypes.
  EXPECT_THROW(random_tensor({2, 3}, DType::I64).mean({0}), UnsupportedDType);
  EXPECT_THROW(random_tensor({2, 3}, DType::U8).mean_all(), UnsupportedDType);
  try {
    t.max(3);
    FAIL() << "no throw";
  } catch (const IndexOutOfRange& err) {
    EXPECT_NE(std::string(err.what()).find("max"), std::string::npos) << err.what();
  }
}

// ---- softmax ----

std::vector<double> softmax_ref(const std::vector<double>& v, const std::vector<size_t>& dims,
                                size_t dim) {
  size_t outer = 1, inner = 1, n = dims[dim];
  for (size_t i = 0; i < dim; ++i) outer *= dims[i];
  for (size_t i = dim + 1; i < dims.size(); ++i) inner *= dims[i];
  std::vector<double> out(v.size());
  for (size_t o = 0; o < outer; ++o) {
    for (size_t k = 0; k < inner; ++k) {
      auto at = [&](size_t i) { return (o * n + i) * inner + k; };
      double mx = -std::numeric_limits<double>::infinity();
      long double sum = 0;  // the oracle in long double
      for (size_t i = 0; i < n; ++i) mx = std::max(mx, v[at(i)]);
      for (size_t i = 0; i < n; ++i) sum += std::exp(static_cast<long double>(v[at(i)]) - mx);
      for (size_t i = 0; i < n; ++i) {
        out[at(i)] = static_cast<double>(std::exp(static_cast<long double>(v[at(i)]) - mx) / sum);
      }
    }
  }
  return out;
}

// The spread (max - min of the finite values) of the softmax row through each element.
std::vector<double> softmax_spread(const std::vector<double>& v, const std::vector<size_t>& dims,
                                   size_t dim) {
  size_t outer = 1, inner = 1, n = dims[dim];
  for (size_t i = 0; i < dim; ++i) outer *= dims[i];
  for (size_t i = dim + 1; i < dims.size(); ++i) inner *= dims[i];
  std::vector<double> out(v.size());
  for (size_t o = 0; o < outer; ++o) {
    for (size_t k = 0; k < inner; ++k) {
      auto at = [&](size_t i) { return (o * n + i) * inner + k; };
      double mx = -std::numeric_limits<double>::infinity(), mn = -mx;
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[at(i)])) continue;
        mx = std::max(mx, v[at(i)]);
        mn = std::min(mn, v[at(i)]);
      }
      for (size_t i = 0; i < n; ++i) out[at(i)] = mx >= mn ? mx - mn : 0;
    }
  }
  return out;
}

// softmax of `t` along `dim` against the float64 reference under numerics::softmax_bound.
::testing::AssertionResult softmax_within(const std::vector<double>& got, const Tensor& t,
                                          size_t dim) {
  std::vector<double> in = t.to_vec_f64();
  std::vector<double> spread = softmax_spread(in, t.dims(), dim);
  size_t n = t.dims()[dim];
  return testing::within_bounds(got, softmax_ref(in, t.dims(), dim), [&](size_t i, double w) {
    return numerics::softmax_bound(t.dtype(), n, w, spread[i]);
  });
}

TEST(Softmax, FloatDTypesLayoutsAndDims) {
  for (DType dt : testing::float_dtypes()) {
    for (auto& [name, t] : testing::layout_variants({4, 5, 6}, dt)) {
      std::vector<double> in = t.to_vec_f64();
      for (size_t d = 0; d < 3; ++d) {
        Tensor s = t.softmax(d);
        ASSERT_EQ(s.shape(), t.shape());
        ASSERT_EQ(s.dtype(), dt);
        EXPECT_TRUE(softmax_within(s.to_vec_f64(), t, d)) << where(dt, {4, 5, 6}, name, {d});
      }
    }
  }
}

TEST(Softmax, StableForLargeInputsAndLongRows) {
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    // exp(1000) overflows every dtype: only the max subtraction keeps this finite.
    std::vector<double> v = random_values(2 * 50, 990.0, 1000.0);
    // f16 (max 65504) spaces values near 60000 by 32: a row there underflows to one-hot, which
    // proves nothing; exp(1000) overflows f16 and f32 alike.
    if (dt == DType::F16) v = random_values(2 * 50, 1000.0, 1010.0);
    Tensor t = tensor_from(v, {2, 50}, dt);
    std::vector<double> out = t.softmax(1).to_vec_f64();
    EXPECT_TRUE(softmax_within(out, t, 1)) << dtype_name(dt);
    // Each row sums to 1 within the sum of its elements' bounds.
    double row = 0, slack = 0;
    std::vector<double> ref = softmax_ref(t.to_vec_f64(), {2, 50}, 1);
    for (size_t i = 0; i < 50; ++i) {
      row += out[i];
      slack += numerics::softmax_bound(dt, 50, ref[i], 10);
    }
    EXPECT_NEAR(row, 1.0, slack) << dtype_name(dt);
  }
  // One long row, split over threads by nothing but its own loop.
  const size_t n = 200000;
  Tensor t = tensor_from(random_values(n, -5, 5), {1, n}, DType::F32);
  EXPECT_TRUE(softmax_within(t.softmax(1).to_vec_f64(), t, 1));
  // Many rows: the threaded path.
  Tensor m = tensor_from(random_values(4096 * 64), {4096, 64}, DType::F32);
  EXPECT_TRUE(softmax_within(m.softmax(1).to_vec_f64(), m, 1));
}

// Outputs of 4 MB and more are written with non-temporal stores from each row's first aligned
// vector on: rows of a length that is no multiple of any vector width start at every alignment,
// and short rows, a nan row, a +inf row and a masked row go through the same path.
TEST(Softmax, LargeOutputsOddRowLengths) {
  const double inf = std::numeric_limits<double>::infinity();
  for (size_t len : {size_t{2053}, size_t{7}}) {
    size_t rows = (size_t{5} << 20) / (len * sizeof(float)) + 3;
    std::vector<double> v = random_values(rows * len, -8.0, 8.0);
    v[1 * len + len / 2] = kNaN;
    v[2 * len] = inf;
    for (size_t i = 0; i + 1 < len; ++i) v[3 * len + i] = -inf;
    Tensor t = tensor_from(v, {rows, len}, DType::F32);
    std::vector<double> out = t.softmax(1).to_vec_f64();
    std::vector<double> in = t.to_vec_f64();
    for (size_t r : {size_t{1}, size_t{2}}) {
      for (size_t i = 0; i < len; ++i) ASSERT_TRUE(std::isnan(out[r * len + i])) << r << " " << i;
    }
    for (size_t i = 0; i + 1 < len; ++i) ASSERT_EQ(out[3 * len + i], 0.0) << i;
    ASSERT_EQ(out[4 * len - 1], 1.0);
    // The other rows against the double reference (the special rows taken out of both).
    std::vector<double> ref = softmax_ref(in, {rows, len}, 1);
    std::vector<double> spread = softmax_spread(in, {rows, len}, 1);
    for (size_t i = len; i < 4 * len; ++i) ref[i] = out[i] = 0;
    EXPECT_TRUE(testing::within_bounds(out, ref, [&](size_t i, double w) {
      return numerics::softmax_bound(DType::F32, len, w, spread[i]);
    })) << len;
  }
}

TEST(Softmax, MasksAndNaN) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : testing::float_dtypes()) {
    // -inf (a mask) gives exactly 0; x - max far below f32's exp range gives 0 too.
    std::vector<double> v{-inf, 0.5, 1.0, -200.0, 0.0, -inf, 2.0, -90.0, kNaN, 1.0, 2.0, 3.0};
    if (dt == DType::F16) v[3] = -60000.0;
    Tensor t = tensor_from(v, {3, 4}, dt);
    std::vector<double> out = t.softmax(1).to_vec_f64();
    std::vector<double> ref = softmax_ref(t.to_vec_f64(), {3, 4}, 1);
    EXPECT_EQ(out[0], 0.0) << dtype_name(dt);
    if (dt != DType::F64) {
      EXPECT_EQ(out[3], 0.0) << dtype_name(dt);
    }
    EXPECT_EQ(out[5], 0.0) << dtype_name(dt);
    std::vector<double> spread = softmax_spread(t.to_vec_f64(), {3, 4}, 1);
    for (size_t i = 0; i < 8; ++i) {
      EXPECT_NEAR(out[i], ref[i], numerics::softmax_bound(dt, 4, ref[i], spread[i]))
          << dtype_name(dt) << " " << i;
    }
    // A nan anywhere in a row makes the whole row nan; other rows are untouched.
    for (size_t i = 8; i < 12; ++i) EXPECT_TRUE(std::isnan(out[i])) << dtype_name(dt) << " " << i;
  }
}

TEST(Softmax, EmptyAndErrors) {
  Tensor e = Tensor::zeros({0, 5}, DType::F32, cpu);
  EXPECT_EQ(e.softmax(1).shape(), Shape({0, 5}));
  EXPECT_EQ(e.softmax(0).shape(), Shape({0, 5}));
  EXPECT_EQ(Tensor::zeros({3, 0}, DType::F64, cpu).softmax(1).shape(), Shape({3, 0}));
  Tensor one = tensor_from({0.3, -7}, {2, 1}, DType::F32);
  EXPECT_EQ(one.softmax(1).to_vec_f64(), (std::vector<double>{1, 1}));
  EXPECT_THROW(random_tensor({2, 3}, DType::F32).softmax(2), IndexOutOfRange);
  EXPECT_THROW(random_tensor({2, 3}, DType::I64).softmax(1), UnsupportedDType);
  EXPECT_THROW(random_tensor({2, 3}, DType::U8).softmax(0), UnsupportedDType);
}

}  // namespace
}  // namespace wick
