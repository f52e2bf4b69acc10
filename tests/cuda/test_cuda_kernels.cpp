// The CUDA kernels' own paths, through the public API, against double-precision references: the
// 16-byte vector path and its tails at every alignment, fill patterns, each reduction strategy
// (warp rows, block rows split into chunks, thread-per-output columns, two-pass sum_all), every
// softmax kernel, atomics under contention (u8 through CAS, f16, bf16), ids out of range, and the
// counter-based generator. The cross-backend oracle (test_cuda_ops.cpp) covers every op and view.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/gpu_tolerance.h"
#include "test_util.h"

namespace wick {
namespace {

using testing::all_close;
using testing::random_values;
using testing::tensor_from;
using testing::tolerance;

const Device gpu = Device::cuda(0);

// Integers wrap in their dtype; floats are compared under a tolerance.
double wrap(double v, DType dt) {
  double m = dt == DType::U8 ? 256.0 : dt == DType::U32 ? 4294967296.0 : 0.0;
  if (m == 0) return v;
  double r = std::fmod(v, m);
  return r < 0 ? r + m : r;
}

double rtol_of(DType dt) {
  return is_float(dt) ? tolerance(dt) : 0;
}

// Values for `dt`: integers 0..19, floats in [lo, hi).
std::vector<double> values_for(size_t n, DType dt, double lo = -2, double hi = 2) {
  auto v = random_values(n, lo, hi);
  if (!is_float(dt)) {
    for (auto& x : v) x = std::floor(std::abs(x) * 10);
  }
  return v;
}

// The values a tensor of `dt` really holds (f16/bf16 rounding included).
std::vector<double> rounded(const std::vector<double>& v, DType dt) {
  return tensor_from(v, Shape{v.size()}, dt).to_vec_f64();
}

// Sizes around the vector width and a large odd one; offsets that break 16-byte alignment.
const std::vector<size_t> kSizes{1, 3, 4, 15, 16, 17, 100003};
const std::vector<size_t> kOffsets{0, 1, 3};

TEST(CudaKernels, ElementwiseVectorPathsAndTails) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::F16, DType::U8, DType::F64}) {
    for (size_t n : kSizes) {
      for (size_t off : kOffsets) {
        std::string what = std::string(dtype_name(dt)) + " n=" + std::to_string(n) +
                           " offset=" + std::to_string(off);
        auto av = rounded(values_for(n + off, dt), dt);
        auto bv = rounded(values_for(n + off, dt), dt);
        Tensor a = tensor_from(av, Shape{n + off}, dt, gpu).narrow(0, off, n);
        Tensor b = tensor_from(bv, Shape{n + off}, dt, gpu).narrow(0, off, n);
        std::vector<double> sum(n), prod(n), gt(n), pick(n), sq(n), cast(n);
        for (size_t i = 0; i < n; ++i) {
          double x = av[off + i], y = bv[off + i];
          sum[i] = wrap(x + y, dt);
          prod[i] = wrap(x * y, dt);
          gt[i] = x > y;
          pick[i] = x > y ? x : y;
          sq[i] = wrap(x * x, dt);
          cast[i] = x;
        }
        double rtol = rtol_of(dt), atol = rtol;
        EXPECT_TRUE(all_close(a.add(b).to_vec_f64(), sum, rtol, atol)) << "add " << what;
        EXPECT_TRUE(all_close(a.mul(b).to_vec_f64(), prod, rtol, atol)) << "mul " << what;
        Tensor c = a.gt(b);
        EXPECT_EQ(c.dtype(), DType::U8);
        EXPECT_TRUE(all_close(c.to_vec_f64(), gt, 0, 0)) << "gt " << what;
        EXPECT_TRUE(all_close(c.where_cond(a, b).to_vec_f64(), pick, 0, 0)) << "where " << what;
        EXPECT_TRUE(all_close(a.sqr().to_vec_f64(), sq, rtol, atol)) << "sqr " << what;
        // The cast's vector width comes from the wider side.
        EXPECT_TRUE(all_close(a.to_dtype(DType::F64).to_vec_f64(), cast, 0, 0)) << "cast " << what;
        EXPECT_TRUE(all_close(a.copy().to_vec_f64(), cast, 0, 0)) << "copy " << what;
      }
    }
  }
}

