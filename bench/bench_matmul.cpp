// wick matmul against OpenBLAS called directly on the same buffers, in the same run, on 2
// threads: f32 squares (64..2048), the per-call overhead of a 2x2 product, bf16/f16 against
// f32 at 1024, the transformer shapes, and the CPU's FMA peak from a register-only loop. Each
// benchmark alternates the wick call and the direct call, so load from other processes hits
// both alike; ratios are rates (direct time / wick time) from the medians. A summary with the
// issue's thresholds is printed at the end.

#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "wick/wick.h"

// With src/ on the include path the direct calls read the tensors' own storage; otherwise they
// read 64-byte-aligned copies of the same values.
#if __has_include("cpu/cpu_storage.h") && __has_include("tensor_impl.h")
#include "cpu/cpu_storage.h"
#include "tensor_impl.h"
#define WICK_BENCH_SAME_BUFFERS 1
#else
#define WICK_BENCH_SAME_BUFFERS 0
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kThreads = 2;

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// The f32 elements of a contiguous tensor, for the direct BLAS calls.
class F32Buffer {
 public:
  explicit F32Buffer(const wick::Tensor& t) {
#if WICK_BENCH_SAME_BUFFERS
    const auto& impl = *t.impl();
    ptr_ = wick::cpu::as_cpu(impl.storage->backend()).as<float>() + impl.layout.start_offset();
#else
    auto v = t.flatten_all().to_vec1<float>();
    owned_.reset(static_cast<float*>(std::aligned_alloc(64, (v.size() * 4 + 63) / 64 * 64)));
    std::memcpy(owned_.get(), v.data(), v.size() * 4);
    ptr_ = owned_.get();
#endif
  }
  float* get() const {
    return ptr_;
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> owned_;
  float* ptr_ = nullptr;
};

wick::Tensor randn(const wick::Shape& shape) {
  return wick::Tensor::randn(0.0f, 1.0f, shape, wick::Device::cpu());
}

// Results for the summary, by benchmark name.
std::map<std::string, std::map<std::string, double>>& results() {
  static std::map<std::string, std::map<std::string, double>> r;
  return r;
}

void report(benchmark::State& state, const std::string& name,
            const std::map<std::string, double>& values) {
  for (const auto& [k, v] : values) state.counters[k] = v;
  results()[name] = values;
}

// Runs wick() and direct() alternately `state` iterations times (the order flips each time);
// the iteration time is wick's. Returns the median seconds of each.
template <class W, class D>
std::pair<double, double> alternate(benchmark::State& state, W&& wick, D&& direct) {
  wick();  // warm both (first-touch of the output, BLAS buffers)
  direct();
  std::vector<double> tw, td;
  bool flip = false;
  for (auto _ : state) {
    double t0, t1, t2;
    if (flip) {
      t0 = now_s();
      direct();
      t1 = now_s();
      wick();
      t2 = now_s();
      td.push_back(t1 - t0);
      tw.push_back(t2 - t1);
    } else {
      t0 = now_s();
      wick();
      t1 = now_s();
      direct();
      t2 = now_s();
      tw.push_back(t1 - t0);
      td.push_back(t2 - t1);
    }
    state.SetIterationTime(tw.back());
    flip = !flip;
  }
  return {median(tw), median(td)};
}

// ---- f32 squares ----

void BM_f32_square(benchmark::State& state) {
  size_t n = static_cast<size_t>(state.range(0));
  auto a = randn({n, n}), b = randn({n, n});
  F32Buffer pa(a), pb(b);
  std::vector<float> c(n * n);
  int ni = static_cast<int>(n);
  auto [tw, td] = alternate(
      state, [&] { benchmark::DoNotOptimize(a.matmul(b)); },
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, pa.get(), ni,
                    pb.get(), ni, 0.0f, c.data(), ni);
        benchmark::ClobberMemory();
      });
  double flops = 2.0 * n * n * n;
  report(
      state, "f32 " + std::to_string(n),
      {{"wick_GFLOPs", flops / tw * 1e-9}, {"blas_GFLOPs", flops / td * 1e-9}, {"ratio", td / tw}});
}
BENCHMARK(BM_f32_square)->Arg(64)->Iterations(3000)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_f32_square)->Arg(256)->Iterations(400)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_f32_square)->Arg(1024)->Iterations(60)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_f32_square)->Arg(2048)->Iterations(12)->UseManualTime()->Unit(benchmark::kMillisecond);

