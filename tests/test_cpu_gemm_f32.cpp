// wick's own f32 GEMM (src/cpu/gemm_f32.h) of the CPU kernels' instruction set (AVX-512, or AVX2
// on other CPUs and under WICK_CPU_ISA=avx2), called directly and through matmul: every output
// element must be the f32 chain of fused multiply-adds over k in order (computed here with
// std::fma, one element at a time: the same bits whatever the shape, the tile, the split or the
// thread count), within the f32 matmul bound of a float64 reference, for ragged shapes, k across
// several k blocks, transposed and strided operands.

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm_f32.h"
#include "wick/cpu.h"
#include "wick/error.h"
#include "wick/numerics.h"
#include "wick/wick.h"

namespace {

using wick::cpu::GemmF32Operand;

// A (rows x cols) operand with values in [-1, 1], stored row-major or column-major (trans) with
// `pad` unused elements after each stored line.
struct Matrix {
  size_t rows, cols, pad;
  bool trans;
  std::vector<float> data;

  Matrix(size_t r, size_t c, bool t, size_t p, std::mt19937& rng)
      : rows(r), cols(c), pad(p), trans(t) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    data.resize((t ? c : r) * ld());
    for (auto& v : data) v = dist(rng);
  }
  size_t ld() const { return (trans ? rows : cols) + pad; }
  float at(size_t r, size_t c) const { return trans ? data[c * ld() + r] : data[r * ld() + c]; }
  GemmF32Operand view() const { return {data.data(), ld(), trans}; }
};

// Element (i, j) of a b: the products added in k order, each with one rounding (an FMA chain).
float fma_chain(const Matrix& a, const Matrix& b, size_t i, size_t j) {
  float acc = 0.0f;
  for (size_t t = 0; t < a.cols; ++t) acc = std::fma(a.at(i, t), b.at(t, j), acc);
  return acc;
}

// A child process of ChildrenOf1And3Threads runs its thread count (WICK_GEMM_F32_CHILD).
const bool kChildThreadsSet = [] {
  if (const char* v = std::getenv("WICK_GEMM_F32_CHILD")) wick::set_cpu_threads(std::stoul(v));
  return true;
}();

const wick::cpu::GemmF32& kernel() {
  return wick::cpu::gemm_f32();
}

std::string shape(size_t m, size_t n, size_t k, bool ta, bool tb) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "(%zu, %zu, %zu)%s%s", m, n, k, ta ? " a^T" : "",
                tb ? " b^T" : "");
  return buf;
}

// Runs the kernel on every combination of the shapes' m, n, k and both layouts of each operand,
// and checks each output against fma_chain (bitwise) and the float64 reference (the bound).
void check_shapes(const std::vector<size_t>& ms, const std::vector<size_t>& ns,
                  const std::vector<size_t>& ks, size_t pad) {
  std::mt19937 rng(11);
  for (size_t m : ms) {
    for (size_t n : ns) {
      for (size_t k : ks) {
        for (int layout = 0; layout < 4; ++layout) {
          const bool ta = layout & 1, tb = layout & 2;
          Matrix a(m, k, ta, pad, rng), b(k, n, tb, pad, rng);
          const size_t ldc = n + pad;
          std::vector<float> c(m * ldc, -7.0f);
          kernel().run(m, n, k, a.view(), b.view(), c.data(), ldc);
          for (size_t i = 0; i < m; ++i) {
            for (size_t j = 0; j < ldc; ++j) {
              const float got = c[i * ldc + j];
              if (j >= n) {
                ASSERT_EQ(got, -7.0f) << "wrote past column n: " << shape(m, n, k, ta, tb);
                continue;
              }
              double want = 0, abs_sum = 0;
              for (size_t t = 0; t < k; ++t) {
                const double p = static_cast<double>(a.at(i, t)) * b.at(t, j);
                want += p;
                abs_sum += std::abs(p);
              }
              ASSERT_LE(std::abs(got - want),
                        wick::numerics::matmul_bound(wick::DType::F32, k, want, abs_sum))
                  << shape(m, n, k, ta, tb) << " at " << i << ", " << j;
              ASSERT_EQ(got, fma_chain(a, b, i, j))
                  << shape(m, n, k, ta, tb) << " at " << i << ", " << j;
            }
          }
        }
      }
    }
  }
}

#define REQUIRE_KERNEL()                                                                          \
  if (kernel().run == nullptr) {                                                                  \
    GTEST_SKIP() << "no wick f32 GEMM with the CPU kernels " << wick::cpu_isa() << " (OpenBLAS)"; \
  }

// Edges in m and n (micro-tiles of 14 x 32 with AVX-512, 6 x 16 with AVX2), k below, at and
// across the k blocks of 256.
TEST(GemmF32, RaggedShapesAreFmaChainsInKOrder) {
  REQUIRE_KERNEL();
  check_shapes({1, 5, 6, 7, 13, 14, 15, 33}, {1, 7, 8, 9, 16, 17, 33, 100}, {1, 13, 256, 257}, 0);
}

// Several row items and blocks of columns (kNc = 1024) with strided operands and output.
TEST(GemmF32, LargerShapesWithStridesAreFmaChains) {
  REQUIRE_KERNEL();
  check_shapes({200}, {1030}, {270}, 3);
  check_shapes({257}, {100}, {513}, 5);
}