TEST(CudaKernels, UnaryFloatFunctionsAgainstDouble) {
  WICK_REQUIRE_GPU();
  struct Fn {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*ref)(double);
    double lo, hi;
  };
  const Fn fns[] = {
      {"exp", [](const Tensor& t) { return t.exp(); }, [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](const Tensor& t) { return t.log(); }, [](double x) { return std::log(x); }, 0.1,
       5},
      {"tanh", [](const Tensor& t) { return t.tanh(); }, [](double x) { return std::tanh(x); }, -3,
       3},
      {"silu", [](const Tensor& t) { return t.silu(); },
       [](double x) { return x / (1 + std::exp(-x)); }, -5, 5},
      {"gelu", [](const Tensor& t) { return t.gelu(); },
       [](double x) {
         return 0.5 * x * (1 + std::tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x)));
       },
       -4, 4},
      {"gelu_erf", [](const Tensor& t) { return t.gelu_erf(); },
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, -4, 4},
      {"powf", [](const Tensor& t) { return t.powf(1.7); },
       [](double x) { return std::pow(x, 1.7); }, 0.1, 3},
      {"clamp", [](const Tensor& t) { return t.clamp(-0.5, 0.8); },
       [](double x) { return std::min(std::max(x, -0.5), 0.8); }, -2, 2},
  };
  for (DType dt : testing::float_dtypes()) {
    for (const Fn& f : fns) {
      auto v = rounded(values_for(4099, dt, f.lo, f.hi), dt);
      std::vector<double> expected(v.size());
      std::transform(v.begin(), v.end(), expected.begin(), f.ref);
      // Odd row length: the transposed view takes the strided path.
      Tensor t = tensor_from(v, Shape{4099}, dt, gpu);
      EXPECT_TRUE(all_close(f.op(t).to_vec_f64(), expected, 2 * tolerance(dt), tolerance(dt)))
          << f.name << " " << dtype_name(dt);
    }
  }
}

TEST(CudaKernels, FillPatternsEveryDType) {
  WICK_REQUIRE_GPU();
  for (size_t n : {size_t{1}, size_t{7}, size_t{1001}}) {
    // Values whose bytes differ take the kernel; zeros the memset.
    EXPECT_EQ(Tensor::full<float>(-1.25f, {n}, gpu).to_vec1<float>(),
              std::vector<float>(n, -1.25f));
    EXPECT_EQ(Tensor::full<double>(3.5, {n}, gpu).to_vec1<double>(), std::vector<double>(n, 3.5));
    EXPECT_EQ(Tensor::full<uint32_t>(0x01020304u, {n}, gpu).to_vec1<uint32_t>(),
              std::vector<uint32_t>(n, 0x01020304u));
    EXPECT_EQ(Tensor::full<int64_t>(-7, {n}, gpu).to_vec1<int64_t>(), std::vector<int64_t>(n, -7));
    EXPECT_EQ(Tensor::full<uint8_t>(9, {n}, gpu).to_vec1<uint8_t>(), std::vector<uint8_t>(n, 9));
    EXPECT_EQ(Tensor::full<f16>(f16(0.375f), {n}, gpu).to_vec_f64(), std::vector<double>(n, 0.375));
    EXPECT_EQ(Tensor::full<bf16>(bf16(-2.0f), {n}, gpu).to_vec_f64(), std::vector<double>(n, -2.0));
    for (DType dt : testing::all_dtypes()) {
      EXPECT_EQ(Tensor::zeros({n}, dt, gpu).to_vec_f64(), std::vector<double>(n, 0.0));
      EXPECT_EQ(Tensor::ones({n}, dt, gpu).to_vec_f64(), std::vector<double>(n, 1.0));
    }
  }
}

