#include "cuda/tuning.h"

#include "cuda/check.h"

namespace wick::cuda {

namespace {

bool pick(int forced, bool table) {
  return forced < 0 ? table : forced != 0;
}

Tuning make_tuning() {
  const TuningOverrides& o = tuning_overrides();
  Tuning t{};
  static_cast<ArchTuning&>(t) = arch_tuning(compute_capability());
  t.pdl = pick(o.pdl, t.pdl);
  t.pdl_step_ends = pick(o.pdl_step_ends, t.pdl_step_ends);
  t.paged_early = pick(o.paged_early, t.paged_early);
  t.decode_gemv = pick(o.decode_gemv, t.decode_gemv);
  t.gemv_argmax = pick(o.gemv_argmax, t.gemv_argmax);
  t.qkv_prefetch = pick(o.qkv_prefetch, t.qkv_prefetch);
  t.gemv_stream = pick(o.gemv_stream, t.gemv_stream);
  t.gemv_pairs = pick(o.gemv_pairs, t.gemv_pairs);
  if (o.row_warps > 0) t.row_warps = o.row_warps;
  t.graph_steps = o.graph_steps;
  t.gemv_rows = o.gemv_rows;
  t.gemv_threads = o.gemv_threads;
  t.gemv_wave_threads = o.gemv_wave_threads;
  t.l2_next_mb = o.l2_next_mb;
  t.l2_tail_mb = o.l2_tail_mb;
  t.l2_end_mb = o.l2_end_mb;
  t.l2_end_gu_mb = o.l2_end_gu_mb;
  t.l2_aside_mb = o.l2_aside_mb;
  t.row_vectors_per_thread = o.row_vectors_per_thread;
  t.decode_splits = o.decode_splits;
  t.row_kernel = o.row_kernel;
  return t;
}

}  // namespace

const Tuning& tuning() {
  static const Tuning t = make_tuning();
  return t;
}

}  // namespace wick::cuda
