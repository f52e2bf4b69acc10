// The environment variables users set (src/settings.h): each value outside the accepted ones
// throws wick::Error naming the variable, the value and what is accepted. The parsers are tested
// directly; the end-to-end cases run in a fresh process (settings are read once per process), with
// the variable set before the first op that reads it.

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "cpu/parallel.h"
#include "settings.h"
#include "wick/cuda.h"
#include "wick/quantized.h"
#include "wick/wick.h"

namespace {

using wick::settings::detail::cgroup_cpu_limit;
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

// A cgroup file system of the test's own under a temporary folder.
struct FakeCgroups {
  std::filesystem::path root = std::filesystem::temp_directory_path() /
                               ("wick-cgroup-" + std::to_string(::getpid()) + "-" +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  FakeCgroups() { std::filesystem::remove_all(root); }
  ~FakeCgroups() { std::filesystem::remove_all(root); }
  void write(const std::string& file, const std::string& text) const {
    const auto path = root / file;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text << "\n";
  }
  size_t limit(const std::string& self_cgroup) const {
    return cgroup_cpu_limit(root.string(), self_cgroup);
  }
};

TEST(Settings, CgroupV2Quota) {
  FakeCgroups fs;
  EXPECT_EQ(fs.limit("0::/\n"), 0u);  // no cpu.max at all
  fs.write("cpu.max", "max 100000");
  EXPECT_EQ(fs.limit("0::/\n"), 0u);
  fs.write("cpu.max", "200000 100000");
  EXPECT_EQ(fs.limit("0::/\n"), 2u);
  fs.write("cpu.max", "150000 100000");  // 1.5 CPUs: rounded up
  EXPECT_EQ(fs.limit("0::/\n"), 2u);
  fs.write("cpu.max", "50000 100000");
  EXPECT_EQ(fs.limit("0::/\n"), 1u);
  // The process's own cgroup and those above it: the smallest quota wins, an unlimited level
  // between them changes nothing.
  fs.write("cpu.max", "800000 100000");
  fs.write("a/cpu.max", "max 100000");
  fs.write("a/b/cpu.max", "300000 100000");
  EXPECT_EQ(fs.limit("0::/a/b\n"), 3u);
  fs.write("a/cpu.max", "250000 100000");
  EXPECT_EQ(fs.limit("0::/a/b\n"), 3u);
  fs.write("a/cpu.max", "120000 100000");
  EXPECT_EQ(fs.limit("0::/a/b\n"), 2u);
  // A path that does not exist in this mount (a container without its own cgroup namespace):
  // the levels that do exist count.
  EXPECT_EQ(fs.limit("0::/docker/0123abcd\n"), 8u);
  // Garbage is no quota, never a crash.
  fs.write("cpu.max", "lots 100000");
  EXPECT_EQ(fs.limit("0::/\n"), 0u);
  fs.write("cpu.max", "100000 0");
  EXPECT_EQ(fs.limit("0::/\n"), 0u);
  EXPECT_EQ(fs.limit("garbage\n0:\n::\n"), 0u);
}

TEST(Settings, CgroupV1Quota) {
  FakeCgroups fs;
  const std::string self = "4:memory:/job\n3:cpu,cpuacct:/job\n2:cpuset:/job\n";
  fs.write("cpu,cpuacct/cpu.cfs_quota_us", "-1");
  fs.write("cpu,cpuacct/cpu.cfs_period_us", "100000");
  EXPECT_EQ(fs.limit(self), 0u);
  fs.write("cpu,cpuacct/job/cpu.cfs_quota_us", "350000");
  fs.write("cpu,cpuacct/job/cpu.cfs_period_us", "100000");
  EXPECT_EQ(fs.limit(self), 4u);
  // Only the hierarchy with the cpu controller counts (not cpuacct or cpuset alone).
  fs.write("cpuset/job/cpu.cfs_quota_us", "100000");
  fs.write("cpuset/job/cpu.cfs_period_us", "100000");
  EXPECT_EQ(fs.limit(self), 4u);
  EXPECT_EQ(fs.limit("3:cpuacct:/job\n"), 0u);
}

// The CPUs of the affinity mask bound the count; the hardware count bounds it too.
TEST(Settings, AvailableCpusFollowTheAffinity) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  const size_t before = wick::settings::available_cpus();
  EXPECT_GE(before, 1u);
  EXPECT_LE(before, std::max(1u, std::thread::hardware_concurrency()));
  EXPECT_LE(before, static_cast<size_t>(CPU_COUNT(&saved)));
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  EXPECT_EQ(wick::settings::available_cpus(), 1u);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_EQ(wick::settings::available_cpus(), before);
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

// The CPU thread pool starts with as many threads as the process has CPUs (one here, through its
// affinity), unless WICK_NUM_THREADS asks for another count.
TEST(SettingsDeathTest, ThreadPoolStartsWithTheAvailableCpus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto pin_to_one_cpu = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) std::exit(3);
    int first = 0;
    while (!CPU_ISSET(first, &set)) ++first;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) std::exit(3);
  };
  EXPECT_EXIT(
      {
        unsetenv("WICK_NUM_THREADS");
        pin_to_one_cpu();
        sum_op()();
        std::exit(wick::settings::num_threads() == 1 && wick::cpu::num_threads() == 1 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one hardware thread";
  EXPECT_EXIT(
      {
        setenv("WICK_NUM_THREADS", "2", 1);
        pin_to_one_cpu();
        sum_op()();
        std::exit(wick::settings::num_threads() == 2 && wick::cpu::num_threads() == 2 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
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
