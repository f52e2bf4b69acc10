// Small-op overhead of the device queue: stream mode (one launch per op) against graph mode (each
// batch captured into a CUDA graph, cached and updated in place) against raw CUDA launches of the
// same kernels from a bare loop. Two workloads: 1000 dependent adds on 4 f32 elements, and a
// 12-layer MLP forward (256 wide, batch 1: matmul, bias add, relu per layer) repeated 100 times.
// The time is wall-clock from the first enqueue to the end of the GPU work (synchronize), per op,
// the median of many samples after warm-up. Prints "RESULT key value" lines; PyTorch eager for the
// same workloads is bench/cuda/torch_graphs.py.
//
// Whether two mechanisms pay, each measured with and without in the same run:
// - the matmul engine's graph replay of repeated identical matmuls (WICK_CUDA_MATMUL_GRAPHS):
//   host time until a 1024 f32 matmul returns, and the MLP in stream mode, with and without;
// - the cuBLASLt warm-up at device creation (WICK_CUDA_WARMUP): fresh child processes of this
//   program (--warm-up-child) with a warm-up thread that runs one GEMM per dtype (the default),
//   with one that only creates the handle, and with none (cuBLASLt created by the first matmul).
//   Each reports the time of its first matmul per dtype and of 200 more; the parent adds the
//   whole process's time, exit included (it waits for a warm-up thread still running).

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "check_exit.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_storage.h"
#include "cuda/kernels.h"
#include "cuda_config.h"
#include "tensor_impl.h"
#include "wick/cuda.h"
#include "wick/wick.h"

