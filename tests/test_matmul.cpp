// matmul and broadcast_matmul on the CPU against a double-precision reference: plain, batched,
// transposed, padded, permuted, broadcast and empty operands in every float dtype, the gemv and
// batch-parallel paths, concurrent callers, and every error.

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "wick/wick.h"

namespace wick {
namespace {

using testing::float_dtypes;
using testing::random_tensor;

// The reference product of a (batch..., m, k) and b (batch..., k, n) with equal batch dims, and
// for each element the sum of |a_ik * b_kj| that bounds its rounding error.
struct Reference {
  std::vector<double> value;
  std::vector<double> abs_sum;
};

Reference reference(const Tensor& a, const Tensor& b) {
  size_t r = a.rank();
  size_t m = a.dims()[r - 2], k = a.dims()[r - 1], n = b.dims()[r - 1];
  size_t batches = Shape(std::vector<size_t>(a.dims().begin(), a.dims().end() - 2)).elem_count();
  auto av = a.to_vec_f64();
  auto bv = b.to_vec_f64();
  Reference ref{std::vector<double>(batches * m * n, 0.0),
                std::vector<double>(batches * m * n, 0.0)};
  for (size_t p = 0; p < batches; ++p) {
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < n; ++j) {
        long double s = 0;  // the oracle: more precise than an f64 matmul
        double s_abs = 0;
        for (size_t q = 0; q < k; ++q) {
          long double t =
              static_cast<long double>(av[(p * m + i) * k + q]) * bv[(p * k + q) * n + j];
          s += t;
          s_abs += static_cast<double>(std::fabs(t));
        }
        ref.value[(p * m + i) * n + j] = static_cast<double>(s);
        ref.abs_sum[(p * m + i) * n + j] = s_abs;
      }
    }
  }
  return ref;
}

// Checks c = a.matmul(b) (a, b with equal batch dims, any layouts) against the reference.
::testing::AssertionResult matches(const Tensor& c, const Tensor& a, const Tensor& b) {
  size_t r = a.rank();
  std::vector<size_t> dims(a.dims().begin(), a.dims().end() - 1);
  dims.push_back(b.dims()[r - 1]);
  if (c.shape() != Shape(dims)) {
    return ::testing::AssertionFailure() << "shape " << c.shape() << ", expected " << Shape(dims);
  }
  if (c.dtype() != a.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << dtype_name(c.dtype());
  }
  if (!c.is_contiguous()) return ::testing::AssertionFailure() << "result not contiguous";
  auto ref = reference(a, b);
  auto got = c.to_vec_f64();
  if (got.size() != ref.value.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << ref.value.size();
  }
  // docs/NUMERICS.md: the result's rounding, a k-long f32 (f64) accumulation and each product's
  // rounding, per element.
  size_t k = a.dims()[r - 1];
  return testing::within_bounds(got, ref.value,
                                [&](size_t i, double want) {
                                  return numerics::matmul_bound(a.dtype(), k, want, ref.abs_sum[i]);
                                })
         << " (" << dtype_name(a.dtype()) << ")";
  return ::testing::AssertionSuccess();
}

Tensor rnd(const Shape& shape, DType dtype) {
  return random_tensor(shape, dtype);
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Matmul, SeedsWalk) {
  auto a = Tensor::arange(0.0f, 4.0f, Device::cpu()).reshape({2, 2});
  auto c = a.matmul(a);  // one storage read twice
  EXPECT_EQ(c.to_vec2<float>(), (std::vector<std::vector<float>>{{2, 3}, {6, 11}}));
}

TEST(Matmul, Plain) {
  const std::vector<std::array<size_t, 3>> shapes = {{3, 5, 4},    {2, 2, 2},    {1, 7, 6},
                                                     {6, 7, 1},    {1, 5, 1},    {5, 1, 4},
                                                     {65, 33, 47}, {128, 64, 96}};
  for (DType dt : float_dtypes()) {
    for (auto [m, k, n] : shapes) {
      auto a = rnd({m, k}, dt), b = rnd({k, n}, dt);
      EXPECT_TRUE(matches(a.matmul(b), a, b)) << m << "x" << k << "x" << n;
    }
  }
}

