#pragma once
// The environment variables a user sets, read in one place (settings.cpp): each is read once, at
// its first use, and a value outside the accepted ones throws wick::Error naming the variable, the
// value and what it accepts. Unset and empty mean the default. The README's table lists them.
// Kernel tuning is not among them: benchmarks and tests set it through src/cuda/tuning.h.

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>

namespace wick::settings {

/// The CPUs this process may run on: the hardware threads, fewer where its CPU affinity (taskset,
/// a cpuset) or a cgroup CPU quota (docker --cpus, a Kubernetes CPU limit, rounded up) allows
/// fewer. Read at each call.
size_t available_cpus();
/// WICK_NUM_THREADS: CPU threads, 1 to the CPU's hardware threads (default: available_cpus(),
/// since more threads than CPUs would leave the pool's spinning workers waiting for threads that
/// are not running).
size_t num_threads();
/// WICK_CPU_CACHE_MB: MiB of freed CPU buffers kept for reuse, 0 to 1048576 (default 256).
size_t cpu_cache_mb();
/// WICK_CPU_ISA: "avx2", "avx512", or "" when unset (the best the CPU has).
const std::string& cpu_isa();
/// WICK_QMATMUL_ACTIVATIONS: "int16" (default), "int8" or "f32".
const std::string& qmatmul_activations();
/// WICK_BATCH_INVARIANT=0|1 as given, nullopt when unset: the serving engine's projections
/// (src/nn/batch_linear.cpp) default to on, everything else to off (batch_invariant()). A value
/// set by set_batch_invariant (wick/cpu.h) takes the place of the variable's.
std::optional<bool> batch_invariant_setting();
/// WICK_BATCH_INVARIANT=0|1 (default 0): the CPU products whose kernel would otherwise depend on
/// the number of rows (f32/f64/f16/bf16 matmul) take one path for every row count, so that a
/// row's bits do not depend on its batch (docs/NUMERICS.md, "Determinism").
bool batch_invariant();

/// The CUDA backend's settings (src/cuda_config.h keeps their meaning).
struct Cuda {
  bool trace = false;                            // WICK_TRACE=0|1
  int ops_per_batch = 50;                        // WICK_CUDA_OPS_PER_BATCH=1..1073741823
  int graphs = -1;                               // WICK_CUDA_GRAPHS=0|1; -1 unset
  double batch_work = 0;                         // WICK_CUDA_BATCH_WORK=X > 0; 0 unset
  bool allow_tf32 = false;                       // WICK_ALLOW_TF32=0|1
  std::string matmul = "auto";                   // WICK_CUDA_MATMUL=auto|cublas|wick
  bool matmul_graphs = true;                     // WICK_CUDA_MATMUL_GRAPHS=0|1
  std::string warmup = "1";                      // WICK_CUDA_WARMUP=0|handle|1
  bool decode_graph = true;                      // WICK_DECODE_GRAPH=0|1
  bool attention_rounding_transformers = false;  // WICK_ATTENTION_ROUNDING=transformers|default
};
const Cuda& cuda();

namespace detail {
/// The parsers, exposed for their tests: `value` of variable `name` (null or empty: unset).
long parse_integer(const char* name, const char* value, long lo, long hi, long unset);
bool parse_flag(const char* name, const char* value, bool unset);
std::string parse_choice(const char* name, const char* value,
                         std::initializer_list<const char*> accepted, const char* unset);
/// The CPUs a cgroup CPU quota allows, or 0 where none applies: the smallest quota of the
/// process's cgroups (`self_cgroup`: the text of /proc/self/cgroup) and of the cgroups above
/// them, read under `root` (/sys/fs/cgroup): v2's cpu.max, v1's cpu.cfs_quota_us and
/// cpu.cfs_period_us in the hierarchy whose controllers include cpu.
size_t cgroup_cpu_limit(const std::string& root, const std::string& self_cgroup);
}  // namespace detail

}  // namespace wick::settings