// Row sums of a rows x cols matrix (row-major values) in double.
std::vector<double> row_sums(const std::vector<double>& v, size_t rows, size_t cols,
                             bool columns = false) {
  std::vector<double> out(columns ? cols : rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) out[columns ? c : r] += v[r * cols + c];
  }
  return out;
}

TEST(CudaKernels, SumEveryStrategy) {
  WICK_REQUIRE_GPU();
  struct Plan {
    size_t rows, cols;
  };
  // Tiny rows (thread per output), warp rows, long rows split in chunks (block groups + second
  // pass), few long rows, many short columns and a few long columns.
  const Plan plans[] = {{5000, 3}, {1000, 100}, {3, 200003}, {1, 3000017}, {4000, 2000}};
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::U8, DType::I64}) {
    for (const Plan& p : plans) {
      if (dt == DType::BF16 && p.rows * p.cols > 1000000) continue;  // bf16 sums lose it all
      std::string what =
          std::string(dtype_name(dt)) + " " + std::to_string(p.rows) + "x" + std::to_string(p.cols);
      auto v = rounded(values_for(p.rows * p.cols, dt), dt);
      Tensor t = tensor_from(v, Shape{p.rows, p.cols}, dt, gpu);
      for (bool columns : {false, true}) {
        auto expected = row_sums(v, p.rows, p.cols, columns);
        for (auto& x : expected) x = wrap(x, dt);
        // Rows reduce dim 1; columns dim 0, and the same through the transposed view.
        Tensor got = columns ? t.sum({0}) : t.sum({1});
        // Random signs: a sum of len values spreads like sqrt(len).
        double atol = rtol_of(dt) * 4 * std::sqrt(static_cast<double>(columns ? p.rows : p.cols));
        EXPECT_TRUE(all_close(got.to_vec_f64(), expected, rtol_of(dt), atol))
            << what << (columns ? " columns" : " rows");
        Tensor got_t = columns ? t.t().sum({1}) : t.t().sum({0});
        EXPECT_TRUE(all_close(got_t.to_vec_f64(), expected, rtol_of(dt), atol))
            << what << (columns ? " columns" : " rows") << " transposed";
      }
      double total = 0;
      for (double x : v) total += x;
      EXPECT_TRUE(all_close(t.sum_all().to_vec_f64(), {wrap(total, dt)}, rtol_of(dt),
                            rtol_of(dt) * std::sqrt(static_cast<double>(v.size())) * 4))
          << what << " sum_all";
    }
  }
}

TEST(CudaKernels, ExtremaAndArgsAcrossChunks) {
  WICK_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::F16, DType::U8, DType::U32, DType::F64}) {
    for (size_t cols : {size_t{100}, size_t{300007}}) {
      const size_t rows = 3;
      // Values 0..3 only: many ties, so the first index must win across threads and chunks.
      auto v = random_values(rows * cols, 0, 4);
      for (auto& x : v) x = std::floor(x);
      Tensor t = tensor_from(v, Shape{rows, cols}, dt, gpu);
      std::vector<double> mx(rows, -1), mn(rows, 9), amx(rows), amn(rows);
      for (size_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < cols; ++c) {
          double x = v[r * cols + c];
          if (x > mx[r]) {
            mx[r] = x;
            amx[r] = static_cast<double>(c);
          }
          if (x < mn[r]) {
            mn[r] = x;
            amn[r] = static_cast<double>(c);
          }
        }
      }
      std::string what = std::string(dtype_name(dt)) + " cols=" + std::to_string(cols);
      EXPECT_TRUE(all_close(t.max(1).to_vec_f64(), mx, 0, 0)) << what;
      EXPECT_TRUE(all_close(t.min(1).to_vec_f64(), mn, 0, 0)) << what;
      Tensor am = t.argmax(1);
      EXPECT_EQ(am.dtype(), DType::U32);
      EXPECT_TRUE(all_close(am.to_vec_f64(), amx, 0, 0)) << what;
      EXPECT_TRUE(all_close(t.argmin(1).to_vec_f64(), amn, 0, 0)) << what;
      // The same through a transposed layout: each run is strided.
      std::vector<double> vt(v.size());
      for (size_t r = 0; r < rows; ++r) {
        for (size_t c = 0; c < cols; ++c) vt[c * rows + r] = v[r * cols + c];
      }
      Tensor tt = tensor_from(vt, Shape{cols, rows}, dt, gpu).t();
      EXPECT_TRUE(all_close(tt.argmax(1).to_vec_f64(), amx, 0, 0)) << what << " strided";
      EXPECT_TRUE(all_close(tt.min(1).to_vec_f64(), mn, 0, 0)) << what << " strided";
    }
  }
  // NaN wins max and argmax (the first NaN), as on the CPU.
  std::vector<float> row(5000, 1.0f);
  row[1234] = NAN;
  row[4000] = NAN;
  Tensor n = Tensor::from_vec(row, {1, 5000}, gpu);
  EXPECT_TRUE(std::isnan(n.max(1).to_vec1<float>()[0]));
  EXPECT_EQ(n.argmax(1).to_vec1<uint32_t>()[0], 1234u);
}

