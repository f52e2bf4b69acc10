// GPU benchmark of the fused nn ops: layer_norm, rms_norm and softmax_last_dim on (4096, 4096)
// bf16 in GB/s beside a device-to-device copy of the same bytes; attention bf16 (b 1, h 32, d 128,
// causal) at s = 1024 / 4096 / 16384 in ms and TFLOP/s; decode (s 1 against a 4096-long KV cache,
// h_kv 8) in GB/s of KV cache read. Times are CUDA events after warm-up, medians of several
// samples, in two ways: through the public op (host work included where it outlasts the GPU's),
// and the kernel alone (its launcher captured many times into a CUDA graph and replayed: the
// GPU's time per call). The decode kernel reads 8 caches in turn (134 MB, beyond the L2), so
// its figure is HBM bandwidth; WICK_BENCH_DECODE_SKV=16,288 measures its two kernel lines at
// those cache lengths instead. Prints "RESULT nn_<key> <value>" lines; bench/cuda/torch_nn.py
// prints PyTorch's. Prefill lines name the kernel launch_attention picks; where that is the wgmma
// kernel, a second line (keys attn_mma_*) times the mma.sync kernel (set_flash_wgmma(false), as
// WICK_FLASH_WGMMA=0).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "check_exit.h"
#include "cuda/cuda_device.h"
#include "cuda/fused_kernels.h"
#include "cuda/kernels.h"
#include "cuda/tuning_env.h"
#include "cuda_config.h"
#include "wick/wick.h"

