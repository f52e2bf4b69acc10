// qmatmul on CUDA against dequantise-then-matmul in float64 (docs/NUMERICS.md): the mat-vec
// kernel (m <= 8) for every block type and activation dtype, and the dequantise-then-cuBLAS path
// (m > 8); the same weights on the CPU for comparison.

#include "../qmatmul_test_util.h"
#include "test_util.h"

namespace wick::testing {
namespace {

void check_cuda(GgmlType type, size_t m, size_t n, size_t k, DType dtype) {
  SCOPED_TRACE(ggml_type_name(type) + " m " + std::to_string(m) + " n " + std::to_string(n) +
               " k " + std::to_string(k) + " " + dtype_name(dtype));
  QTensor w = random_qtensor(type, n, k);
  Tensor x = random_tensor({m, k}, dtype);
  poison_allocations(m * n, dtype, Device::cuda(0));
  Tensor y = qmatmul(x.to_device(Device::cuda(0)), w.to_device(Device::cuda(0)));
  ASSERT_EQ(y.shape(), Shape({m, n}));
  ASSERT_EQ(y.dtype(), dtype);
  ASSERT_TRUE(y.device().is_cuda());
  std::vector<double> wv = w.dequantize().to_dtype(DType::F64).flatten_all().to_vec1<double>();
  std::vector<double> xv = x.to_dtype(DType::F64).flatten_all().to_vec1<double>();
  std::vector<double> got = y.to_dtype(DType::F64).flatten_all().to_vec1<double>();
  std::vector<double> want(m * n), abs_sum(m * n);
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double s = 0, a = 0;
      for (size_t p = 0; p < k; ++p) {
        s += wv[j * k + p] * xv[i * k + p];
        a += std::abs(wv[j * k + p] * xv[i * k + p]);
      }
      want[i * n + j] = s;
      abs_sum[i * n + j] = a;
    }
  }
  // m > 8 is dequantise-then-matmul in x's dtype: the weights are rounded to it first.
  double weight_rounding = m > 8 ? numerics::unit_roundoff(dtype) : 0;
  EXPECT_TRUE(within_bounds(got, want, [&](size_t i, double e) {
    double b = numerics::qmatmul_bound(dtype, k, e, abs_sum[i], 0);
    if (dtype != DType::F32) b += numerics::matmul_bound(dtype, k, e, abs_sum[i]);
    return b + weight_rounding * abs_sum[i];
  }));
}

TEST(CudaQMatmul, MatVecEveryTypeAndDtype) {
  WICK_REQUIRE_GPU();
  for (GgmlType t : qmatmul_block_types()) {
    size_t kb = ggml_block_size(t);
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      check_cuda(t, 1, 37, 4 * kb > 1024 ? 4 * kb : 1024, dt);
      check_cuda(t, 8, 130, 2 * kb, dt);
    }
    check_cuda(t, 3, 5, kb, DType::F32);
  }
}

TEST(CudaQMatmul, PrefillDequantisesThenMultiplies) {
  WICK_REQUIRE_GPU();
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K}) {
    check_cuda(t, 20, 64, 512, DType::F32);
    check_cuda(t, 33, 48, 256, DType::BF16);
  }
}

TEST(CudaQMatmul, AgreesWithTheCpu) {
  WICK_REQUIRE_GPU();
  QTensor w = random_qtensor(GgmlType::Q4_1, 96, 256);
  Tensor x = random_tensor({2, 256}, DType::F32);
  auto cpu = qmatmul(x, w).flatten_all().to_vec1<float>();
  auto gpu = qmatmul(x.to_device(Device::cuda(0)), w.to_device(Device::cuda(0)))
                 .to_device(Device::cpu())
                 .flatten_all()
                 .to_vec1<float>();
  ASSERT_EQ(cpu.size(), gpu.size());
  double spread = 0, diff = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    spread = std::max(spread, std::abs(double(cpu[i])));
    diff = std::max(diff, std::abs(double(cpu[i]) - gpu[i]));
  }
  // The CPU quantizes x to 16-bit blocks (8-bit with WICK_QMATMUL_ACTIVATIONS=int8); CUDA does
  // not. 16 bits move an output by about 4e-4 of the spread at most here.
  const int bits = qmatmul_cpu_activation_bits(GgmlType::Q4_1);
  EXPECT_LT(diff, (bits == 8 ? 0.05 : 0.005) * spread);
}

TEST(CudaQMatmul, Errors) {
  WICK_REQUIRE_GPU();
  QTensor w = random_qtensor(GgmlType::Q4_0, 8, 64).to_device(Device::cuda(0));
  EXPECT_THROW(qmatmul(random_tensor({2, 64}, DType::F32), w), DeviceMismatch);
  EXPECT_THROW(qmatmul(random_tensor({2, 64}, DType::F64, Device::cuda(0)), w), UnsupportedDType);
  EXPECT_THROW(qmatmul(random_tensor({2, 32}, DType::F32, Device::cuda(0)), w), ShapeMismatch);
}

}  // namespace
}  // namespace wick::testing