// ---- per-call overhead on 2x2 ----

void BM_overhead_2x2(benchmark::State& state) {
  constexpr int kCalls = 2000;  // per timed block, so the clock's cost disappears
  auto a = randn({2, 2}), b = randn({2, 2});
  F32Buffer pa(a), pb(b);
  float c[4];
  auto [tw, td] = alternate(
      state,
      [&] {
        for (int i = 0; i < kCalls; ++i) benchmark::DoNotOptimize(a.matmul(b));
      },
      [&] {
        for (int i = 0; i < kCalls; ++i) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, pa.get(), 2,
                      pb.get(), 2, 0.0f, c, 2);
          benchmark::ClobberMemory();
        }
      });
  report(state, "2x2 overhead",
         {{"wick_ns", tw / kCalls * 1e9},
          {"blas_ns", td / kCalls * 1e9},
          {"overhead_ns", (tw - td) / kCalls * 1e9}});
}
BENCHMARK(BM_overhead_2x2)->Iterations(200)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- bf16 / f16 against f32 ----

void BM_half_1024(benchmark::State& state) {
  auto dtype = static_cast<wick::DType>(state.range(0));
  constexpr size_t n = 1024;
  auto a = randn({n, n}), b = randn({n, n});
  auto ah = a.to_dtype(dtype), bh = b.to_dtype(dtype);
  F32Buffer pa(a), pb(b);
  std::vector<float> c(n * n);
  int ni = static_cast<int>(n);
  auto [tw, td] = alternate(
      state, [&] { benchmark::DoNotOptimize(ah.matmul(bh)); },
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0f, pa.get(), ni,
                    pb.get(), ni, 0.0f, c.data(), ni);
        benchmark::ClobberMemory();
      });
  double flops = 2.0 * n * n * n;
  report(state, std::string("1024 ") + wick::dtype_name(dtype),
         {{"wick_GFLOPs", flops / tw * 1e-9},
          {"blas_f32_GFLOPs", flops / td * 1e-9},
          {"ratio_to_f32", td / tw}});
}
BENCHMARK(BM_half_1024)
    ->Arg(static_cast<int>(wick::DType::BF16))
    ->Arg(static_cast<int>(wick::DType::F16))
    ->Iterations(30)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- transformer shapes ----

struct ProblemShape {
  const char* name;
  size_t b, m, k, n;
};

const ProblemShape kShapes[] = {
    {"1x4096x4096 (gemv)", 1, 1, 4096, 4096},
    {"128x3072x768", 1, 128, 3072, 768},
    {"128x768x3072", 1, 128, 768, 3072},
    {"12x(128x64)(64x128)", 12, 128, 64, 128},
};

