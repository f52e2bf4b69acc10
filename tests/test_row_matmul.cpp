// cpu::row_matmul (src/cpu/row_matmul.h), the serving engine's batch-invariant projection: within
// the float64 product's bound, each row the same bits alone as among any rows, and its errors.
// CTest runs it again with WICK_CPU_ISA forced to each instruction set this CPU has.

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "cpu/row_matmul.h"
#include "test_util.h"
#include "wick/numerics.h"
#include "wick/wick.h"

using wick::Device;
using wick::DType;
using wick::Shape;
using wick::Tensor;

namespace {

class RowMatmulDType : public ::testing::TestWithParam<DType> {};

// Against a float64 product within matmul_bound, and each row the same bits alone as among
// m = 1..140 rows (tiles of 4 rows and 3 or 6 weight rows, blocks of 128 rows, k with a tail of
// 8 or 16 lanes); row_matmul runs the kernels of the CPU kernels' instruction set.
TEST_P(RowMatmulDType, WithinItsBoundAndTheSameBitsForEveryM) {
  const DType wt = GetParam();
  const size_t n = 37, k = 83, m = 140;
  Tensor x = wick::testing::random_tensor({m, k}, DType::F32);
  Tensor w = wick::testing::random_tensor({n, k}, wt);
  std::vector<double> xv = x.to_vec_f64(), wv = w.to_vec_f64();
  std::vector<double> want(m * n), abs_sum(m * n);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      long double s = 0, a = 0;
      for (size_t e = 0; e < k; ++e) {
        s += static_cast<long double>(xv[i * k + e]) * wv[j * k + e];
        a += std::fabs(static_cast<long double>(xv[i * k + e]) * wv[j * k + e]);
      }
      want[i * n + j] = static_cast<double>(s);
      abs_sum[i * n + j] = static_cast<double>(a);
    }
  }
  SCOPED_TRACE(wick::cpu::row_matmul_kernels().name);
  Tensor y = wick::cpu::row_matmul(x, w);
  ASSERT_EQ(y.shape(), (Shape{m, n}));
  std::vector<double> yv = y.to_vec_f64();
  EXPECT_TRUE(wick::testing::within_bounds(yv, want, [&](size_t i, double e) {
    return wick::numerics::matmul_bound(DType::F32, k, e, abs_sum[i]);
  }));
  for (size_t rows : {1, 2, 3, 4, 5, 17, 64, 65, 128, 129}) {
    for (size_t start : {size_t{0}, m - rows}) {
      auto part = wick::cpu::row_matmul(x.narrow(0, start, rows).contiguous(), w).to_vec_f64();
      std::vector<double> ref(yv.begin() + static_cast<ptrdiff_t>(start * n),
                              yv.begin() + static_cast<ptrdiff_t>((start + rows) * n));
      EXPECT_EQ(part, ref) << rows << " rows from " << start;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, RowMatmulDType,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16));

TEST(RowMatmul, Errors) {
  const Device cpu = Device::cpu();
  EXPECT_THROW(wick::cpu::row_matmul(Tensor::ones({2, 3}, DType::F32, cpu),
                                     Tensor::ones({4, 5}, DType::F32, cpu)),
               wick::ShapeMismatch);
  EXPECT_THROW(wick::cpu::row_matmul(Tensor::ones({2, 3}, DType::F64, cpu),
                                     Tensor::ones({4, 3}, DType::F32, cpu)),
               wick::ShapeMismatch);
  EXPECT_THROW(wick::cpu::row_matmul(Tensor::ones({2, 3}, DType::F32, cpu),
                                     Tensor::ones({4, 3}, DType::F64, cpu)),
               wick::UnsupportedDType);
}

}  // namespace