TEST(CudaKernels, SoftmaxEveryKernel) {
  WICK_REQUIRE_GPU();
  // Warp rows (up to 1024), block rows in registers (up to 8192; vectors when rows are 16-byte
  // aligned) and longer rows in two passes.
  const size_t widths[] = {1, 31, 1024, 1025, 2048, 5003, 8192, 8193};
  for (DType dt : testing::float_dtypes()) {
    for (size_t cols : widths) {
      const size_t rows = 9;
      auto v = rounded(values_for(rows * cols, dt, -6, 6), dt);
      if (cols > 1) v[cols + 1] = -INFINITY;  // a masked element: exp gives 0, the row stays finite
      std::vector<double> expected(v.size());
      for (size_t r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        for (size_t c = 0; c < cols; ++c) m = std::max(m, v[r * cols + c]);
        for (size_t c = 0; c < cols; ++c) s += std::exp(v[r * cols + c] - m);
        for (size_t c = 0; c < cols; ++c)
          expected[r * cols + c] = std::exp(v[r * cols + c] - m) / s;
      }
      Tensor t = tensor_from(v, Shape{rows, cols}, dt, gpu);
      EXPECT_TRUE(
          all_close(t.softmax(1).to_vec_f64(), expected, 2 * tolerance(dt), tolerance(dt) * 1e-2))
          << dtype_name(dt) << " cols=" << cols;
    }
  }
}

TEST(CudaKernels, IdsOutOfRangeThrowAndLeaveTheDeviceUsable) {
  WICK_REQUIRE_GPU();
  Tensor table = tensor_from(values_for(5 * 3, DType::F32), Shape{5, 3}, DType::F32, gpu);
  Tensor bad64 = Tensor::from_vec<int64_t>({0, -1, 2}, {3}, gpu);
  Tensor bad32 = Tensor::from_vec<uint32_t>({4, 5}, {2}, gpu);
  EXPECT_THROW(table.index_select(bad64, 0).to_vec2<float>(), IndexOutOfRange);
  EXPECT_THROW(table.index_select(bad32, 0).to_vec2<float>(), IndexOutOfRange);
  Tensor gids = Tensor::from_vec<int64_t>({0, 1, 3, 2, 2, 1}, {2, 3}, gpu);
  EXPECT_THROW(table.narrow(0, 0, 2).gather(gids, 1).to_vec2<float>(), IndexOutOfRange);
  Tensor src = Tensor::ones({2, 3}, DType::F32, gpu);
  EXPECT_THROW(table.index_add(bad32, src, 0).to_vec2<float>(), IndexOutOfRange);
  EXPECT_THROW(table.narrow(0, 0, 2).scatter_add(gids, src, 1).to_vec2<float>(), IndexOutOfRange);
  // The queue still works and good ids give the right rows.
  Tensor good = Tensor::from_vec<uint32_t>({4, 0, 4}, {3}, gpu);
  auto rows = table.index_select(good, 0).to_vec2<float>();
  auto all = table.to_vec2<float>();
  EXPECT_EQ(rows[0], all[4]);
  EXPECT_EQ(rows[1], all[0]);
  EXPECT_EQ(rows[2], all[4]);
}

