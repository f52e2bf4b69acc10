// The encoder's dense projections (nn::detail::dense, fused::DenseOp): the bf16 GEMM (AMX tiles
// where the CPU has them, the composed fallback elsewhere) against a float64 product of the
// bf16-rounded operands at numerics.h's bf16 matmul bound, shapes that are not whole tiles
// included; rows independent of the batch; the kernel chosen against the CPU's own features.

#include <cpuid.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "expect_error.h"
#include "fused/dense.h"
#include "nn/dense.h"
#include "test_util.h"
#include "wick/cpu.h"

namespace {

using namespace wick;
using wick::testing::random_values;

// x rounded to bf16 (nearest even), written here apart from the library's conversion.
double round_bf16(double v) {
  float f = static_cast<float>(v);
  uint32_t bits = 0;
  std::memcpy(&bits, &f, 4);
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Whether this CPU and OS offer AMX-BF16 tiles (cpuid, XCR0 tile state).
bool cpu_has_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}

struct Case {
  size_t m, n, k;
};

// dense(x, w, b, gelu[, residual]) for f32 x, bias and residual and bf16 (or f32) w against
// float64, element by element.
void check_dense(const Case& c, bool gelu, bool with_residual = false, DType wdtype = DType::BF16) {
  const bool bf = wdtype == DType::BF16;
  auto xv = random_values(c.m * c.k), wv = random_values(c.n * c.k), bv = random_values(c.n);
  auto rv = random_values(c.m * c.n);
  std::vector<double> wr(wv.size()), xr(xv.size());
  for (size_t i = 0; i < wv.size(); ++i) wr[i] = bf ? round_bf16(wv[i]) : float(wv[i]);
  for (size_t i = 0; i < xv.size(); ++i) {
    xr[i] = bf ? round_bf16(static_cast<float>(xv[i])) : float(xv[i]);
  }
  for (auto& v : bv) v = static_cast<float>(v);
  for (auto& v : rv) v = static_cast<float>(v);
  auto x = Tensor::from_vec(xv, {c.m, c.k}, Device::cpu()).to_dtype(DType::F32);
  auto w = Tensor::from_vec(wr, {c.n, c.k}, Device::cpu()).to_dtype(wdtype);
  auto b = Tensor::from_vec(bv, {c.n}, Device::cpu()).to_dtype(DType::F32);
  auto r = Tensor::from_vec(rv, {c.m, c.n}, Device::cpu()).to_dtype(DType::F32);
  auto y = with_residual ? nn::detail::dense(x, w, b, gelu, r) : nn::detail::dense(x, w, b, gelu);
  ASSERT_EQ(y.shape(), Shape({c.m, c.n}));
  ASSERT_EQ(y.dtype(), DType::F32);
  auto got = y.to_vec_f64();
  size_t bad = 0;
  for (size_t i = 0; i < c.m; ++i) {
    for (size_t j = 0; j < c.n; ++j) {
      double sum = 0, abs_sum = 0;
      for (size_t t = 0; t < c.k; ++t) {
        sum += xr[i * c.k + t] * wr[j * c.k + t];
        abs_sum += std::abs(xr[i * c.k + t] * wr[j * c.k + t]);
      }
      double want = sum + bv[j];
      // The bias joins the f32 sum: one more term of the k + 1 long sum.
      double bound = numerics::matmul_bound(wdtype, c.k + 1, want, abs_sum + std::abs(bv[j]));
      if (gelu) {
        // |gelu'| <= 1.13: the sum's error carries over; then gelu's own f32 error.
        double g = 0.5 * want * (1 + std::erf(want / std::sqrt(2.0)));
        bound = 1.13 * bound + 16 * 0x1p-24 * (std::abs(g) + std::abs(want)) + 1e-30;
        want = g;
      }
      if (with_residual) {
        // One more f32 addition.
        want += rv[i * c.n + j];
        bound += 0x1p-24 * std::abs(want);
      }
      double e = std::abs(got[i * c.n + j] - want);
      if (!(e <= bound) && ++bad <= 5) {
        ADD_FAILURE() << "m " << c.m << " n " << c.n << " k " << c.k << " gelu " << gelu << " ["
                      << i << ", " << j << "]: got " << got[i * c.n + j] << " want " << want
                      << " bound " << bound;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

const std::vector<Case> kCases = {{1, 1, 1},     {3, 5, 7},     {16, 16, 32},    {17, 33, 31},
                                  {32, 32, 64},  {45, 100, 65}, {70, 47, 129},   {33, 16, 384},
                                  {9, 384, 384}, {100, 96, 33}, {128, 1152, 384}};

TEST(Bf16Gemm, MatchesFloat64AtTheBf16MatmulBound) {
  for (const Case& c : kCases) check_dense(c, false);
}

TEST(Bf16Gemm, ResidualEpilogueMatchesFloat64) {
  for (const Case& c : {Case{3, 5, 7}, Case{45, 100, 65}, Case{64, 384, 1536}}) {
    check_dense(c, false, true);
  }
  check_dense({33, 70, 40}, true, true);
}

// f32 weights: sgemm, then bias, GELU and residual in one pass (the same op, f32 bounds).
TEST(DenseF32, EpilogueMatchesFloat64) {
  for (const Case& c : {Case{3, 5, 7}, Case{45, 100, 65}}) {
    check_dense(c, false, false, DType::F32);
    check_dense(c, true, true, DType::F32);
  }
}

TEST(Bf16Gemm, GeluEpilogueMatchesFloat64) {
  for (const Case& c : {Case{5, 9, 13}, Case{40, 70, 96}, Case{64, 1536, 384}})
    check_dense(c, true);
}

// Whether this CPU has AVX512-BF16 (cpuid leaf 7 subleaf 1, eax bit 5).
bool cpu_has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)) != 0;
}

// The kernel is the best this CPU offers: AMX-BF16 where the CPU and the OS have the tiles and
// the AVX-512 kernels run, else AVX512-BF16's dot products where the CPU has them
// (WICK_EXPECT_ISA=avx2 runs, and qemu's Haswell, get none).
TEST(Bf16Gemm, KernelMatchesTheCpu) {
  const char* expect = std::getenv("WICK_EXPECT_ISA");
  const bool avx512 = expect == nullptr ? cpu_isa() == "avx512" : std::string(expect) == "avx512";
  const std::string want = !avx512                 ? ""
                           : cpu_has_amx()         ? "amx-bf16"
                           : cpu_has_avx512_bf16() ? "avx512-bf16"
                                                   : "";
  EXPECT_EQ(cpu_bf16_gemm(), want) << "CPU ISA " << cpu_isa();
}

// A row's result does not depend on the rows beside it (nor on how many there are) in the tile
// kernel (the composed fallback is sgemm's, batch-invariant only with WICK_BATCH_INVARIANT=1).
TEST(Bf16Gemm, RowsAloneEqualRowsInTheBatch) {
  if (cpu_bf16_gemm().empty()) GTEST_SKIP() << "no bf16 GEMM kernel on this CPU";
  const size_t m = 70, n = 200, k = 96;
  auto x = Tensor::from_vec(random_values(m * k), {m, k}, Device::cpu()).to_dtype(DType::F32);
  auto w = Tensor::from_vec(random_values(n * k), {n, k}, Device::cpu()).to_dtype(DType::BF16);
  auto b = Tensor::from_vec(random_values(n), {n}, Device::cpu()).to_dtype(DType::F32);
  auto all = nn::detail::dense(x, w, b).to_vec_f64();
  for (size_t r : {size_t{0}, size_t{31}, size_t{32}, size_t{69}}) {
    for (size_t rows : {size_t{1}, m - r}) {
      auto part = nn::detail::dense(x.narrow(0, r, rows), w, b).to_vec_f64();
      for (size_t j = 0; j < rows * n; ++j) {
        ASSERT_EQ(part[j], all[r * n + j]) << "row " << r << " of " << rows << ", element " << j;
      }
    }
  }
}

// The kernel against the op's own composition (bf16-rounded x, f32 sgemm), on strided inputs.
TEST(Bf16Gemm, StridedInputsMatchTheFallback) {
  const size_t m = 37, n = 50, k = 40;
  auto big =
      Tensor::from_vec(random_values(m * 2 * k), {m, 2 * k}, Device::cpu()).to_dtype(DType::F32);
  auto x = big.narrow(1, 3, k);
  auto w = Tensor::from_vec(random_values(n * k), {n, k}, Device::cpu()).to_dtype(DType::BF16);
  auto b = Tensor::from_vec(random_values(n), {n}, Device::cpu()).to_dtype(DType::F32);
  auto got = nn::detail::dense(x, w, b).to_vec_f64();
  auto want = fused::DenseOp(false).fallback({x.contiguous(), w, b})[0].to_vec_f64();
  auto xs = x.contiguous().to_vec_f64(), ws = w.to_vec_f64();
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < n; ++j) {
      double abs_sum = 0;
      for (size_t t = 0; t < k; ++t) abs_sum += std::abs(xs[i * k + t] * ws[j * k + t]);
      double bound = 2 * numerics::matmul_bound(DType::BF16, k + 1, want[i * n + j], abs_sum);
      EXPECT_LE(std::abs(got[i * n + j] - want[i * n + j]), bound) << i << ", " << j;
    }
  }
}

TEST(Bf16Gemm, BadOperandsThrow) {
  auto x = Tensor::zeros({4, 8}, DType::F32, Device::cpu());
  auto w = Tensor::zeros({6, 8}, DType::BF16, Device::cpu());
  auto b = Tensor::zeros({6}, DType::F32, Device::cpu());
  EXPECT_BAD(DTypeMismatch, "dense", nn::detail::dense(x, w.to_dtype(DType::F16), b));
  EXPECT_BAD(DTypeMismatch, "dense", nn::detail::dense(x, w, b.to_dtype(DType::BF16)));
  EXPECT_BAD(ShapeMismatch, "dense", nn::detail::dense(x, w.narrow(1, 0, 7), b));
  EXPECT_BAD(ShapeMismatch, "dense", nn::detail::dense(x, w, b.narrow(0, 0, 5)));
  EXPECT_BAD(ShapeMismatch, "dense",
             nn::detail::dense(x, w, b, false, Tensor::zeros({4, 5}, DType::F32, Device::cpu())));
  EXPECT_BAD(DTypeMismatch, "dense",
             nn::detail::dense(x, w, b, false, Tensor::zeros({4, 6}, DType::F16, Device::cpu())));
}

}  // namespace