TEST(Matmul, Batched) {
  for (DType dt : float_dtypes()) {
    auto a = rnd({4, 5, 6}, dt), b = rnd({4, 6, 3}, dt);
    EXPECT_TRUE(matches(a.matmul(b), a, b));
    // Batched gemv shapes.
    auto a1 = rnd({3, 1, 9}, dt), b1 = rnd({3, 9, 5}, dt);
    EXPECT_TRUE(matches(a1.matmul(b1), a1, b1));
    auto a2 = rnd({3, 5, 9}, dt), b2 = rnd({3, 9, 1}, dt);
    EXPECT_TRUE(matches(a2.matmul(b2), a2, b2));
  }
}

TEST(Matmul, RankFive) {
  for (DType dt : float_dtypes()) {
    auto a = rnd({2, 3, 2, 4, 5}, dt), b = rnd({2, 3, 2, 5, 3}, dt);
    EXPECT_TRUE(matches(a.matmul(b), a, b));
    // Size-1 batch dims mixed in.
    auto c = rnd({1, 3, 1, 4, 5}, dt), d = rnd({1, 3, 1, 5, 2}, dt);
    EXPECT_TRUE(matches(c.matmul(d), c, d));
  }
}

TEST(Matmul, Transposed) {
  for (DType dt : float_dtypes()) {
    auto at = rnd({3, 6, 4}, dt).transpose(1, 2);  // (3, 4, 6)
    auto bt = rnd({3, 5, 6}, dt).transpose(1, 2);  // (3, 6, 5)
    auto a = rnd({3, 4, 6}, dt), b = rnd({3, 6, 5}, dt);
    EXPECT_TRUE(matches(at.matmul(b), at, b)) << "lhs transposed";
    EXPECT_TRUE(matches(a.matmul(bt), a, bt)) << "rhs transposed";
    EXPECT_TRUE(matches(at.matmul(bt), at, bt)) << "both transposed";
    // A 1-row lhs whose elements are 3 apart (a column of a (k, 3) matrix), and a 1-column rhs
    // taken from a row: the gemv paths with strided vectors.
    auto col = rnd({7, 3}, dt).narrow(1, 1, 1).t();  // (1, 7), strides (1, 3)
    auto m7 = rnd({7, 4}, dt);
    EXPECT_TRUE(matches(col.matmul(m7), col, m7)) << "strided gemv lhs";
    auto m7t = rnd({4, 7}, dt).t();  // (7, 4) transposed
    EXPECT_TRUE(matches(col.matmul(m7t), col, m7t)) << "strided gemv lhs, transposed rhs";
    auto row = rnd({3, 7}, dt).narrow(0, 2, 1).t();  // (7, 1)
    auto l = rnd({5, 7}, dt);
    EXPECT_TRUE(matches(l.matmul(row), l, row)) << "gemv rhs from a row";
    auto lt = rnd({7, 5}, dt).t();
    EXPECT_TRUE(matches(lt.matmul(row), lt, row)) << "gemv, transposed lhs";
  }
}

// Few lhs rows times a linear layer's transposed f16/bf16 weight (the decode step's shape): the
// weight is widened inside the dot products, not copied; batches share the weight.
TEST(Matmul, FewRowsTimesTransposedHalfWeight) {
  for (DType dt : {DType::BF16, DType::F16}) {
    for (size_t m : {1, 3, 8}) {
      for (size_t k : {5, 37, 300}) {
        Tensor w = rnd({129, k}, dt);
        Tensor a = rnd({m, k}, dt);
        EXPECT_TRUE(matches(a.matmul(w.t()), a, w.t())) << m << " " << k;
        Tensor batched = rnd({2, 1, k}, dt);
        Tensor wb = w.t().broadcast_left({2});
        EXPECT_TRUE(matches(batched.matmul(wb), batched, wb)) << m << " " << k;
        Tensor strided = rnd({k, m}, dt).t();
        EXPECT_TRUE(matches(strided.matmul(w.t()), strided, w.t())) << m << " " << k;
      }
    }
  }
}

TEST(Matmul, NarrowedPaddedRows) {
  for (DType dt : float_dtypes()) {
    auto a = rnd({2, 5, 11}, dt).narrow(2, 3, 6);  // rows 11 apart, k = 6
    auto b = rnd({2, 9, 4}, dt).narrow(1, 2, 6);   // offset start, rows 4 apart
    ASSERT_FALSE(a.is_contiguous());
    EXPECT_TRUE(matches(a.matmul(b), a, b));
    auto bw = rnd({2, 6, 10}, dt).narrow(2, 1, 4);  // padded rhs rows
    EXPECT_TRUE(matches(a.matmul(bw), a, bw));
    // Narrowed batch: every other batch is skipped.
    auto a2 = rnd({5, 3, 4}, dt).narrow(0, 1, 3), b2 = rnd({3, 4, 2}, dt);
    EXPECT_TRUE(matches(a2.matmul(b2), a2, b2));
  }
}