// Shapes are m x k x n. The direct peer is what a framework without wick's choices runs:
// cblas_sgemm per batch (threaded), also for m == 1; the gemv figure is given beside it.
void BM_transformer(benchmark::State& state) {
  const ProblemShape& s = kShapes[state.range(0)];
  auto a = s.b == 1 ? randn({s.m, s.k}) : randn({s.b, s.m, s.k});
  auto b = s.b == 1 ? randn({s.k, s.n}) : randn({s.b, s.k, s.n});
  F32Buffer pa(a), pb(b);
  std::vector<float> c(s.b * s.m * s.n);
  int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  auto sgemm_loop = [&] {
    for (size_t i = 0; i < s.b; ++i) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f,
                  pa.get() + i * s.m * s.k, k, pb.get() + i * s.k * s.n, n, 0.0f,
                  c.data() + i * s.m * s.n, n);
    }
    benchmark::ClobberMemory();
  };
  auto [tw, td] = alternate(
      state, [&] { benchmark::DoNotOptimize(a.matmul(b)); }, sgemm_loop);
  double flops = 2.0 * s.b * s.m * s.n * s.k;
  std::map<std::string, double> values{
      {"wick_GFLOPs", flops / tw * 1e-9}, {"blas_GFLOPs", flops / td * 1e-9}, {"ratio", td / tw}};
  if (s.m == 1) {
    // The best direct call for this shape, interleaved with wick the same way.
    std::vector<double> tw2, tv;
    for (int r = 0; r < 40; ++r) {
      double t0 = now_s();
      benchmark::DoNotOptimize(a.matmul(b));
      double t1 = now_s();
      cblas_sgemv(CblasRowMajor, CblasTrans, k, n, 1.0f, pb.get(), n, pa.get(), 1, 0.0f, c.data(),
                  1);
      benchmark::ClobberMemory();
      tv.push_back(now_s() - t1);
      tw2.push_back(t1 - t0);
    }
    values["ratio_to_sgemv"] = median(tv) / median(tw2);
  }
  report(state, s.name, values);
}
BENCHMARK(BM_transformer)->Arg(0)->Iterations(100)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_transformer)->Arg(1)->Iterations(100)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_transformer)->Arg(2)->Iterations(100)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_transformer)->Arg(3)->Iterations(3000)->UseManualTime()->Unit(benchmark::kMicrosecond);

// ---- FMA peak ----

// 10 independent chains of FMAs at the widest vector width this CPU has (chosen at run time, so
// the figure is the machine's, whatever the build flags): enough in flight for two FMA pipes of
// latency 4-5. Each loop returns its sum so that nothing is optimised away.
#if defined(__x86_64__)
__attribute__((noinline, target("avx512f"))) float fma_loop_avx512(size_t iters) {
  __m512 acc[10];
  for (int j = 0; j < 10; ++j) acc[j] = _mm512_set1_ps(0.001f * static_cast<float>(j));
  const __m512 mul = _mm512_set1_ps(0.9999999f), add = _mm512_set1_ps(1e-7f);
  for (size_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 10; ++j) acc[j] = _mm512_fmadd_ps(acc[j], mul, add);
  }
  __m512 s = acc[0];
  for (int j = 1; j < 10; ++j) s = _mm512_add_ps(s, acc[j]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}

__attribute__((noinline, target("avx2,fma"))) float fma_loop_avx2(size_t iters) {
  __m256 acc[10];
  for (int j = 0; j < 10; ++j) acc[j] = _mm256_set1_ps(0.001f * static_cast<float>(j));
  const __m256 mul = _mm256_set1_ps(0.9999999f), add = _mm256_set1_ps(1e-7f);
  for (size_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 10; ++j) acc[j] = _mm256_fmadd_ps(acc[j], mul, add);
  }
  __m256 s = acc[0];
  for (int j = 1; j < 10; ++j) s = _mm256_add_ps(s, acc[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

const bool kHasAvx512 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}();
const int kLanes = kHasAvx512 ? 16 : 8;

float fma_loop(size_t iters) {
  return kHasAvx512 ? fma_loop_avx512(iters) : fma_loop_avx2(iters);
}
#else
constexpr int kLanes = 1;

__attribute__((noinline)) float fma_loop(size_t iters) {
  float acc[10];
  for (int j = 0; j < 10; ++j) acc[j] = 0.001f * static_cast<float>(j);
  for (size_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 10; ++j) acc[j] = std::fma(acc[j], 0.9999999f, 1e-7f);
  }
  float s = 0;
  for (float v : acc) s += v;
  return s;
}
#endif
const double kFlopsPerIter = 10 * kLanes * 2;

// GFLOP/s of `threads` threads running the loop at once.
double fma_gflops(int threads, size_t iters) {
  std::vector<std::thread> pool;
  std::vector<float> sink(threads);
  double t0 = now_s();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sink[t] = fma_loop(iters); });
  for (auto& th : pool) th.join();
  double dt = now_s() - t0;
  benchmark::DoNotOptimize(sink.data());
  return kFlopsPerIter * iters * threads / dt * 1e-9;
}

