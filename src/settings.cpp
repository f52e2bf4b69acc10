#include "settings.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "util.h"
#include "wick/cpu.h"
#include "wick/error.h"

namespace wick::settings {

namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

[[noreturn]] void reject(const char* name, const char* value, const std::string& accepted) {
  throw Error(str(name, "=", value, ": expected ", accepted));
}

size_t hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : hw;
}

// The CPUs in the calling thread's affinity mask (taskset, a cpuset cgroup); 0 when unknown.
size_t affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
  return static_cast<size_t>(CPU_COUNT(&set));
}

// Whitespace-separated words of a small file; empty when it cannot be read.
std::vector<std::string> words_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// A quota of `quota` microseconds per `period` as CPUs, rounded up (1.5 CPUs: 2); 0 for none.
size_t quota_cpus(const std::string& quota, const std::string& period) {
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || *end != '\0' || !(q > 0)) return 0;  // "max", "-1": no quota
  const double p = std::strtod(period.c_str(), &end);
  if (end == period.c_str() || *end != '\0' || !(p > 0)) return 0;
  return static_cast<size_t>(std::ceil(q / p));
}

// The quota of one cgroup directory: v2's cpu.max ("QUOTA PERIOD"), else v1's cpu.cfs_quota_us
// and cpu.cfs_period_us; 0 for none.
size_t cgroup_dir_cpus(const std::string& dir) {
  const auto max = words_of(dir + "/cpu.max");
  if (max.size() == 2) return quota_cpus(max[0], max[1]);
  const auto quota = words_of(dir + "/cpu.cfs_quota_us");
  const auto period = words_of(dir + "/cpu.cfs_period_us");
  if (quota.size() == 1 && period.size() == 1) return quota_cpus(quota[0], period[0]);
  return 0;
}

// The smallest quota of the cgroup `mount` + `path` and of every cgroup above it up to `mount`
// (a container's own hierarchy may hold only its top); 0 for none.
size_t cgroup_path_cpus(const std::string& mount, std::string path) {
  size_t least = 0;
  for (;;) {
    const size_t cpus = cgroup_dir_cpus(mount + path);
    if (cpus > 0) least = least == 0 ? cpus : std::min(least, cpus);
    const size_t slash = path.rfind('/');
    if (path == "/" || slash == std::string::npos) return least;
    path.resize(slash);
  }
}

double parse_positive(const char* name, const char* value, double unset) {
  if (value == nullptr || *value == '\0') return unset;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(value, &end);
  if (std::isspace(static_cast<unsigned char>(value[0])) != 0 || end == value || *end != '\0' ||
      errno != 0 || !std::isfinite(x) || x <= 0) {
    reject(name, value, "a positive number");
  }
  return x;
}

Cuda read_cuda() {
  Cuda c;
  c.trace = detail::parse_flag("WICK_TRACE", env("WICK_TRACE"), false);
  c.ops_per_batch = static_cast<int>(detail::parse_integer(
      "WICK_CUDA_OPS_PER_BATCH", env("WICK_CUDA_OPS_PER_BATCH"), 1, (1L << 30) - 1, 50));
  if (const char* v = env("WICK_CUDA_GRAPHS")) {
    c.graphs = detail::parse_flag("WICK_CUDA_GRAPHS", v, true) ? 1 : 0;
  }
  c.batch_work = parse_positive("WICK_CUDA_BATCH_WORK", env("WICK_CUDA_BATCH_WORK"), 0);
  c.allow_tf32 = detail::parse_flag("WICK_ALLOW_TF32", env("WICK_ALLOW_TF32"), false);
  c.matmul = detail::parse_choice("WICK_CUDA_MATMUL", env("WICK_CUDA_MATMUL"),
                                  {"auto", "cublas", "wick"}, "auto");
  c.matmul_graphs =
      detail::parse_flag("WICK_CUDA_MATMUL_GRAPHS", env("WICK_CUDA_MATMUL_GRAPHS"), true);
  c.warmup =
      detail::parse_choice("WICK_CUDA_WARMUP", env("WICK_CUDA_WARMUP"), {"0", "handle", "1"}, "1");
  c.decode_graph = detail::parse_flag("WICK_DECODE_GRAPH", env("WICK_DECODE_GRAPH"), true);
  c.attention_rounding_transformers =
      detail::parse_choice("WICK_ATTENTION_ROUNDING", env("WICK_ATTENTION_ROUNDING"),
                           {"default", "transformers"}, "default") == "transformers";
  return c;
}

}  // namespace

