// The CPU backend's thread pool (src/cpu/parallel.h): every index run exactly once, whatever the
// split; exceptions carried to the caller; nested and concurrent calls; workers woken from sleep;
// a pool of real-time threads (which spin whatever the load average says).

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu/parallel.h"
#include "wick/cpu.h"

namespace {

using wick::cpu::num_threads;
using wick::cpu::parallel_for;

// Runs parallel_for(n, grain) and checks that each index of [0, n) was visited exactly once, in
// chunks of at least `grain` items except the last.
::testing::AssertionResult covers_once(size_t n, size_t grain) {
  std::unique_ptr<std::atomic<int>[]> hits(new std::atomic<int>[n]);
  for (size_t i = 0; i < n; ++i) hits[i] = 0;
  std::atomic<size_t> short_chunks{0};
  parallel_for(n, grain, [&](size_t begin, size_t end) {
    if (end - begin < grain && end != n) short_chunks.fetch_add(1);
    for (size_t i = begin; i < end; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
  });
  for (size_t i = 0; i < n; ++i) {
    if (hits[i] != 1) {
      return ::testing::AssertionFailure() << "n " << n << ", grain " << grain << ": index " << i
                                           << " ran " << hits[i] << " times";
    }
  }
  if (short_chunks != 0) {
    return ::testing::AssertionFailure()
           << "n " << n << ", grain " << grain << ": " << short_chunks << " chunks below the grain";
  }
  return ::testing::AssertionSuccess();
}

TEST(CpuParallel, EveryIndexOnceOverManySplits) {
  std::mt19937 rng(3);
  for (int r = 0; r < 20000; ++r) {
    size_t n = rng() % 300;
    size_t grain = 1 + rng() % 40;
    ASSERT_TRUE(covers_once(n, grain));
  }
  ASSERT_TRUE(covers_once(1 << 20, 1));
  ASSERT_TRUE(covers_once(1 << 20, 1000));
}

TEST(CpuParallel, UsesTheWorkers) {
  if (num_threads() < 2) GTEST_SKIP() << "one thread (WICK_NUM_THREADS or a single CPU)";
  std::mutex mutex;
  std::set<std::thread::id> ids;
  // Chunks that sleep leave the CPU to the workers even on a loaded machine.
  parallel_for(64, 1, [&](size_t, size_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mutex);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_GE(ids.size(), 2u);
  EXPECT_LE(ids.size(), num_threads());
}

TEST(CpuParallel, ExceptionReachesTheCaller) {
  for (int r = 0; r < 100; ++r) {
    EXPECT_THROW(parallel_for(1000, 1,
                              [&](size_t begin, size_t end) {
                                if (begin <= 500 && 500 < end) throw std::out_of_range("500");
                              }),
                 std::out_of_range);
    ASSERT_TRUE(covers_once(1000, 3));  // the pool still works
  }
}

TEST(CpuParallel, NestedCallsRunInline) {
  std::vector<std::atomic<int>> hits(64 * 64);
  parallel_for(64, 1, [&](size_t b0, size_t e0) {
    for (size_t i = b0; i < e0; ++i) {
      parallel_for(64, 1, [&](size_t b1, size_t e1) {
        for (size_t j = b1; j < e1; ++j) hits[i * 64 + j].fetch_add(1);
      });
    }
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << i;
}

TEST(CpuParallel, ConcurrentCallersAllComplete) {
  // One job has the pool at a time; the other callers run theirs inline.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int r = 0; r < 2000; ++r) {
        if (!covers_once(1 + rng() % 500, 1 + rng() % 8)) failures.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, 0);
}

TEST(CpuParallel, SleepingWorkersWake) {
  // Workers idle for longer than they spin (300 us by default) sleep; jobs still complete.
  for (int r = 0; r < 20; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(covers_once(10000, 10));
  }
}

// Exit status of a child that could not take a real-time policy (no CAP_SYS_NICE).
constexpr int kNoRealtime = 77;

// Runs in the child processes of RealTimePool: jobs from a SCHED_FIFO process, with gaps that
// let the workers spin (short) and sleep (long).
TEST(CpuParallel, RealTimeChild) {
  const char* threads = std::getenv("WICK_TEST_RT_THREADS");
  if (threads == nullptr) GTEST_SKIP() << "runs in the child processes of RealTimePool";
  sched_param param{};
  param.sched_priority = 1;
  if (sched_setscheduler(0, SCHED_FIFO, &param) != 0) std::exit(kNoRealtime);
  wick::set_cpu_threads(std::stoul(threads));
  ASSERT_EQ(num_threads(), std::stoul(threads));
  for (int r = 0; r < 200; ++r) {
    if (r % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(covers_once(1000 + r, 1 + r % 7));
  }
  std::vector<std::atomic<int>> hits(256);
  parallel_for(256, 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) hits[i].fetch_add(1);
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << i;
}

TEST(CpuParallel, RealTimePool) {
  // As many threads as CPUs (the workers spin) and one more (they may not: a spinning real-time
  // worker would hold the CPU its caller waits for).
  const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  for (long threads : {std::max(2L, cpus), cpus + 1}) {
    std::string cmd = "WICK_TEST_RT_THREADS=" + std::to_string(threads) + " timeout 120 /proc/" +
                      std::to_string(getpid()) +
                      "/exe --gtest_filter=CpuParallel.RealTimeChild > /dev/null 2>&1";
    int rc = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(rc)) << cmd;
    if (WEXITSTATUS(rc) == kNoRealtime) GTEST_SKIP() << "no real-time policy for this process";
    EXPECT_EQ(WEXITSTATUS(rc), 0) << cmd;
  }
}

}  // namespace
