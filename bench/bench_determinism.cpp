// The cost of the batch-invariant CPU path (WICK_BATCH_INVARIANT=1, docs/NUMERICS.md,
// "Determinism") beside the default path, in one run: this program runs itself as child
// processes with the switch off and on, alternately (the switch is read once per process), and
// prints the median of each figure and the ratio on/off.
//
//   bench_determinism [--rounds 3] [--minilm MODEL_DIR] [--gguf SmolLM2.gguf] [--tokens 64]
//
// Figures: matmul GFLOP/s for decode-, batch- and prefill-shaped f32 products (x @ W^T, W a
// linear layer's weight); MiniLM sentences/s (128 sentences, batch 128); decode tok/s of the GGUF
// model (greedy, 64 new tokens after an 8-token prompt).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "../tools/conform_determinism.h"
#include "wick/generator.h"
#include "wick/models.h"
#include "wick/wick.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Shape3 {
  size_t m, k, n;
};

constexpr Shape3 kShapes[] = {{1, 576, 1536},   {4, 576, 1536},    {16, 576, 1536},
                              {64, 576, 1536},  {512, 384, 1536},  {1, 2048, 2048},
                              {32, 2048, 2048}, {1024, 1024, 1024}};

// The child: prints "name value" lines.
void child(const std::string& minilm, const std::string& gguf, size_t tokens) {
  using namespace wick;
  determinism::Inputs in(7);
  for (Shape3 s : kShapes) {
    Tensor x = in.uniform({s.m, s.k}), w = in.uniform({s.n, s.k}, DType::F32, -0.1, 0.1);
    Tensor wt = w.t();
    x.matmul(wt).to_vec_f64();  // warm-up
    size_t reps = 0;
    auto t0 = Clock::now();
    do {
      x.matmul(wt).elem_count();
      ++reps;
    } while (seconds_since(t0) < 0.3);
    double gflops = 2.0 * s.m * s.k * s.n * reps / seconds_since(t0) / 1e9;
    std::printf("matmul f32 m=%zu k=%zu n=%zu (GFLOP/s) %.3f\n", s.m, s.k, s.n, gflops);
  }
  if (!minilm.empty()) {
    auto embedder = SentenceEmbedder::load(minilm, Device::cpu());
    auto texts = determinism::sentences(128);
    embedder.embed(texts).elem_count();
    auto t0 = Clock::now();
    size_t runs = 0;
    do {
      embedder.embed(texts).to_vec_f64();
      ++runs;
    } while (seconds_since(t0) < 1.0);
    std::printf("MiniLM embed batch 128 (sentences/s) %.3f\n", 128.0 * runs / seconds_since(t0));
  }
  if (!gguf.empty()) {
    auto model = models::load_causal_lm(gguf, Device::cpu());
    GenerateOptions opt;
    opt.max_new_tokens = tokens;
    opt.stop_tokens = {0xffffffffu};
    Generator gen(*model, opt);
    std::vector<uint32_t> prompt = {1, 504, 3458, 282, 4723, 314, 253, 1789};
    gen.generate(prompt);
    double best = 0;
    for (int i = 0; i < 2; ++i) {
      gen.generate(prompt);
      best = std::max(best, gen.stats().decode_tokens_per_second());
    }
    std::printf("SmolLM2 decode (tok/s) %.3f\n", best);
  }
  std::fflush(stdout);
}

std::string self_exe() {
  std::vector<char> buf(4096);
  ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  return n > 0 ? std::string(buf.data(), static_cast<size_t>(n)) : std::string();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  size_t tokens = 64;
  std::string minilm, gguf;
  bool is_child = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--rounds") {
      rounds = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--minilm") {
      minilm = value();
    } else if (a == "--gguf") {
      gguf = value();
    } else if (a == "--tokens") {
      tokens = std::max<size_t>(2, std::strtoul(value().c_str(), nullptr, 10));
    } else if (a == "--child") {
      is_child = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_determinism [--rounds 3] [--minilm DIR] [--gguf FILE] "
                   "[--tokens 64]\n");
      return 2;
    }
  }
  if (is_child) {
    child(minilm, gguf, tokens);
    return 0;
  }
  // name -> (off, on) figures over the rounds.
  std::map<std::string, std::vector<double>> figures[2];
  std::vector<std::string> order;
  for (int r = 0; r < rounds; ++r) {
    for (int on = 0; on < 2; ++on) {
      std::string cmd = "WICK_BATCH_INVARIANT=" + std::to_string(on) + " '" + self_exe() +
                        "' --child --tokens " + std::to_string(tokens);
      if (!minilm.empty()) cmd += " --minilm '" + minilm + "'";
      if (!gguf.empty()) cmd += " --gguf '" + gguf + "'";
      FILE* p = popen(cmd.c_str(), "r");
      if (p == nullptr) return 1;
      char line[512];
      while (std::fgets(line, sizeof line, p) != nullptr) {
        std::string s = line;
        size_t sp = s.find_last_of(' ');
        if (sp == std::string::npos) continue;
        std::string name = s.substr(0, sp);
        if (figures[0].count(name) == 0 && figures[1].count(name) == 0) order.push_back(name);
        figures[on][name].push_back(std::atof(s.c_str() + sp + 1));
      }
      if (pclose(p) != 0) {
        std::fprintf(stderr, "bench_determinism: child failed: %s\n", cmd.c_str());
        return 1;
      }
    }
  }
  std::printf("%-44s %12s %12s %8s   (medians of %d rounds, off/on alternating)\n", "figure",
              "default", "invariant", "on/off", rounds);
  for (const auto& name : order) {
    double off = median(figures[0][name]), on = median(figures[1][name]);
    std::printf("%-44s %12.2f %12.2f %8.3f\n", name.c_str(), off, on, off > 0 ? on / off : 0);
  }
  return 0;
}
