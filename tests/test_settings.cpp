// The environment variables users set (src/settings.h): each value outside the accepted ones
// throws wick::Error naming the variable, the value and what is accepted. The parsers are tested
// directly; the end-to-end cases run in a fresh process (settings are read once per process), with
// the variable set before the first op that reads it.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "settings.h"
#include "wick/cuda.h"
#include "wick/quantized.h"
#include "wick/wick.h"

namespace {

using wick::settings::detail::parse_choice;
using wick::settings::detail::parse_flag;
using wick::settings::detail::parse_integer;

// The message of the wick::Error f throws; fails when it throws none or another type.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const wick::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no wick::Error thrown";
  return "";
}

TEST(Settings, IntegersInRange) {
  EXPECT_EQ(parse_integer("WICK_NUM_THREADS", "1", 1, 8, 8), 1);
  EXPECT_EQ(parse_integer("WICK_NUM_THREADS", "8", 1, 8, 8), 8);
  EXPECT_EQ(parse_integer("WICK_CPU_CACHE_MB", "0", 0, 1 << 20, 256), 0);
  EXPECT_EQ(parse_integer("WICK_NUM_THREADS", nullptr, 1, 8, 5), 5);  // unset
  EXPECT_EQ(parse_integer("WICK_NUM_THREADS", "", 1, 8, 5), 5);       // empty: unset
}

TEST(Settings, IntegersRejected) {
  for (const char* bad : {"abc", "0", "-1", "1000", "4x", " 4", "1e3", "99999999999999999999"}) {
    SCOPED_TRACE(bad);
    const std::string m = error_of([&] { parse_integer("WICK_NUM_THREADS", bad, 1, 8, 8); });
    EXPECT_EQ(m, std::string("WICK_NUM_THREADS=") + bad + ": expected an integer from 1 to 8");
  }
}

TEST(Settings, Flags) {
  EXPECT_TRUE(parse_flag("WICK_TRACE", "1", false));
  EXPECT_FALSE(parse_flag("WICK_TRACE", "0", true));
  EXPECT_TRUE(parse_flag("WICK_TRACE", nullptr, true));
  EXPECT_EQ(error_of([] { parse_flag("WICK_CUDA_GRAPHS", "yes", true); }),
            "WICK_CUDA_GRAPHS=yes: expected 0 or 1");
}

TEST(Settings, Choices) {
  EXPECT_EQ(parse_choice("WICK_QMATMUL_ACTIVATIONS", "int8", {"int16", "int8", "f32"}, "int16"),
            "int8");
  EXPECT_EQ(parse_choice("WICK_QMATMUL_ACTIVATIONS", nullptr, {"int16", "int8", "f32"}, "int16"),
            "int16");
  EXPECT_EQ(error_of([] {
              parse_choice("WICK_QMATMUL_ACTIVATIONS", "int4", {"int16", "int8", "f32"}, "int16");
            }),
            "WICK_QMATMUL_ACTIVATIONS=int4: expected one of int16, int8, f32");
  EXPECT_EQ(error_of([] {
              parse_choice("WICK_CPU_ISA", "AVX2", {"avx2", "avx512"}, "");
            }),
            "WICK_CPU_ISA=AVX2: expected one of avx2, avx512");
}

// In a fresh process: `name`=`value`, then `op` must throw wick::Error whose message starts with
// "name=value: expected".
template <class Op>
void expect_rejected_in_process(const char* name, const char* value, Op op) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv(name, value, 1);
        try {
          op();
        } catch (const wick::Error& e) {
          const std::string want = std::string(name) + "=" + value + ": expected";
          std::exit(std::string(e.what()).rfind(want, 0) == 0 ? 0 : 2);
        }
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "");
}

auto sum_op() {
  return [] {
    auto x = wick::Tensor::from_vec<float>({1, 2, 3, 4}, {2, 2}, wick::Device::cpu());
    (void)x.sum({1}).to_vec1<float>();
  };
}

TEST(SettingsDeathTest, NumThreadsRejected) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const std::string above = std::to_string(hw + 1);
  for (const char* bad : {"abc", "0", "-1", "1000"}) {
    SCOPED_TRACE(bad);
    if (std::string(bad) == "1000" && hw >= 1000) continue;
    expect_rejected_in_process("WICK_NUM_THREADS", bad, sum_op());
  }
  expect_rejected_in_process("WICK_NUM_THREADS", above.c_str(), sum_op());
}

TEST(SettingsDeathTest, QmatmulActivationsRejected) {
  expect_rejected_in_process("WICK_QMATMUL_ACTIVATIONS", "int4",
                             [] { (void)wick::qmatmul_cpu_activation_bits(wick::GgmlType::Q4_0); });
}

TEST(SettingsDeathTest, CpuCacheRejected) {
  expect_rejected_in_process("WICK_CPU_CACHE_MB", "-5", [] {
    auto x = wick::Tensor::zeros({1024, 1024}, wick::DType::F32, wick::Device::cpu());
    (void)x;
  });
}

TEST(SettingsDeathTest, CudaSettingsRejected) {
  // Read in either build (the no-CUDA stub answers the same switches).
  expect_rejected_in_process("WICK_CUDA_MATMUL", "fast", [] { (void)wick::cuda_matmul_path(); });
  expect_rejected_in_process("WICK_ALLOW_TF32", "yes", [] { (void)wick::cuda_tf32_allowed(); });
  expect_rejected_in_process("WICK_CUDA_OPS_PER_BATCH", "0",
                             [] { (void)wick::cuda_tf32_allowed(); });
}

TEST(SettingsDeathTest, ValidValuesAccepted) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("WICK_NUM_THREADS", "1", 1);
        setenv("WICK_QMATMUL_ACTIVATIONS", "int8", 1);
        setenv("WICK_CPU_CACHE_MB", "0", 1);
        setenv("WICK_CUDA_MATMUL", "cublas", 1);
        setenv("WICK_ALLOW_TF32", "1", 1);
        sum_op()();
        const bool ok = wick::settings::num_threads() == 1 &&
                        wick::qmatmul_cpu_activation_bits(wick::GgmlType::Q4_0) == 8 &&
                        wick::settings::cpu_cache_mb() == 0 &&
                        wick::cuda_matmul_path() == wick::CudaMatmulPath::Cublas &&
                        wick::cuda_tf32_allowed();
        std::exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// set_batch_invariant (wick/cpu.h) takes the place of WICK_BATCH_INVARIANT, either way, from the
// call on (the default and the variable's value before it).
TEST(SettingsDeathTest, SetBatchInvariantOverridesTheVariable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("WICK_BATCH_INVARIANT", "0", 1);
        const bool before = !wick::settings::batch_invariant() &&
                            wick::settings::batch_invariant_setting() == false;
        wick::set_batch_invariant(true);
        const bool on =
            wick::settings::batch_invariant() && wick::settings::batch_invariant_setting() == true;
        wick::set_batch_invariant(false);
        const bool off = !wick::settings::batch_invariant() &&
                         wick::settings::batch_invariant_setting() == false;
        std::exit(before && on && off ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        unsetenv("WICK_BATCH_INVARIANT");
        const bool before = !wick::settings::batch_invariant() &&
                            !wick::settings::batch_invariant_setting().has_value();
        wick::set_batch_invariant(true);
        std::exit(before && wick::settings::batch_invariant() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
