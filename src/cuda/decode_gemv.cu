// The decode step's fused projections (decode_gemv.h): one token's activations against weights
// read once per token, so the kernels are bound by the weight stream. This file picks the kernel
// for a projection's weight format and shape: plain rows (decode_gemv_plain.cu), GGML rows by
// blocks of rows (decode_gemv_ggml.cu), streamed through fewer blocks (decode_gemv_stream.cu) or
// in warp-owned pairs (decode_gemv_pairs.cu, k a multiple of 2048). The kernels are programmatic
// dependent launches: a kernel's first weights load while the kernel before it finishes. Their
// device pieces: decode_gemv_device.cuh. History and figures: docs/perf/gemv.md.

#include <cstdint>
#ifdef WICK_DEVICE_TIMELINE
#include <cstdio>
#include <cstdlib>
#include <vector>
#endif

#include "cuda/decode_gemv.h"
#include "cuda/decode_gemv_launch.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "cuda_config.h"

namespace wick::cuda {
namespace {

using namespace gemv;

// Rows a block: fewer, longer-lived blocks for many rows (launching a block costs about as much
// as reading a few kilobytes): 4 plain rows (a single wave of blocks for Llama's qkv), or 8 rows
// of blocks (their copies in shared memory hold no registers) where there are 2,048 rows or more;
// else 2. TuningOverrides::gemv_rows forces 2, 4 or 8 where shared memory allows.
int rows_per_block(const GemvArgs& a, int64_t row_bytes) {
  const bool dense = a.weights == GemvWeights::Dense;
  const int forced = tuning().gemv_rows;
  if (forced > 0 && (dense || forced * staged_stride(row_bytes) <= kMaxStagedBytes)) return forced;
  if (dense) return 4;
  return a.n >= 2048 && 8 * staged_stride(row_bytes) <= kMaxStagedBytes ? 8 : 2;
}

// The kernel for the projection's weight format and shape.
void launch_format(DType dtype, const GemvArgs& a, int64_t row_bytes, cudaStream_t s) {
  // GGML rows stream through fewer blocks when there are four groups of rows or more per
  // multiprocessor (fewer would leave each block one group, in fewer blocks than one group of 2
  // rows each), unless the table or an override turns it off, rows a block are forced, or k is too
  // long to keep x in registers.
  if (a.weights != GemvWeights::Dense && ggml_pairs_fit(a, row_bytes)) {
    return launch_ggml_pairs(dtype, a, row_bytes, s);
  }
  if (a.weights != GemvWeights::Dense && tuning().gemv_stream && tuning().gemv_rows == 0 &&
      ggml_stream_fits(a)) {
    return launch_ggml_stream(dtype, a, row_bytes, s);
  }
  const int rows = rows_per_block(a, row_bytes);
  if (a.weights == GemvWeights::Dense) return launch_plain_rows(dtype, a, row_bytes, rows, s);
  launch_ggml_rows(dtype, a, row_bytes, rows, s);
}

}  // namespace

bool gemv_fits(DType dtype, const GemvArgs& a) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) return false;
  if (a.k <= 0 || a.n <= 0 || a.n % 2 != 0 || a.n / 2 > INT32_MAX) return false;
  const int64_t row_bytes = row_bytes_of(dtype, a.weights, a.k);
  if (row_bytes == 0 || !aligned(a.x, 16)) return false;
  // Dense rows are read 16 bytes at a time; GGML rows are copied to shared memory in pieces of
  // at least 4 bytes.
  if (a.weights == GemvWeights::Dense) {
    if (!aligned(a.w, 16)) return false;
  } else if (staged_copy_bytes(a.w, row_bytes) == 0 ||
             2 * staged_stride(row_bytes) > kMaxStagedBytes) {
    return false;
  }
  if (a.argmax != nullptr &&
      (a.epilogue != GemvEpilogue::Store || a.weights != GemvWeights::Dense || a.n > INT32_MAX)) {
    return false;
  }
  if (a.epilogue == GemvEpilogue::QkvRope) {
    return a.d > 0 && a.d % 2 == 0 && a.n == (a.h + 2 * a.h_kv) * a.d && a.rot_half > 0 &&
           2 * a.rot_half <= a.d;
  }
  return a.epilogue != GemvEpilogue::Add || a.residual != nullptr;
}

void launch_gemv(DType dtype, const GemvArgs& a, cudaStream_t s) {
#ifdef WICK_DEVICE_TIMELINE
  timeline::write_at_exit();
#endif
  const int64_t row_bytes = row_bytes_of(dtype, a.weights, a.k);
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    throw UnsupportedDType("decode gemv: f32, f16 or bf16");
  }
  launch_format(dtype, a, row_bytes, s);
  if (a.argmax != nullptr) launch_argmax_pick(a.argmax, tuning().pdl_step_ends, s);
}

#ifdef WICK_DEVICE_TIMELINE
namespace timeline {
std::vector<Record> take_gemv_plain();
std::vector<Record> take_gemv_ggml();
std::vector<Record> take_gemv_stream();
std::vector<Record> take_gemv_pairs();
std::vector<Record> take_attention();
std::vector<Record> take_decoder_ops();
std::vector<Record> take_paged_attention();

void write_at_exit() {
  static const bool registered = [] {
    if (std::getenv("WICK_DEVICE_TIMELINE_OUT") == nullptr) return false;
    std::atexit([] {
      cudaDeviceSynchronize();
      FILE* f = std::fopen(std::getenv("WICK_DEVICE_TIMELINE_OUT"), "w");
      if (f == nullptr) return;
      using Take = std::vector<Record> (*)();
      for (Take take : {Take{take_gemv_plain}, Take{take_gemv_ggml}, Take{take_gemv_stream},
                        Take{take_gemv_pairs}, Take{take_attention}, Take{take_decoder_ops},
                        Take{take_paged_attention}}) {
        for (const Record& r : take()) {
          std::fprintf(f, "%u %u %u %u %llu %llu %llu\n", r.tag, r.block, r.sm, r.seq,
                       static_cast<unsigned long long>(r.start),
                       static_cast<unsigned long long>(r.waited),
                       static_cast<unsigned long long>(r.end));
        }
      }
      std::fclose(f);
    });
    return true;
  }();
  (void)registered;
}
}  // namespace timeline
#endif

}  // namespace wick::cuda