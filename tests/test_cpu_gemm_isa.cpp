// The CPU GEMM's kernels against the processor it runs on: they must use the best instruction
// set the CPU (and its OS) offers, so that a BLAS that does not know the processor (OpenBLAS
// 0.3.21 runs SSE3 kernels on CPUs newer than its model list) never passes unnoticed. The CPU's
// features are read here with cpuid and xgetbv, apart from the library's own detection.

#include <cpuid.h>
#include <gtest/gtest.h>
#include <strings.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "wick/cpu.h"
#include "wick/numerics.h"
#include "wick/wick.h"

namespace {

uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// The best f32 GEMM instruction set of this CPU and OS: "avx512" (F, DQ, BW, VL with the
// opmask and upper ZMM state enabled), "avx2" (with FMA), "avx" or "sse".
std::string best_isa() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return "sse";
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12);
  if (!osxsave || !avx) return "sse";
  const uint64_t xcr = xcr0();
  if ((xcr & 0x6) != 0x6) return "sse";  // XMM and YMM state
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return "avx";
  const bool avx2 = b7 & (1u << 5);
  const bool f = b7 & (1u << 16), dq = b7 & (1u << 17), bw = b7 & (1u << 30), vl = b7 & (1u << 31);
  if (f && dq && bw && vl && (xcr & 0xe6) == 0xe6) return "avx512";
  if (avx2 && fma) return "avx2";
  return "avx";
}

// OpenBLAS's x86-64 cores with kernels above SSE, by instruction set.
std::string core_isa(const std::string& core) {
  static const std::array<std::pair<const char*, const char*>, 10> cores{{
      {"SapphireRapids", "avx512"},
      {"Cooperlake", "avx512"},
      {"SkylakeX", "avx512"},
      {"Haswell", "avx2"},
      {"Zen", "avx2"},
      {"Excavator", "avx"},
      {"Steamroller", "avx"},
      {"Piledriver", "avx"},
      {"Bulldozer", "avx"},
      {"Sandybridge", "avx"},
  }};
  for (const auto& [name, isa] : cores) {
    if (strcasecmp(name, core.c_str()) == 0) return isa;
  }
  return "sse";
}

// The core named in cpu_gemm(): OpenBLAS's configuration is "OpenBLAS <version> <options...>
// <core> MAX_THREADS=<n> [isa]"; the core is the word before MAX_THREADS.
std::string core_of(const std::string& gemm) {
  std::istringstream in(gemm);
  std::string word, prev;
  while (in >> word) {
    if (word.rfind("MAX_THREADS=", 0) == 0) return prev;
    prev = word;
  }
  return "";
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

TEST(CpuGemmIsa, KernelsUseTheBestInstructionSetOfTheCpu) {
  const std::string gemm = wick::cpu_gemm();
  const std::string core = core_of(gemm);
  ASSERT_FALSE(core.empty()) << gemm;
  const std::string forced = env("OPENBLAS_CORETYPE");
  if (!forced.empty()) {
    // The user's choice is kept (OpenBLAS itself resolves the name, falling back on its own
    // detection for a name it does not know).
    GTEST_SKIP() << "OPENBLAS_CORETYPE=" << forced << " chooses the kernels: " << gemm;
  }
  const std::string best = best_isa();
  EXPECT_EQ(core_isa(core), best) << "CPU GEMM: " << gemm << "; this CPU offers " << best;
  EXPECT_EQ(wick::cpu_gemm_isa(), best) << gemm;
  EXPECT_NE(gemm.find("[" + best + "]"), std::string::npos) << gemm;
  // wick's own CPU kernels (the f32 GEMM, attention, element-wise ops) run the best set the
  // build has for this CPU, unless WICK_CPU_ISA forces one.
  if (env("WICK_CPU_ISA").empty()) {
#if defined(WICK_TEST_AVX512_KERNELS)
    const std::string kernels = best == "avx512" ? "avx512" : "avx2";
#else
    const std::string kernels = "avx2";
#endif
    EXPECT_EQ(wick::cpu_isa(), kernels) << "this CPU offers " << best;
  }
  // On an AVX-512 CPU the f32 products take wick's own AVX-512 GEMM, unless the CPU kernels are
  // forced down to AVX2 (or the build has no AVX-512 kernels: its cpu_isa() is "avx2" then too).
  if (best == "avx512" && wick::cpu_isa() == "avx512") {
    EXPECT_NE(gemm.find("f32 wick avx512"), std::string::npos) << gemm;
  }
}

// The quantized matmuls' integer kernels: AVX512-VNNI's VPDPBUSD wherever the CPU has it and
// wick's kernels run AVX-512, else AVX2's VPMADDUBSW.
TEST(CpuGemmIsa, QuantizedKernelsUseVnniWhereTheCpuHasIt) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool vnni = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11)) != 0;
  const bool want_vnni = vnni && wick::cpu_isa() == "avx512";
  EXPECT_EQ(wick::cpu_qmatmul_isa(), want_vnni ? "avx512-vnni" : "avx2")
      << "CPU kernels " << wick::cpu_isa() << ", AVX512-VNNI " << vnni;
}

