#pragma once
// clang-format off
// Every setting of the CUDA backend, read from the environment once, in one place. The CUDA
// backend and the no-CUDA stub both use it, so a setting means the same in either build.
//
//   WICK_TRACE=1                     library loads and first kernel uses, with times, on stderr
//   WICK_CUDA_OPS_PER_BATCH=N        ops per command batch (default 50)
//   WICK_CUDA_GRAPHS=0|1             batches captured and replayed as CUDA graphs (default on)
//   WICK_CUDA_BATCH_WORK=X           ops above X flops-equivalent start at once, outside graphs
//   WICK_ALLOW_TF32=1                f32 matmuls may use TF32 (cuda_allow_tf32)
//   WICK_CUDA_MATMUL=auto|cublas|wick  the GEMM (cuda_set_matmul_path)
//   WICK_CUDA_MATMUL_GRAPHS=0        no graph replay of repeated identical matmuls
//   WICK_CUDA_WARMUP=0|handle        0: no cuBLASLt warm-up thread at device creation (auto
//                                    matmuls then stay on wick's GEMM; with cublas the first
//                                    matmul creates cuBLASLt); handle: a warm-up thread that
//                                    creates the cuBLASLt handle but runs no GEMM
//   WICK_DECODE_GRAPH=0              Llama decode steps op by op, not as captured CUDA graphs
//   WICK_GRAPH_STEPS=1..8            greedy decode steps a captured graph runs (default 4;
//                                    benchmarks)
//   WICK_DECODE_GEMV=0               one-token projections without their fused epilogues
//   WICK_PDL=0                       decode kernels without programmatic dependent launch
//   WICK_GEMV_ROWS=2|4|8             output rows a block of the decode GEMV (benchmarks)
//   WICK_GEMV_THREADS=64|128|256     threads a block of 4 plain rows of the decode GEMV
//                                    (benchmarks)
//   WICK_GEMV_ARGMAX=0               the decode step's argmax as kernels of their own, not
//                                    offered by the output head's (benchmarks)
//   WICK_L2_NEXT_MB=N                MB of the gate/up weights the decode step's output projection
//                                    asks the L2 for during the attention (default: up to 4;
//                                    benchmarks)
//   WICK_L2_TAIL_MB=N                MB of the next projection's weights each decode projection
//                                    asks the L2 for as it starts (default: 1 where its own
//                                    weights are up to 4 MB, else 0; benchmarks)
//   WICK_L2_END_MB=N                 MB of the next projection's weights the last blocks of a
//                                    larger decode projection with a residual add (down, o)
//                                    ask the L2 for as they finish (default 8; a set
//                                    WICK_L2_TAIL_MB replaces it; benchmarks)
//   WICK_L2_END_GU_MB=N              the same for the gate/up projection (default 4; benchmarks)
//   WICK_QKV_PREFETCH=0              the decode qkv projection's blocks do not ask the L2 for
//                                    their rows before pdl_wait (benchmarks)
//   WICK_GEMV_STREAM=0               GGML rows of the decode GEMV one block per group of rows,
//                                    not streamed through fewer blocks (benchmarks)
//   WICK_GEMV_PAIRS=0                GGML rows with k a multiple of 2048 through the block
//                                    kernels, not in warp-owned pairs (benchmarks)
//   WICK_ROW_VPT=2|4|8               vectors per thread of the row kernels (benchmarks)
//   WICK_ROW_KERNEL=block|warp|bulk  the kernel for rows a warp could hold (benchmarks; bulk:
//                                    softmax rows staged in shared memory, where it applies)
//   WICK_ROW_WARPS=1|4               rows (warps) per block of the warp-per-row kernel
//                                    (default 2)
//   WICK_DECODE_SPLITS=N             key splits per k/v head of decode attention (default: one
//                                    wave over the GPU; benchmarks)
//   WICK_FLASH_WGMMA=0               prefill attention on sm_90 by the mma.sync kernel, not the
//                                    wgmma one (tests, benchmarks)
// clang-format on

#include <atomic>

#include "wick/cuda.h"

namespace wick::cuda {

/// What the device starts at creation to make cuBLASLt ready before the first matmul needs it.
enum class WarmUp {
  Off,     // nothing: the first matmul on the cublas path creates the handle itself
  Handle,  // a thread creates the handle and workspace
  Full,    // that thread also runs one 1024^3 GEMM per dtype (cuBLAS loads its kernels)
};

/// Which kernel runs rows a warp could hold in registers.
enum class RowKernel { Auto, Block, Warp, Bulk };

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
  int graph_steps = 0;  // 0: the generator's own choice
  bool decode_gemv = true;
  bool pdl = true;                 // programmatic dependent launch of the decode kernels
  bool pdl_step_ends = true;       // the decode step's ends let the next kernel launch at once
  int gemv_rows = 0;               // 0: the decode GEMV's own choice
  int gemv_threads = 0;            // 0: the decode GEMV's own choice
  bool gemv_argmax = true;         // the greedy pick inside the output head's kernel
  int l2_next_mb = -1;             // -1: the decode GEMV's own choice
  int l2_tail_mb = -1;             // -1: the decode GEMV's own choice
  int l2_end_mb = -1;              // -1: the decode GEMV's own choice
  int l2_end_gu_mb = -1;           // -1: the decode GEMV's own choice
  int l2_aside_mb = -1;            // -1: the decode step's side branch's own choice
  bool qkv_prefetch = true;        // the decode qkv projection's blocks ask the L2 for their rows
  bool gemv_stream = true;         // GGML rows streamed through fewer blocks
  bool gemv_pairs = true;          // GGML rows with k % 2048 == 0 in warp-owned pairs
  int row_vectors_per_thread = 0;  // 0: the kernel's own choice
  bool attention_rounding_transformers = false;
  RowKernel row_kernel = RowKernel::Auto;
  int row_warps = 2;
  int decode_splits = 0;    // 0: the kernel's own choice
  bool flash_wgmma = true;  // initial value
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
