// Autograd memory and time: a 20-layer MLP (batch 64, width 256, f32) forward + backward.
// Counters: graph_MB, the bytes the autograd graph keeps alive after the forward pass (parameters
// and saved activations); activations_MB, the same without the parameters; peak_grad_MB, the most
// gradient bytes backward held at once (intermediates are released as soon as consumed);
// all_grads_MB, what keeping every intermediate gradient would have cost instead.
// On CUDA, peak_device_MB is the caching allocator's peak over the run.

#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "../src/backprop_stats.h"
#include "wick/cuda.h"
#include "wick/wick.h"

namespace {

using namespace wick;

constexpr size_t kLayers = 20;
constexpr size_t kBatch = 64;
constexpr size_t kWidth = 256;

struct Mlp {
  std::vector<Tensor> w, b;
  Tensor x;

  explicit Mlp(const Device& dev) {
    dev.set_seed(5);
    float scale = std::sqrt(2.0f / kWidth);
    for (size_t i = 0; i < kLayers; ++i) {
      w.push_back(Tensor::randn(0.0f, scale, {kWidth, kWidth}, dev).requires_grad());
      b.push_back(Tensor::zeros({kWidth}, DType::F32, dev).requires_grad());
    }
    x = Tensor::randn(0.0f, 1.0f, {kBatch, kWidth}, dev);
  }

  Tensor loss() const {
    Tensor h = x;
    for (size_t i = 0; i < kLayers; ++i) h = h.matmul(w[i]).broadcast_add(b[i]).relu();
    return h.sqr().mean_all();
  }

  size_t param_bytes() const {
    size_t bytes = 0;
    for (size_t i = 0; i < kLayers; ++i) {
      bytes += (w[i].elem_count() + b[i].elem_count()) * sizeof(float);
    }
    return bytes;
  }
};

double mb(size_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

void mlp_forward_backward(benchmark::State& state, Device dev) {
  Mlp model(dev);
  detail::GraphStats graph;
  detail::BackwardStats back;
  for (auto _ : state) {
    Tensor loss = model.loss();
    graph = detail::graph_stats(loss);
    GradStore grads = loss.backward();
    back = detail::last_backward_stats();
    benchmark::DoNotOptimize(grads.get(model.w[0])->to_vec_f64());
  }
  state.counters["graph_MB"] = mb(graph.bytes);
  state.counters["activations_MB"] =
      mb(graph.bytes - model.param_bytes() - model.x.elem_count() * 4);
  state.counters["peak_grad_MB"] = mb(back.peak_live_bytes);
  state.counters["all_grads_MB"] = mb(graph.grad_bytes);
  state.counters["graph_ops"] = static_cast<double>(graph.ops);
  if (dev.is_cuda()) state.counters["peak_device_MB"] = mb(cuda_memory_stats(dev.ordinal()).peak);
  static bool printed[2] = {false, false};
  if (printed[dev.is_cuda()]) return;
  printed[dev.is_cuda()] = true;
  std::printf(
      "%s: graph holds %.2f MB (%zu ops, %.2f MB of parameters), backward peak gradient "
      "bytes %.2f MB (all gradients kept: %.2f MB), %zu accumulations\n",
      dev.to_string().c_str(), mb(graph.bytes), graph.ops, mb(model.param_bytes()),
      mb(back.peak_live_bytes), mb(graph.grad_bytes), back.accumulations);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::RegisterBenchmark("mlp20_forward_backward/cpu", mlp_forward_backward, Device::cpu())
      ->Unit(benchmark::kMillisecond);
  if (cuda_is_available()) {
    benchmark::RegisterBenchmark("mlp20_forward_backward/cuda", mlp_forward_backward,
                                 Device::cuda())
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
