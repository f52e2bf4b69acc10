// Small-op overhead of the device queue: stream mode (one launch per op) against graph mode (each
// batch captured into a CUDA graph, cached and updated in place) against raw CUDA launches of the
// same kernels from a bare loop. Two workloads: 1000 dependent adds on 4 f32 elements, and a
// 12-layer MLP forward (256 wide, batch 1: matmul, bias add, relu per layer) repeated 100 times.
// The time is wall-clock from the first enqueue to the end of the GPU work (synchronize), per op,
// the median of many samples after warm-up. Prints "RESULT key value" lines; PyTorch eager for the
// same workloads is bench/cuda/torch_graphs.py.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_device.h"
#include "cuda/cuda_storage.h"
#include "cuda/kernels.h"
#include "tensor_impl.h"
#include "wick/cuda.h"
#include "wick/wick.h"

namespace {

using namespace wick;

#define CHECK_CUDA(x)                                                      \
  do {                                                                     \
    cudaError_t e_ = (x);                                                  \
    if (e_ != cudaSuccess) {                                               \
      std::fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                        \
    }                                                                      \
  } while (0)
#define CHECK_CUBLAS(x)                                                       \
  do {                                                                        \
    cublasStatus_t s_ = (x);                                                  \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
      std::fprintf(stderr, "%s failed: %s\n", #x, cublasGetStatusString(s_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

constexpr int kChain = 1000;
constexpr int kLayers = 12;
constexpr size_t kWidth = 256;
constexpr int kForwards = 100;
constexpr int kMlpOps = kForwards * kLayers * 3;

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

// Median wall-clock microseconds of `run` (which must end with the GPU idle).
double median_us(const std::function<void()>& run, int samples) {
  for (int i = 0; i < 3; ++i) run();
  std::vector<double> t;
  for (int s = 0; s < samples; ++s) {
    double t0 = now_us();
    run();
    t.push_back(now_us() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void result(const std::string& key, double value) {
  std::printf("RESULT %s %.6g\n", key.c_str(), value);
}

void* device_ptr(const Tensor& t) {
  const auto& s = static_cast<const cuda::CudaStorage&>(t.impl()->storage->backend());
  return s.data_at(t.layout().start_offset());
}

}  // namespace

int main() {
  if (!cuda_is_available()) {
    std::fprintf(stderr, "bench_graphs: no CUDA device\n");
    return 2;
  }
  Device gpu = Device::cuda(0);
  cuda::CudaDevice& dev = cuda::cuda_device(0);
  cudaStream_t stream = dev.stream();
  // The steady state: cuBLASLt warmed up.
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  (void)Tensor::ones({2, 2}, DType::F32, gpu).matmul(Tensor::ones({2, 2}, DType::F32, gpu));
  gpu.synchronize();
  const bool default_mode = dev.graph_mode();
  std::printf("== bench_graphs: %d ops per batch, default mode %s\n", dev.ops_per_batch(),
              default_mode ? "graphs" : "stream");

  // ---- workload 1: 1000 dependent adds on 4 f32 ----
  Tensor y = Tensor::randn(0.0f, 1.0f, {4}, gpu);
  float expect = 0;
  {
    auto yv = y.to_vec1<float>();
    expect = yv[2] * static_cast<float>(kChain + 1);
  }
  auto chain = [&] {
    Tensor x = y;
    for (int i = 0; i < kChain; ++i) x = x + y;
    gpu.synchronize();
    return x;
  };
  double chain_us[2] = {0, 0};  // stream, graphs
  for (int mode = 0; mode < 2; ++mode) {
    dev.set_graph_mode(mode == 1);
    float got = chain().to_vec1<float>()[2];
    if (std::abs(got - expect) > 1e-3f * std::abs(expect) + 1e-3f) {
      std::fprintf(stderr, "add chain: got %g, expected %g\n", got, expect);
      return 1;
    }
    chain_us[mode] = median_us([&] { (void)chain(); }, 21) / kChain;
  }
  cuda::GraphStats gs = dev.graph_stats();

  // Raw: the same add kernel launched from a bare loop, ping-ponging two buffers.
  float* buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, 3 * 4 * sizeof(float)));
  const void* yp = device_ptr(y);
  cuda::StridedView v4 = cuda::dense_view(4);
  auto raw_chain = [&] {
    float* a = buf;
    float* b = buf + 4;
    cuda::launch_binary(BinaryKind::Add, DType::F32, yp, v4, yp, v4, a, 4, stream);
    for (int i = 1; i < kChain; ++i) {
      cuda::launch_binary(BinaryKind::Add, DType::F32, a, v4, yp, v4, b, 4, stream);
      std::swap(a, b);
    }
  };
  double raw_chain_us = median_us(
                            [&] {
                              raw_chain();
                              CHECK_CUDA(cudaStreamSynchronize(stream));
                            },
                            21) /
                        kChain;
  // The floor: the same 1000 launches captured once and replayed.
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  raw_chain();
  CHECK_CUDA(cudaStreamEndCapture(stream, &g));
  CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
  double replay_chain_us = median_us(
                               [&] {
                                 CHECK_CUDA(cudaGraphLaunch(ge, stream));
                                 CHECK_CUDA(cudaStreamSynchronize(stream));
                               },
                               21) /
                           kChain;

  // ---- workload 2: 12-layer MLP, 256 wide, batch 1, 100 forwards ----
  std::vector<Tensor> w, b;
  for (int l = 0; l < kLayers; ++l) {
    w.push_back(Tensor::randn(0.0f, 0.0625f, {kWidth, kWidth}, gpu));
    b.push_back(Tensor::randn(0.0f, 0.1f, {kWidth}, gpu));
  }
  Tensor x0 = Tensor::randn(0.0f, 1.0f, {1, kWidth}, gpu);
  auto forward = [&] {
    Tensor h = x0;
    for (int l = 0; l < kLayers; ++l) h = h.matmul(w[l]).broadcast_add(b[l]).relu();
    return h;
  };
  auto mlp = [&] {
    for (int f = 0; f < kForwards; ++f) (void)forward();
    gpu.synchronize();
  };
  double mlp_us[2] = {0, 0};
  std::vector<float> outs[2];
  for (int mode = 0; mode < 2; ++mode) {
    dev.set_graph_mode(mode == 1);
    outs[mode] = forward().to_vec2<float>()[0];
    mlp_us[mode] = median_us(mlp, 11) / kMlpOps;
  }
  cuda::GraphStats gs2 = dev.graph_stats();
  for (size_t i = 0; i < kWidth; ++i) {
    if (std::abs(outs[0][i] - outs[1][i]) > 1e-4f * (1 + std::abs(outs[0][i]))) {
      std::fprintf(stderr, "mlp: stream and graph results differ at %zu: %g vs %g\n", i, outs[0][i],
                   outs[1][i]);
      return 1;
    }
  }

  // Raw: cuBLAS SGEMM + wick's add and relu kernels on preallocated buffers.
  cublasHandle_t handle;
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasSetStream(handle, stream));
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, size_t{32} << 20));
  CHECK_CUBLAS(cublasSetWorkspace(handle, ws, size_t{32} << 20));
  float* act = nullptr;
  CHECK_CUDA(cudaMalloc(&act, 4 * kWidth * sizeof(float)));
  cuda::StridedView vw = cuda::dense_view(kWidth);
  const UnaryOp relu{UnaryKind::Relu};
  auto raw_forward = [&] {
    // Four rotating activation buffers: each layer writes the three the input is not in.
    const float* in = static_cast<const float*>(device_ptr(x0));
    int at = -1;
    const float one = 1, zero = 0;
    const int n = static_cast<int>(kWidth);
    for (int l = 0; l < kLayers; ++l) {
      float* mm = act + ((at + 1) % 4) * kWidth;
      float* biased = act + ((at + 2) % 4) * kWidth;
      at = (at + 3) % 4;
      float* out = act + at * kWidth;
      // Row-major (1 x n) = (1 x n)(n x n) as column-major C^T = W^T x^T.
      CHECK_CUBLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, 1, n, &one,
                               static_cast<const float*>(device_ptr(w[l])), n, in, n, &zero, mm,
                               n));
      cuda::launch_binary(BinaryKind::Add, DType::F32, mm, vw, device_ptr(b[l]), vw, biased, kWidth,
                          stream);
      cuda::launch_unary(relu, DType::F32, biased, vw, out, kWidth, stream);
      in = out;
    }
  };
  double raw_mlp_us = median_us(
                          [&] {
                            for (int f = 0; f < kForwards; ++f) raw_forward();
                            CHECK_CUDA(cudaStreamSynchronize(stream));
                          },
                          11) /
                      kMlpOps;

  dev.set_graph_mode(default_mode);

  std::printf("== per-op cost, wall-clock us (enqueue to GPU done, median)\n");
  std::printf("%-28s %10s %10s %10s %12s\n", "workload", "stream", "graphs", "raw", "raw replay");
  std::printf("%-28s %10.2f %10.2f %10.2f %12.2f\n", "1000 dependent adds (4 f32)", chain_us[0],
              chain_us[1], raw_chain_us, replay_chain_us);
  std::printf("%-28s %10.2f %10.2f %10.2f %12s\n", "MLP 12x256 b1 x100 (3600)", mlp_us[0],
              mlp_us[1], raw_mlp_us, "-");
  std::printf(
      "graph cache after the add chain: %zu commits, %zu updates, %zu instantiations, "
      "%zu refused\n",
      gs.commits, gs.updates, gs.instantiations, gs.refused);
  std::printf(
      "graph cache after the MLP: %zu commits, %zu updates, %zu instantiations, %zu "
      "refused, %zu cached, %zu lost\n",
      gs2.commits, gs2.updates, gs2.instantiations, gs2.refused, gs2.cached, gs2.lost);
  result("graphs_add_chain_stream_us", chain_us[0]);
  result("graphs_add_chain_graph_us", chain_us[1]);
  result("graphs_add_chain_raw_us", raw_chain_us);
  result("graphs_add_chain_replay_us", replay_chain_us);
  result("graphs_mlp_stream_us", mlp_us[0]);
  result("graphs_mlp_graph_us", mlp_us[1]);
  result("graphs_mlp_raw_us", raw_mlp_us);
  result("graphs_mlp_stream_forward_us", mlp_us[0] * kLayers * 3);
  result("graphs_mlp_graph_forward_us", mlp_us[1] * kLayers * 3);
  std::printf("targets: graph add chain <= 3 us/op: %s; graph MLP faster than stream: %s\n",
              chain_us[1] <= 3.0 ? "met" : "MISSED", mlp_us[1] < mlp_us[0] ? "met" : "MISSED");

  CHECK_CUDA(cudaGraphExecDestroy(ge));
  CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUBLAS(cublasDestroy(handle));
  return 0;
}
