#include "cuda_config.h"

#include "cuda/tuning.h"
#include "settings.h"

namespace wick {

namespace cuda {

namespace {

Config read_config() {
  const settings::Cuda& s = settings::cuda();
  Config c;
  c.trace = s.trace;
  c.ops_per_batch = s.ops_per_batch;
  c.graphs = s.graphs;
  c.batch_work = s.batch_work;
  c.allow_tf32 = s.allow_tf32;
  if (s.matmul == "cublas") c.matmul_path = CudaMatmulPath::Cublas;
  if (s.matmul == "wick") c.matmul_path = CudaMatmulPath::Wick;
  c.matmul_graphs = s.matmul_graphs;
  if (s.warmup == "0") c.warmup = WarmUp::Off;
  if (s.warmup == "handle") c.warmup = WarmUp::Handle;
  c.decode_graph = s.decode_graph;
  c.graph_steps = tuning_overrides().graph_steps;
  c.attention_rounding_transformers = s.attention_rounding_transformers;
  return c;
}

}  // namespace

const Config& config() {
  static const Config c = read_config();
  return c;
}

TuningOverrides& tuning_overrides() {
  static TuningOverrides o;
  return o;
}

Switches& switches() {
  static Switches s{{config().allow_tf32},
                    {config().matmul_path},
                    {config().matmul_graphs},
                    {tuning_overrides().flash_wgmma != 0}};
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
