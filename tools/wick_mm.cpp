// wick-mm: the seeds' matmul experiment program. `walk` shows when a 2x2 matmul and its read-back
// return, `time` times N x N matmuls (matmul return, synchronize, one-element read), `read`
// compares two ways of reading one element of a result. Public API only, so the same program
// runs on every backend. On the CPU, `time` first prints the GEMM library and the kernels it runs.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "wick/cpu.h"
#include "wick/wick.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// "1.9 µs" below a millisecond, "1.485 ms" above, as in the seeds' output.
std::string fmt_time(double s) {
  char buf[64];
  if (s < 1e-3) {
    std::snprintf(buf, sizeof buf, "%.1f µs", s * 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  }
  return buf;
}

// Shortest round-trip form with a ".0" on whole numbers, like Rust's {:?} for f32.
std::string fmt_float(float v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string fmt_rows(const std::vector<std::vector<float>>& rows) {
  std::string s = "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    s += i ? ", [" : "[";
    for (size_t j = 0; j < rows[i].size(); ++j) s += (j ? ", " : "") + fmt_float(rows[i][j]);
    s += "]";
  }
  return s + "]";
}

// The single element of `t`, whatever its float dtype.
double read_scalar(const wick::Tensor& t) {
  switch (t.dtype()) {
    case wick::DType::F32:
      return t.to_scalar<float>();
    case wick::DType::F64:
      return t.to_scalar<double>();
    case wick::DType::F16:
      return static_cast<float>(t.to_scalar<wick::f16>());
    case wick::DType::BF16:
      return static_cast<float>(t.to_scalar<wick::bf16>());
    default:
      throw wick::Error("wick-mm: unexpected dtype " + std::string(dtype_name(t.dtype())));
  }
}

wick::DType parse_dtype(const std::string& name) {
  if (name == "f64") return wick::DType::F64;
  if (name == "f16") return wick::DType::F16;
  if (name == "bf16") return wick::DType::BF16;
  return wick::DType::F32;
}

// Two random size x size matrices on `device`, made before any timing.
std::pair<wick::Tensor, wick::Tensor> random_pair(const wick::Device& device, size_t size,
                                                  wick::DType dtype) {
  auto a = wick::Tensor::randn(0.0f, 1.0f, {size, size}, device).to_dtype(dtype);
  auto b = wick::Tensor::randn(0.0f, 1.0f, {size, size}, device).to_dtype(dtype);
  device.synchronize();
  return {a, b};
}

void walk(const std::string& name, const wick::Device& device) {
  auto a = wick::Tensor::arange(0.0f, 4.0f, device).reshape({2, 2});
  auto t = Clock::now();
  auto c = a.matmul(a);
  double t_mm = seconds_since(t);
  auto v = c.to_vec2<float>();
  double t_read = seconds_since(t);
  std::printf("%s: %s; matmul returned after %s, to_vec2 returned after %s\n", name.c_str(),
              fmt_rows(v).c_str(), fmt_time(t_mm).c_str(), fmt_time(t_read).c_str());
}

void time_runs(const std::string& name, const wick::Device& device, size_t size, int runs,
               wick::DType dtype) {
  auto [a, b] = random_pair(device, size, dtype);
  double flops = 2.0 * static_cast<double>(size) * static_cast<double>(size) * size;
  std::string tag = "wick-mm " + name + " " + std::to_string(size) + "x" + std::to_string(size) +
                    " " + dtype_name(dtype);
  if (device.is_cpu()) {
    std::printf("%s: GEMM %s\n", tag.c_str(), wick::cpu_gemm().c_str());
  }
  std::vector<double> synced;
  for (int r = 0; r < runs; ++r) {
    auto t = Clock::now();
    auto c = a.matmul(b);
    double t_mm = seconds_since(t);
    device.synchronize();
    double t_sync = seconds_since(t);
    double v = read_scalar(c.get(0).get(0));
    double t_read = seconds_since(t);
    synced.push_back(t_sync);
    std::printf(
        "%s run %d: matmul returned %s, after synchronize %s (%.0f GFLOP/s), after reading "
        "c[0][0] %s (=%.3f)\n",
        tag.c_str(), r, fmt_time(t_mm).c_str(), fmt_time(t_sync).c_str(), flops / t_sync * 1e-9,
        fmt_time(t_read).c_str(), v);
  }
  if (synced.empty()) return;
  if (synced.size() == 1) {
    std::printf("%s: first run %s (%.0f GFLOP/s), no further runs\n", tag.c_str(),
                fmt_time(synced[0]).c_str(), flops / synced[0] * 1e-9);
    return;
  }
  std::vector<double> rest(synced.begin() + 1, synced.end());
  std::sort(rest.begin(), rest.end());
  size_t h = rest.size() / 2;
  double median = rest.size() % 2 ? rest[h] : (rest[h - 1] + rest[h]) / 2;
  std::printf("%s: first run %s, median of the other %zu %s (%.0f GFLOP/s)\n", tag.c_str(),
              fmt_time(synced[0]).c_str(), rest.size(), fmt_time(median).c_str(),
              flops / median * 1e-9);
}

void read_element(const std::string& name, const wick::Device& device) {
  constexpr size_t kSize = 1024;
  auto [a, b] = random_pair(device, kSize, wick::DType::F32);
  auto c = a.matmul(b);
  device.synchronize();
  // The same element, read as a view of the whole result and as a one-element copy.
  size_t i = kSize / 2, j = kSize / 3;
  std::printf("wick-mm %s: c[%zu][%zu] of a %zux%zu f32 result\n", name.c_str(), i, j, kSize,
              kSize);
  for (int r = 0; r < 4; ++r) {
    auto t = Clock::now();
    float view = c.get(i).get(j).to_scalar<float>();
    double t_view = seconds_since(t);
    t = Clock::now();
    float copy = c.narrow(0, i, 1).narrow(1, j, 1).contiguous().flatten_all().to_vec1<float>()[0];
    double t_copy = seconds_since(t);
    std::printf("run %d: view to_scalar %s (%.3f), narrow+contiguous+to_vec1 %s (%.3f)\n", r,
                fmt_time(t_view).c_str(), view, fmt_time(t_copy).c_str(), copy);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wick-mm: the seeds' matmul experiment on a wick device (cpu, cuda, cuda:N).\n"
      "Exit codes: 0 success, 1 runtime failure, 2 usage error, 3 the asked device is missing."};
  app.require_subcommand(1);
  app.fallthrough();  // --threads after the subcommand
  wick::tools::CommonOptions common;
  wick::tools::add_common_options(app, "wick-mm", common);

  std::string device_name;
  size_t size = 1024;
  int runs = 6;
  std::string dtype_name_arg = "f32";

  auto* walk_cmd = app.add_subcommand(
      "walk",
      "One 2x2 arange matmul: prints the values and when matmul and to_vec2 returned (on an "
      "asynchronous device matmul only queues the work; to_vec2 waits for it).");
  walk_cmd->add_option("device", device_name, "cpu, cuda or cuda:N")->required();

  auto* time_cmd = app.add_subcommand(
      "time",
      "Two random NxN matrices, then R matmuls: each run prints when matmul returned, when "
      "synchronize returned (with GFLOP/s) and when reading c[0][0] returned; then the first "
      "run and the median of the others.");
  time_cmd->add_option("device", device_name, "cpu, cuda or cuda:N")->required();
  time_cmd->add_option("--size", size, "matrix size N")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  time_cmd->add_option("--runs", runs, "number of timed runs R")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  time_cmd->add_option("--dtype", dtype_name_arg, "element type")
      ->check(CLI::IsMember({"f32", "f64", "f16", "bf16"}))
      ->capture_default_str();

  auto* read_cmd = app.add_subcommand(
      "read",
      "Reads one element of a 1024x1024 f32 matmul result 4 times, two ways: to_scalar on a "
      "view of the result, and narrow + contiguous + to_vec1 (a one-element copy); prints both "
      "times.");
  read_cmd->add_option("device", device_name, "cpu, cuda or cuda:N")->required();

  return wick::tools::run(app, argc, argv, "wick-mm", common, [&]() -> int {
    const wick::Device device = wick::tools::parse_device(device_name);
    if (walk_cmd->parsed()) {
      walk(device_name, device);
    } else if (time_cmd->parsed()) {
      time_runs(device_name, device, size, runs, parse_dtype(dtype_name_arg));
    } else if (read_cmd->parsed()) {
      read_element(device_name, device);
    }
    return wick::tools::kOk;
  });
}
