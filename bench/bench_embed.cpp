// Sentence-embedding throughput of wick's SentenceEmbedder: embeds every line of a file (batched,
// tokenization included, results read back to the host) and prints sentences/s. bench/embed_peer.py
// runs this beside sentence-transformers on the same sentences and prints the ratio.
//
//   bench_embed MODEL_DIR SENTENCES.txt [--device cpu|cuda] [--dtype f32|f16|bf16] [--batch 128]
//               [--runs 1] [--output embeddings.npy]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "wick/formats.h"
#include "wick/models.h"
#include "wick/wick.h"

namespace {

using Clock = std::chrono::steady_clock;

int usage() {
  std::fprintf(stderr,
               "usage: bench_embed MODEL_DIR SENTENCES.txt [--device cpu|cuda] [--dtype "
               "f32|f16|bf16] [--batch N] [--runs R] [--output FILE.npy]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  std::string device_name = "cpu", dtype_name_arg = "f32", output;
  size_t batch = 128, runs = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--device") {
      device_name = value();
    } else if (a == "--dtype") {
      dtype_name_arg = value();
    } else if (a == "--batch") {
      batch = std::strtoul(value().c_str(), nullptr, 10);
    } else if (a == "--runs") {
      runs = std::strtoul(value().c_str(), nullptr, 10);
    } else if (a == "--output") {
      output = value();
    } else if (a.rfind("--", 0) == 0) {
      return usage();
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 2 || batch == 0 || runs == 0) return usage();

  try {
    auto device = wick::Device::parse(device_name);
    wick::SentenceEmbedderOptions options;
    options.batch_size = batch;
    options.dtype = dtype_name_arg == "bf16"  ? wick::DType::BF16
                    : dtype_name_arg == "f16" ? wick::DType::F16
                                              : wick::DType::F32;
    auto embedder = wick::SentenceEmbedder::load(positional[0], device, options);

    std::ifstream in(positional[1], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "bench_embed: cannot open %s\n", positional[1].c_str());
      return 1;
    }
    std::vector<std::string> texts;
    for (std::string line; std::getline(in, line);) texts.push_back(line);

    // Warm-up: first kernel uses, allocator pools, BLAS threads.
    std::vector<std::string> warm(texts.begin(), texts.begin() + std::min(texts.size(), 2 * batch));
    embedder.embed(warm).to_device(wick::Device::cpu());

    std::vector<double> secs;
    wick::Tensor emb;
    for (size_t r = 0; r < runs; ++r) {
      auto t0 = Clock::now();
      emb = embedder.embed(texts).to_device(wick::Device::cpu());
      secs.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    double median = secs[secs.size() / 2];
    std::printf("wick: %zu sentences, batch %zu, %s %s: %.3f s (median of %zu), %.1f sentences/s\n",
                texts.size(), batch, device.to_string().c_str(), dtype_name_arg.c_str(), median,
                runs, static_cast<double>(texts.size()) / median);
    std::printf("WICK_SENTENCES_PER_S %.3f\n", static_cast<double>(texts.size()) / median);
    if (!output.empty()) wick::npy::save(emb, output);
  } catch (const wick::Error& e) {
    std::fprintf(stderr, "bench_embed: %s\n", e.what());
    return 1;
  }
  return 0;
}
