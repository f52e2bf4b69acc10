#pragma once
// The CUDA backend's settings, read once from the environment by settings.cpp (which validates
// them): the CUDA backend and the no-CUDA stub both use them, so a setting means the same in
// either build. Kernel tuning is not here: cuda/tuning.h.

#include <atomic>

#include "cuda/tuning.h"
#include "wick/cuda.h"

namespace wick::cuda {

/// What the device starts at creation to make cuBLASLt ready before the first matmul needs it.
enum class WarmUp {
  Off,     // nothing: the first matmul on the cublas path creates the handle itself
  Handle,  // a thread creates the handle and workspace
  Full,    // that thread also runs one 1024^3 GEMM per dtype (cuBLAS loads its kernels)
};

struct Config {
  bool trace = false;
  int ops_per_batch = 50;
  int graphs = -1;                                    // 1 on, 0 off, -1 the backend's default
  double batch_work = 0;                              // 0: the backend's default
  bool allow_tf32 = false;                            // initial value of the run-time switch
  CudaMatmulPath matmul_path = CudaMatmulPath::Auto;  // initial value
  bool matmul_graphs = true;                          // initial value
  WarmUp warmup = WarmUp::Full;
  bool decode_graph = true;
  int graph_steps = 0;  // 0: the generator's own choice (TuningOverrides::graph_steps)
  bool attention_rounding_transformers = false;
};

/// The settings, read from the environment at first use.
const Config& config();

/// The settings that change at run time (public setters, tests, benchmarks), starting from
/// config().
struct Switches {
  std::atomic<bool> allow_tf32;
  std::atomic<CudaMatmulPath> matmul_path;
  std::atomic<bool> matmul_graphs;
  std::atomic<bool> flash_wgmma;
};
Switches& switches();

/// "WICK_TRACE=1".
inline bool trace_enabled() {
  return config().trace;
}
/// Whether repeated identical matmuls (same shapes and buffers) are replayed as CUDA graphs.
inline bool matmul_graphs_enabled() {
  return switches().matmul_graphs.load(std::memory_order_relaxed);
}
inline void set_matmul_graphs(bool on) {
  switches().matmul_graphs.store(on);
}
/// Whether prefill attention on a 9.0 GPU may take the wgmma kernel (attention_wgmma.h).
inline bool flash_wgmma_enabled() {
  return switches().flash_wgmma.load(std::memory_order_relaxed);
}
inline void set_flash_wgmma(bool on) {
  switches().flash_wgmma.store(on);
}

}  // namespace wick::cuda