TEST(Matmul, PermutedBatch) {
  for (DType dt : float_dtypes()) {
    auto a = rnd({4, 3, 5}, dt).permute({1, 0, 2});  // (3, 4, 5), batch stride 5
    auto b = rnd({3, 5, 2}, dt);
    EXPECT_TRUE(matches(a.matmul(b), a, b));
    // Two batch dims swapped: their strides no longer collapse.
    auto c = rnd({3, 2, 4, 5}, dt).permute({1, 0, 2, 3});
    auto d = rnd({5, 2, 3, 6}, dt).permute({1, 2, 0, 3});  // (2, 3, 5, 6)
    EXPECT_TRUE(matches(c.matmul(d), c, d));
  }
}

TEST(Matmul, ArbitraryInnerStrides) {
  for (DType dt : float_dtypes()) {
    // Inner stride 2 on both matrix dims: one contiguous copy, same answer.
    auto a = rnd({4, 6, 2}, dt).narrow(2, 1, 1).squeeze(2);  // (4, 6), strides (12, 2)
    auto b = rnd({6, 3, 2}, dt).narrow(2, 0, 1).squeeze(2);  // (6, 3), strides (6, 2)
    EXPECT_TRUE(matches(a.matmul(b), a, b));
    // Broadcast inside the matrix (stride 0 along k and along n).
    auto ab = rnd({4, 1}, dt).broadcast_as({4, 6});
    auto bb = rnd({1, 3}, dt).broadcast_as({6, 3});
    EXPECT_TRUE(matches(ab.matmul(bb), ab, bb));
    auto bc = rnd({6, 1}, dt).broadcast_as({6, 3});
    EXPECT_TRUE(matches(a.matmul(bc), a, bc));
    // Batched and permuted all the way: (b, m, k) from a (k, m, b) buffer.
    auto p = rnd({5, 4, 3}, dt).permute({2, 1, 0});
    auto q = rnd({3, 5, 2}, dt);
    EXPECT_TRUE(matches(p.matmul(q), p, q));
  }
}

TEST(Matmul, BroadcastBatches) {
  for (DType dt : float_dtypes()) {
    // Stride-0 lhs batch.
    auto a = rnd({4, 5}, dt).broadcast_as({3, 4, 5});
    auto b = rnd({3, 5, 6}, dt);
    EXPECT_TRUE(matches(a.matmul(b), a, b)) << "broadcast lhs";
    // Broadcast rhs with a transposed lhs.
    auto at = rnd({3, 5, 4}, dt).transpose(1, 2);
    auto bb = rnd({5, 6}, dt).broadcast_as({3, 5, 6});
    EXPECT_TRUE(matches(at.matmul(bb), at, bb)) << "broadcast rhs, transposed lhs";
    // Broadcast rhs with a contiguous lhs (folded into one product), also with m == 1.
    auto ac = rnd({3, 4, 5}, dt);
    EXPECT_TRUE(matches(ac.matmul(bb), ac, bb)) << "broadcast rhs";
    auto a1 = rnd({3, 1, 5}, dt);
    EXPECT_TRUE(matches(a1.matmul(bb), a1, bb)) << "broadcast rhs, m == 1";
    auto bbt = rnd({6, 5}, dt).t().broadcast_as({3, 5, 6});
    EXPECT_TRUE(matches(ac.matmul(bbt), ac, bbt)) << "broadcast transposed rhs";
    // Both broadcast: every batch is the same product.
    EXPECT_TRUE(matches(a.matmul(bb), a, bb)) << "both broadcast";
    // A broadcast dim mixed with a real one: (2, 3) batch with strides (0, 20).
    auto mixed = rnd({3, 4, 5}, dt).broadcast_as({2, 3, 4, 5});
    auto other = rnd({2, 3, 5, 2}, dt);
    EXPECT_TRUE(matches(mixed.matmul(other), mixed, other)) << "mixed broadcast";
  }
}

