#include "cuda_config.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace wick {

namespace cuda {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

bool env_is(const char* name, const char* value) {
  const char* v = env(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

Config read_config() {
  Config c;
  c.trace = env_is("WICK_TRACE", "1");
  if (const char* v = env("WICK_CUDA_OPS_PER_BATCH")) {
    char* end = nullptr;
    long x = std::strtol(v, &end, 10);
    if (*end == '\0' && x > 0 && x < (1 << 30)) c.ops_per_batch = static_cast<int>(x);
  }
  if (env_is("WICK_CUDA_GRAPHS", "0")) c.graphs = 0;
  if (env_is("WICK_CUDA_GRAPHS", "1")) c.graphs = 1;
  if (const char* v = env("WICK_CUDA_BATCH_WORK")) {
    char* end = nullptr;
    double x = std::strtod(v, &end);
    if (*end == '\0' && x > 0) c.batch_work = x;
  }
  c.allow_tf32 = env_is("WICK_ALLOW_TF32", "1");
  if (env_is("WICK_CUDA_MATMUL", "cublas")) c.matmul_path = CudaMatmulPath::Cublas;
  if (env_is("WICK_CUDA_MATMUL", "wick")) c.matmul_path = CudaMatmulPath::Wick;
  c.matmul_graphs = !env_is("WICK_CUDA_MATMUL_GRAPHS", "0");
  if (env_is("WICK_CUDA_WARMUP", "0")) c.warmup = WarmUp::Off;
  if (env_is("WICK_CUDA_WARMUP", "handle")) c.warmup = WarmUp::Handle;
  c.decode_graph = !env_is("WICK_DECODE_GRAPH", "0");
  if (const char* v = env("WICK_GRAPH_STEPS"); v != nullptr && std::atoi(v) >= 1) {
    c.graph_steps = std::min(std::atoi(v), 8);
  }
  c.decode_gemv = !env_is("WICK_DECODE_GEMV", "0");
  c.pdl = !env_is("WICK_PDL", "0");
  c.pdl_step_ends = !env_is("WICK_PDL_STEP_ENDS", "0");
  for (const char* rows : {"2", "4", "8"}) {
    if (env_is("WICK_GEMV_ROWS", rows)) c.gemv_rows = std::atoi(rows);
  }
  for (const char* threads : {"64", "128", "256"}) {
    if (env_is("WICK_GEMV_THREADS", threads)) c.gemv_threads = std::atoi(threads);
  }
  c.gemv_argmax = !env_is("WICK_GEMV_ARGMAX", "0");
  if (const char* v = env("WICK_L2_NEXT_MB"); v != nullptr && std::atoi(v) >= 0) {
    c.l2_next_mb = std::min(std::atoi(v), 1024);
  }
  if (const char* v = env("WICK_L2_TAIL_MB"); v != nullptr && std::atoi(v) >= 0) {
    c.l2_tail_mb = std::min(std::atoi(v), 1024);
  }
  if (const char* v = env("WICK_L2_END_MB"); v != nullptr && std::atoi(v) >= 0) {
    c.l2_end_mb = std::min(std::atoi(v), 1024);
  }
  if (const char* v = env("WICK_L2_END_GU_MB"); v != nullptr && std::atoi(v) >= 0) {
    c.l2_end_gu_mb = std::min(std::atoi(v), 1024);
  }
  if (const char* v = env("WICK_L2_ASIDE_MB"); v != nullptr && std::atoi(v) >= 0) {
    c.l2_aside_mb = std::min(std::atoi(v), 1024);
  }
  c.qkv_prefetch = !env_is("WICK_QKV_PREFETCH", "0");
  c.gemv_stream = !env_is("WICK_GEMV_STREAM", "0");
  c.gemv_pairs = !env_is("WICK_GEMV_PAIRS", "0");
  if (const char* v = env("WICK_ROW_VPT")) c.row_vectors_per_thread = std::atoi(v);
  c.attention_rounding_transformers = env_is("WICK_ATTENTION_ROUNDING", "transformers");
  if (env_is("WICK_ROW_KERNEL", "block")) c.row_kernel = RowKernel::Block;
  if (env_is("WICK_ROW_KERNEL", "warp")) c.row_kernel = RowKernel::Warp;
  if (env_is("WICK_ROW_KERNEL", "bulk")) c.row_kernel = RowKernel::Bulk;
  if (env_is("WICK_ROW_WARPS", "1")) c.row_warps = 1;
  if (env_is("WICK_ROW_WARPS", "4")) c.row_warps = 4;
  if (const char* v = env("WICK_DECODE_SPLITS"); v != nullptr && std::atoi(v) > 0) {
    c.decode_splits = std::atoi(v);
  }
  c.flash_wgmma = !env_is("WICK_FLASH_WGMMA", "0");
  return c;
}

}  // namespace

const Config& config() {
  static const Config c = read_config();
  return c;
}

Switches& switches() {
  static Switches s{{config().allow_tf32},
                    {config().matmul_path},
                    {config().matmul_graphs},
                    {config().flash_wgmma}};
  return s;
}

}  // namespace cuda

void cuda_allow_tf32(bool allow) {
  cuda::switches().allow_tf32.store(allow);
}
bool cuda_tf32_allowed() {
  return cuda::switches().allow_tf32.load();
}
void cuda_set_matmul_path(CudaMatmulPath path) {
  cuda::switches().matmul_path.store(path);
}
CudaMatmulPath cuda_matmul_path() {
  return cuda::switches().matmul_path.load();
}

}  // namespace wick