void BM_fma_peak(benchmark::State& state) {
  constexpr size_t kIters = 50'000'000;  // ~0.1 s per thread near peak
  std::vector<double> one, two;
  for (auto _ : state) {
    one.push_back(fma_gflops(1, kIters));
    two.push_back(fma_gflops(kThreads, kIters));
  }
  // The best of the runs: peak means the machine at its fastest.
  report(state, "FMA peak",
         {{"peak_1thread_GFLOPs", *std::max_element(one.begin(), one.end())},
          {"peak_2threads_GFLOPs", *std::max_element(two.begin(), two.end())}});
}
BENCHMARK(BM_fma_peak)->Iterations(5)->Unit(benchmark::kMillisecond);

// ---- summary ----

void print_summary() {
  auto& r = results();
  auto get = [&](const std::string& name, const std::string& key) {
    auto it = r.find(name);
    if (it == r.end() || !it->second.count(key)) return -1.0;
    return it->second.at(key);
  };
  auto verdict = [](bool ok) { return ok ? "ok" : "BELOW TARGET"; };
  std::printf("\n== summary (%d threads, %s) ==\n", kThreads,
              WICK_BENCH_SAME_BUFFERS ? "direct calls on the tensors' own buffers"
                                      : "direct calls on copies of the tensors' values");
  for (const char* n : {"64", "256", "1024", "2048"}) {
    std::string name = std::string("f32 ") + n;
    double ratio = get(name, "ratio");
    bool gated = std::string(n) != "64";
    std::printf("%-24s wick %7.1f GFLOP/s, OpenBLAS %7.1f GFLOP/s, ratio %.3f %s\n", name.c_str(),
                get(name, "wick_GFLOPs"), get(name, "blas_GFLOPs"), ratio,
                gated ? verdict(ratio >= 0.97) : "(reported only)");
  }
  double ov = get("2x2 overhead", "overhead_ns");
  std::printf("%-24s wick %.0f ns, OpenBLAS %.0f ns, overhead %.0f ns %s\n", "2x2 per call",
              get("2x2 overhead", "wick_ns"), get("2x2 overhead", "blas_ns"), ov,
              verdict(ov < 1000));
  for (const char* d : {"bf16", "f16"}) {
    std::string name = std::string("1024 ") + d;
    double ratio = get(name, "ratio_to_f32");
    std::printf("%-24s wick %7.1f GFLOP/s, OpenBLAS f32 %7.1f GFLOP/s, ratio %.3f %s\n",
                name.c_str(), get(name, "wick_GFLOPs"), get(name, "blas_f32_GFLOPs"), ratio,
                verdict(ratio >= 0.8));
  }
  for (const auto& s : kShapes) {
    double ratio = get(s.name, "ratio");
    bool ahead = s.m == 1 || s.b > 1;
    std::printf("%-24s wick %7.1f GFLOP/s, OpenBLAS sgemm %7.1f GFLOP/s, ratio %.3f %s", s.name,
                get(s.name, "wick_GFLOPs"), get(s.name, "blas_GFLOPs"), ratio,
                verdict(ahead ? ratio > 1.0 : ratio >= 0.97));
    if (s.m == 1) std::printf(" (vs direct sgemv %.3f)", get(s.name, "ratio_to_sgemv"));
    std::printf("\n");
  }
  std::printf(
      "%-24s %d-wide: 1 thread %.1f GFLOP/s, %d threads %.1f GFLOP/s; 1024 f32 reaches %.0f%%\n",
      "FMA peak (f32)", kLanes, get("FMA peak", "peak_1thread_GFLOPs"), kThreads,
      get("FMA peak", "peak_2threads_GFLOPs"),
      100 * get("f32 1024", "wick_GFLOPs") / get("FMA peak", "peak_2threads_GFLOPs"));
}

}  // namespace

int main(int argc, char** argv) {
  // Both wick (BLAS and its own workers) and the direct calls use 2 threads.
  setenv("WICK_NUM_THREADS", std::to_string(kThreads).c_str(), 1);
  openblas_set_num_threads(kThreads);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary();
  return 0;
}
