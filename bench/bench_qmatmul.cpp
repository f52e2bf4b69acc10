// qmatmul on the CPU (weights kept quantized) beside the f32 matmul of the same weights
// dequantised (OpenBLAS sgemm through Tensor::matmul), on SmolLM2-135M's and Llama-1B's
// matrix shapes: m = 1 (decode) and m = 128 (prefill). Counters: weight GB/s read and GFLOP/s.
//
//   bench_qmatmul [--benchmark_filter=q4_1]

#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

#include "wick/cpu.h"
#include "wick/half.h"
#include "wick/quantized.h"
#include "wick/wick.h"

namespace {

using wick::GgmlType;

// Random blocks with sane scales (values about +-1).
wick::QTensor random_q(GgmlType type, size_t n, size_t k) {
  size_t bytes = wick::ggml_bytes(type, n * k), bs = wick::ggml_type_size(type);
  std::vector<uint8_t> raw(bytes);
  std::mt19937 gen(42);
  for (auto& b : raw) b = static_cast<uint8_t>(gen());
  uint16_t small = wick::detail::float_to_half_bits(0.01f);
  for (size_t off = 0; off < bytes; off += bs) {
    size_t at = type == GgmlType::Q6_K ? off + 208 : type == GgmlType::Q2_K ? off + 80 : off;
    std::memcpy(raw.data() + at, &small, 2);
    if (type == GgmlType::Q4_1 || type == GgmlType::Q4_K || type == GgmlType::Q5_1 ||
        type == GgmlType::Q5_K || type == GgmlType::Q2_K)  // m, dmin
      std::memcpy(raw.data() + at + 2, &small, 2);
  }
  return wick::QTensor(type, {n, k}, wick::Tensor::from_vec(raw, {bytes}, wick::Device::cpu()));
}

GgmlType type_of(int64_t i) {
  static const GgmlType types[] = {GgmlType::Q4_0,   GgmlType::Q4_1,  GgmlType::Q8_0,
                                   GgmlType::Q4_K,   GgmlType::Q6_K,  GgmlType::Q5_0,
                                   GgmlType::Q5_1,   GgmlType::Q5_K,  GgmlType::Q2_K,
                                   GgmlType::IQ4_XS, GgmlType::IQ4_NL};
  return types[i];
}

// Args: type index, m, n, k.
void BM_qmatmul(benchmark::State& state) {
  GgmlType type = type_of(state.range(0));
  size_t m = state.range(1), n = state.range(2), k = state.range(3);
  wick::QTensor w = random_q(type, n, k);
  wick::Tensor x = wick::Tensor::randn(0.0f, 1.0f, {m, k}, wick::Device::cpu());
  wick::qmatmul(x, w);  // repacks once
  for (auto _ : state) benchmark::DoNotOptimize(wick::qmatmul(x, w));
  state.SetLabel(wick::ggml_type_name(type) + " (" + wick::cpu_isa() + ")");
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(w.data().elem_count()),
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The peer: the same weights dequantised to f32, x times w^T through OpenBLAS.
void BM_dequantised_f32_matmul(benchmark::State& state) {
  GgmlType type = type_of(state.range(0));
  size_t m = state.range(1), n = state.range(2), k = state.range(3);
  wick::Tensor wt = random_q(type, n, k).dequantize().t();
  wick::Tensor x = wick::Tensor::randn(0.0f, 1.0f, {m, k}, wick::Device::cpu());
  for (auto _ : state) benchmark::DoNotOptimize(x.matmul(wt));
  state.SetLabel(wick::ggml_type_name(type) + " as f32");
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(n * k * 4),
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t t = 0; t < 11; ++t) {
    for (int64_t m : {1, 128}) {
      // SmolLM2's k = 576 is no multiple of the K-quants' 256 (its Q4_K_M files store those
      // matrices as Q5_0 or Q8_0).
      if (576 % wick::ggml_block_size(type_of(t)) == 0) b->Args({t, m, 3072, 576});  // gate+up
      b->Args({t, m, 576, 1536});                                                    // SmolLM2 down
      b->Args({t, m, 8192, 2048});                                                   // Llama-1B up
    }
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime()->ArgNames({"type", "m", "n", "k"});
}

BENCHMARK(BM_qmatmul)->Apply(shapes);
BENCHMARK(BM_dequantised_f32_matmul)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
