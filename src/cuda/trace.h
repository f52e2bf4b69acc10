#pragma once
// WICK_TRACE=1 output of the CUDA backend: one line per library load, first kernel use, graph
// commit and matmul path, with its time.

#include <chrono>
#include <cstdio>
#include <string>

namespace wick::cuda {

/// Milliseconds on a steady clock.
inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

/// Prints one trace line: "[wick] <kind> <name> <ms> ms".
inline void trace_line(const char* kind, const std::string& name, double ms) {
  std::fprintf(stderr, "[wick] %s %s %.3f ms\n", kind, name.c_str(), ms);
}

}  // namespace wick::cuda
