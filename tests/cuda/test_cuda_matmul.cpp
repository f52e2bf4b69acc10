// Every matmul case of the CPU path on CUDA, through cuBLASLt and through wick's own GEMM, in
// every float dtype, against a double-precision CPU reference under wick/numerics.h's matmul
// bound (docs/NUMERICS.md), with results allocated in poisoned memory.

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "test_util.h"
#include "wick/cuda.h"

namespace wick {
namespace {

using testing::random_values;
using testing::tensor_from;
using testing::within_bounds;

const Device cpu = Device::cpu();
const Device gpu = Device::cuda(0);

// Restores the matmul path and TF32 setting when a test ends.
struct PathGuard {
  CudaMatmulPath path = cuda_matmul_path();
  bool tf32 = cuda_tf32_allowed();
  ~PathGuard() {
    cuda_set_matmul_path(path);
    cuda_allow_tf32(tf32);
  }
};

struct MatmulCase {
  std::string name;
  Shape lhs_base, rhs_base;
  std::function<Tensor(const Tensor&)> lhs, rhs;
  bool broadcast = false;  // broadcast_matmul instead of matmul
};

Tensor same_view(const Tensor& t) {
  return t;
}

const std::vector<MatmulCase>& cases() {
  static const std::vector<MatmulCase> v{
      {"plain", {17, 33}, {33, 29}, same_view, same_view},
      {"batched", {4, 17, 33}, {4, 33, 29}, same_view, same_view},
      {"rank5", {2, 3, 2, 9, 7}, {2, 3, 2, 7, 5}, same_view, same_view},
      {"transposed lhs", {33, 17}, {33, 29}, [](const Tensor& t) { return t.t(); }, same_view},
      {"transposed rhs", {17, 33}, {29, 33}, same_view, [](const Tensor& t) { return t.t(); }},
      {"both transposed batched",
       {4, 33, 17},
       {4, 29, 33},
       [](const Tensor& t) { return t.transpose(1, 2); },
       [](const Tensor& t) { return t.transpose(1, 2); }},
      {"narrowed padded rows",
       {17, 40},
       {33, 35},
       [](const Tensor& t) { return t.narrow(1, 3, 33); },
       [](const Tensor& t) { return t.narrow(1, 2, 29); }},
      {"column-major narrowed",
       {40, 17},
       {29, 36},
       [](const Tensor& t) { return t.narrow(0, 2, 33).t(); },
       [](const Tensor& t) { return t.narrow(1, 1, 33).t(); }},
      {"permuted batch",
       {17, 4, 33},
       {33, 4, 29},
       [](const Tensor& t) {
         return t.permute({1, 0, 2});
       },
       [](const Tensor& t) {
         return t.permute({1, 0, 2});
       }},
      {"stride-0 lhs batch",
       {1, 17, 33},
       {4, 33, 29},
       [](const Tensor& t) {
         return t.broadcast_as({4, 17, 33});
       },
       same_view},
      {"broadcast rhs, transposed lhs",
       {4, 33, 17},
       {33, 29},
       [](const Tensor& t) { return t.transpose(1, 2); },
       [](const Tensor& t) {
         return t.broadcast_as({4, 33, 29});
       }},
      {"no unit stride",
       {17, 33, 2},
       {33, 2, 29},
       [](const Tensor& t) { return t.narrow(2, 1, 1).squeeze(2); },
       [](const Tensor& t) { return t.narrow(1, 0, 1).squeeze(1); }},
      {"batch with two strides",
       {2, 3, 17, 33},
       {3, 2, 33, 29},
       [](const Tensor& t) { return t; },
       [](const Tensor& t) { return t.transpose(0, 1); }},
      {"broadcast_matmul both sides", {3, 1, 17, 33}, {1, 4, 33, 29}, same_view, same_view, true},
      {"vector rows", {1, 33}, {33, 1}, same_view, same_view},
      {"tiles and edges", {2, 130, 260}, {2, 260, 131}, same_view, same_view},
  };
  return v;
}

Tensor random_tensor_of(const Shape& shape, DType dt) {
  return tensor_from(random_values(shape.elem_count()), shape, dt);
}

Tensor run(const MatmulCase& c, const Tensor& a, const Tensor& b) {
  return c.broadcast ? c.lhs(a).broadcast_matmul(c.rhs(b)) : c.lhs(a).matmul(c.rhs(b));
}

Tensor f64(const Tensor& t) {
  return t.to_dtype(DType::F64);
}

// The float64 reference of a matmul and, per output, the sum of |a_ij * b_jn| that bounds its
// rounding error; `product` multiplies two operands (matmul, a view's matmul, broadcast_matmul).
struct Reference {
  std::vector<double> want, abs_sum;
};
template <class Product>
Reference reference(const Tensor& a, const Tensor& b, Product product) {
  return {product(f64(a), f64(b)).to_vec_f64(), product(f64(a).abs(), f64(b).abs()).to_vec_f64()};
}

// A GPU result (dtype `dt`, k-long dot products) against the reference.
::testing::AssertionResult matches(const Tensor& got, DType dt, size_t k, const Reference& ref) {
  if (got.device() != gpu) return ::testing::AssertionFailure() << "result not on cuda:0";
  if (got.dtype() != dt) return ::testing::AssertionFailure() << "dtype " << got.dtype();
  bool tf32 = cuda_tf32_allowed();
  return within_bounds(got.to_vec_f64(), ref.want, [&](size_t i, double w) {
    return numerics::matmul_bound(dt, k, w, ref.abs_sum[i], tf32);
  });
}

// Poisons the next GPU allocations of a result's size.
void poison(size_t count, DType dt) {
  testing::poison_allocations(count, dt, gpu);
}

void check_all_cases(CudaMatmulPath path) {
  PathGuard guard;
  cuda_set_matmul_path(path);
  for (DType dt : testing::float_dtypes()) {
    for (const auto& c : cases()) {
      Tensor a = random_tensor_of(c.lhs_base, dt), b = random_tensor_of(c.rhs_base, dt);
      Tensor want = run(c, a.to_dtype(DType::F64), b.to_dtype(DType::F64));
      Reference ref =
          reference(a, b, [&](const Tensor& x, const Tensor& y) { return run(c, x, y); });
      poison(want.elem_count(), dt);
      Tensor got = run(c, a.to_device(gpu), b.to_device(gpu));
      ASSERT_EQ(got.device(), gpu);
      ASSERT_EQ(got.dtype(), dt);
      ASSERT_EQ(got.shape(), want.shape()) << c.name;
      size_t k = c.lhs(a).dims().back();
      EXPECT_TRUE(matches(got, dt, k, ref))
          << c.name << " " << dtype_name(dt) << " path " << static_cast<int>(path);
    }
  }
}

TEST(CudaMatmul, EveryCaseThroughCublas) {
  WICK_REQUIRE_GPU();
  check_all_cases(CudaMatmulPath::Cublas);
}

TEST(CudaMatmul, EveryCaseThroughWickGemm) {
  WICK_REQUIRE_GPU();
  check_all_cases(CudaMatmulPath::Wick);
}

TEST(CudaMatmul, EveryCaseAuto) {
  WICK_REQUIRE_GPU();
  check_all_cases(CudaMatmulPath::Auto);
}

TEST(CudaMatmul, ZeroSizes) {
  WICK_REQUIRE_GPU();
  PathGuard guard;
  for (auto path : {CudaMatmulPath::Cublas, CudaMatmulPath::Wick}) {
    cuda_set_matmul_path(path);
    for (DType dt : testing::float_dtypes()) {
      auto a = Tensor::zeros({0, 5}, dt, gpu), b = Tensor::ones({5, 3}, dt, gpu);
      EXPECT_EQ(a.matmul(b).shape(), Shape({0, 3}));
      auto c = Tensor::ones({4, 0}, dt, gpu), d = Tensor::ones({0, 3}, dt, gpu);
      // k == 0: a sum over nothing.
      EXPECT_EQ(c.matmul(d).to_vec_f64(), std::vector<double>(12, 0.0)) << dtype_name(dt);
      auto e = Tensor::ones({0, 4, 5}, dt, gpu), f = Tensor::ones({0, 5, 2}, dt, gpu);
      EXPECT_EQ(e.matmul(f).shape(), Shape({0, 4, 2}));
    }
  }
}

TEST(CudaMatmul, SquareSizesBothPaths) {
  WICK_REQUIRE_GPU();
  PathGuard guard;
  for (size_t n : {64, 1024}) {
    for (DType dt : testing::float_dtypes()) {
      Tensor a = random_tensor_of({n, n}, dt), b = random_tensor_of({n, n}, dt);
      Reference ref = reference(a, b, [](const Tensor& x, const Tensor& y) { return x.matmul(y); });
      Tensor ga = a.to_device(gpu), gb = b.to_device(gpu);
      for (auto path : {CudaMatmulPath::Cublas, CudaMatmulPath::Wick}) {
        cuda_set_matmul_path(path);
        poison(n * n, dt);
        EXPECT_TRUE(matches(ga.matmul(gb), dt, n, ref))
            << n << " " << dtype_name(dt) << " path " << static_cast<int>(path);
      }
    }
  }
}

// Largest |got - want| relative to the largest |want|.
double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

TEST(CudaMatmul, F32IsTrueFp32UnlessTf32IsAllowed) {
  WICK_REQUIRE_GPU();
  PathGuard guard;
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  Tensor a = random_tensor_of({256, 2048}, DType::F32),
         b = random_tensor_of({2048, 256}, DType::F32);
  auto want = a.to_dtype(DType::F64).matmul(b.to_dtype(DType::F64)).to_vec_f64();
  Tensor ga = a.to_device(gpu), gb = b.to_device(gpu);
  cuda_allow_tf32(false);
  EXPECT_FALSE(cuda_tf32_allowed());
  double fp32 = rel_error(ga.matmul(gb).to_vec_f64(), want);
  EXPECT_LT(fp32, 1e-5) << "f32 matmul is not true fp32";
  cuda_allow_tf32(true);
  EXPECT_TRUE(cuda_tf32_allowed());
  double tf32 = rel_error(ga.matmul(gb).to_vec_f64(), want);
  EXPECT_LT(tf32, 1e-2);
  EXPECT_GT(tf32, fp32);  // 10-bit products: TF32 is really in use
}

TEST(CudaMatmul, RepeatedMatmulsOnTheSameBuffersSeeNewContents) {
  WICK_REQUIRE_GPU();
  PathGuard guard;
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  for (DType dt : testing::float_dtypes()) {
    Tensor ga = random_tensor_of({48, 40}, dt).to_device(gpu);
    Tensor gb = random_tensor_of({40, 24}, dt).to_device(gpu);
    for (int round = 0; round < 3; ++round) {
      Reference ref = reference(ga.to_device(cpu), gb.to_device(cpu),
                                [](const Tensor& x, const Tensor& y) { return x.matmul(y); });
      // Same shapes and buffers each time: from the third call on, a replayed graph.
      for (int i = 0; i < 6; ++i) {
        poison(48 * 24, dt);
        Tensor c = ga.matmul(gb);
        EXPECT_TRUE(matches(c, dt, 40, ref))
            << dtype_name(dt) << " round " << round << " call " << i;
      }
      // New contents in the same buffers: a replay must compute with them.
      ga.assign(random_tensor_of({48, 40}, dt).to_device(gpu));
      gb.assign(random_tensor_of({40, 24}, dt).to_device(gpu));
    }
  }
}

TEST(CudaMatmul, MatmulReadingOneStorageTwice) {
  WICK_REQUIRE_GPU();
  Tensor a = random_tensor_of({32, 32}, DType::F32);
  Reference ref = reference(a, a, [](const Tensor& x, const Tensor& y) { return x.matmul(y.t()); });
  Tensor ga = a.to_device(gpu);
  poison(32 * 32, DType::F32);
  EXPECT_TRUE(matches(ga.matmul(ga.t()), DType::F32, 32, ref));
}

TEST(CudaMatmul, Errors) {
  WICK_REQUIRE_GPU();
  Tensor ga = Tensor::ones({2, 3}, DType::F32, gpu), gb = Tensor::ones({3, 2}, DType::F32, gpu);
  Tensor cb = Tensor::ones({3, 2}, DType::F32, cpu);
  EXPECT_THROW(ga.matmul(cb), DeviceMismatch);
  EXPECT_THROW(ga.matmul(gb.to_dtype(DType::F16)), DTypeMismatch);
  EXPECT_THROW(ga.to_dtype(DType::I64).matmul(gb.to_dtype(DType::I64)), UnsupportedDType);
  EXPECT_THROW(ga.matmul(ga), ShapeMismatch);
}

}  // namespace
}  // namespace wick
