// Creation from plain C++ values: the dtype each argument type gives (element_type_t), randn and
// rand with a dtype argument (F32 by default) next to their templated forms, and the one-dim
// reductions sum(dim) and mean(dim) against the vector forms and a float64 reference.

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <typeinfo>

#include "expect_error.h"
#include "test_util.h"

namespace wick {
namespace {

using testing::random_values;
using testing::tensor_from;
using testing::within_bounds;

const Device cpu = Device::cpu();

// ---- the element type of a C++ value ----

static_assert(std::is_same_v<element_type_t<float>, float>);
static_assert(std::is_same_v<element_type_t<double>, double>);
static_assert(std::is_same_v<element_type_t<f16>, f16>);
static_assert(std::is_same_v<element_type_t<bf16>, bf16>);
static_assert(std::is_same_v<element_type_t<uint8_t>, uint8_t>);
static_assert(std::is_same_v<element_type_t<uint32_t>, uint32_t>);
static_assert(std::is_same_v<element_type_t<int64_t>, int64_t>);
static_assert(std::is_same_v<element_type_t<int>, int64_t>);
static_assert(std::is_same_v<element_type_t<long long>, int64_t>);
static_assert(std::is_same_v<element_type_t<short>, int64_t>);
static_assert(std::is_same_v<element_type_t<int8_t>, int64_t>);
static_assert(std::is_same_v<element_type_t<unsigned short>, uint32_t>);
static_assert(std::is_same_v<element_type_t<size_t>, int64_t>);
static_assert(std::is_same_v<element_type_t<unsigned long long>, int64_t>);
static_assert(!ElementValue<bool>);
static_assert(!ElementValue<char>);
static_assert(!ElementValue<char32_t>);
static_assert(!ElementValue<long double>);
static_assert(!ElementValue<std::string>);

// What the creation functions accept (a requires-expression per call form).
template <class T>
concept ArangeAccepts = requires(T v) {
  Tensor::arange(v, v, cpu);
};
static_assert(ArangeAccepts<int> && ArangeAccepts<size_t> && ArangeAccepts<float>);
static_assert(!ArangeAccepts<bool> && !ArangeAccepts<char> && !ArangeAccepts<long double>);

TEST(Creation, ArangeOfPlainIntegersIsI64) {
  Tensor a = Tensor::arange(0, 4, cpu);
  EXPECT_EQ(a.dtype(), DType::I64);
  EXPECT_EQ(a.to_vec1<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  Tensor b = Tensor::arange_step(10, 0, -3, cpu);
  EXPECT_EQ(b.dtype(), DType::I64);
  EXPECT_EQ(b.to_vec1<int64_t>(), (std::vector<int64_t>{10, 7, 4, 1}));
  size_t n = 3;
  Tensor c = Tensor::arange(size_t{0}, n, cpu);
  EXPECT_EQ(c.dtype(), DType::I64);
  EXPECT_EQ(c.to_vec1<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  Tensor d = Tensor::arange(short{-2}, short{1}, cpu);
  EXPECT_EQ(d.to_vec1<int64_t>(), (std::vector<int64_t>{-2, -1, 0}));
  Tensor e = Tensor::arange(static_cast<unsigned short>(1), static_cast<unsigned short>(3), cpu);
  EXPECT_EQ(e.dtype(), DType::U32);
  EXPECT_EQ(e.to_vec1<uint32_t>(), (std::vector<uint32_t>{1, 2}));
  // Element types keep their own dtype; an explicit T converts the literals.
  EXPECT_EQ(Tensor::arange(0u, 2u, cpu).dtype(), DType::U32);
  EXPECT_EQ(Tensor::arange(0.0f, 2.0f, cpu).to_vec1<float>(), (std::vector<float>{0, 1}));
  EXPECT_EQ(Tensor::arange(0.0, 2.0, cpu).dtype(), DType::F64);
  EXPECT_EQ(Tensor::arange<float>(0, 3, cpu).to_vec1<float>(), (std::vector<float>{0, 1, 2}));
}

TEST(Creation, UnsignedValuesBeyondI64Throw) {
  const uint64_t big = uint64_t{1} << 63;
  EXPECT_BAD(Error, "9223372036854775808", Tensor::arange(uint64_t{0}, big, cpu));
  EXPECT_BAD(Error, "does not fit i64", Tensor::from_vec(std::vector<uint64_t>{1, big}, {2}, cpu));
  EXPECT_BAD(Error, "full", Tensor::full(big, {1}, cpu));
  EXPECT_BAD(Error, "scalar", Tensor::scalar(big, cpu));
  const uint64_t top = big - 1;
  EXPECT_EQ(Tensor::scalar(top, cpu).to_scalar<int64_t>(), std::numeric_limits<int64_t>::max());
}

TEST(Creation, FromVecOfPlainValuesAndBracedLists) {
  Tensor a = Tensor::from_vec({1, -2, 3}, {3}, cpu);
  EXPECT_EQ(a.dtype(), DType::I64);
  EXPECT_EQ(a.to_vec1<int64_t>(), (std::vector<int64_t>{1, -2, 3}));
  Tensor b = Tensor::from_vec(std::vector<int>{4, 5, 6, 7}, {2, 2}, cpu);
  EXPECT_EQ(b.to_vec2<int64_t>(), (std::vector<std::vector<int64_t>>{{4, 5}, {6, 7}}));
  Tensor c = Tensor::from_vec({1.5f, 2.5f}, {2}, cpu);
  EXPECT_EQ(c.dtype(), DType::F32);
  EXPECT_EQ(c.to_vec1<float>(), (std::vector<float>{1.5f, 2.5f}));
  Tensor d = Tensor::from_vec(std::vector<size_t>{0, 9}, {2}, cpu);
  EXPECT_EQ(d.to_vec1<int64_t>(), (std::vector<int64_t>{0, 9}));
  Tensor e = Tensor::from_vec<float>({1, 2}, {2}, cpu);
  EXPECT_EQ(e.to_vec1<float>(), (std::vector<float>{1, 2}));
  EXPECT_BAD(ShapeMismatch, "2 elements cannot fill shape [3]", Tensor::from_vec({1, 2}, {3}, cpu));
  // Plain ids index as i64 ids do.
  Tensor table = Tensor::arange(0.0f, 6.0f, cpu).reshape({3, 2});
  EXPECT_EQ(table.embedding(Tensor::from_vec({2, 0}, {2}, cpu)).to_vec2<float>(),
            (std::vector<std::vector<float>>{{4, 5}, {0, 1}}));
}

TEST(Creation, FullAndScalarOfPlainValues) {
  Tensor a = Tensor::full(7, {2}, cpu);
  EXPECT_EQ(a.dtype(), DType::I64);
  EXPECT_EQ(a.to_vec1<int64_t>(), (std::vector<int64_t>{7, 7}));
  EXPECT_EQ(Tensor::scalar(-3, cpu).to_scalar<int64_t>(), -3);
  EXPECT_EQ(Tensor::scalar(2.5f, cpu).dtype(), DType::F32);
  EXPECT_EQ(Tensor::full(uint8_t{9}, {1}, cpu).dtype(), DType::U8);
}

// ---- randn and rand ----

TEST(Creation, RandnAndRandAreF32UnlessAsked) {
  EXPECT_EQ(Tensor::randn(0.0, 1.0, {4}, cpu).dtype(), DType::F32);
  EXPECT_EQ(Tensor::rand(0.0, 1.0, {4}, cpu).dtype(), DType::F32);
  EXPECT_EQ(Tensor::randn(0, 1, {4}, cpu).dtype(), DType::F32);
  EXPECT_EQ(Tensor::randn(0.0, 1.0, {4}, cpu, DType::F64).dtype(), DType::F64);
  EXPECT_EQ(Tensor::rand(0.0, 1.0, {4}, cpu, DType::BF16).dtype(), DType::BF16);
  EXPECT_EQ(Tensor::randn({2, 3}, DType::F16, cpu).shape(), Shape({2, 3}));
  EXPECT_EQ(Tensor::rand({2, 3}, DType::F32, cpu).dtype(), DType::F32);
  // The templated forms keep T's dtype.
  EXPECT_EQ(Tensor::randn<double>(0.0, 1.0, {4}, cpu).dtype(), DType::F64);
  EXPECT_EQ(Tensor::randn(0.0f, 1.0f, {4}, cpu).dtype(), DType::F32);
  EXPECT_EQ(Tensor::rand(bf16(0.0f), bf16(1.0f), {4}, cpu).dtype(), DType::BF16);
  EXPECT_EQ(Tensor::rand<double>(0, 1, {4}, cpu).dtype(), DType::F64);
}

TEST(Creation, RandnOverloadsDrawTheSameSamples) {
  cpu.set_seed(1234);
  auto a = Tensor::randn(0.5, 2.0, {257}, cpu).to_vec1<float>();
  cpu.set_seed(1234);
  auto b = Tensor::randn<float>(0.5f, 2.0f, {257}, cpu).to_vec1<float>();
  EXPECT_EQ(a, b);
  cpu.set_seed(99);
  auto c = Tensor::rand({100}, DType::F32, cpu).to_vec1<float>();
  cpu.set_seed(99);
  auto d = Tensor::rand(0.0, 1.0, {100}, cpu).to_vec1<float>();
  EXPECT_EQ(c, d);
}

TEST(Creation, RandnAndRandDistributions) {
  const size_t n = 40000;
  cpu.set_seed(7);
  auto x = Tensor::randn(3.0, 2.0, {n}, cpu).to_vec_f64();
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= n;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n - 1;
  // Five standard errors: the mean's is 2 / sqrt(n) = 0.01, the variance's 4 sqrt(2 / n) = 0.028.
  EXPECT_NEAR(mean, 3.0, 0.05);
  EXPECT_NEAR(var, 4.0, 0.15);
  auto u = Tensor::rand(2.0, 5.0, {n}, cpu, DType::F64).to_vec1<double>();
  double lo = 5, hi = 2, umean = 0;
  for (double v : u) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    umean += v / n;
  }
  EXPECT_GE(lo, 2.0);
  EXPECT_LT(hi, 5.0);
  EXPECT_LT(lo, 2.01);  // the whole range is covered
  EXPECT_GT(hi, 4.99);
  EXPECT_NEAR(umean, 3.5, 5 * 3.0 / std::sqrt(12.0 * n));
}

TEST(Creation, RandomErrors) {
  EXPECT_BAD(UnsupportedDType, "randn: unsupported dtype i64",
             Tensor::randn(0.0, 1.0, {2}, cpu, DType::I64));
  EXPECT_BAD(UnsupportedDType, "rand: unsupported dtype u8", Tensor::rand({2}, DType::U8, cpu));
  EXPECT_BAD(UnsupportedDType, "randn: unsupported dtype i64",
             Tensor::randn<int64_t>(0, 1, {2}, cpu));
  EXPECT_BAD(UnsupportedDType, "rand: unsupported dtype u32", Tensor::rand(0u, 1u, {2}, cpu));
  EXPECT_BAD(Error, "randn: invalid parameters 0, -1", Tensor::randn(0.0, -1.0, {2}, cpu));
  EXPECT_BAD(Error, "rand: invalid parameters 2, 1", Tensor::rand(2.0, 1.0, {2}, cpu));
}

// ---- one-dim reductions ----

TEST(Creation, SumAndMeanOfOneDim) {
  const std::vector<size_t> dims{3, 4, 5};
  std::vector<double> v = random_values(60);
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor t = tensor_from(v, Shape(dims), dt);
    for (size_t d = 0; d < 3; ++d) {
      // Reference: the float64 sum over dim d of the values as rounded to dt.
      std::vector<double> x = t.to_vec_f64();
      std::vector<size_t> out_dims = dims;
      out_dims[d] = 1;
      std::vector<double> want(Shape(out_dims).elem_count(), 0.0), abs(want.size(), 0.0);
      for (size_t i = 0; i < 3; ++i)
        for (size_t j = 0; j < 4; ++j)
          for (size_t k = 0; k < 5; ++k) {
            size_t idx[3] = {i, j, k};
            idx[d] = 0;
            size_t o = (idx[0] * out_dims[1] + idx[1]) * out_dims[2] + idx[2];
            want[o] += x[(i * 4 + j) * 5 + k];
            abs[o] += std::abs(x[(i * 4 + j) * 5 + k]);
          }
      const size_t n = dims[d];
      std::vector<double> want_mean(want.size());
      for (size_t i = 0; i < want.size(); ++i) want_mean[i] = want[i] / n;

      Tensor s = t.sum(d), sk = t.sum_keepdim(d), m = t.mean(static_cast<int>(d)),
             mk = t.mean_keepdim(d);
      std::vector<size_t> dropped = dims;
      dropped.erase(dropped.begin() + d);
      EXPECT_EQ(s.shape(), Shape(dropped));
      EXPECT_EQ(sk.shape(), Shape(out_dims));
      EXPECT_EQ(m.shape(), Shape(dropped));
      EXPECT_EQ(mk.shape(), Shape(out_dims));
      EXPECT_TRUE(
          within_bounds(s.to_vec_f64(), want,
                        [&](size_t i, double w) { return numerics::sum_bound(dt, n, w, abs[i]); }))
          << dt << " dim " << d;
      EXPECT_TRUE(
          within_bounds(mk.to_vec_f64(), want_mean,
                        [&](size_t i, double w) { return numerics::mean_bound(dt, n, w, abs[i]); }))
          << dt << " dim " << d;
      // The one-dim forms are the vector forms.
      EXPECT_EQ(s.to_vec_f64(), t.sum({d}).to_vec_f64());
      EXPECT_EQ(sk.to_vec_f64(), t.sum_keepdim({d}).to_vec_f64());
      EXPECT_EQ(m.to_vec_f64(), t.mean({d}).to_vec_f64());
    }
  }
  // An empty list still reduces nothing; a braced single dim is that dim.
  Tensor t = Tensor::arange(0.0f, 6.0f, cpu).reshape({2, 3});
  EXPECT_EQ(t.sum_keepdim({}).shape(), Shape({2, 3}));
  EXPECT_EQ(t.sum({1}).to_vec1<float>(), (std::vector<float>{3, 12}));
  EXPECT_EQ(t.sum(1).to_vec1<float>(), (std::vector<float>{3, 12}));
  EXPECT_EQ(t.sum(size_t{0}).to_vec1<float>(), (std::vector<float>{3, 5, 7}));
}

TEST(Creation, SumOfOneDimGradient) {
  Tensor x = Tensor::arange(0.0, 6.0, cpu).reshape({2, 3}).requires_grad();
  Tensor w = Tensor::from_vec({1.0, -2.0}, {2}, cpu);
  GradStore g = x.sum(1).mul(w).sum_all().backward();
  EXPECT_EQ(g.get(x)->to_vec2<double>(),
            (std::vector<std::vector<double>>{{1, 1, 1}, {-2, -2, -2}}));
}

TEST(Creation, OneDimReductionErrors) {
  Tensor t = Tensor::zeros({2, 3}, DType::F32, cpu);
  EXPECT_BAD(IndexOutOfRange, "sum: dim -1 is negative", t.sum(-1));
  EXPECT_BAD(IndexOutOfRange, "mean: dim -2 is negative", t.mean_keepdim(-2));
  EXPECT_BAD(IndexOutOfRange, "dim 2 out of range for shape [2, 3]", t.sum(2));
  EXPECT_BAD(IndexOutOfRange, "dim 5 out of range", t.mean(5));
  EXPECT_BAD(UnsupportedDType, "mean", Tensor::arange(0, 4, cpu).mean(0));
}

}  // namespace
}  // namespace wick
