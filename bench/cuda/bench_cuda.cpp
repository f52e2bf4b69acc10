// GPU benchmark: wick against cuBLAS called directly on the same buffers, on the same stream, and
// the queue's costs (matmul return time, one-element read-back), element-wise add against a
// device-to-device copy, softmax and sum bandwidth. Times are CUDA events after warm-up, the
// median of many samples. Prints "RESULT key value" lines for scripts/gpu-check.sh.

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "check_exit.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_storage.h"
#include "cuda_config.h"
#include "tensor_impl.h"
#include "wick/cuda.h"
#include "wick/wick.h"

namespace {

using namespace wick;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void result(const std::string& key, double value) {
  std::printf("RESULT %s %.6g\n", key.c_str(), value);
}

const void* device_ptr(const Tensor& t) {
  const auto& s = static_cast<const cuda::CudaStorage&>(t.impl()->storage->backend());
  return s.data_at(t.layout().start_offset());
}

struct Timer {
  cudaStream_t stream;
  cudaEvent_t start, stop;
  void* lead = nullptr;
  size_t lead_bytes = size_t{4} << 30;
  explicit Timer(cudaStream_t s) : stream(s) {
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    CHECK_CUDA(cudaMalloc(&lead, lead_bytes));
  }
  // GPU ms per call of `op`, median over `samples` samples of `reps` calls. With `keep_full`, a
  // 4 GB memset runs first so that the host has enqueued all calls before the first one starts:
  // the time is then the GPU's alone, with no launch gaps, for wick and cuBLAS alike.
  double sample(const std::function<void()>& op, int reps, int s, bool keep_full) {
    if (keep_full) CHECK_CUDA(cudaMemsetAsync(lead, s, lead_bytes, stream));
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int r = 0; r < reps; ++r) op();
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    return t / reps;
  }
  double time(const std::function<void()>& op, int reps, int samples, bool keep_full) {
    for (int i = 0; i < 2; ++i) op();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<double> ms;
    for (int s = 0; s < samples; ++s) ms.push_back(sample(op, reps, s, keep_full));
    return median(ms);
  }
  // Two ops sampled in turn (a, b, a, b, ...), so that clock and temperature drift over the run
  // weighs on both alike; medians of each.
  std::pair<double, double> time_pair(const std::function<void()>& a,
                                      const std::function<void()>& b, int reps, int samples) {
    for (int i = 0; i < 2; ++i) {
      a();
      b();
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<double> ma, mb;
    for (int s = 0; s < samples; ++s) {
      ma.push_back(sample(a, reps, s, true));
      mb.push_back(sample(b, reps, s, true));
    }
    return {median(ma), median(mb)};
  }
};

Tensor random_gpu(const Shape& shape, DType dt, const Device& gpu) {
  return Tensor::randn(0.0f, 1.0f, shape, gpu).to_dtype(dt);
}

double host_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main() {
  if (!cuda_is_available()) {
    std::fprintf(stderr, "bench_cuda: no CUDA device\n");
    return 2;
  }
  Device gpu = Device::cuda(0);
  cuda::CudaDevice& dev = cuda::cuda_device(0);
  cudaStream_t stream = dev.stream();
  // This program records its own events and cuBLAS calls on the device stream, which a graph
  // capture would reject: it measures the stream queue (bench_graphs measures graph mode).
  dev.queue().set_graph_mode(false);
  // Benchmarks measure the steady state: wait for cuBLASLt's warm-up.
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  (void)Tensor::ones({2, 2}, DType::F32, gpu).matmul(Tensor::ones({2, 2}, DType::F32, gpu));
  gpu.synchronize();
  Timer timer(stream);
  cublasHandle_t handle;
  CHECK_CUBLAS(cublasCreate(&handle));
  CHECK_CUBLAS(cublasSetStream(handle, stream));
  // cuBLAS needs its own workspace; give it the same 32 MiB that wick gives cuBLASLt.
  void* ws = nullptr;
  CHECK_CUDA(cudaMalloc(&ws, size_t{32} << 20));
  CHECK_CUBLAS(cublasSetWorkspace(handle, ws, size_t{32} << 20));

  std::printf("== matmul: wick vs cublasGemmEx on the same buffers (GPU time, queue kept full)\n");
  std::printf("%6s %5s %12s %12s %7s\n", "n", "dtype", "wick TF/s", "cuBLAS TF/s", "ratio");
  for (size_t n : {1024, 4096, 8192}) {
    for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
      Tensor a = random_gpu({n, n}, dt, gpu), b = random_gpu({n, n}, dt, gpu);
      Tensor c_direct = Tensor::zeros({n, n}, dt, gpu);
      gpu.synchronize();
      double flop = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
      // ~20 ms per sample at the expected rate.
      double rate = dt == DType::F32 ? 50e12 : 600e12;
      int reps = std::max(2, static_cast<int>(0.02 / (flop / rate)));
      reps = std::min(reps, 200);
      int samples = n >= 8192 && dt == DType::F32 ? 5 : 9;
      cudaDataType_t type = dt == DType::F32    ? CUDA_R_32F
                            : dt == DType::BF16 ? CUDA_R_16BF
                                                : CUDA_R_16F;
      float one = 1, zero = 0;
      int in = static_cast<int>(n);
      const void* pa = device_ptr(a);
      const void* pb = device_ptr(b);
      void* pc = const_cast<void*>(device_ptr(c_direct));
      auto [t_wick, t_blas] = timer.time_pair(
          [&] { (void)a.matmul(b); },
          [&] {
            // Row-major C = A B as column-major C^T = B^T A^T.
            CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, in, in, in, &one, pb, type,
                                      in, pa, type, in, &zero, pc, type, in, CUBLAS_COMPUTE_32F,
                                      CUBLAS_GEMM_DEFAULT));
          },
          reps, samples);
      double ratio = t_blas / t_wick;
      std::printf("%6zu %5s %12.1f %12.1f %7.3f\n", n, dtype_name(dt), flop / t_wick / 1e9,
                  flop / t_blas / 1e9, ratio);
      std::string key = std::string("matmul_") + std::to_string(n) + "_" + dtype_name(dt);
      result(key + "_ratio", ratio);
      result(key + "_tflops", flop / t_wick / 1e9);
      result(key + "_cublas_tflops", flop / t_blas / 1e9);
    }
  }

  {
    // Host time until matmul returns (1024 f32, steady): the queue's cost per op.
    size_t n = 1024;
    Tensor a = random_gpu({n, n}, DType::F32, gpu), b = random_gpu({n, n}, DType::F32, gpu);
    // Host microseconds per call, median of 5 groups of 100 back-to-back calls.
    auto host_median = [&](const std::function<void()>& fn) {
      for (int i = 0; i < 20; ++i) fn();
      gpu.synchronize();
      std::vector<double> us;
      for (int s = 0; s < 5; ++s) {
        for (int i = 0; i < 100; ++i) {
          double t0 = host_us();
          fn();
          us.push_back(host_us() - t0);
        }
        gpu.synchronize();
      }
      return median(us);
    };
    double ret = host_median([&] { Tensor c = a.matmul(b); });
    cuda::set_matmul_graphs(false);
    double ret_plain = host_median([&] { Tensor c = a.matmul(b); });
    cuda::set_matmul_graphs(true);
    // The floors: cuBLAS and cuBLASLt called directly, a 4-byte memset, a tiny wick op.
    Tensor c_direct = Tensor::zeros({n, n}, DType::F32, gpu);
    const void* pa = device_ptr(a);
    const void* pb = device_ptr(b);
    void* pc = const_cast<void*>(device_ptr(c_direct));
    int in = static_cast<int>(n);
    float one = 1, zero = 0;
    double gemmex = host_median([&] {
      CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, in, in, in, &one, pb, CUDA_R_32F,
                                in, pa, CUDA_R_32F, in, &zero, pc, CUDA_R_32F, in,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    cublasLtHandle_t lt;
    CHECK_CUBLAS(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, n, in));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, n, n, in));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, n, in));
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws_bytes = size_t{32} << 20;
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &found));
    double lt_us = host_median([&] {
      CHECK_CUBLAS(cublasLtMatmul(lt, desc, &one, pb, la, pa, lb, &zero, pc, lc, pc, lc, &heur.algo,
                                  ws, heur.workspaceSize, stream));
    });
    double memset_us = host_median([&] { CHECK_CUDA(cudaMemsetAsync(pc, 0, 4, stream)); });
    Tensor tiny = Tensor::ones({4}, DType::F32, gpu);
    double tiny_us = host_median([&] { Tensor t = tiny + tiny; });
    std::printf(
        "== host time until the call returns, 1024 f32 matmul (median of 500):\n"
        "   wick %.2f us (graph replay), %.2f us (cublasLtMatmul each call); cublasGemmEx"
        " %.2f us, cublasLtMatmul %.2f us; 4-byte memset %.2f us; wick add of 4 f32 "
        "%.2f us\n",
        ret, ret_plain, gemmex, lt_us, memset_us, tiny_us);
    result("matmul_return_us", ret);
    result("matmul_return_plain_us", ret_plain);
    result("cublas_gemmex_return_us", gemmex);
    result("cublaslt_return_us", lt_us);
    result("memset_return_us", memset_us);
    result("tiny_add_return_us", tiny_us);

    // One element of a 1024^2 result, after synchronize.
    Tensor c = a.matmul(b);
    gpu.synchronize();
    Tensor elem = c.narrow(0, 517, 1).narrow(1, 33, 1);
    std::vector<double> rb;
    for (int i = 0; i < 300; ++i) {
      double t0 = host_us();
      float v = elem.to_scalar<float>();
      rb.push_back(host_us() - t0);
      if (v != v) std::printf("nan\n");
    }
    std::printf("== read-back of one element of a 1024^2 result: %.2f us (median)\n", median(rb));
    result("readback_one_us", median(rb));
  }

  {
    // Element-wise add on 64M f32 against a device-to-device copy of the same size.
    size_t n = size_t{64} << 20;
    Tensor x = random_gpu({n}, DType::F32, gpu), y = random_gpu({n}, DType::F32, gpu);
    Tensor dst = Tensor::zeros({n}, DType::F32, gpu);
    gpu.synchronize();
    double bytes = static_cast<double>(n) * 4;
    double t_add = timer.time([&] { (void)(x + y); }, 20, 9, false);
    const void* px = device_ptr(x);
    void* pd = const_cast<void*>(device_ptr(dst));
    double t_copy = timer.time(
        [&] { CHECK_CUDA(cudaMemcpyAsync(pd, px, n * 4, cudaMemcpyDeviceToDevice, stream)); }, 20,
        9, false);
    double add_gbs = 3 * bytes / t_add / 1e6, copy_gbs = 2 * bytes / t_copy / 1e6;
    std::printf("== add 64M f32: %.0f GB/s, D2D copy %.0f GB/s, ratio %.3f\n", add_gbs, copy_gbs,
                add_gbs / copy_gbs);
    result("add_gbs", add_gbs);
    result("copy_gbs", copy_gbs);
    result("add_vs_copy", add_gbs / copy_gbs);

    Tensor rows = x.reshape({8192, 8192});
    double t_soft = timer.time([&] { (void)rows.softmax(1); }, 10, 9, false);
    double soft_gbs = 2 * bytes / t_soft / 1e6;
    double t_sum = timer.time([&] { (void)x.sum_all(); }, 20, 9, false);
    double sum_gbs = bytes / t_sum / 1e6;
    std::printf("== softmax 8192x8192 f32: %.0f GB/s; sum of 64M f32: %.0f GB/s\n", soft_gbs,
                sum_gbs);
    result("softmax_gbs", soft_gbs);
    result("sum_gbs", sum_gbs);
  }

  CudaMemoryStats m = cuda_memory_stats();
  std::printf("== allocator: %.1f MB in use, %.1f MB cached, %.1f MB peak\n", m.in_use / 1e6,
              m.cached / 1e6, m.peak / 1e6);
  cublasDestroy(handle);
  return 0;
}
