// Threads sharing tensors: writes in opposite orders must not deadlock, writers must not starve
// behind readers, and reads see whole writes. Runs under ThreadSanitizer in CI (scripts/test.sh).
// Every wait is bounded: a watchdog fails the test instead of hanging CI.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
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

// Starts `n` threads running body(i) together, so that their loops overlap.
void run_together(int n, const std::function<void(int)>& body) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield();
      body(i);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(Concurrency, OppositeAssignsDoNotDeadlock) {
  // a.assign(b) took a's write lock then b's read lock: against b.assign(a), each thread held
  // the lock the other waited for.
  // Large enough that each copy holds its locks a while, so the two loops collide.
  const size_t n = size_t{1} << 16;
  Tensor a = filled(1.f, n), b = filled(2.f, n);
  Watchdog watchdog("ABBA assigns", std::chrono::seconds(60));
  const int rounds = 500 * kScale;
  run_together(2, [&](int who) {
    for (int i = 0; i < rounds; ++i) who ? b.assign(a) : a.assign(b);
  });
  // Every write copies a whole tensor under the write lock, so each holds one value throughout.
  auto va = a.to_vec1<float>(), vb = b.to_vec1<float>();
  for (float x : va) EXPECT_EQ(x, va[0]);
  for (float x : vb) EXPECT_EQ(x, vb[0]);
}

TEST(Concurrency, AssignsThroughViewsOfOneStorageInBothOrders) {
  // Two views of one storage and one of another, written in a cycle: one lock per storage.
  const size_t n = size_t{1} << 15;
  Tensor base = filled(0.f, 2 * n);
  Tensor lo = base.narrow(0, 0, n), hi = base.narrow(0, n, n), other = filled(5.f, n);
  Watchdog watchdog("view assigns", std::chrono::seconds(60));
  const int rounds = 300 * kScale;
  run_together(3, [&](int who) {
    for (int i = 0; i < rounds; ++i) {
      if (who == 0) lo.assign(other);
      if (who == 1) other.assign(hi);
      if (who == 2) hi.assign(lo);
    }
  });
  for (float x : base.to_vec1<float>()) EXPECT_TRUE(x == 0.f || x == 5.f);
}

TEST(Concurrency, WritersAreNotStarvedByReaders) {
  // glibc's shared_mutex prefers readers: with readers looping, 2 of 300 writes finished in 31 s.
  constexpr int kReaders = 7;
  // Each sum holds the read lock a while, so reads overlap (smaller under the slow sanitizers).
  const size_t n = kScale > 1 ? size_t{1} << 18 : size_t{1} << 14;
  const float ones = static_cast<float>(n);
  Tensor w = filled(1.f, n), v = filled(2.f, n);
  std::atomic<bool> stop{false};
  std::atomic<long> reads{0};
  const int writes = 100 * kScale;
  int written = 0;
  double seconds = 0;
  Watchdog watchdog("writer among readers", std::chrono::seconds(90));
  run_together(kReaders + 1, [&](int who) {
    if (who < kReaders) {
      while (!stop.load()) {
        float s = w.sum_all().to_scalar<float>();
        // A read sees one whole write: every element 1 or every element 2.
        EXPECT_TRUE(s == ones || s == 2 * ones) << s;
        reads.fetch_add(1);
      }
      return;
    }
    while (reads.load() < kReaders) std::this_thread::yield();  // readers are reading
    auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    // Bounded: a starved writer gives up after 20 s and the test fails on the count.
    for (; written < writes && elapsed() < 20; ++written)
      w.assign(written % 2 ? v : v.affine(0.5, 0));
    seconds = elapsed();
    stop = true;
  });
  std::printf("%d of %d writes among %d readers in %.3f s (%ld reads)\n", written, writes, kReaders,
              seconds, reads.load());
  EXPECT_EQ(written, writes);
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
