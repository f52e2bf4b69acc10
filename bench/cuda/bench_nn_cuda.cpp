// GPU benchmark of the fused nn ops: layer_norm, rms_norm and softmax_last_dim on (4096, 4096)
// bf16 in GB/s beside a device-to-device copy of the same bytes; attention bf16 (b 1, h 32, d 128,
// causal) at s = 1024 / 4096 / 16384 in ms and TFLOP/s; decode (s 1 against a 4096-long KV cache,
// h_kv 8) in GB/s of KV cache read. Times are CUDA events after warm-up, medians of several
// samples. Prints "RESULT nn_<key> <value>" lines; bench/cuda/torch_nn.py prints PyTorch's.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_device.h"
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

void result(const std::string& key, double value) {
  std::printf("RESULT nn_%s %.6g\n", key.c_str(), value);
}

// GPU ms per call of `op`: the median of `samples` samples of `reps` calls each. A 1 GiB memset
// is queued first so that the host has enqueued every call before the first one starts: the
// time is the GPU's alone, without launch gaps (as torch_nn.py measures PyTorch).
double gpu_ms(cudaStream_t stream, const std::function<void()>& op, int reps, int samples) {
  static void* lead = nullptr;
  const size_t lead_bytes = size_t{1} << 30;
  if (lead == nullptr) CHECK_CUDA(cudaMalloc(&lead, lead_bytes));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) op();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int s = 0; s < samples; ++s) {
    CHECK_CUDA(cudaMemsetAsync(lead, s, lead_bytes, stream));
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int r = 0; r < reps; ++r) op();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / reps);
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Tensor randn(const Shape& shape, const Device& gpu) {
  return Tensor::randn(0.0f, 1.0f, shape, gpu).to_dtype(DType::BF16);
}

}  // namespace

int main(int argc, char** argv) {
  // Optional parts to run: rows, attn, decode (default: all).
  auto want = [&](const char* part) {
    if (argc < 2) return true;
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == part) return true;
    }
    return false;
  };
  if (!cuda_is_available()) {
    std::fprintf(stderr, "bench_nn_cuda: no CUDA device\n");
    return 2;
  }
  Device gpu = Device::cuda(0);
  cuda::CudaDevice& dev = cuda::cuda_device(0);
  // Events are recorded on the device stream, which a graph capture would reject.
  dev.queue().set_graph_mode(false);
  cudaStream_t stream = dev.stream();

  // ---- row ops at (4096, 4096) bf16: read 32 MiB, write 32 MiB ----
  const size_t rows = 4096, cols = 4096;
  const double bytes = 2.0 * rows * cols * 2;
  Tensor x = randn({rows, cols}, gpu), w = randn({cols}, gpu), b = randn({cols}, gpu);
  void* copy_dst = nullptr;
  CHECK_CUDA(cudaMalloc(&copy_dst, rows * cols * 2));
  gpu.synchronize();
  const void* copy_src = nullptr;
  {
    // The copy reads a buffer of the same size; a fresh cudaMalloc'd source is as good.
    void* src = nullptr;
    CHECK_CUDA(cudaMalloc(&src, rows * cols * 2));
    CHECK_CUDA(cudaMemset(src, 1, rows * cols * 2));
    copy_src = src;
  }
  double t_copy = gpu_ms(
      stream,
      [&] {
        CHECK_CUDA(
            cudaMemcpyAsync(copy_dst, copy_src, rows * cols * 2, cudaMemcpyDeviceToDevice, stream));
      },
      20, 15);
  double copy_gbs = bytes / t_copy / 1e6;
  std::printf("== (4096, 4096) bf16 row ops, D2D copy of the same bytes: %.0f GB/s\n", copy_gbs);
  result("copy_gbs", copy_gbs);
  struct RowOp {
    const char* name;
    std::function<Tensor()> run;
  };
  std::vector<RowOp> ops{
      {"layer_norm", [&] { return x.layer_norm(w, b, 1e-5); }},
      {"rms_norm", [&] { return x.rms_norm(w, 1e-5); }},
      {"softmax", [&] { return x.softmax_last_dim(); }},
  };
  for (const RowOp& op : ops) {
    if (!want("rows")) break;
    double t = gpu_ms(
        stream, [&] { (void)op.run(); }, 20, 15);
    double gbs = bytes / t / 1e6;
    std::printf("%-11s %8.3f ms %7.0f GB/s  %5.1f%% of copy\n", op.name, t, gbs,
                100 * gbs / copy_gbs);
    result(std::string(op.name) + "_gbs", gbs);
    result(std::string(op.name) + "_vs_copy", gbs / copy_gbs);
  }

  // ---- attention, prefill: bf16, b 1, h 32, d 128, causal ----
  const size_t heads = 32, dim = 128;
  std::printf("== attention bf16 b=1 h=32 d=128 causal\n");
  for (size_t s : {1024, 4096, 16384}) {
    if (!want("attn")) break;
    Tensor q = randn({1, heads, s, dim}, gpu), k = randn({1, heads, s, dim}, gpu),
           v = randn({1, heads, s, dim}, gpu);
    int reps = s >= 16384 ? 2 : 10;
    double t = gpu_ms(
        stream,
        [&] {
          (void)nn::scaled_dot_product_attention(q, k, v, {true, 0, std::nullopt});
        },
        reps, 7);
    double tflops = 4.0 * heads * s * s * dim * 0.5 / t / 1e9;
    std::printf("s=%-6zu %9.3f ms %7.1f TFLOP/s\n", s, t, tflops);
    result("attn_s" + std::to_string(s) + "_ms", t);
    result("attn_s" + std::to_string(s) + "_tflops", tflops);
  }

  // ---- decode: one query per head against a 4096-long KV cache, h_kv 8 ----
  if (want("decode")) {
    const size_t s_kv = 4096, h_kv = 8;
    Tensor q = randn({1, heads, 1, dim}, gpu), k = randn({1, h_kv, s_kv, dim}, gpu),
           v = randn({1, h_kv, s_kv, dim}, gpu);
    double t = gpu_ms(
        stream,
        [&] {
          (void)nn::scaled_dot_product_attention(q, k, v, {true, 0, std::nullopt});
        },
        50, 15);
    double kv_bytes = 2.0 * h_kv * s_kv * dim * 2;
    double gbs = kv_bytes / t / 1e6;
    std::printf(
        "== decode s=1 s_kv=4096 h=32 h_kv=8: %.1f us, %.0f GB/s of KV cache, %.1f%% of "
        "copy bandwidth\n",
        t * 1e3, gbs, 100 * gbs / copy_gbs);
    result("decode_us", t * 1e3);
    result("decode_gbs", gbs);
    result("decode_vs_copy", gbs / copy_gbs);
  }
  return 0;
}