namespace {

using namespace wick;

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

// Host microseconds until `fn` returns, median of 5 groups of 100 back-to-back calls.
double host_return_us(const std::function<void()>& fn, const Device& gpu) {
  for (int i = 0; i < 20; ++i) fn();
  gpu.synchronize();
  std::vector<double> us;
  for (int s = 0; s < 5; ++s) {
    for (int i = 0; i < 100; ++i) {
      double t0 = now_us();
      fn();
      us.push_back(now_us() - t0);
    }
    gpu.synchronize();
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// ---- the cuBLASLt warm-up, in fresh processes ----

constexpr int kWarmUpLoop = 200;
constexpr int kWarmUpRuns = 3;

// The child: first matmul (1024^3, to one element read on the host) per dtype, right after the
// device is created, then kWarmUpLoop more f32 ones. Prints one WARMUP_CHILD line, in ms.
int warm_up_child() {
  double t0 = now_us();
  Device gpu = Device::cuda(0);
  Tensor a = Tensor::randn(0.0f, 1.0f, {1024, 1024}, gpu);
  Tensor b = Tensor::randn(0.0f, 1.0f, {1024, 1024}, gpu);
  auto read_one = [](const Tensor& c) {
    return c.narrow(0, 517, 1).narrow(1, 33, 1).to_dtype(DType::F32).to_scalar<float>();
  };
  (void)read_one(a);
  double device_ms = (now_us() - t0) / 1e3;
  float sink = 0;
  auto first = [&](DType dt) {
    Tensor x = a.to_dtype(dt), y = b.to_dtype(dt);
    gpu.synchronize();
    double t = now_us();
    sink += read_one(x.matmul(y));
    return (now_us() - t) / 1e3;
  };
  double f32 = first(DType::F32), bf16 = first(DType::BF16), f16 = first(DType::F16);
  double t = now_us();
  for (int i = 0; i < kWarmUpLoop; ++i) sink += read_one(a.matmul(b));
  double loop = (now_us() - t) / 1e3;
  std::printf("WARMUP_CHILD %.4f %.4f %.4f %.4f %.4f %d\n", device_ms, f32, bf16, f16, loop,
              sink != sink);
  return 0;
}

struct WarmUpVariant {
  const char* key;
  const char* name;
  const char* env;
};

struct WarmUpFigures {
  double device_ms = 0, f32 = 0, bf16 = 0, f16 = 0, loop = 0, process_ms = 0;
};

// Medians over kWarmUpRuns child processes of each variant; false when a child failed.
bool measure_warm_up(const char* self, const std::vector<WarmUpVariant>& variants,
                     std::vector<WarmUpFigures>& out) {
  std::vector<std::array<std::vector<double>, 6>> samples(variants.size());
  for (int run = 0; run < kWarmUpRuns; ++run) {
    for (size_t v = 0; v < variants.size(); ++v) {  // interleaved: drift weighs on all alike
      std::string cmd = std::string(variants[v].env) + " '" + self + "' --warm-up-child";
      double t0 = now_us();
      FILE* p = popen(cmd.c_str(), "r");
      if (p == nullptr) return false;
      char line[512] = {};
      WarmUpFigures f;
      int bad = 1, got = 0;
      while (std::fgets(line, sizeof line, p) != nullptr) {
        if (std::strncmp(line, "WARMUP_CHILD ", 13) == 0) {
          got = std::sscanf(line + 13, "%lf %lf %lf %lf %lf %d", &f.device_ms, &f.f32, &f.bf16,
                            &f.f16, &f.loop, &bad);
        }
      }
      int rc = pclose(p);
      f.process_ms = (now_us() - t0) / 1e3;
      if (rc != 0 || got != 6 || bad != 0) {
        std::fprintf(stderr, "bench_graphs: warm-up child (%s) failed: exit %d\n", cmd.c_str(), rc);
        return false;
      }
      double vals[6] = {f.device_ms, f.f32, f.bf16, f.f16, f.loop, f.process_ms};
      for (int i = 0; i < 6; ++i) samples[v][i].push_back(vals[i]);
    }
  }
  out.assign(variants.size(), {});
  for (size_t v = 0; v < variants.size(); ++v) {
    double m[6];
    for (int i = 0; i < 6; ++i) {
      auto& x = samples[v][i];
      std::sort(x.begin(), x.end());
      m[i] = x[x.size() / 2];
    }
    out[v] = {m[0], m[1], m[2], m[3], m[4], m[5]};
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--warm-up-child") == 0) {
    try {
      return warm_up_child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_graphs --warm-up-child: %s\n", e.what());
      return 1;
    }
  }
  if (!cuda_is_available()) {
    std::fprintf(stderr, "bench_graphs: no CUDA device\n");
    return 2;
  }

  // ---- the cuBLASLt warm-up: before this process makes a context of its own ----
  const std::vector<WarmUpVariant> variants = {
      {"full", "warm-up thread, handle + 1 GEMM per dtype (default)",
       "WICK_CUDA_WARMUP=1 WICK_CUDA_MATMUL=auto"},
      {"handle", "warm-up thread, handle only (no GEMM)",
       "WICK_CUDA_WARMUP=handle WICK_CUDA_MATMUL=auto"},
      {"none", "no warm-up: cuBLASLt made by the first matmul",
       "WICK_CUDA_WARMUP=0 WICK_CUDA_MATMUL=cublas"},
  };
  std::vector<WarmUpFigures> warm;
  char self[PATH_MAX] = {};
  ssize_t self_len = readlink("/proc/self/exe", self, sizeof self - 1);
  bool warm_ok = self_len > 0 && measure_warm_up(self, variants, warm);

  Device gpu = Device::cuda(0);
  cuda::CudaDevice& dev = cuda::cuda_device(0);
  cuda::Queue& queue = dev.queue();
  cudaStream_t stream = dev.stream();
  // The steady state: cuBLASLt warmed up.
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  cuda::set_matmul_graphs(true);  // stream mode as by default, until measured without below
  (void)Tensor::ones({2, 2}, DType::F32, gpu).matmul(Tensor::ones({2, 2}, DType::F32, gpu));
  gpu.synchronize();
  const bool default_mode = queue.graph_mode();
  std::printf("== bench_graphs: %d ops per batch, default mode %s\n", queue.ops_per_batch(),
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
    queue.set_graph_mode(mode == 1);
    float got = chain().to_vec1<float>()[2];
    if (std::abs(got - expect) > 1e-3f * std::abs(expect) + 1e-3f) {
      std::fprintf(stderr, "add chain: got %g, expected %g\n", got, expect);
      return 1;
    }
    chain_us[mode] = median_us([&] { (void)chain(); }, 21) / kChain;
  }
  cuda::GraphStats gs = queue.graph_stats();

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
    queue.set_graph_mode(mode == 1);
    outs[mode] = forward().to_vec2<float>()[0];
    mlp_us[mode] = median_us(mlp, 11) / kMlpOps;
  }
  cuda::GraphStats gs2 = queue.graph_stats();
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

  // ---- the matmul engine's graph replay, with and without ----
  // The MLP in stream mode without it (graph mode never uses it: its batches are captured).
  queue.set_graph_mode(false);
  cuda::set_matmul_graphs(false);
  double mlp_stream_plain_us = median_us(mlp, 11) / kMlpOps;
  // Host time until a 1024 f32 matmul returns: graph mode (the default), then stream mode with
  // and without graph replay.
  Tensor ma = Tensor::randn(0.0f, 1.0f, {1024, 1024}, gpu);
  Tensor mb = Tensor::randn(0.0f, 1.0f, {1024, 1024}, gpu);
  auto mm = [&] { Tensor c = ma.matmul(mb); };
  double ret_stream_plain_us = host_return_us(mm, gpu);
  cuda::set_matmul_graphs(true);
  double ret_stream_us = host_return_us(mm, gpu);
  queue.set_graph_mode(true);
  double ret_graph_us = host_return_us(mm, gpu);
  cuda::set_matmul_graphs(cuda::config().matmul_graphs);

  queue.set_graph_mode(default_mode);

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

  std::printf(
      "== matmul graph replay (WICK_CUDA_MATMUL_GRAPHS), host us until a 1024 f32 matmul "
      "returns (median of 500)\n"
      "   graph mode (default, replay unused) %.2f; stream mode with replay %.2f, without %.2f\n"
      "   MLP in stream mode, us/op: with replay %.2f, without %.2f\n",
      ret_graph_us, ret_stream_us, ret_stream_plain_us, mlp_us[0], mlp_stream_plain_us);
  result("matmul_return_graph_mode_us", ret_graph_us);
  result("matmul_return_stream_replay_us", ret_stream_us);
  result("matmul_return_stream_plain_us", ret_stream_plain_us);
  result("graphs_mlp_stream_no_matmul_graphs_us", mlp_stream_plain_us);

  if (warm_ok) {
    std::printf(
        "== cuBLASLt warm-up (WICK_CUDA_WARMUP), fresh processes, median of %d, ms: first "
        "1024^3 matmul to a host read per dtype, right after the device is made; %d more f32; "
        "the whole process\n",
        kWarmUpRuns, kWarmUpLoop);
    std::printf("%-52s %8s %8s %8s %8s %9s %9s\n", "variant", "device", "f32", "bf16", "f16",
                "200 f32", "process");
    for (size_t v = 0; v < variants.size(); ++v) {
      const WarmUpFigures& f = warm[v];
      std::printf("%-52s %8.2f %8.2f %8.2f %8.2f %9.2f %9.1f\n", variants[v].name, f.device_ms,
                  f.f32, f.bf16, f.f16, f.loop, f.process_ms);
      std::string k = std::string("warmup_") + variants[v].key + "_";
      result(k + "first_f32_ms", f.f32);
      result(k + "first_bf16_ms", f.bf16);
      result(k + "first_f16_ms", f.f16);
      result(k + "loop_f32_ms", f.loop);
      result(k + "process_ms", f.process_ms);
    }
  } else {
    std::printf("== cuBLASLt warm-up: not measured (a child process failed)\n");
  }

  CHECK_CUDA(cudaGraphExecDestroy(ge));
  CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUBLAS(cublasDestroy(handle));
  return 0;
}