TEST(Matmul, BroadcastMatmul) {
  for (DType dt : float_dtypes()) {
    auto a = rnd({2, 1, 4, 5}, dt), b = rnd({3, 5, 6}, dt);
    auto c = a.broadcast_matmul(b);
    EXPECT_EQ(c.shape(), Shape({2, 3, 4, 6}));
    EXPECT_TRUE(matches(c, a.broadcast_as({2, 3, 4, 5}), b.broadcast_as({2, 3, 5, 6})));
    // Rank 2 lhs against a batched rhs, and the reverse.
    auto w = rnd({4, 5}, dt), x = rnd({7, 5, 2}, dt);
    EXPECT_TRUE(matches(w.broadcast_matmul(x), w.broadcast_as({7, 4, 5}), x));
    auto y = rnd({7, 3, 4}, dt);
    EXPECT_TRUE(matches(y.broadcast_matmul(w), y, w.broadcast_as({7, 4, 5})));
    // Equal batches behave as matmul.
    auto p = rnd({2, 3, 4}, dt), q = rnd({2, 4, 3}, dt);
    EXPECT_TRUE(matches(p.broadcast_matmul(q), p, q));
  }
}

TEST(Matmul, ZeroSizes) {
  for (DType dt : float_dtypes()) {
    auto c = rnd({0, 4}, dt).matmul(rnd({4, 3}, dt));
    EXPECT_EQ(c.shape(), Shape({0, 3}));
    EXPECT_EQ(c.elem_count(), 0u);
    EXPECT_EQ(rnd({2, 4}, dt).matmul(rnd({4, 0}, dt)).shape(), Shape({2, 0}));
    EXPECT_EQ(rnd({0, 2, 4}, dt).matmul(rnd({0, 4, 3}, dt)).shape(), Shape({0, 2, 3}));
    // k == 0: a (2, 3) of zeros.
    auto z = rnd({2, 0}, dt).matmul(rnd({0, 3}, dt));
    EXPECT_EQ(z.shape(), Shape({2, 3}));
    EXPECT_EQ(z.to_vec_f64(), std::vector<double>(6, 0.0));
    EXPECT_EQ(z.dtype(), dt);
    auto zb = rnd({2, 3}, dt).broadcast_matmul(rnd({4, 3, 0}, dt));
    EXPECT_EQ(zb.shape(), Shape({4, 2, 0}));
  }
}

TEST(Matmul, BatchParallelShapes) {
  // 12 x (128x64)(64x128) goes to the workers with single-threaded BLAS; 3 larger batches use
  // one threaded call each. Both must give the same answer as the reference.
  for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
    auto a = rnd({12, 128, 64}, dt), b = rnd({12, 64, 128}, dt);
    EXPECT_TRUE(matches(a.matmul(b), a, b));
    auto c = rnd({3, 200, 260}, dt), d = rnd({3, 260, 330}, dt);
    EXPECT_TRUE(matches(c.matmul(d), c, d));
  }
}

