// wick::set_cpu_threads (include/wick/cpu.h): the count the CPU thread pool starts with. Its own
// executable, so that no earlier test has started the pool.

#include <gtest/gtest.h>

#include <string>

#include "wick/cpu.h"
#include "wick/wick.h"

namespace {

TEST(CpuThreads, SetBeforeTheFirstOpThenFixed) {
  EXPECT_THROW(wick::set_cpu_threads(0), wick::Error);
  EXPECT_THROW(wick::set_cpu_threads(1025), wick::Error);
  wick::set_cpu_threads(3);
  EXPECT_EQ(wick::cpu_threads(), 3u);
  wick::set_cpu_threads(3);  // the same count again: fine
  // A large element-wise op runs on the pool, which starts with 3 threads.
  auto dev = wick::Device::cpu();
  auto a = wick::Tensor::ones({1 << 20}, wick::DType::F32, dev);
  EXPECT_EQ(a.add(a).sum_all().to_scalar<float>(), 2.0f * (1 << 20));
  EXPECT_EQ(wick::cpu_threads(), 3u);
  wick::set_cpu_threads(3);
  try {
    wick::set_cpu_threads(2);
    FAIL() << "no error";
  } catch (const wick::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already runs 3 threads"), std::string::npos) << e.what();
  }
}

}  // namespace
