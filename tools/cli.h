#pragma once
// The command-line convention every wick tool follows (README "Command-line tools"): the result
// alone on stdout, everything else on stderr; exit 0 on success, 1 on a runtime failure (a failed
// write to stdout or an output file included), 2 on a usage error, 3 when the asked device is
// missing; --version; --threads; every option checked before any work; "-" for stdin.

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "wick/cpu.h"
#include "wick/device.h"
#include "wick/error.h"

#ifndef WICK_VERSION_STRING
#define WICK_VERSION_STRING "unknown"
#endif

namespace wick::tools {

enum Exit : int { kOk = 0, kRuntime = 1, kUsage = 2, kNoDevice = 3 };

/// A bad argument found after CLI11's own checks: exit 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
/// The asked device is not there: exit 3.
struct NoDevice : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The options every tool has: --version and --threads.
struct CommonOptions {
  size_t threads = 0;
};

inline void add_common_options(CLI::App& app, const std::string& name, CommonOptions& common) {
  app.set_version_flag("--version", name + " " + WICK_VERSION_STRING);
  app.add_option(
         "--threads", common.threads,
         "CPU worker threads (default: WICK_NUM_THREADS, else the CPUs this process may run on)")
      ->check(CLI::Range(size_t{1}, size_t{1024}));
}

/// A whole number from 0 to `max`, decimal digits only (CLI11 alone would take "-1" as a huge
/// count, "0x10" as hex and "010" as octal).
inline CLI::Validator count_in(uint64_t max) {
  return CLI::Validator(
      [max](std::string& s) -> std::string {
        bool ok =
            !s.empty() && s.size() <= 20 && s.find_first_not_of("0123456789") == std::string::npos;
        if (ok) {
          errno = 0;
          unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
          ok = errno == 0 && v <= max;
        }
        return ok ? std::string()
                  : "must be a whole number from 0 to " + std::to_string(max) + ", got '" + s + "'";
      },
      "");
}

/// A finite number in [lo, hi] (or (lo, hi] with `open_lo`); NaN and infinities are refused.
inline CLI::Validator number_in(double lo, double hi, bool open_lo = false) {
  std::string range =
      (open_lo ? "(" : "[") + CLI::detail::to_string(lo) + ", " + CLI::detail::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, open_lo, range](std::string& s) -> std::string {
        char* end = nullptr;
        double v = std::strtod(s.c_str(), &end);
        bool ok = !s.empty() && end == s.c_str() + s.size() && std::isfinite(v) &&
                  (open_lo ? v > lo : v >= lo) && v <= hi;
        return ok ? std::string() : "must be a number in " + range + ", got '" + s + "'";
      },
      range);
}

/// "cpu", "cuda" or "cuda:N"; exit 2 for anything else, 3 when the GPU is not there.
inline Device parse_device(const std::string& name) {
  Device d = Device::cpu();
  bool digits = name.size() > 5 && name.rfind("cuda:", 0) == 0 &&
                name.find_first_not_of("0123456789", 5) == std::string::npos;
  if (name != "cpu" && name != "cuda" && !digits) {
    throw UsageError("--device must be cpu, cuda or cuda:N (N the GPU's number), got '" + name +
                     "'");
  }
  try {
    d = Device::parse(name);
  } catch (const Error&) {
    throw UsageError("--device " + name + ": no such GPU number");
  }
  if (d.is_cuda()) {
    int count = 0;
    try {
      count = cuda_device_count();
    } catch (const std::exception&) {
      count = 0;
    }
    if (d.ordinal() >= count) {
      throw NoDevice("--device " + name + ": " +
                     (count == 0 ? std::string("no CUDA GPU is available (no GPU, no driver, or a "
                                               "build without CUDA)")
                                 : "this machine has " + std::to_string(count) + " CUDA GPU(s)"));
    }
  }
  return d;
}