TEST(Matmul, ConcurrentCallers) {
  // Batch-parallel calls switch OpenBLAS to one thread process-wide; threads doing small batched
  // and large products at once must all still get right answers. (A large product that runs
  // single-threaded meanwhile may round differently from a threaded one: compared with the
  // reference, not bit for bit.)
  auto a = rnd({12, 64, 32}, DType::F32), b = rnd({12, 32, 64}, DType::F32);
  auto c = rnd({256, 256}, DType::F32), d = rnd({256, 256}, DType::F32);
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < 10 && failures[t].empty(); ++r) {
        auto res = (t % 2 == 0) ? matches(a.matmul(b), a, b) : matches(c.matmul(d), c, d);
        if (!res) failures[t] = res.message();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

// OpenBLAS's own thread count (linked through wick).
extern "C" int openblas_get_num_threads(void);

TEST(Matmul, BlasThreadsRestored) {
  // A batch-parallel product sets OpenBLAS to one thread while it runs and back afterwards.
  auto a = rnd({12, 128, 64}, DType::F32), b = rnd({12, 64, 128}, DType::F32);
  auto c = a.matmul(b);
  int threads = openblas_get_num_threads();
  auto d = a.matmul(b);
  EXPECT_EQ(openblas_get_num_threads(), threads);
  EXPECT_TRUE(matches(d, a, b));
}

TEST(MatmulDeathTest, WickNumThreadsSetsBlasThreads) {
  // Run in a fresh process (threadsafe style re-executes the test binary), so that the thread
  // count is read from this environment.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("WICK_NUM_THREADS", "1", 1);
        auto a = rnd({4, 4}, DType::F32);
        auto c = a.matmul(a);
        std::exit(openblas_get_num_threads() == 1 && c.elem_count() == 16 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Matmul, Tracked) {
  // matmul records itself; the result is right either way.
  auto a = rnd({3, 4}, DType::F32).requires_grad(), b = rnd({4, 2}, DType::F32);
  auto c = a.matmul(b);
  EXPECT_TRUE(c.is_tracked());
  EXPECT_TRUE(matches(c, a, b));
}

TEST(MatmulErrors, Shapes) {
  auto f = [](const Shape& a, const Shape& b) {
    return message_of([&] { rnd(a, DType::F32).matmul(rnd(b, DType::F32)); });
  };
  auto expect_shape_error = [](const Shape& a, const Shape& b, bool broadcast) {
    auto lhs = rnd(a, DType::F32), rhs = rnd(b, DType::F32);
    if (broadcast) {
      EXPECT_THROW(lhs.broadcast_matmul(rhs), ShapeMismatch) << a << " " << b;
    } else {
      EXPECT_THROW(lhs.matmul(rhs), ShapeMismatch) << a << " " << b;
    }
  };
  expect_shape_error({3}, {3, 2}, false);                 // rank 1
  expect_shape_error({2, 3}, {3}, false);                 // rank 1
  expect_shape_error({2, 3}, {4, 5}, false);              // k
  expect_shape_error({2, 3}, {1, 3, 4}, false);           // ranks differ
  expect_shape_error({2, 3, 4, 5}, {3, 2, 5, 6}, false);  // batch dims differ, same product
  expect_shape_error({2, 4, 5}, {3, 5, 6}, true);         // batches do not broadcast
  expect_shape_error({2, 4, 5}, {2, 4, 6}, true);         // k
  expect_shape_error({5}, {5, 6}, true);                  // rank 1

  std::string msg = f({2, 3}, {4, 5});
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lhs: [2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rhs: [4, 5]"), std::string::npos) << msg;
  msg = f({2, 3, 4, 5}, {3, 2, 5, 6});
  EXPECT_NE(msg.find("lhs: [2, 3, 4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rhs: [3, 2, 5, 6]"), std::string::npos) << msg;
  msg = message_of([] { rnd({2, 4, 5}, DType::F32).broadcast_matmul(rnd({3, 5, 6}, DType::F32)); });
  EXPECT_NE(msg.find("broadcast_matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lhs: [2, 4, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rhs: [3, 5, 6]"), std::string::npos) << msg;
}

TEST(MatmulErrors, DTypes) {
  auto a = rnd({2, 3}, DType::F32), b = rnd({3, 2}, DType::F64);
  EXPECT_THROW(a.matmul(b), DTypeMismatch);
  std::string msg = message_of([&] { a.matmul(b); });
  EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
  EXPECT_THROW(a.broadcast_matmul(b), DTypeMismatch);

  for (DType dt : {DType::U8, DType::U32, DType::I64}) {
    auto x = rnd({2, 3}, dt), y = rnd({3, 2}, dt);
    EXPECT_THROW(x.matmul(y), UnsupportedDType) << dtype_name(dt);
    EXPECT_THROW(x.broadcast_matmul(y), UnsupportedDType) << dtype_name(dt);
    msg = message_of([&] { x.matmul(y); });
    EXPECT_NE(msg.find("matmul"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dtype_name(dt)), std::string::npos) << msg;
  }
}

TEST(MatmulErrors, Devices) {
  if (!cuda_is_available()) {
    // Without a GPU the other device cannot even be made: that failure is a BackendError.
    EXPECT_THROW(rnd({2, 3}, DType::F32).to_device(Device::cuda(0)), BackendError);
  }
  // DeviceMismatch needs tensors on two devices: skipped without a GPU, failed under
  // WICK_REQUIRE_CUDA=1.
  WICK_REQUIRE_GPU();
  auto a = rnd({2, 3}, DType::F32), b = rnd({3, 2}, DType::F32).to_device(Device::cuda(0));
  EXPECT_THROW(a.matmul(b), DeviceMismatch);
  EXPECT_THROW(a.broadcast_matmul(b), DeviceMismatch);
  std::string msg = message_of([&] { a.matmul(b); });
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
}

TEST(MatmulErrors, EmptyHandle) {
  Tensor empty;
  auto a = rnd({2, 2}, DType::F32);
  EXPECT_THROW(empty.matmul(a), Error);
  EXPECT_THROW(a.matmul(empty), Error);
}

}  // namespace
}  // namespace wick
