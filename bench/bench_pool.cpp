// The CPU thread pool's fixed cost (src/cpu/parallel.h): one parallel_for of trivial chunks,
// back to back (idle workers spinning) and after the caller worked alone for a while (a decode
// step's serial parts between its parallel ops: a few microseconds keep the workers spinning, a
// millisecond lets them sleep), and the inline path of a job too small to split. Wall time per
// call; run under `chrt -f 10` on a shared machine, or the figures include waiting for a core.
//
//   bench_pool [--benchmark_filter=...]   (WICK_NUM_THREADS: the pool's threads)

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstddef>

#include "cpu/parallel.h"

namespace {

using wick::cpu::num_threads;
using wick::cpu::parallel_for;

std::atomic<size_t> sink{0};

// One chunk per thread and a little work in each: the round trip of a job, not its work.
void job() {
  const size_t n = num_threads();
  parallel_for(n, 1, [](size_t begin, size_t end) {
    sink.fetch_add(end - begin, std::memory_order_relaxed);
  });
}

// The caller alone, busy for `us` microseconds (the serial part between two parallel ops).
void busy(int64_t us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

void BM_pool_back_to_back(benchmark::State& state) {
  job();  // starts the pool
  for (auto _ : state) job();
  state.counters["threads"] = static_cast<double>(num_threads());
}

// Manual time: only the job counts, not the caller's gap before it.
void BM_pool_after_gap_us(benchmark::State& state) {
  job();
  for (auto _ : state) {
    busy(state.range(0));
    auto t0 = std::chrono::steady_clock::now();
    job();
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

void BM_pool_inline(benchmark::State& state) {
  job();
  for (auto _ : state) {
    parallel_for(8, 8, [](size_t begin, size_t end) {
      sink.fetch_add(end - begin, std::memory_order_relaxed);
    });
  }
}

BENCHMARK(BM_pool_back_to_back)->UseRealTime();
// A fixed count of iterations: the minimum time counts the jobs only, not the gaps.
BENCHMARK(BM_pool_after_gap_us)->Arg(2)->Arg(20)->Iterations(20000)->UseManualTime();
BENCHMARK(BM_pool_after_gap_us)->Arg(1000)->Iterations(500)->UseManualTime();
BENCHMARK(BM_pool_inline)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
