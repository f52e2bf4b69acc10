#pragma once
// The test file of the load benchmarks: one f32 tensor "w" of WICK_BENCH_LOAD_MB megabytes
// (default 1024) in a safetensors file, written in chunks (no 1 GB buffer), in a temp folder.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace wick::bench {

inline size_t load_bench_bytes() {
  const char* v = std::getenv("WICK_BENCH_LOAD_MB");
  size_t mb = v ? std::strtoull(v, nullptr, 10) : 1024;
  return std::max<size_t>(mb, 1) << 20;
}

/// Writes the file; returns its path (remove its folder when done).
inline std::string write_load_bench_file(size_t bytes) {
  auto dir =
      std::filesystem::temp_directory_path() / ("wick_bench_load_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = (dir / "w.safetensors").string();
  size_t n = bytes / 4;
  std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) +
                       "],\"data_offsets\":[0," + std::to_string(n * 4) + "]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::ofstream f(path, std::ios::binary);
  uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<float> chunk(size_t{16} << 20);
  for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<float>(i % 1000) * 0.5f;
  for (size_t done = 0; done < n;) {
    size_t m = std::min(chunk.size(), n - done);
    f.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(m * 4));
    done += m;
  }
  return path;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Median of `reps` timings of fn().
template <class F>
double median_seconds(int reps, F&& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace wick::bench
