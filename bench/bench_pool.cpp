// The CPU thread pool's fixed cost (src/cpu/parallel.h): one parallel_for of trivial chunks,
// back to back (idle workers spinning) and after the caller worked alone for a while (a decode
// step's serial parts between its parallel ops: a few microseconds keep the workers spinning, a
// millisecond lets them sleep), and the inline path of a job too small to split. Wall time per
// call; run under `chrt -f 10` on a shared machine, or the figures include waiting for a core.
// BM_pool_compute_ceiling is the other yardstick: arithmetic alone (no memory traffic) split over
// the pool, whose rate at 2 threads over 1 is the most that any compute-bound path (a decode
// step) can gain from the second thread on this machine (a VM's vCPUs may share cores);
// BM_pool_read_ceiling the same for a path bound by reading memory.
//
//   bench_pool [--benchmark_filter=...]   (WICK_NUM_THREADS: the pool's threads)

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/parallel.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

// Eight independent chains of multiply-adds in registers, `steps` steps each: scalar 64-bit
// integers, or AVX2's u8 x s8 pair sums (the instruction of qmatmul's decode tiles on AVX2).
uint64_t scalar_chains(size_t steps) {
  uint64_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  for (size_t i = 0; i < steps; ++i) {
    for (uint64_t& v : x) v = v * 6364136223846793005ULL + 1442695040888963407ULL;
  }
  uint64_t sum = 0;
  for (uint64_t v : x) sum += v;
  return sum;
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t avx2_chains(size_t steps) {
  __m256i x[8];
  for (int i = 0; i < 8; ++i) x[i] = _mm256_set1_epi8(static_cast<char>(i + 1));
  const __m256i w = _mm256_set1_epi8(3);
  for (size_t s = 0; s < steps; ++s) {
    for (__m256i& v : x) v = _mm256_maddubs_epi16(v, w);
  }
  uint64_t sum = 0;
  for (const __m256i& v : x) sum += static_cast<uint64_t>(_mm256_extract_epi64(v, 0));
  return sum;
}
bool have_avx2() {
  return __builtin_cpu_supports("avx2");
}
#else
uint64_t avx2_chains(size_t) {
  return 0;
}  // never called: have_avx2() is false
bool have_avx2() {
  return false;
}
#endif

// 64 chunks of chains (about a millisecond a job on one thread) split over the pool. Arg: 0
// scalar, 1 AVX2.
void BM_pool_compute_ceiling(benchmark::State& state) {
  constexpr size_t kChunks = 64, kSteps = 4096;
  const bool simd = state.range(0) == 1;
  if (simd && !have_avx2()) {
    state.SkipWithError("no AVX2 on this CPU");
    return;
  }
  job();
  for (auto _ : state) {
    parallel_for(kChunks, 1, [simd](size_t begin, size_t end) {
      uint64_t sum = 0;
      for (size_t c = begin; c < end; ++c)
        sum += simd ? avx2_chains(kSteps) : scalar_chains(kSteps);
      sink.fetch_add(static_cast<size_t>(sum & 1), std::memory_order_relaxed);
    });
  }
  state.SetLabel(simd ? "avx2 maddubs" : "scalar mul-add");
  state.counters["threads"] = static_cast<double>(num_threads());
  state.counters["Gchain-steps/s"] = benchmark::Counter(
      kChunks * kSteps * 8 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// A plain read of 256 MiB (far past any L3), 64 chunks split over the pool: the rate at which
// this machine's cores read memory at all, the ceiling of a decode step that streams its weights
// (the bytes it reads a token times tokens/s).
void BM_pool_read_ceiling(benchmark::State& state) {
  constexpr size_t kBytes = size_t{256} << 20, kChunks = 64;
  std::vector<uint64_t> buffer(kBytes / sizeof(uint64_t), 1);
  const uint64_t* data = buffer.data();
  const size_t per_chunk = buffer.size() / kChunks;
  job();
  for (auto _ : state) {
    parallel_for(kChunks, 1, [&](size_t begin, size_t end) {
      uint64_t sum[4] = {};
      for (size_t i = begin * per_chunk; i < end * per_chunk; i += 4) {
        for (size_t l = 0; l < 4; ++l) sum[l] += data[i + l];
      }
      sink.fetch_add(static_cast<size_t>((sum[0] + sum[1] + sum[2] + sum[3]) & 1),
                     std::memory_order_relaxed);
    });
  }
  state.counters["threads"] = static_cast<double>(num_threads());
  state.counters["GB/s"] =
      benchmark::Counter(kBytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_pool_back_to_back)->UseRealTime();
BENCHMARK(BM_pool_read_ceiling)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_pool_compute_ceiling)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);
// A fixed count of iterations: the minimum time counts the jobs only, not the gaps.
BENCHMARK(BM_pool_after_gap_us)->Arg(2)->Arg(20)->Iterations(20000)->UseManualTime();
BENCHMARK(BM_pool_after_gap_us)->Arg(1000)->Iterations(500)->UseManualTime();
BENCHMARK(BM_pool_inline)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
