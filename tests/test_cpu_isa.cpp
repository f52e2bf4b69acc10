// The CPU kernels' instruction set: chosen once, forced by WICK_CPU_ISA. CTest runs this file
// again with WICK_CPU_ISA set and WICK_EXPECT_ISA naming the outcome: "avx2", "avx512", or
// "error" (an unknown value, or AVX-512 asked of a CPU without it, as under qemu -cpu Haswell).

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "wick/cpu.h"
#include "wick/wick.h"

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

TEST(CpuIsa, ChosenAsExpected) {
  const std::string expect = env("WICK_EXPECT_ISA");
  auto x = wick::Tensor::arange(0.0f, 4.0f, wick::Device::cpu());
  if (expect == "error") {
    try {
      wick::cpu_isa();
      FAIL() << "cpu_isa() did not throw with WICK_CPU_ISA=" << env("WICK_CPU_ISA");
    } catch (const wick::Error& e) {
      EXPECT_NE(std::string(e.what()).find("WICK_CPU_ISA="), std::string::npos) << e.what();
    }
    // Every CPU op reports the same error instead of running kernels the CPU lacks.
    EXPECT_THROW((x + x).to_vec1<float>(), wick::Error);
    return;
  }
  const std::string isa = wick::cpu_isa();
  EXPECT_TRUE(isa == "avx2" || isa == "avx512") << isa;
  if (!expect.empty()) {
    EXPECT_EQ(isa, expect);
  }
  EXPECT_EQ((x * x).sum_all().to_scalar<float>(), 14.0f);
}

}  // namespace
