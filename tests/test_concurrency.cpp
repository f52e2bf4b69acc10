// Threads sharing tensors: writes in opposite orders must not deadlock, writers must not starve
// behind readers, and reads see whole writes. Runs under ThreadSanitizer in CI (scripts/test.sh).
// Every wait is bounded: a watchdog fails the test instead of hanging CI.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "wick/wick.h"

namespace wick {
namespace {

const Device cpu = Device::cpu();

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr int kScale = 1;  // sanitizers run 5-20x slower
#else
constexpr int kScale = 4;
#endif

// Aborts the process when the scope outlives `limit`: a deadlock ends as a failure with a message.
class Watchdog {
 public:
  Watchdog(const char* what, std::chrono::seconds limit)
      : thread_([this, what, limit] {
          std::unique_lock lock(mutex_);
          if (!cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "watchdog: %s did not finish in %lld s (deadlock?)\n", what,
                         static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

Tensor filled(float v, size_t n = 256) {
  return Tensor::full(v, Shape({n}), cpu);
}

TEST(Concurrency, OppositeAssignsDoNotDeadlock) {
  // a.assign(b) took a's write lock then b's read lock: against b.assign(a), each thread held
  // the lock the other waited for.
  Tensor a = filled(1.f), b = filled(2.f);
  Watchdog watchdog("ABBA assigns", std::chrono::seconds(60));
  const int rounds = 500 * kScale;
  std::thread t1([&] {
    for (int i = 0; i < rounds; ++i) a.assign(b);
  });
  std::thread t2([&] {
    for (int i = 0; i < rounds; ++i) b.assign(a);
  });
  t1.join();
  t2.join();
  // Every write copies a whole tensor under the write lock, so each holds one value throughout.
  auto va = a.to_vec1<float>(), vb = b.to_vec1<float>();
  for (float x : va) EXPECT_EQ(x, va[0]);
  for (float x : vb) EXPECT_EQ(x, vb[0]);
}

TEST(Concurrency, AssignsThroughViewsOfOneStorageInBothOrders) {
  // Two views of one storage and one of another, written in a cycle: one lock per storage.
  Tensor base = filled(0.f, 512);
  Tensor lo = base.narrow(0, 0, 256), hi = base.narrow(0, 256, 256), other = filled(5.f);
  Watchdog watchdog("view assigns", std::chrono::seconds(60));
  const int rounds = 300 * kScale;
  std::thread t1([&] {
    for (int i = 0; i < rounds; ++i) lo.assign(other);
  });
  std::thread t2([&] {
    for (int i = 0; i < rounds; ++i) other.assign(hi);
  });
  std::thread t3([&] {
    for (int i = 0; i < rounds; ++i) hi.assign(lo);
  });
  t1.join();
  t2.join();
  t3.join();
  SUCCEED();
}

TEST(Concurrency, WritersAreNotStarvedByReaders) {
  // glibc's shared_mutex prefers readers: with readers looping, 2 of 300 writes finished in 31 s.
  constexpr int kReaders = 7;
  Tensor w = filled(1.f, 4096), v = filled(2.f, 4096);
  std::atomic<bool> stop{false};
  std::atomic<long> reads{0};
  Watchdog watchdog("writer among readers", std::chrono::seconds(60));
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        float s = w.sum_all().to_scalar<float>();
        // A read sees one whole write: every element 1 or every element 2.
        EXPECT_TRUE(s == 4096.f || s == 8192.f) << s;
        reads.fetch_add(1);
      }
    });
  }
  while (reads.load() < kReaders) std::this_thread::yield();  // readers are running
  auto start = std::chrono::steady_clock::now();
  const int writes = 300;
  for (int i = 0; i < writes; ++i) w.assign(i % 2 ? v : filled(1.f, 4096));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stop = true;
  for (auto& t : readers) t.join();
  std::printf("%d writes among %d readers took %.6f s (%ld reads)\n", writes, kReaders, seconds,
              reads.load());
  EXPECT_LT(seconds, 30.0);
}

TEST(Concurrency, ConcurrentRecordingAndBackwardOnSharedLeaves) {
  // Graphs built and differentiated on several threads from the same leaves.
  Tensor x = Tensor::from_vec(std::vector<float>{1, 2, 3, 4}, {2, 2}, cpu).requires_grad();
  Watchdog watchdog("parallel backward", std::chrono::seconds(60));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20 * kScale; ++i) {
        Tensor loss = x.matmul(x).sum_all();
        auto g = loss.backward().get(x)->flatten_all().to_vec1<float>();
        // d/dx sum(x x) = 1 x^T + x^T 1 = [[3, 7], [3, 7]] + [[4, 4], [6, 6]]
        EXPECT_EQ(g, (std::vector<float>{7, 11, 9, 13}));
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(Concurrency, ReadersOfOneStorageTwiceInOneOp) {
  // a.matmul(a) and a.add(a) lock a's storage once; with a writer waiting, locking it twice
  // would deadlock against the writer-fair lock.
  Tensor a = Tensor::ones({16, 16}, DType::F32, cpu);
  std::atomic<bool> stop{false};
  Watchdog watchdog("self ops against a writer", std::chrono::seconds(60));
  std::thread reader([&] {
    while (!stop.load()) {
      a.matmul(a);
      a.add(a);
      a.broadcast_mul(a.narrow(0, 0, 1));
    }
  });
  for (int i = 0; i < 200 * kScale; ++i) a.assign(Tensor::ones({16, 16}, DType::F32, cpu));
  stop = true;
  reader.join();
}

}  // namespace
}  // namespace wick