TEST(CudaKernels, AtomicAddsUnderContention) {
  WICK_REQUIRE_GPU();
  // Every id hits the same few rows: thousands of atomic adds per element.
  const size_t n_ids = 4096, width = 33, rows = 32;
  std::vector<int64_t> ids(n_ids);
  for (size_t i = 0; i < n_ids; ++i) ids[i] = static_cast<int64_t>(i % rows);
  Tensor idt = Tensor::from_vec(ids, {n_ids}, gpu);
  for (DType dt : testing::all_dtypes()) {
    // 128 hits per element of 0.25 stay exact even in bf16; u8 wraps (3 * 128 = 384).
    double unit = is_float(dt) ? 0.25 : 3;
    Tensor base = Tensor::zeros({rows, width}, dt, gpu);
    Tensor src =
        tensor_from(std::vector<double>(n_ids * width, unit), Shape{n_ids, width}, dt, gpu);
    std::vector<double> expected(rows * width);
    for (size_t r = 0; r < rows; ++r) {
      double hits = static_cast<double>((n_ids - r + rows - 1) / rows);
      for (size_t c = 0; c < width; ++c) expected[r * width + c] = wrap(hits * unit, dt);
    }
    EXPECT_TRUE(all_close(base.index_add(idt, src, 0).to_vec_f64(), expected, 0, 0))
        << "index_add " << dtype_name(dt);
    // scatter_add along dim 0 with ids[p][c] = p % rows: the same totals.
    Tensor sids = idt.unsqueeze(1).broadcast_as({n_ids, width}).contiguous();
    EXPECT_TRUE(all_close(base.scatter_add(sids, src, 0).to_vec_f64(), expected, 0, 0))
        << "scatter_add " << dtype_name(dt);
  }
}

TEST(CudaKernels, RandomIsCounterBased) {
  WICK_REQUIRE_GPU();
  gpu.set_seed(1234);
  auto a = Tensor::rand(0.0f, 1.0f, {1001}, gpu).to_vec1<float>();
  auto b = Tensor::rand(0.0f, 1.0f, {7}, gpu).to_vec1<float>();
  gpu.set_seed(1234);
  EXPECT_EQ(Tensor::rand(0.0f, 1.0f, {1001}, gpu).to_vec1<float>(), a);
  EXPECT_EQ(Tensor::rand(0.0f, 1.0f, {7}, gpu).to_vec1<float>(), b);
  gpu.set_seed(1235);
  EXPECT_NE(Tensor::rand(0.0f, 1.0f, {1001}, gpu).to_vec1<float>(), a);
  for (DType dt : {DType::F32, DType::F64}) {
    Tensor g = dt == DType::F32 ? Tensor::randn(1.0f, 3.0f, {1 << 20}, gpu)
                                : Tensor::randn(1.0, 3.0, {1 << 20}, gpu);
    auto v = g.to_vec_f64();
    double m = 0, s = 0, tail = 0;
    for (double x : v) m += x;
    m /= static_cast<double>(v.size());
    for (double x : v) {
      s += (x - m) * (x - m);
      tail += std::abs(x - 1.0) > 6.0;  // beyond 2 sigma: about 4.55%
    }
    EXPECT_NEAR(m, 1.0, 0.02) << dtype_name(dt);
    EXPECT_NEAR(std::sqrt(s / static_cast<double>(v.size())), 3.0, 0.02) << dtype_name(dt);
    EXPECT_NEAR(tail / static_cast<double>(v.size()), 0.0455, 0.003) << dtype_name(dt);
  }
}

}  // namespace
}  // namespace wick
