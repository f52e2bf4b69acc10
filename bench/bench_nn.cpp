// The fused ops on the CPU beside their element-wise compositions on the same inputs, in the
// same run: layer_norm, rms_norm and softmax on (2048, 2048) f32 (16 MB a tensor), rope on
// (1, 32, 256, 128) and attention (1, 8, 1024, 64), causal and not. Closing lines give composed /
// fused time (issue 13 asks for >= 3x). On a shared machine run with
// --benchmark_repetitions=5: the closing lines then use the medians.

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "wick/wick.h"

namespace {

using wick::DType;
using wick::Shape;
using wick::Tensor;

const wick::Device cpu = wick::Device::cpu();

Tensor input(const Shape& shape, uint64_t seed, DType dtype = DType::F32) {
  cpu.set_seed(seed);
  return Tensor::rand<float>(-2.0f, 2.0f, shape, cpu).to_dtype(dtype);
}

// ---- the compositions ----

Tensor layer_norm_composed(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  size_t last = x.rank() - 1;
  Tensor xc = x.broadcast_sub(x.mean_keepdim({last}));
  Tensor rstd = xc.sqr().mean_keepdim({last}).affine(1, eps).sqrt().recip();
  return xc.broadcast_mul(rstd).broadcast_mul(w).broadcast_add(b);
}

Tensor rms_norm_composed(const Tensor& x, const Tensor& w, double eps) {
  size_t last = x.rank() - 1;
  Tensor rstd = x.sqr().mean_keepdim({last}).affine(1, eps).sqrt().recip();
  return x.broadcast_mul(rstd).broadcast_mul(w);
}

Tensor softmax_composed(const Tensor& x) {
  size_t last = x.rank() - 1;
  Tensor e = x.broadcast_sub(x.max_keepdim(last)).exp();
  return e.broadcast_div(e.sum_keepdim({last}));
}

Tensor rope_composed(const Tensor& x, const Tensor& c, const Tensor& s) {
  size_t half = x.dims()[3] / 2;
  Tensor a = x.narrow(3, 0, half), b = x.narrow(3, half, half);
  return Tensor::cat({a.broadcast_mul(c).broadcast_sub(b.broadcast_mul(s)),
                      b.broadcast_mul(c).broadcast_add(a.broadcast_mul(s))},
                     3);
}

Tensor attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  double scale = 1.0 / std::sqrt(static_cast<double>(q.dims()[3]));
  Tensor sc = q.matmul(k.t()).affine(scale, 0);
  if (mask.defined()) sc = sc.broadcast_add(mask);
  return softmax_composed(sc).matmul(v);
}

Tensor causal_mask(size_t s) {
  std::vector<float> m(s * s);
  for (size_t i = 0; i < s; ++i)
    for (size_t j = 0; j < s; ++j)
      m[i * s + j] = j <= i ? 0.0f : -std::numeric_limits<float>::infinity();
  return Tensor::from_vec(m, Shape{s, s}, cpu);
}

// ---- benchmarks: <op>_fused and <op>_composed on the same inputs ----

constexpr size_t kRows = 2048, kCols = 2048;

