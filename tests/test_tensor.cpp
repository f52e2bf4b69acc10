// The tensor core: creation, views (never copying), copies, read-back and their errors.

#include <sstream>

#include "test_util.h"

namespace wick {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::random_values;

const Device cpu = Device::cpu();

// Row-major reference: element (i0, i1, ...) of a dense array of `dims`, after a permutation.
std::vector<double> permute_ref(const std::vector<double>& v, const std::vector<size_t>& dims,
                                const std::vector<size_t>& order) {
  size_t rank = dims.size();
  std::vector<size_t> src_strides = Shape(dims).contiguous_strides();
  std::vector<size_t> out_dims(rank);
  for (size_t i = 0; i < rank; ++i) out_dims[i] = dims[order[i]];
  std::vector<double> out(v.size());
  std::vector<size_t> idx(rank, 0);
  for (size_t flat = 0; flat < v.size(); ++flat) {
    size_t off = 0;
    for (size_t i = 0; i < rank; ++i) off += idx[i] * src_strides[order[i]];
    out[flat] = v[off];
    for (size_t i = rank; i-- > 0;) {
      if (++idx[i] < out_dims[i]) break;
      idx[i] = 0;
    }
  }
  return out;
}

TEST(Creation, ZerosOnesFullEveryDType) {
  for (DType dt : testing::all_dtypes()) {
    auto z = Tensor::zeros({2, 3}, dt, cpu);
    auto o = Tensor::ones({2, 3}, dt, cpu);
    EXPECT_EQ(z.dtype(), dt);
    EXPECT_EQ(z.shape(), Shape({2, 3}));
    EXPECT_EQ(z.to_vec_f64(), std::vector<double>(6, 0.0)) << dtype_name(dt);
    EXPECT_EQ(o.to_vec_f64(), std::vector<double>(6, 1.0)) << dtype_name(dt);
  }
  EXPECT_EQ(Tensor::full<int64_t>(-7, {3}, cpu).to_vec1<int64_t>(),
            (std::vector<int64_t>{-7, -7, -7}));
  EXPECT_EQ(Tensor::full(2.5f, {2}, cpu).to_vec1<float>(), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(Tensor::zeros({0, 4}, DType::F32, cpu).elem_count(), 0u);
}

TEST(Creation, ArangeAndStep) {
  EXPECT_EQ(Tensor::arange(0.0f, 4.0f, cpu).to_vec1<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_EQ(Tensor::arange_step<int64_t>(10, 0, -3, cpu).to_vec1<int64_t>(),
            (std::vector<int64_t>{10, 7, 4, 1}));
  EXPECT_EQ(Tensor::arange_step(0.0, 1.0, 0.25, cpu).to_vec1<double>(),
            (std::vector<double>{0, 0.25, 0.5, 0.75}));
  EXPECT_EQ(Tensor::arange(3.0f, 3.0f, cpu).elem_count(), 0u);
  EXPECT_THROW(Tensor::arange_step(0.0, 1.0, 0.0, cpu), Error);
}

TEST(Creation, FromVecAndScalar) {
  std::vector<uint32_t> v{1, 2, 3, 4, 5, 6};
  auto t = Tensor::from_vec(v, {2, 3}, cpu);
  EXPECT_EQ(t.dtype(), DType::U32);
  EXPECT_EQ(t.to_vec2<uint32_t>(), (std::vector<std::vector<uint32_t>>{{1, 2, 3}, {4, 5, 6}}));
  auto s = Tensor::scalar(bf16(1.5f), cpu);
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_EQ(static_cast<float>(s.to_scalar<bf16>()), 1.5f);
  try {
    Tensor::from_vec(v, {2, 2}, cpu);
    FAIL() << "expected ShapeMismatch";
  } catch (const ShapeMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 2]"), std::string::npos) << e.what();
  }
}

TEST(Creation, RandomIsSeededPerDevice) {
  cpu.set_seed(42);
  auto a = Tensor::randn(0.0f, 1.0f, {1000}, cpu).to_vec1<float>();
  cpu.set_seed(42);
  auto b = Tensor::randn(0.0f, 1.0f, {1000}, cpu).to_vec1<float>();
  EXPECT_EQ(a, b);
  auto u = Tensor::rand<double>(-1.0, 3.0, {1000}, cpu).to_vec1<double>();
  for (double x : u) {
    EXPECT_GE(x, -1.0);
    EXPECT_LT(x, 3.0);
  }
  EXPECT_THROW(Tensor::rand<int64_t>(0, 5, {3}, cpu), UnsupportedDType);
  EXPECT_THROW(Tensor::randn(0.0f, -1.0f, {3}, cpu), Error);
}

TEST(Views, TransposeAndPermuteShareStorage) {
  auto values = random_values(24);
  auto t = Tensor::from_vec(values, {2, 3, 4}, cpu);
  for (const auto& order : std::vector<std::vector<size_t>>{
           {0, 1, 2}, {2, 1, 0}, {1, 0, 2}, {0, 2, 1}, {2, 0, 1}, {1, 2, 0}}) {
    auto p = t.permute(order);
    EXPECT_TRUE(p.same_storage(t));
    EXPECT_EQ(p.to_vec_f64(), permute_ref(values, {2, 3, 4}, order));
    EXPECT_EQ(p.contiguous().to_vec_f64(), permute_ref(values, {2, 3, 4}, order));
  }
  auto tt = t.transpose(0, 2);
  EXPECT_EQ(tt.shape(), Shape({4, 3, 2}));
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(t.t().shape(), Shape({2, 4, 3}));
  EXPECT_TRUE(Tensor::zeros({3, 1}, DType::F32, cpu).t().is_contiguous());
}

TEST(Views, NarrowGetSqueezeUnsqueeze) {
  auto values = random_values(30);
  auto t = Tensor::from_vec(values, {5, 6}, cpu);
  auto n = t.narrow(1, 2, 3);
  EXPECT_TRUE(n.same_storage(t));
  auto rows = n.to_vec2<double>();
  for (size_t i = 0; i < 5; ++i)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(rows[i][j], values[i * 6 + 2 + j]);
  auto g = t.get(3);
  EXPECT_EQ(g.shape(), Shape({6}));
  EXPECT_EQ(g.to_vec1<double>(), std::vector<double>(values.begin() + 18, values.begin() + 24));
  EXPECT_EQ(t.narrow(0, 1, 0).elem_count(), 0u);
  auto u = n.unsqueeze(1);
  EXPECT_EQ(u.shape(), Shape({5, 1, 3}));
  EXPECT_EQ(u.squeeze(1).to_vec_f64(), n.to_vec_f64());
  EXPECT_EQ(t.unsqueeze(2).shape(), Shape({5, 6, 1}));
  // a narrowed, transposed view reads back correctly
  auto nt = t.narrow(0, 1, 3).t();
  auto vals = nt.to_vec2<double>();
  for (size_t i = 0; i < 6; ++i)
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(vals[i][j], values[(j + 1) * 6 + i]);
}

TEST(Views, ReshapeViewsOrCopies) {
  auto values = random_values(24);
  auto t = Tensor::from_vec(values, {2, 3, 4}, cpu);
  auto r = t.reshape({6, 4});
  EXPECT_TRUE(r.same_storage(t));
  EXPECT_EQ(r.to_vec_f64(), values);
  auto tr = t.transpose(1, 2).reshape({8, 3});  // not a view: copies
  EXPECT_FALSE(tr.same_storage(t));
  EXPECT_EQ(tr.to_vec_f64(), permute_ref(values, {2, 3, 4}, {0, 2, 1}));
  EXPECT_EQ(t.flatten_all().shape(), Shape({24}));
  EXPECT_THROW(t.reshape({5, 5}), ShapeMismatch);
}

TEST(Views, BroadcastUsesStrideZero) {
  auto values = random_values(3);
  auto t = Tensor::from_vec(values, {3}, cpu);
  auto b = t.broadcast_as({4, 3});
  EXPECT_TRUE(b.same_storage(t));
  EXPECT_EQ(b.layout().strides()[0], 0u);
  auto rows = b.to_vec2<double>();
  for (const auto& row : rows) EXPECT_EQ(row, values);
  auto col = Tensor::from_vec(values, {3, 1}, cpu).broadcast_as({2, 3, 5});
  auto v = col.to_vec3<double>();
  EXPECT_EQ(v[1][2][4], values[2]);
  EXPECT_EQ(t.broadcast_left({2, 2}).shape(), Shape({2, 2, 3}));
  EXPECT_THROW(t.broadcast_as({4, 2}), ShapeMismatch);
  EXPECT_THROW(t.broadcast_as({}), ShapeMismatch);
}

TEST(Copies, ContiguousCopyCatStack) {
  auto a = random_tensor({2, 3}, DType::F32);
  auto b = random_tensor({2, 5}, DType::F32);
  EXPECT_TRUE(a.contiguous().same_storage(a));
  auto c = a.copy();
  EXPECT_FALSE(c.same_storage(a));
  EXPECT_EQ(c.to_vec_f64(), a.to_vec_f64());
  auto cat = Tensor::cat({a, b}, 1);
  EXPECT_EQ(cat.shape(), Shape({2, 8}));
  auto av = a.to_vec2<float>(), bv = b.to_vec2<float>(), cv = cat.to_vec2<float>();
  for (size_t i = 0; i < 2; ++i) {
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(cv[i][j], av[i][j]);
    for (size_t j = 0; j < 5; ++j) EXPECT_EQ(cv[i][3 + j], bv[i][j]);
  }
  // strided inputs
  auto cat0 = Tensor::cat({a.t(), b.t()}, 0);
  EXPECT_EQ(cat0.shape(), Shape({8, 2}));
  EXPECT_EQ(cat0.to_vec_f64(), cat.t().contiguous().to_vec_f64());
  auto s = Tensor::stack({a, a.affine(2, 0)}, 0);
  EXPECT_EQ(s.shape(), Shape({2, 2, 3}));
  EXPECT_EQ(s.get(1).to_vec_f64(), a.affine(2, 0).to_vec_f64());
  EXPECT_EQ(Tensor::stack({a, a}, 2).shape(), Shape({2, 3, 2}));
  EXPECT_THROW(Tensor::cat({a, b}, 0), ShapeMismatch);
  EXPECT_THROW(Tensor::cat({a, a.to_dtype(DType::F64)}, 0), DTypeMismatch);
  EXPECT_THROW(Tensor::cat({}, 0), ShapeMismatch);
  EXPECT_THROW(Tensor::stack({a, b}, 0), ShapeMismatch);
}

TEST(Copies, ToDTypeRoundTrips) {
  auto values = random_values(50, -100, 100);
  auto t = Tensor::from_vec(values, {50}, cpu);
  for (DType dt : testing::float_dtypes()) {
    auto back = t.to_dtype(dt).to_dtype(DType::F64).to_vec1<double>();
    EXPECT_TRUE(testing::within_bounds(back, values, [&](size_t, double e) {
      return numerics::convert_bound(dt, e);
    })) << dtype_name(dt);
  }
  auto ints = Tensor::from_vec(std::vector<int64_t>{-3, 0, 7, 255}, {4}, cpu);
  EXPECT_EQ(ints.to_dtype(DType::F32).to_vec1<float>(), (std::vector<float>{-3, 0, 7, 255}));
  EXPECT_EQ(ints.to_dtype(DType::U8).to_vec1<uint8_t>()[3], 255);
}

TEST(ReadBack, WrongTypeOrRankThrows) {
  auto t = random_tensor({2, 3}, DType::F32);
  EXPECT_THROW(t.to_vec2<double>(), DTypeMismatch);
  EXPECT_THROW(t.to_vec1<float>(), ShapeMismatch);
  EXPECT_THROW(t.to_vec3<float>(), ShapeMismatch);
  EXPECT_THROW(t.to_scalar<float>(), ShapeMismatch);
  EXPECT_EQ(t.narrow(0, 1, 1).narrow(1, 2, 1).to_scalar<float>(), t.to_vec2<float>()[1][2]);
  try {
    t.to_vec2<int64_t>();
  } catch (const DTypeMismatch& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("i64"), std::string::npos) << e.what();
  }
}

TEST(Errors, BoundsAndRanks) {
  auto t = random_tensor({2, 3}, DType::F32);
  EXPECT_THROW(t.transpose(0, 2), IndexOutOfRange);
  EXPECT_THROW(t.narrow(1, 2, 2), IndexOutOfRange);
  EXPECT_THROW(t.narrow(2, 0, 1), IndexOutOfRange);
  EXPECT_THROW(t.get(2), IndexOutOfRange);
  EXPECT_THROW(t.squeeze(0), ShapeMismatch);
  EXPECT_THROW(t.unsqueeze(3), IndexOutOfRange);
  EXPECT_THROW(t.permute({0, 0}), ShapeMismatch);
  EXPECT_THROW(t.permute({0}), ShapeMismatch);
  EXPECT_THROW(Tensor::scalar(1.0f, cpu).t(), ShapeMismatch);
  EXPECT_THROW(Tensor().shape(), Error);
  if (!cuda_is_available()) {
    EXPECT_THROW(t.to_device(Device::cuda(0)), BackendError);
  }
  EXPECT_THROW(t.to_device(Device::cuda(cuda_device_count())), BackendError);
  try {
    t.narrow(1, 2, 2);
  } catch (const IndexOutOfRange& e) {
    EXPECT_NE(std::string(e.what()).find("narrow"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);
  }
}

TEST(Errors, BinaryShapeDTypeAndBroadcast) {
  auto a = random_tensor({2, 3}, DType::F32);
  auto b = random_tensor({3, 2}, DType::F32);
  try {
    a.add(b);
    FAIL();
  } catch (const ShapeMismatch& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("add"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  }
  EXPECT_THROW(a.add(a.to_dtype(DType::F64)), DTypeMismatch);
  EXPECT_THROW(a + b, ShapeMismatch);
  EXPECT_THROW(a.exp().to_dtype(DType::U8).exp(), UnsupportedDType);
  EXPECT_THROW(a.where_cond(a, a), DTypeMismatch);
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("cuda").ordinal(), 0);
  EXPECT_EQ(Device::cuda(1).to_string(), "cuda:1");
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
  cpu.synchronize();
}

TEST(Printing, BoundedValuesShapeDType) {
  auto t = Tensor::arange(0.0f, 6.0f, cpu).reshape({2, 3});
  std::ostringstream os;
  os << t;
  EXPECT_EQ(os.str(), "Tensor([[0, 1, 2], [3, 4, 5]], shape=[2, 3], dtype=f32, device=cpu)");
  std::ostringstream big;
  big << Tensor::arange<int64_t>(0, 100, cpu);
  EXPECT_EQ(big.str(), "Tensor([0, 1, 2, ..., 97, 98, 99], shape=[100], dtype=i64, device=cpu)");
}

TEST(Assign, WritesThroughViewsAndRejectsBroadcastTargets) {
  auto t = random_tensor({3, 4}, DType::F32);
  auto row = random_tensor({4}, DType::F32);
  t.get(1).assign(row);
  EXPECT_EQ(t.to_vec2<float>()[1], row.to_vec1<float>());
  auto col = random_tensor({3}, DType::F32);
  t.t().get(2).assign(col);  // a strided target
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t.to_vec2<float>()[i][2], col.to_vec1<float>()[i]);
  EXPECT_THROW(row.broadcast_as({3, 4}).assign(t), ShapeMismatch);
  EXPECT_THROW(t.assign(row), ShapeMismatch);
  EXPECT_THROW(t.assign(t.to_dtype(DType::F64)), DTypeMismatch);
}

TEST(Ids, UniquePerHandle) {
  auto a = random_tensor({2, 2}, DType::F32);
  EXPECT_NE(a.id(), a.t().id());
  EXPECT_NE(a.id(), a.detach().id());
  Tensor copy = a;
  EXPECT_EQ(copy.id(), a.id());
}

}  // namespace
}  // namespace wick