// f32 products through the kernels chosen, against a float64 reference: sizes that take
// OpenBLAS's packed sgemm (several blocks and edges) and its gemv, each operand row- or
// column-major (a transposed view), split across the thread pool by rows (m >= n) or by
// columns, and a batch.
TEST(CpuGemmIsa, ProductsOfTheChosenKernelsAreRight) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto dev = wick::Device::cpu();
  // (b, m, n, k)
  for (const auto& dims : {std::array<size_t, 4>{1, 300, 257, 413},
                           {1, 37, 700, 129},
                           {1, 1, 700, 520},
                           {1, 700, 1, 520},
                           {1, 64, 64, 64},
                           {3, 90, 70, 50}}) {
    const size_t bt = dims[0], m = dims[1], n = dims[2], k = dims[3];
    for (int trans = 0; trans < 4; ++trans) {
      const bool ta = trans & 1, tb = trans & 2;
      std::vector<float> a(bt * m * k), b(bt * k * n);
      for (auto& v : a) v = dist(rng);
      for (auto& v : b) v = dist(rng);
      // a[(bi * m + i) * k + t] and b[(bi * k + t) * n + j] whichever the storage.
      auto stored = [&](const std::vector<float>& v, size_t rows, size_t cols, bool t) {
        if (!t) return wick::Tensor::from_vec(v, {bt, rows, cols}, dev);
        std::vector<float> tr(v.size());
        for (size_t bi = 0; bi < bt; ++bi) {
          for (size_t r = 0; r < rows; ++r) {
            for (size_t c = 0; c < cols; ++c) {
              tr[(bi * cols + c) * rows + r] = v[(bi * rows + r) * cols + c];
            }
          }
        }
        return wick::Tensor::from_vec(tr, {bt, cols, rows}, dev).transpose(1, 2);
      };
      auto got = stored(a, m, k, ta).matmul(stored(b, k, n, tb)).flatten_all().to_vec1<float>();
      ASSERT_EQ(got.size(), bt * m * n);
      for (size_t bi = 0; bi < bt; ++bi) {
        for (size_t i = 0; i < m; ++i) {
          for (size_t j = 0; j < n; ++j) {
            double want = 0, abs_sum = 0;
            for (size_t t = 0; t < k; ++t) {
              const double p =
                  static_cast<double>(a[(bi * m + i) * k + t]) * b[(bi * k + t) * n + j];
              want += p;
              abs_sum += std::abs(p);
            }
            const double bound = wick::numerics::matmul_bound(wick::DType::F32, k, want, abs_sum);
            ASSERT_LE(std::abs(got[(bi * m + i) * n + j] - want), bound)
                << "(" << bt << ", " << m << ", " << n << ", " << k << ") trans " << trans << " at "
                << bi << ", " << i << ", " << j;
          }
        }
      }
    }
  }
}

}  // namespace
