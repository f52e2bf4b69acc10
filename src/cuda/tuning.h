#pragma once
// Tuning of the CUDA kernels, as data: a constexpr table per compute capability holding the
// choices the kernels make by default, and TuningOverrides, which only benchmark and test
// binaries set (this header is private: the library reads no environment variable for any of
// it; bench/README.md lists the variables bench/ and tests/ map onto it, tuning_env.h). Set the
// overrides before the first GPU op: the kernels read tuning() once.

#include <cstdint>

namespace wick::cuda {

/// Which kernel runs rows a warp could hold in registers.
enum class RowKernel { Auto, Block, Warp, Bulk };

/// The defaults of one GPU architecture.
struct ArchTuning {
  int compute_capability;  // 10 * major + minor
  // The decode step's launches.
  bool pdl;            // programmatic dependent launch of the decode kernels
  bool pdl_step_ends;  // the step's ends (pick, advance, embedding) let the next kernel start
  bool paged_early;    // a one-sequence paged step's attention lets its output projection start
  // The one-token projections (decode_gemv*.cu, decode_gemv.cpp).
  bool decode_gemv;              // fused projections with their epilogues (else composed from ops)
  bool gemv_argmax;              // the greedy pick offered by the output head's kernel
  bool qkv_prefetch;             // the qkv projection's blocks ask the L2 for their rows early
  bool gemv_stream;              // GGML rows of large projections streamed through fewer blocks
  bool gemv_pairs;               // GGML rows with k % 2048 == 0 in warp-owned pairs
  int64_t l2_next_bytes;         // the output projection's ask for gate/up (at most)
  int64_t l2_tail_bytes;         // a latency-bound projection's ask as it starts
  int64_t l2_end_gate_up_bytes;  // gate/up's last blocks' ask for down
  int64_t l2_end_project_add_bytes;  // down's and o's last blocks' ask for the next projection
  int64_t l2_aside_bytes;            // the side branch's ask for gate/up
  // Row kernels.
  int row_warps;  // rows (warps) a block of the warp-per-row kernel
};

inline constexpr ArchTuning kArchTunings[] = {
    {90, true, true, true, true, true, true, true, true, int64_t{4} << 20, int64_t{1} << 20,
     int64_t{4} << 20, int64_t{8} << 20, int64_t{12} << 20, 2},
};

/// The table for compute capability `cc` (10 * major + minor): the newest entry at or below it,
/// else the oldest (every GPU the library builds for takes the sm_90 choices today).
constexpr const ArchTuning& arch_tuning(int cc) {
  const ArchTuning* best = &kArchTunings[0];
  for (const ArchTuning& t : kArchTunings) {
    if (t.compute_capability <= cc && t.compute_capability >= best->compute_capability) best = &t;
  }
  return *best;
}

/// What benchmarks and tests may force. Unset values (-1 for a size or a switch, 0 for a count)
/// leave the table's choice or the kernel's own.
struct TuningOverrides {
  int pdl = -1, pdl_step_ends = -1, paged_early = -1, decode_gemv = -1, gemv_argmax = -1,
      qkv_prefetch = -1, gemv_stream = -1, gemv_pairs = -1;  // 0 or 1
  int flash_wgmma = -1;  // 0: prefill attention by mma.sync where wgmma applies (set_flash_wgmma)
  int graph_steps = 0;   // 1..8 greedy decode steps a captured graph runs
  int gemv_rows = 0;     // 2, 4 or 8 output rows a block of the decode GEMV
  int gemv_threads = 0;  // 32, 64, 128 or 256 threads a block of 4 plain rows
  int gemv_wave_threads = 0;       // 32, 64 or 128: see dense_threads (decode_gemv_plain.cu)
  int l2_next_mb = -1;             // the output projection's ask for gate/up
  int l2_tail_mb = -1;             // every projection's ask as it starts (replaces the end asks)
  int l2_end_mb = -1;              // down's and o's last blocks' ask
  int l2_end_gu_mb = -1;           // gate/up's last blocks' ask
  int l2_aside_mb = -1;            // the side branch's ask (0: none)
  int row_vectors_per_thread = 0;  // 2, 4 or 8
  RowKernel row_kernel = RowKernel::Auto;
  int row_warps = 0;      // 1, 2 or 4
  int decode_splits = 0;  // key splits per k/v head of decode attention
};

/// The overrides; benchmark and test binaries only.
TuningOverrides& tuning_overrides();

/// The effective tuning: the table of the GPU in use, overrides applied (and the knobs without a
/// table entry, copied from the overrides). Read once, at the first call.
struct Tuning : ArchTuning {
  int graph_steps, gemv_rows, gemv_threads, gemv_wave_threads, l2_next_mb, l2_tail_mb, l2_end_mb,
      l2_end_gu_mb, l2_aside_mb, row_vectors_per_thread, decode_splits;
  RowKernel row_kernel;
};
const Tuning& tuning();

}  // namespace wick::cuda
