#include "cpu/parallel.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "settings.h"
#include "util.h"
#include "wick/cpu.h"
#include "wick/error.h"
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace wick::cpu {

namespace {

// Set while a thread runs a chunk, so that nested parallel_for calls run inline instead of
// waiting for the pool that runs them.
thread_local bool in_parallel_region = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

using Clock = std::chrono::steady_clock;

// The pool's job word: epoch (24 bits) | chunk count (20 bits) | next unclaimed chunk (20 bits).
// A thread claims a chunk with one fetch_add, which also tells it which job and how many chunks
// the chunk belongs to, so a thread that wakes late can never run a chunk of a job it did not
// read. The next field overshoots the chunk count by at most one per thread per job.
constexpr int kCountBits = 20;
constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
constexpr uint64_t kEpochMask = (uint64_t{1} << 24) - 1;
constexpr size_t kMaxChunks = size_t{1} << (kCountBits - 1);
// Chunks per thread: small enough to share out what a thread descheduled by the OS leaves.
constexpr size_t kChunksPerThread = 4;
// Pauses (some 40-140 cycles each) between a waiting worker's looks at the clock, and before the
// submitting thread on an oversubscribed machine starts yielding while it waits for the workers'
// last chunks.
constexpr unsigned kCheckEvery = 64;
constexpr unsigned kCallerSpins = 64;
// How long an idle worker spins before it sleeps (it sleeps at once on an oversubscribed machine).
constexpr size_t kSpinUs = 300;

// Whether the machine has more runnable threads than CPUs, on average: the running count of
// /proc/loadavg, read at most every kLoadCheckMs, smoothed over a few reads (each read moves the
// average kLoadSmoothing of the way). A single read catches whatever thread was awake at that
// instant -- a server's HTTP thread writing a token, its client reading it -- and a pool that
// took that for a loaded machine slept between jobs for the next kLoadCheckMs. Spinning workers on
// a machine that stays oversubscribed only take CPU time from the threads with work, while
// sleeping ones get the scheduler's wake-up preference: they sleep at once.
constexpr int kLoadCheckMs = 20;
constexpr int64_t kLoadSmoothing = 4;  // the average moves 1/4 of the way a read
bool loadavg_oversubscribed() {
  static const long cpus = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  static std::atomic<int64_t> next_check{0};
  // The average running count, in thousandths; -1 before the first read.
  static std::atomic<int64_t> average_milli{-1};
  static std::atomic<bool> over{false};
  const int64_t now = Clock::now().time_since_epoch().count();
  int64_t next = next_check.load(std::memory_order_relaxed);
  if (now < next ||
      !next_check.compare_exchange_strong(next, now + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::milliseconds(kLoadCheckMs))
                                                          .count())) {
    return over.load(std::memory_order_relaxed);
  }
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    double l1, l5, l15;
    long running = 0, total = 0;
    if (std::fscanf(f, "%lf %lf %lf %ld/%ld", &l1, &l5, &l15, &running, &total) == 5) {
      // Only the thread that won the compare-exchange above gets here: no other writer.
      const int64_t sample = int64_t{running} * 1000;
      int64_t average = average_milli.load(std::memory_order_relaxed);
      average = average < 0 ? sample : average + (sample - average) / kLoadSmoothing;
      average_milli.store(average, std::memory_order_relaxed);
      // Above cpus + 1/2: a thread more than the CPUs on most reads.
      over.store(average > int64_t{cpus} * 1000 + 500, std::memory_order_relaxed);
    }
    std::fclose(f);
  }
  return over.load(std::memory_order_relaxed);
}

// Whether the calling thread runs under a real-time policy (SCHED_FIFO or SCHED_RR, e.g. under
// `chrt`): the runnable threads of other processes, at the normal policy, never preempt it.
bool realtime_policy() {
  const int policy = sched_getscheduler(0);
  return policy == SCHED_FIFO || policy == SCHED_RR;
}