/// Comma-separated token ids, each a decimal number that fits 32 bits; exit 2 otherwise.
inline std::vector<uint32_t> parse_ids(const std::string& option, const std::string& text) {
  std::vector<uint32_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
        item.size() > 10 || std::stoull(item) > std::numeric_limits<uint32_t>::max()) {
      throw UsageError(option + ": '" + item +
                       "' is not a token id (a whole number from 0 to 4294967295)");
    }
    ids.push_back(static_cast<uint32_t>(std::stoull(item)));
    start = comma + 1;
  }
  return ids;
}

/// Checks a path option that names a file to read ("-": stdin): exit 2 for a directory or a
/// missing file.
inline void check_input_file(const std::string& option, const std::string& path) {
  if (path == "-") return;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw UsageError(option + " " + path + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw UsageError(option + " " + path + ": is a directory, not a file");
}

/// The whole of `path` ("-": stdin); a read error is a runtime error.
inline std::string read_all(const std::string& path) {
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw Error("cannot open " + path + ": " + std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  bool failed = std::ferror(f) != 0;
  int err = errno;
  if (f != stdin) std::fclose(f);
  if (failed) {
    throw Error("cannot read " + (path == "-" ? std::string("standard input") : path) + ": " +
                std::strerror(err));
  }
  return text;
}

/// Writes `n` bytes to stdout; false (errno set) when the write failed.
inline bool write_stdout(const void* data, size_t n) {
  return std::fwrite(data, 1, n, stdout) == n;
}

/// Raised when stdout cannot be written: exit 1.
struct OutputError : Error {
  using Error::Error;
};

inline void check_stdout() {
  if (std::fflush(stdout) != 0 || std::ferror(stdout) != 0) {
    throw OutputError(std::string("cannot write standard output: ") + std::strerror(errno));
  }
}

/// Applies --threads before the library starts its thread pool.
inline void apply_common_options(const CommonOptions& common) {
  if (common.threads > 0) set_cpu_threads(common.threads);
}

/// Parses the command line and runs `body`, mapping errors to the exit codes: CLI11's message and
/// 2 for a bad command line; 2, 3, 1 for UsageError, NoDevice and every other exception; 1 when
/// stdout cannot be written at the end. SIGPIPE is ignored: a closed pipe is a write error.
inline int run(CLI::App& app, int argc, char** argv, const std::string& name,
               const CommonOptions& common, const std::function<int()>& body) {
  std::signal(SIGPIPE, SIG_IGN);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help, --version
      app.exit(e, std::cout, std::cerr);
      std::cout.flush();
      return std::cout ? kOk : kRuntime;
    }
    std::fprintf(stderr, "%s: %s\nRun with --help for more information.\n", name.c_str(), e.what());
    return kUsage;
  }
  int rc = kOk;
  try {
    apply_common_options(common);
    rc = body();
    check_stdout();
    std::cout.flush();
    if (!std::cout) throw OutputError("cannot write standard output");
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    return kUsage;
  } catch (const NoDevice& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    return kNoDevice;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
    return kRuntime;
  }
  return rc;
}

/// A progress line on stderr ("\r" redrawn while stderr is a terminal, else one line at the
/// start and one at the end).
class Progress {
 public:
  Progress(bool enabled, std::string what) : enabled_(enabled), what_(std::move(what)) {}
  void update(size_t done, size_t total, const char* unit) {
    if (!enabled_ || total == 0) return;
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    if (tty) {
      std::fprintf(stderr, "\r%s: %zu/%zu %s, %.0f/s", what_.c_str(), done, total, unit,
                   secs > 0 ? static_cast<double>(done) / secs : 0.0);
      if (done == total) std::fputc('\n', stderr);
    } else if (done == total) {
      std::fprintf(stderr, "%s: %zu %s in %.2f s\n", what_.c_str(), total, unit, secs);
    } else if (!started_) {
      std::fprintf(stderr, "%s: %zu %s...\n", what_.c_str(), total, unit);
    }
    started_ = true;
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  bool started_ = false;
  std::string what_;
  Clock::time_point start_ = Clock::now();
};

}  // namespace wick::tools
