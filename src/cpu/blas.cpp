#include "cpu/blas.h"

#include <cblas.h>
#include <dlfcn.h>
#include <strings.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/gemm_f32.h"
#include "util.h"
#include "wick/cpu.h"

namespace wick::cpu {

namespace {

struct CoreIsa {
  const char* core;
  const char* isa;
};

// OpenBLAS's x86-64 cores (gotoblas_corename) and the instruction set of their f32 kernels.
constexpr std::array<CoreIsa, 28> kCores{{
    {"SapphireRapids", "avx512"},
    {"Cooperlake", "avx512"},
    {"SkylakeX", "avx512"},
    {"Haswell", "avx2"},
    {"Zen", "avx2"},
    {"Excavator", "avx"},
    {"Steamroller", "avx"},
    {"Piledriver", "avx"},
    {"Bulldozer", "avx"},
    {"Sandybridge", "avx"},
    {"Nehalem", "sse"},
    {"Dunnington", "sse"},
    {"Penryn", "sse"},
    {"Core2", "sse"},
    {"Prescott", "sse"},
    {"Northwood", "sse"},
    {"Coppermine", "sse"},
    {"Katmai", "sse"},
    {"Banias", "sse"},
    {"Atom", "sse"},
    {"Nano", "sse"},
    {"Opteron", "sse"},
    {"Opteron_SSE3", "sse"},
    {"Barcelona", "sse"},
    {"Bobcat", "sse"},
    {"Athlon", "sse"},
    {"Generic", "sse"},
    {"Unknown", "sse"},
}};

bool is_amd() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

// The OpenBLAS cores whose kernels use the best instruction set this CPU (and its OS) offers,
// the preferred first; empty when OpenBLAS has only SSE kernels for it.
std::vector<const char*> best_cores() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  // The builtins also check that the OS saves the wider registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    // Cooperlake's tables add the bf16 kernels (sbgemm) to SkylakeX's f32 and f64 ones; some
    // OpenBLAS releases cannot force it by name.
    if (__builtin_cpu_supports("avx512bf16")) return {"Cooperlake", "SkylakeX"};
    return {"SkylakeX"};
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {is_amd() ? "Zen" : "Haswell", "Haswell"};
  }
  if (__builtin_cpu_supports("avx")) return {"Sandybridge"};
#endif
  return {};
}

int isa_rank(const std::string& isa) {
  if (isa == "avx512") return 3;
  if (isa == "avx2") return 2;
  if (isa == "avx") return 1;
  return 0;
}

bool trace_on() {
  const char* v = std::getenv("WICK_TRACE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

// Re-runs the core selection of a DYNAMIC_ARCH OpenBLAS with `core` forced, through its own
// exported entry points (absent from a build for one fixed CPU, which is then left as it is).
// OpenBLAS reads OPENBLAS_CORETYPE at that moment: it is set for the call and removed after.
// The worker threads its constructor started are stopped first (as OpenBLAS does before a fork):
// one still starting up reads the kernel table, which is null between quit and init. wick runs
// OpenBLAS single-threaded, so they are not needed again.
bool force_core(const char* core) {
  using Fn = void (*)();
  auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return false;
  stop_blas_threads();
  setenv("OPENBLAS_CORETYPE", core, 1);
  quit();
  init();
  unsetenv("OPENBLAS_CORETYPE");
  return true;
}

void select_core() {
  const std::string before = openblas_get_corename();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const bool user_forced = env != nullptr && *env != '\0';
  // A name not in kCores (a newer core than this list) is left as it is.
  const std::string before_isa = blas_core_isa(before);
  bool switched = false;
  if (!user_forced && !before_isa.empty()) {
    for (const char* core : best_cores()) {
      if (isa_rank(blas_core_isa(openblas_get_corename())) >= isa_rank(blas_core_isa(core))) {
        break;
      }
      if (!force_core(core)) break;
      switched = true;
    }
  }
  if (trace_on()) {
    std::string how = user_forced ? " (OPENBLAS_CORETYPE)" : "";
    if (switched) how = str(" (OpenBLAS chose ", before, " for this CPU)");
    std::fprintf(stderr, "wick: CPU GEMM: %s, kernels %s [%s]%s\n", openblas_get_config(),
                 openblas_get_corename(), blas_core_isa(openblas_get_corename()).c_str(),
                 how.c_str());
    const GemmF32& f32 = gemm_f32();
    std::fprintf(stderr, "wick: CPU f32 GEMM: %s; under batch invariance %s\n",
                 f32.default_path ? f32.name : "OpenBLAS (the kernels above)",
                 f32.run != nullptr ? f32.name : "OpenBLAS, in calls of whole tiles");
  }
}

}  // namespace

// At the first BLAS use, not at load time: OpenBLAS's worker threads, started by its own
// constructor, have settled by then.
void init_blas() {
  static const bool done = (select_core(), true);
  (void)done;
}

void stop_blas_threads() {
  if (auto stop = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"))) {
    stop();
  }
}

std::string blas_core() {
  init_blas();
  return openblas_get_corename();
}

const GemmF32& gemm_f32() {
  // Follows the CPU kernels' choice (WICK_CPU_ISA included); a throw leaves it unset.
  static const GemmF32& gemm = []() -> const GemmF32& {
    // In every build: cpu_isa() rejects a bad WICK_CPU_ISA.
    [[maybe_unused]] const std::string isa = wick::cpu_isa();
#if !defined(WICK_NO_AVX512_KERNELS)
    if (isa == "avx512") return kAvx512GemmF32;
#endif
    return kAvx2GemmF32;
  }();
  return gemm;
}

std::string blas_core_isa(const std::string& core) {
  for (const auto& c : kCores) {
    if (strcasecmp(c.core, core.c_str()) == 0) return c.isa;
  }
  return "";
}

}  // namespace wick::cpu

namespace wick {

std::string cpu_gemm() {
  const std::string core = cpu::blas_core();
  const std::string blas = str(openblas_get_config(), " [", cpu::blas_core_isa(core), "]");
  const cpu::GemmF32& f32 = cpu::gemm_f32();
  if (!f32.default_path) return blas;
  return str("f32 ", f32.name, ", f64 ", blas);
}

std::string cpu_gemm_isa() {
  return cpu::blas_core_isa(cpu::blas_core());
}

}  // namespace wick