template <class F>
void run(benchmark::State& state, F&& f, double bytes) {
  for (auto _ : state) {
    Tensor y = f();
    benchmark::DoNotOptimize(y);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_layer_norm_fused(benchmark::State& state) {
  Tensor x = input({kRows, kCols}, 1), w = input({kCols}, 2), b = input({kCols}, 3);
  run(
      state, [&] { return x.layer_norm(w, b, 1e-5); }, 8.0 * kRows * kCols);
}
void BM_layer_norm_composed(benchmark::State& state) {
  Tensor x = input({kRows, kCols}, 1), w = input({kCols}, 2), b = input({kCols}, 3);
  run(
      state, [&] { return layer_norm_composed(x, w, b, 1e-5); }, 8.0 * kRows * kCols);
}
void BM_rms_norm_fused(benchmark::State& state) {
  Tensor x = input({kRows, kCols}, 1), w = input({kCols}, 2);
  run(
      state, [&] { return x.rms_norm(w, 1e-5); }, 8.0 * kRows * kCols);
}
void BM_rms_norm_composed(benchmark::State& state) {
  Tensor x = input({kRows, kCols}, 1), w = input({kCols}, 2);
  run(
      state, [&] { return rms_norm_composed(x, w, 1e-5); }, 8.0 * kRows * kCols);
}
void BM_softmax_fused(benchmark::State& state) {
  Tensor x = input({kRows, kCols}, 1);
  run(
      state, [&] { return x.softmax_last_dim(); }, 8.0 * kRows * kCols);
}
void BM_softmax_composed(benchmark::State& state) {
  Tensor x = input({kRows, kCols}, 1);
  run(
      state, [&] { return softmax_composed(x); }, 8.0 * kRows * kCols);
}

const Shape kRopeShape{1, 32, 256, 128};
void BM_rope_fused(benchmark::State& state) {
  Tensor x = input(kRopeShape, 1), c = input({256, 64}, 2), s = input({256, 64}, 3);
  run(
      state, [&] { return x.rope(c, s); }, 8.0 * kRopeShape.elem_count());
}
void BM_rope_composed(benchmark::State& state) {
  Tensor x = input(kRopeShape, 1), c = input({256, 64}, 2), s = input({256, 64}, 3);
  run(
      state, [&] { return rope_composed(x, c, s); }, 8.0 * kRopeShape.elem_count());
}

constexpr size_t kHeads = 8, kSeq = 1024, kDim = 64;
void attention_bench(benchmark::State& state, bool fused, bool causal) {
  Tensor q = input({1, kHeads, kSeq, kDim}, 1), k = input({1, kHeads, kSeq, kDim}, 2),
         v = input({1, kHeads, kSeq, kDim}, 3);
  Tensor mask = causal ? causal_mask(kSeq) : Tensor();
  for (auto _ : state) {
    Tensor y = fused ? wick::nn::scaled_dot_product_attention(q, k, v, {causal, 0, std::nullopt})
                     : attention_composed(q, k, v, mask);
    benchmark::DoNotOptimize(y);
  }
  double flops = 4.0 * kHeads * kSeq * kSeq * kDim * (causal ? 0.5 : 1.0);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
void BM_attention_fused(benchmark::State& state) {
  attention_bench(state, true, false);
}
void BM_attention_composed(benchmark::State& state) {
  attention_bench(state, false, false);
}
void BM_attention_causal_fused(benchmark::State& state) {
  attention_bench(state, true, true);
}
void BM_attention_causal_composed(benchmark::State& state) {
  attention_bench(state, false, true);
}

// The k/v caches' bytes read a second (GB/s).
void cache_read_rate(benchmark::State& state, size_t layers, size_t kv_heads, size_t keys) {
  state.counters["GB/s"] =
      benchmark::Counter(2.0 * layers * kv_heads * keys * kDim * sizeof(float) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

// One decode step's attention over a model's layers: a query row per head, (1, heads, 1, 64),
// against each layer's own k/v cache of (1, kv_heads, keys, 64), so that the caches stream from
// memory as they do in a decode step (layers x caches larger than the L3). Args: keys, heads,
// kv_heads (decode_shapes).
void BM_attention_decode(benchmark::State& state) {
  const size_t keys = state.range(0), heads = state.range(1), kv_heads = state.range(2);
  constexpr size_t kLayers = 30;
  Tensor q = input({1, heads, 1, kDim}, 1);
  std::vector<Tensor> k, v;
  for (size_t i = 0; i < kLayers; ++i) {
    k.push_back(input({1, kv_heads, keys, kDim}, 2 + 2 * i));
    v.push_back(input({1, kv_heads, keys, kDim}, 3 + 2 * i));
  }
  for (auto _ : state) {
    for (size_t i = 0; i < kLayers; ++i) {
      Tensor y = wick::nn::scaled_dot_product_attention(q, k[i], v[i], {true, 0, std::nullopt});
      benchmark::DoNotOptimize(y);
    }
  }
  cache_read_rate(state, kLayers, kv_heads, keys);
}

// The same over paged caches (the serving engine's one-token step): one sequence's pages of 16
// rows, its positions in order.
void BM_paged_attention_decode(benchmark::State& state) {
  const size_t keys = state.range(0), heads = state.range(1), kv_heads = state.range(2);
  constexpr size_t kLayers = 30, kPage = 16;
  const size_t pages = (keys + kPage - 1) / kPage;
  Tensor q = input({1, heads, kDim}, 1);
  std::vector<Tensor> k, v;
  for (size_t i = 0; i < kLayers; ++i) {
    k.push_back(input({pages, kv_heads, kPage, kDim}, 2 + 2 * i));
    v.push_back(input({pages, kv_heads, kPage, kDim}, 3 + 2 * i));
  }
  std::vector<uint32_t> table(pages);
  for (size_t p = 0; p < pages; ++p) table[p] = static_cast<uint32_t>(p);
  Tensor page_table = Tensor::from_vec(table, {1, pages}, wick::Device::cpu());
  Tensor seq = Tensor::from_vec(std::vector<uint32_t>{0}, {1}, wick::Device::cpu());
  Tensor pos = Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(keys - 1)}, {1},
                                wick::Device::cpu());
  for (auto _ : state) {
    for (size_t i = 0; i < kLayers; ++i) {
      Tensor y = wick::nn::paged_attention(q, k[i], v[i], page_table, seq, pos);
      benchmark::DoNotOptimize(y);
    }
  }
  cache_read_rate(state, kLayers, kv_heads, keys);
}

// keys, heads, k/v heads: SmolLM2-135M at two lengths, Qwen3-0.6B's and Gemma-3-1B's heads.
void decode_shapes(benchmark::internal::Benchmark* b) {
  b->Args({256, 9, 3})->Args({1024, 9, 3})->Args({1024, 16, 8})->Args({1024, 4, 1});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_attention_decode)->Apply(decode_shapes);
BENCHMARK(BM_paged_attention_decode)->Apply(decode_shapes);
BENCHMARK(BM_layer_norm_fused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_layer_norm_composed)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rms_norm_fused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rms_norm_composed)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_softmax_fused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_softmax_composed)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rope_fused)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_rope_composed)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention_fused)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_composed)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_causal_fused)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_attention_causal_composed)->UseRealTime()->Unit(benchmark::kMillisecond);

// Console output plus each benchmark's real time per iteration, for the closing speedups.
class SpeedupReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "median") continue;
      seconds_[run.run_name.function_name] = run.GetAdjustedRealTime();
    }
  }
  void print_speedups() const {
    for (const char* op :
         {"layer_norm", "rms_norm", "softmax", "rope", "attention", "attention_causal"}) {
      auto f = seconds_.find(std::string("BM_") + op + "_fused");
      auto c = seconds_.find(std::string("BM_") + op + "_composed");
      if (f == seconds_.end() || c == seconds_.end() || f->second <= 0) continue;
      std::printf("%s: composed / fused time = %.1fx\n", op, c->second / f->second);
    }
  }

 private:
  std::map<std::string, double> seconds_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  SpeedupReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.print_speedups();
  benchmark::Shutdown();
  return 0;
}
