// Tokenizer encode throughput on the 2,331-line test corpus (584 kB), wick beside Hugging Face
// tokenizers (scripts/bench_tokenizer_hf.py, run from here when python3 has `tokenizers`).

#include <benchmark/benchmark.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "wick/tokenizer.h"

namespace {

const std::string kData = WICK_TOKENIZER_DATA;

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    std::ifstream in(kData + "/corpus.jsonl");
    for (std::string line; std::getline(in, line);) {
      out.push_back(nlohmann::json::parse(line).get<std::string>());
    }
    return out;
  }();
  return lines;
}

size_t corpus_bytes() {
  size_t n = 0;
  for (const auto& s : corpus()) n += s.size();
  return n;
}

const wick::Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, wick::Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    it = cache.emplace(name, wick::Tokenizer::from_json(read_gz(kData + "/" + name + ".json.gz")))
             .first;
  }
  return it->second;
}

void encode_lines(benchmark::State& state, const std::string& name) {
  const wick::Tokenizer& tok = tokenizer(name);
  size_t tokens = 0;
  for (auto _ : state) {
    for (const auto& line : corpus()) {
      auto ids = tok.encode(line, false);
      tokens += ids.size();
      benchmark::DoNotOptimize(ids.data());
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus_bytes()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

void encode_batch(benchmark::State& state, const std::string& name) {
  const wick::Tokenizer& tok = tokenizer(name);
  for (auto _ : state) {
    auto b = tok.encode_batch(corpus(), false);
    benchmark::DoNotOptimize(b.ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus_bytes()));
}

// Wall-clock time throughout, as the Python script measures HF.
BENCHMARK_CAPTURE(encode_lines, minilm, std::string("minilm"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(encode_lines, smollm2, std::string("smollm2"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(encode_lines, llama3_style, std::string("llama3_style"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(encode_batch, minilm, std::string("minilm"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(encode_batch, smollm2, std::string("smollm2"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The peer's figure from the same run: HF tokenizers through Python, when it is installed.
void print_hf_figures() {
  std::string cmd =
      "python3 " WICK_SOURCE_DIR "/scripts/bench_tokenizer_hf.py " + kData + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return;
  char buf[512];
  std::string out;
  while (fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  int rc = pclose(p);
  if (rc == 0 && !out.empty()) {
    std::cout << out;
  } else {
    std::cout << "HF tokenizers: not measured (python3 with `tokenizers` not found)\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::cout << "corpus: " << corpus().size() << " lines, " << corpus_bytes() << " bytes\n";
  print_hf_figures();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
