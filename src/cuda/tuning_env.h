#pragma once
// The benchmark variables (bench/README.md) as TuningOverrides, for the benchmark and test
// binaries that take them from their environment (the library itself reads none of them). Each
// is validated as the user settings are (settings.h): a value outside the accepted ones throws
// wick::Error naming it. Call before the first GPU op.

#include <cstdlib>
#include <string>

#include "cuda/tuning.h"
#include "settings.h"

namespace wick::cuda {

inline void apply_tuning_env() {
  using settings::detail::parse_choice;
  using settings::detail::parse_flag;
  using settings::detail::parse_integer;
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  TuningOverrides& o = tuning_overrides();
  auto flag = [&](const char* name, int& field) {
    if (const char* v = env(name)) field = parse_flag(name, v, true) ? 1 : 0;
  };
  auto count = [&](const char* name, int& field, std::initializer_list<const char*> accepted) {
    if (const char* v = env(name)) field = std::stoi(parse_choice(name, v, accepted, "0"));
  };
  auto mb = [&](const char* name, int& field) {
    if (const char* v = env(name)) field = static_cast<int>(parse_integer(name, v, 0, 1024, -1));
  };
  flag("WICK_PDL", o.pdl);
  flag("WICK_PDL_STEP_ENDS", o.pdl_step_ends);
  flag("WICK_PAGED_EARLY", o.paged_early);
  flag("WICK_DECODE_GEMV", o.decode_gemv);
  flag("WICK_GEMV_ARGMAX", o.gemv_argmax);
  flag("WICK_QKV_PREFETCH", o.qkv_prefetch);
  flag("WICK_GEMV_STREAM", o.gemv_stream);
  flag("WICK_GEMV_PAIRS", o.gemv_pairs);
  flag("WICK_FLASH_WGMMA", o.flash_wgmma);
  if (const char* v = env("WICK_GRAPH_STEPS")) {
    o.graph_steps = static_cast<int>(parse_integer("WICK_GRAPH_STEPS", v, 1, 8, 0));
  }
  count("WICK_GEMV_ROWS", o.gemv_rows, {"2", "4", "8"});
  count("WICK_GEMV_THREADS", o.gemv_threads, {"32", "64", "128", "256"});
  count("WICK_GEMV_WAVE_THREADS", o.gemv_wave_threads, {"32", "64", "128"});
  count("WICK_ROW_VPT", o.row_vectors_per_thread, {"2", "4", "8"});
  count("WICK_ROW_WARPS", o.row_warps, {"1", "2", "4"});
  mb("WICK_L2_NEXT_MB", o.l2_next_mb);
  mb("WICK_L2_TAIL_MB", o.l2_tail_mb);
  mb("WICK_L2_END_MB", o.l2_end_mb);
  mb("WICK_L2_END_GU_MB", o.l2_end_gu_mb);
  mb("WICK_L2_ASIDE_MB", o.l2_aside_mb);
  if (const char* v = env("WICK_ROW_KERNEL")) {
    const std::string k =
        parse_choice("WICK_ROW_KERNEL", v, {"auto", "block", "warp", "bulk"}, "auto");
    o.row_kernel = k == "block"  ? RowKernel::Block
                   : k == "warp" ? RowKernel::Warp
                   : k == "bulk" ? RowKernel::Bulk
                                 : RowKernel::Auto;
  }
  if (const char* v = env("WICK_DECODE_SPLITS")) {
    o.decode_splits = static_cast<int>(parse_integer("WICK_DECODE_SPLITS", v, 1, 128, 0));
  }
}

}  // namespace wick::cuda