// A row computed alone has the bits it has inside a larger product, at every place in its tile.
TEST(GemmF32, RowAloneEqualsRowInsideLargerM) {
  REQUIRE_KERNEL();
  std::mt19937 rng(5);
  const size_t m = 45, n = 70, k = 300;
  for (bool ta : {false, true}) {
    Matrix a(m, k, ta, 0, rng), b(k, n, false, 0, rng);
    std::vector<float> all(m * n);
    kernel().run(m, n, k, a.view(), b.view(), all.data(), n);
    for (size_t i = 0; i < m; ++i) {
      // Row i alone: a view starting at that row.
      GemmF32Operand row{a.data.data() + (ta ? i : i * a.ld()), a.ld(), ta};
      std::vector<float> one(n);
      kernel().run(1, n, k, row, b.view(), one.data(), n);
      for (size_t j = 0; j < n; ++j) {
        ASSERT_EQ(std::memcmp(&one[j], &all[i * n + j], sizeof(float)), 0)
            << "row " << i << " col " << j << (ta ? " a^T" : "");
      }
    }
  }
}

// The pool's thread count does not change a bit: the chain checks again in child processes of
// 1 and 3 threads.
TEST(GemmF32, ChildrenOf1And3Threads) {
  REQUIRE_KERNEL();
  if (std::getenv("WICK_GEMM_F32_CHILD") != nullptr) GTEST_SKIP() << "in a child already";
  std::vector<char> exe(4096);
  const ssize_t len = readlink("/proc/self/exe", exe.data(), exe.size() - 1);
  ASSERT_GT(len, 0);
  for (int threads : {1, 3}) {
    char cmd[4300];
    std::snprintf(cmd, sizeof cmd,
                  "WICK_GEMM_F32_CHILD=%d '%.*s' "
                  "--gtest_filter='GemmF32.Larger*' > /dev/null 2>&1",
                  threads, static_cast<int>(len), exe.data());
    EXPECT_EQ(std::system(cmd), 0) << cmd;
  }
}

// Every x86-64 build has a kernel for each instruction set of the CPU kernels; cpu_gemm() names it
// where it is the f32 products' default path (AVX-512); with AVX2 it serves batch invariance, and
// the f32 products are OpenBLAS's.
TEST(GemmF32, NamedByCpuGemm) {
  const std::string gemm = wick::cpu_gemm();
  ASSERT_NE(kernel().run, nullptr) << gemm;
  EXPECT_NE(std::string(kernel().name).find("wick " + wick::cpu_isa()), std::string::npos);
  EXPECT_EQ(kernel().default_path, wick::cpu_isa() == "avx512");
  if (kernel().default_path) {
    EXPECT_NE(gemm.find(std::string("f32 ") + kernel().name), std::string::npos) << gemm;
  } else {
    EXPECT_EQ(gemm.find("wick"), std::string::npos) << gemm;
  }
}

// An unknown WICK_CPU_ISA makes cpu_gemm() throw cpu_isa()'s Error (in a fresh process: the
// choice is made once).
TEST(GemmF32DeathTest, CpuGemmThrowsOnAnUnknownIsa) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("WICK_CPU_ISA", "sse9", 1);
        try {
          (void)wick::cpu_gemm();
        } catch (const wick::Error& e) {
          std::exit(std::string(e.what()).find("WICK_CPU_ISA=sse9") != std::string::npos ? 0 : 1);
        }
        std::exit(2);
      },
      ::testing::ExitedWithCode(0), "");
}

// Through matmul (the kernel where the CPU has it, OpenBLAS otherwise): transposed and strided
// (sliced) operands, a batch sharing its right-hand side, against float64.
TEST(GemmF32, MatmulOfViewsWithinTheBound) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto dev = wick::Device::cpu();
  auto random = [&](std::vector<size_t> dims) {
    size_t count = 1;
    for (size_t d : dims) count *= d;
    std::vector<float> v(count);
    for (auto& x : v) x = dist(rng);
    return wick::Tensor::from_vec(v, dims, dev);
  };
  for (const auto& [m, n, k] :
       {std::array<size_t, 3>{33, 100, 257}, {257, 65, 300}, {2, 300, 40}, {300, 2, 40}}) {
    // a: columns 5..5+k of a wider matrix (a padded row-major view); b: a transposed (k x n).
    auto a_full = random({m, k + 9});
    auto a = a_full.narrow(1, 5, k);
    auto b_stored = random({n, k});
    auto b = b_stored.transpose(0, 1);
    auto got = a.matmul(b).to_vec2<float>();
    auto av = a.contiguous().to_vec2<float>();
    auto bv = b_stored.to_vec2<float>();
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < n; ++j) {
        double want = 0, abs_sum = 0;
        for (size_t t = 0; t < k; ++t) {
          const double p = static_cast<double>(av[i][t]) * bv[j][t];
          want += p;
          abs_sum += std::abs(p);
        }
        ASSERT_LE(std::abs(got[i][j] - want),
                  wick::numerics::matmul_bound(wick::DType::F32, k, want, abs_sum))
            << m << " x " << n << " x " << k << " at " << i << ", " << j;
      }
    }
  }
}

}  // namespace