uint64_t epoch_of(uint64_t w) {
  return w >> (2 * kCountBits);
}

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads)
      : size_(threads),
        spin_(std::chrono::microseconds(kSpinUs)),
        // Workers inherit the creating thread's policy. Real-time threads no more than the CPUs
        // own theirs whatever else is runnable: the load average says nothing about them.
        watch_load_(!realtime_policy() ||
                    threads > static_cast<size_t>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)))) {
    // The calling thread takes part in every job, so the pool needs threads - 1 workers.
    for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      stop_.store(true, std::memory_order_seq_cst);
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  size_t size() const { return size_; }

  // Runs the job on the pool; false (nothing run) when another thread's job has it.
  bool try_run(size_t n, size_t chunks, RangeFn fn, void* ctx) {
    std::unique_lock<std::mutex> submit(submit_, std::try_to_lock);
    if (!submit.owns_lock()) return false;
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    chunk_size_ = (n + chunks - 1) / chunks;
    chunks = (n + chunk_size_ - 1) / chunk_size_;
    done_.store(0, std::memory_order_relaxed);
    epoch_ = (epoch_ + 1) & kEpochMask;
    if (epoch_ == 0) epoch_ = 1;
    // seq_cst with the load of sleepers_ below, against the workers' increment of sleepers_
    // and their check of word_: either a worker sees this job or this thread sees it asleep.
    word_.store((epoch_ << (2 * kCountBits)) | (uint64_t{chunks} << kCountBits),
                std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      { std::lock_guard<std::mutex> lock(sleep_mutex_); }
      wake_.notify_all();
    }
    in_parallel_region = true;
    run_chunks();
    in_parallel_region = false;
    // Chunks taken by workers may still run, usually ending within microseconds: spin. On an
    // oversubscribed machine yield after a few spins, so that a worker the OS preempted
    // mid-chunk gets a CPU; otherwise a yield only delays noticing the workers' end.
    const bool polite = watch_load_ && loadavg_oversubscribed();
    for (unsigned i = 0; done_.load(std::memory_order_acquire) < chunks; ++i) {
      if (!polite || i < kCallerSpins) {
        cpu_relax();
      } else {
        std::this_thread::yield();
      }
    }
    if (error_) {
      std::exception_ptr e = std::exchange(error_, nullptr);
      std::rethrow_exception(e);
    }
    return true;
  }

 private:
  // Claims and runs chunks of the current job until none is left; returns that job's epoch.
  // The chunks run are counted once at the end (done_ is the line the submitter polls).
  uint64_t run_chunks() {
    size_t ran = 0;
    for (;; ++ran) {
      uint64_t w = word_.fetch_add(1, std::memory_order_acq_rel);
      size_t c = w & kCountMask;
      size_t chunks = (w >> kCountBits) & kCountMask;
      if (c >= chunks) {
        if (ran > 0) done_.fetch_add(ran, std::memory_order_release);
        return epoch_of(w);
      }
      size_t begin = c * chunk_size_;
      size_t end = std::min(n_, begin + chunk_size_);
      try {
        fn_(ctx_, begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  // Waits for a job of another epoch than `seen`: spins for spin_ unless the machine is
  // oversubscribed, then sleeps. False on stop.
  bool wait_for_job(uint64_t seen) {
    auto changed = [&] { return epoch_of(word_.load(std::memory_order_seq_cst)) != seen; };
    auto start = Clock::now();
    const bool spin = spin_.count() > 0 && !(watch_load_ && loadavg_oversubscribed());
    for (unsigned i = 1; spin; ++i) {
      if (changed()) return true;
      cpu_relax();
      if ((i & (kCheckEvery - 1)) == 0) {
        if (stop_.load(std::memory_order_relaxed)) return false;
        if (Clock::now() - start > spin_) break;
      }
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      wake_.wait(lock, [&] { return stop_.load(std::memory_order_seq_cst) || changed(); });
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return !stop_.load(std::memory_order_relaxed);
  }

  void worker_loop() {
    in_parallel_region = true;
    uint64_t seen = 0;
    while (wait_for_job(seen)) seen = run_chunks();
  }

  const size_t size_;
  const Clock::duration spin_;
  const bool watch_load_;  // whether an oversubscribed machine makes idle workers sleep at once
  // The job, written by the submitting thread before it stores word_ (release), read by a
  // thread only after it claimed a chunk from that word: never rewritten while chunks run.
  RangeFn fn_ = nullptr;
  void* ctx_ = nullptr;
  size_t n_ = 0;
  size_t chunk_size_ = 1;
  uint64_t epoch_ = 0;  // the submitter's
  std::exception_ptr error_;
  std::mutex error_mutex_;
  std::mutex submit_;  // one job at a time

  alignas(64) std::atomic<uint64_t> word_{0};
  alignas(64) std::atomic<size_t> done_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::vector<std::thread> workers_;
};

// set_cpu_threads' count (0: none), and whether the pool has taken its count.
std::atomic<size_t> forced_threads{0};
std::atomic<bool> pool_started{false};

// The count the pool starts with: set_cpu_threads', else settings::num_threads().
size_t requested_threads() {
  const size_t forced = forced_threads.load();
  return forced > 0 ? forced : settings::num_threads();
}

size_t pool_threads() {
  pool_started = true;
  return requested_threads();
}

ThreadPool& pool() {
  static ThreadPool p(pool_threads());
  return p;
}

}  // namespace

size_t num_threads() {
  return pool().size();
}

bool threads_forced() {
  return forced_threads.load() > 0;
}

void parallel_for_raw(size_t n, size_t grain, RangeFn fn, void* ctx) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  if (n < 2 * grain || in_parallel_region) {
    fn(ctx, 0, n);
    return;
  }
  ThreadPool& p = pool();
  size_t chunks = std::min({p.size() * kChunksPerThread, n / grain, kMaxChunks});
  // A multiple of the thread count, so that threads running alike end together.
  if (chunks > p.size()) chunks -= chunks % p.size();
  if (p.size() <= 1 || chunks <= 1 || !p.try_run(n, chunks, fn, ctx)) fn(ctx, 0, n);
}

}  // namespace wick::cpu

namespace wick {

size_t cpu_threads() {
  return cpu::pool_started.load() ? cpu::num_threads() : cpu::requested_threads();
}

void set_cpu_threads(size_t n) {
  if (n == 0 || n > 1024) throw Error(str("set_cpu_threads: n must be in [1, 1024], got ", n));
  if (!cpu::pool_started.load()) cpu::forced_threads = n;
  if (cpu::pool_started.load() && cpu::num_threads() != n) {
    throw Error(str("set_cpu_threads(", n, "): the CPU thread pool already runs ",
                    cpu::num_threads(), " threads"));
  }
}

}  // namespace wick