namespace {

using namespace wick;

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

// GPU ms per call of `launch` (kernel launches on the stream it is given, call i of n): called
// once directly (first-use set-up), then `per_graph` times into a CUDA graph replayed `replays`
// times per sample; the median of `samples`.
double graph_ms(const std::function<void(cudaStream_t, int)>& launch, int per_graph, int replays,
                int samples) {
  cudaStream_t cs;
  CHECK_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  launch(cs, 0);
  CHECK_CUDA(cudaStreamSynchronize(cs));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) launch(cs, i);
  CHECK_CUDA(cudaStreamEndCapture(cs, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) CHECK_CUDA(cudaGraphLaunch(exec, cs));
  CHECK_CUDA(cudaStreamSynchronize(cs));
  std::vector<double> ms;
  for (int s = 0; s < samples; ++s) {
    CHECK_CUDA(cudaEventRecord(start, cs));
    for (int r = 0; r < replays; ++r) CHECK_CUDA(cudaGraphLaunch(exec, cs));
    CHECK_CUDA(cudaEventRecord(stop, cs));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / (replays * per_graph));
  }
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(cs));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The kernel launch_attention picks now for bf16 causal attention of contiguous (1, heads, s,
// dim) q, k, v: the op's fresh tensors, 256-byte aligned (whole cudaMalloc'd blocks).
const char* prefill_kernel(size_t heads, size_t s, size_t dim) {
  alignas(256) static char aligned[16];
  cuda::AttentionArgs a;
  a.q = a.k = a.v = a.out = aligned;
  for (int64_t* st : {a.q_strides, a.k_strides, a.v_strides}) {
    st[0] = static_cast<int64_t>(heads * s * dim);
    st[1] = static_cast<int64_t>(s * dim);
    st[2] = static_cast<int64_t>(dim);
  }
  a.b = 1;
  a.h = a.h_kv = static_cast<int>(heads);
  a.s = a.s_kv = static_cast<int>(s);
  a.d = static_cast<int>(dim);
  a.scale = 1 / std::sqrt(static_cast<float>(dim));
  a.causal = true;
  return cuda::attention_kernel_name(DType::BF16, a);
}

// A device buffer of n random bf16 values (normal, mean 0, sd 1).
void* device_bf16(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> host(n);
  for (auto& h : host) {
    float f = dist(gen);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // nearest even
  }
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * 2));
  CHECK_CUDA(cudaMemcpy(p, host.data(), n * 2, cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  cuda::apply_tuning_env();  // the benchmark variables of bench/README.md
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
    std::printf("%-11s %8.3f ms %7.0f GB/s  %5.1f%% of copy  (op)\n", op.name, t, gbs,
                100 * gbs / copy_gbs);
    result(std::string(op.name) + "_gbs", gbs);
    result(std::string(op.name) + "_vs_copy", gbs / copy_gbs);
  }
  // The kernels alone, on raw buffers of the same shape (graph replay).
  if (want("rows")) {
    void* rx = device_bf16(rows * cols, 1);
    void* rw = device_bf16(cols, 2);
    void* rb = device_bf16(cols, 3);
    void* ry = nullptr;
    CHECK_CUDA(cudaMalloc(&ry, rows * cols * 2));
    struct RowKernel {
      const char* name;
      std::function<void(cudaStream_t)> launch;
    };
    std::vector<RowKernel> kernels{
        {"layer_norm",
         [&](cudaStream_t cs) {
           cuda::launch_norm(DType::BF16, false, rx, rw, rb, ry, rows, cols, 1e-5, cs);
         }},
        {"rms_norm",
         [&](cudaStream_t cs) {
           cuda::launch_norm(DType::BF16, true, rx, rw, nullptr, ry, rows, cols, 1e-5, cs);
         }},
        {"softmax",
         [&](cudaStream_t cs) {
           cuda::launch_softmax_last_dim(DType::BF16, rx, ry, rows, cols, cs);
         }},
    };
    for (const RowKernel& k : kernels) {
      double t = graph_ms([&](cudaStream_t cs, int) { k.launch(cs); }, 20, 5, 9);
      double gbs = bytes / t / 1e6;
      std::printf("%-11s %8.3f ms %7.0f GB/s  %5.1f%% of copy  (kernel)\n", k.name, t, gbs,
                  100 * gbs / copy_gbs);
      result(std::string(k.name) + "_kernel_gbs", gbs);
      result(std::string(k.name) + "_kernel_vs_copy", gbs / copy_gbs);
    }
    for (void* p : {rx, rw, rb, ry}) CHECK_CUDA(cudaFree(p));
  }

  // ---- attention, prefill: bf16, b 1, h 32, d 128, causal ----
  const size_t heads = 32, dim = 128;
  std::printf("== attention bf16 b=1 h=32 d=128 causal\n");
  for (size_t s : {1024, 4096, 16384}) {
    if (!want("attn")) break;
    Tensor q = randn({1, heads, s, dim}, gpu), k = randn({1, heads, s, dim}, gpu),
           v = randn({1, heads, s, dim}, gpu);
    int reps = s >= 16384 ? 2 : 10;
    // The default kernel, then the mma.sync one where the default was the wgmma kernel.
    std::string first;
    for (int pass = 0; pass < 2; ++pass) {
      cuda::set_flash_wgmma(pass == 0 && cuda::tuning_overrides().flash_wgmma != 0);
      const std::string kernel = prefill_kernel(heads, s, dim);
      if (pass == 1 && kernel == first) break;
      first = kernel;
      double t = gpu_ms(
          stream,
          [&] {
            (void)nn::scaled_dot_product_attention(q, k, v, {true, 0, std::nullopt});
          },
          reps, 7);
      double tflops = 4.0 * heads * s * s * dim * 0.5 / t / 1e9;
      std::printf("s=%-6zu %9.3f ms %7.1f TFLOP/s  %s\n", s, t, tflops, kernel.c_str());
      const std::string key = (pass == 0 ? "attn_s" : "attn_mma_s") + std::to_string(s);
      result(key + "_ms", t);
      result(key + "_tflops", tflops);
    }
    cuda::set_flash_wgmma(cuda::tuning_overrides().flash_wgmma != 0);
  }

  // ---- decode: one query per head against a 4096-long KV cache, h_kv 8 ----
  // WICK_BENCH_DECODE_SKV=288,1024: the kernel's two lines at other cache lengths instead.
  std::vector<size_t> decode_lengths = {4096};
  const bool lengths_given = std::getenv("WICK_BENCH_DECODE_SKV") != nullptr;
  if (lengths_given) {
    const char* e = std::getenv("WICK_BENCH_DECODE_SKV");
    decode_lengths.clear();
    for (const char* c = e; *c != 0;) {
      char* end = nullptr;
      decode_lengths.push_back(std::strtoul(c, &end, 10));
      c = *end != 0 ? end + 1 : end;
    }
  }
  for (size_t s_kv : decode_lengths) {
    if (!want("decode")) break;
    const size_t h_kv = 8;
    const double kv_bytes = 2.0 * h_kv * s_kv * dim * 2;
    std::printf("== decode bf16 s=1 s_kv=%zu h=%zu h_kv=%zu d=%zu, KV cache %.1f MB\n", s_kv, heads,
                h_kv, dim, kv_bytes / 1e6);
    char at[32] = "";  // the key's suffix at other lengths
    if (lengths_given) std::snprintf(at, sizeof at, "_%zu", s_kv);
    auto line = [&](const char* what, const std::string& key, double ms, double bytes_read) {
      double gbs = bytes_read / ms / 1e6;
      std::printf("%-52s %6.2f us %6.0f GB/s %5.1f%% of copy\n", what, ms * 1e3, gbs,
                  100 * gbs / copy_gbs);
      result(key + at + "_us", ms * 1e3);
      result(key + at + "_gbs", gbs);
      result(key + at + "_vs_copy", gbs / copy_gbs);
    };
    // The kernel alone: 8 caches read in turn, at 4096 keys 134 MB, so that the L2 (50 MB) holds
    // none.
    const int sets = 8;
    const size_t kv_elems = h_kv * s_kv * dim;
    std::vector<void*> ks, vs;
    for (int i = 0; i < sets; ++i) {
      ks.push_back(device_bf16(kv_elems, 100 + i));
      vs.push_back(device_bf16(kv_elems, 200 + i));
    }
    void* dq = device_bf16(heads * dim, 7);
    void* dout = nullptr;
    CHECK_CUDA(cudaMalloc(&dout, heads * dim * 2));
    void* scratch = nullptr;
    const size_t scratch_bytes = size_t{16} << 20;
    CHECK_CUDA(cudaMalloc(&scratch, scratch_bytes));
    auto args_for = [&](int set, const void* mask, int64_t mask_stride) {
      cuda::AttentionArgs a;
      a.q = dq;
      a.k = ks[set % sets];
      a.v = vs[set % sets];
      a.mask = mask;
      a.out = dout;
      int64_t qs[3] = {static_cast<int64_t>(heads * dim), static_cast<int64_t>(dim),
                       static_cast<int64_t>(dim)};
      int64_t kvs[3] = {static_cast<int64_t>(kv_elems), static_cast<int64_t>(s_kv * dim),
                        static_cast<int64_t>(dim)};
      for (int i = 0; i < 3; ++i) {
        a.q_strides[i] = qs[i];
        a.k_strides[i] = a.v_strides[i] = kvs[i];
      }
      a.mask_strides[3] = mask_stride;  // one mask row broadcast to every head
      a.b = 1;
      a.h = static_cast<int>(heads);
      a.h_kv = static_cast<int>(h_kv);
      a.s = 1;
      a.s_kv = static_cast<int>(s_kv);
      a.d = static_cast<int>(dim);
      a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dim)));
      return a;
    };
    auto decode_launch = [&](cudaStream_t cs, int set, const void* mask,
                             const uint32_t* last_key = nullptr, bool early = false) {
      size_t used = 0;
      cuda::TempAlloc temp = [&](size_t n) -> void* {
        void* p = static_cast<char*>(scratch) + used;
        used += (n + 255) / 256 * 256;
        if (used > scratch_bytes) {
          std::fprintf(stderr, "bench_nn_cuda: decode scratch too small\n");
          std::exit(1);
        }
        return p;
      };
      cuda::AttentionArgs a = args_for(set, mask, 1);
      a.last_key = last_key;
      a.launch_next_early = early;
      cuda::launch_attention(DType::BF16, a, temp, cs);
    };
    double t_cold =
        graph_ms([&](cudaStream_t cs, int i) { decode_launch(cs, i, nullptr); }, 8 * sets, 4, 9);
    line("kernel, 8 caches in turn (HBM)", "decode", t_cold, kv_bytes);
    // The graph-captured Llama step's form: the last key in device memory (here the cache's last
    // row), so that a kernel reads the rows before it while the kernel before it finishes.
    uint32_t* dlast = nullptr;
    CHECK_CUDA(cudaMalloc(&dlast, sizeof(uint32_t)));
    const uint32_t last_host = static_cast<uint32_t>(s_kv - 1);
    CHECK_CUDA(cudaMemcpy(dlast, &last_host, sizeof last_host, cudaMemcpyHostToDevice));
    double t_last = graph_ms([&](cudaStream_t cs, int i) { decode_launch(cs, i, nullptr, dlast); },
                             8 * sets, 4, 9);
    line("kernel, device last key (graph step), 8 caches", "decode_last_key", t_last, kv_bytes);
    // As the graph step launches the kernel after it (there the output projection): as soon as
    // every block has asked for its first tiles, so that the next call's reads overlap this one's.
    double t_early =
        graph_ms([&](cudaStream_t cs, int i) { decode_launch(cs, i, nullptr, dlast, true); },
                 8 * sets, 4, 9);
    line("kernel, device last key, next launched early", "decode_last_key_early", t_early,
         kv_bytes);
    // The rest at the default length only.
    if (lengths_given) {
      for (void* p : ks) CHECK_CUDA(cudaFree(p));
      for (void* p : vs) CHECK_CUDA(cudaFree(p));
      for (void* p : {dq, dout, scratch, static_cast<void*>(dlast)}) CHECK_CUDA(cudaFree(p));
      continue;
    }
    double t_warm =
        graph_ms([&](cudaStream_t cs, int) { decode_launch(cs, 0, nullptr); }, 8 * sets, 4, 9);
    line("kernel, one cache (partly L2)", "decode_l2", t_warm, kv_bytes);
    // The graph-captured Llama step's mask: 0 up to the position, -inf after; only the visible
    // half of the cache is read.
    std::vector<uint16_t> mask_host(s_kv);
    const size_t pos = s_kv / 2 - 1;
    for (size_t j = 0; j < s_kv; ++j) mask_host[j] = j <= pos ? 0x0000 : 0xff80;  // 0, -inf
    void* dmask = nullptr;
    CHECK_CUDA(cudaMalloc(&dmask, s_kv * 2));
    CHECK_CUDA(cudaMemcpy(dmask, mask_host.data(), s_kv * 2, cudaMemcpyHostToDevice));
    double t_mask =
        graph_ms([&](cudaStream_t cs, int i) { decode_launch(cs, i, dmask); }, 8 * sets, 4, 9);
    line("kernel, mask hiding the last half (visible bytes)", "decode_masked", t_mask,
         kv_bytes * (pos + 1) / s_kv);

    // Through the public op on one cache (host work per call included where it outlasts the GPU).
    Tensor q = randn({1, heads, 1, dim}, gpu), k = randn({1, h_kv, s_kv, dim}, gpu),
           v = randn({1, h_kv, s_kv, dim}, gpu);
    double t_op = gpu_ms(
        stream,
        [&] {
          (void)nn::scaled_dot_product_attention(q, k, v, {true, 0, std::nullopt});
        },
        50, 15);
    line("nn::scaled_dot_product_attention, one cache", "decode_op", t_op, kv_bytes);
    for (void* p : ks) CHECK_CUDA(cudaFree(p));
    for (void* p : vs) CHECK_CUDA(cudaFree(p));
    for (void* p : {dq, dout, scratch, dmask, static_cast<void*>(dlast)}) CHECK_CUDA(cudaFree(p));
  }
  return 0;
}