namespace detail {

long parse_integer(const char* name, const char* value, long lo, long hi, long unset) {
  if (value == nullptr || *value == '\0') return unset;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(value, &end, 10);
  // strtol skips leading spaces and takes a sign: only an optional '-' and digits are accepted.
  const bool digits = std::isdigit(static_cast<unsigned char>(value[0])) != 0 ||
                      (value[0] == '-' && std::isdigit(static_cast<unsigned char>(value[1])) != 0);
  if (!digits || end == value || *end != '\0' || errno != 0 || x < lo || x > hi) {
    reject(name, value, str("an integer from ", lo, " to ", hi));
  }
  return x;
}

bool parse_flag(const char* name, const char* value, bool unset) {
  if (value == nullptr || *value == '\0') return unset;
  const std::string v = value;
  if (v == "1") return true;
  if (v == "0") return false;
  reject(name, value, "0 or 1");
}

std::string parse_choice(const char* name, const char* value,
                         std::initializer_list<const char*> accepted, const char* unset) {
  if (value == nullptr || *value == '\0') return unset;
  std::string list;
  for (const char* a : accepted) {
    if (std::string(value) == a) return a;
    list += list.empty() ? "" : ", ";
    list += a;
  }
  reject(name, value, "one of " + list);
}

size_t cgroup_cpu_limit(const std::string& root, const std::string& self_cgroup) {
  size_t least = 0;
  std::istringstream lines(self_cgroup);
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH": v2's single line has ID 0 and no controllers; v1 has one line per
    // hierarchy, mounted under root/CONTROLLERS (e.g. "cpu,cpuacct").
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::string mount;
    if (controllers.empty()) {
      mount = root;
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {
      mount = root + "/" + controllers;
    } else {
      continue;
    }
    const size_t cpus = cgroup_path_cpus(mount, path);
    if (cpus > 0) least = least == 0 ? cpus : std::min(least, cpus);
  }
  return least;
}

}  // namespace detail

size_t available_cpus() {
  size_t n = hardware_threads();
  if (const size_t affinity = affinity_cpus(); affinity > 0) n = std::min(n, affinity);
  std::ifstream self("/proc/self/cgroup");
  std::ostringstream text;
  text << self.rdbuf();
  if (const size_t quota = detail::cgroup_cpu_limit("/sys/fs/cgroup", text.str()); quota > 0) {
    n = std::min(n, quota);
  }
  return std::max<size_t>(n, 1);
}

size_t num_threads() {
  static const size_t n = [] {
    const long hw = static_cast<long>(hardware_threads());
    return static_cast<size_t>(detail::parse_integer("WICK_NUM_THREADS", env("WICK_NUM_THREADS"), 1,
                                                     hw, static_cast<long>(available_cpus())));
  }();
  return n;
}

size_t cpu_cache_mb() {
  static const size_t mb = static_cast<size_t>(
      detail::parse_integer("WICK_CPU_CACHE_MB", env("WICK_CPU_CACHE_MB"), 0, 1L << 20, 256));
  return mb;
}

const std::string& cpu_isa() {
  static const std::string isa =
      detail::parse_choice("WICK_CPU_ISA", env("WICK_CPU_ISA"), {"avx2", "avx512"}, "");
  return isa;
}

const std::string& qmatmul_activations() {
  static const std::string acts =
      detail::parse_choice("WICK_QMATMUL_ACTIVATIONS", env("WICK_QMATMUL_ACTIVATIONS"),
                           {"int16", "int8", "f32"}, "int16");
  return acts;
}

namespace {
// set_batch_invariant's value: -1 none (the environment's), 0 off, 1 on.
std::atomic<int> g_batch_invariant{-1};
}  // namespace

std::optional<bool> batch_invariant_setting() {
  if (const int set = g_batch_invariant.load(std::memory_order_relaxed); set >= 0) return set == 1;
  static const std::optional<bool> on = []() -> std::optional<bool> {
    const char* v = env("WICK_BATCH_INVARIANT");
    if (v == nullptr || *v == '\0') return std::nullopt;
    return detail::parse_flag("WICK_BATCH_INVARIANT", v, false);
  }();
  return on;
}

bool batch_invariant() {
  return batch_invariant_setting().value_or(false);
}

const Cuda& cuda() {
  static const Cuda c = read_cuda();
  return c;
}

}  // namespace wick::settings

namespace wick {

void set_batch_invariant(bool on) {
  settings::g_batch_invariant.store(on ? 1 : 0, std::memory_order_relaxed);
}

bool batch_invariant() {
  return settings::batch_invariant();
}

}  // namespace wick
