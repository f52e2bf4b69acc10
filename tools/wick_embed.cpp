// wick-embed: sentence embeddings from a sentence-transformers model folder (all-MiniLM-L6-v2 and
// other BERT encoders). One text per input line; one embedding per line out, as JSON or .npy.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "wick/formats.h"
#include "wick/models.h"
#include "wick/wick.h"

namespace {

namespace fs = std::filesystem;

std::vector<std::string> read_lines(std::istream& in) {
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

// "[####......] 1234/10000 sentences, 850/s" redrawn in place on stderr.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), start_(Clock::now()) {}
  void update(size_t done, size_t total) {
    if (!enabled_ || total == 0) return;
    constexpr size_t kWidth = 30;
    size_t filled = done * kWidth / total;
    double secs = std::chrono::duration<double>(Clock::now() - start_).count();
    std::fprintf(stderr, "\r[%s%s] %zu/%zu sentences, %.0f/s", std::string(filled, '#').c_str(),
                 std::string(kWidth - filled, '.').c_str(), done, total,
                 secs > 0 ? static_cast<double>(done) / secs : 0.0);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  Clock::time_point start_;
};

void write_json(const std::vector<std::vector<float>>& rows, std::FILE* out) {
  std::fputs("[", out);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::fputs(i ? ",\n [" : "\n [", out);
    for (size_t j = 0; j < rows[i].size(); ++j) {
      std::fprintf(out, j ? ", %.9g" : "%.9g", static_cast<double>(rows[i][j]));
    }
    std::fputs("]", out);
  }
  std::fputs(rows.empty() ? "]\n" : "\n]\n", out);
}

// wick::npy::save writes files; for stdout the bytes go through a temporary file.
void write_npy(const wick::Tensor& emb, const std::string& output) {
  if (output != "-") {
    wick::npy::save(emb, output);
    return;
  }
  auto tmp = fs::temp_directory_path() / ("wick-embed-" + std::to_string(::getpid()) + ".npy");
  wick::npy::save(emb, tmp.string());
  {
    std::ifstream in(tmp, std::ios::binary);
    std::cout << in.rdbuf();
    std::cout.flush();
  }
  fs::remove(tmp);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wick-embed: sentence embeddings with a sentence-transformers model folder (e.g.\n"
      "all-MiniLM-L6-v2: config.json, model.safetensors, tokenizer.json, modules.json,\n"
      "1_Pooling/config.json). Reads one text per line from INPUT (default: stdin) and writes\n"
      "one embedding per line: a JSON array of arrays, or an (n, dim) f32 .npy file."};
  std::string model_dir, input = "-", output = "-", device_name = "cpu", format = "json";
  std::string dtype_arg = "f32";
  size_t batch = 32;
  bool quiet = false;
  app.add_option("MODEL_DIR", model_dir, "the model folder")->required();
  app.add_option("INPUT", input, "text file, one sentence per line ('-': stdin)")
      ->capture_default_str();
  app.add_option("--device", device_name, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--dtype", dtype_arg, "compute dtype of the encoder")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--batch", batch, "sentences per forward pass")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--format", format, "output format")
      ->check(CLI::IsMember({"json", "npy"}))
      ->capture_default_str();
  app.add_option("-o,--output", output, "output file ('-': stdout)")->capture_default_str();
  app.add_flag("-q,--quiet", quiet, "no progress bar");
  CLI11_PARSE(app, argc, argv);

  if (format == "npy" && output == "-" && ::isatty(STDOUT_FILENO)) {
    std::fprintf(stderr, "wick-embed: --format npy writes binary; give --output FILE or redirect\n");
    return 2;
  }
  wick::Device device = wick::Device::cpu();
  try {
    device = wick::Device::parse(device_name);
    device.synchronize();  // throws when the device is not there
  } catch (const wick::Error& e) {
    std::fprintf(stderr, "wick-embed: %s\n", e.what());
    return 2;
  }

  try {
    wick::SentenceEmbedderOptions options;
    options.batch_size = batch;
    options.dtype = dtype_arg == "bf16"  ? wick::DType::BF16
                    : dtype_arg == "f16" ? wick::DType::F16
                                         : wick::DType::F32;
    auto embedder = wick::SentenceEmbedder::load(model_dir, device, options);

    std::vector<std::string> texts;
    if (input == "-") {
      texts = read_lines(std::cin);
    } else {
      std::ifstream in(input, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "wick-embed: cannot open input file '%s'\n", input.c_str());
        return 1;
      }
      texts = read_lines(in);
    }

    // Only for inputs longer than one batch, and only when someone can watch it.
    ProgressBar bar(!quiet && texts.size() > batch && ::isatty(STDERR_FILENO));
    auto emb = embedder.embed(texts, [&](size_t done, size_t total) { bar.update(done, total); })
                   .to_device(wick::Device::cpu());

    if (format == "npy") {
      write_npy(emb, output);
    } else {
      auto rows = texts.empty() ? std::vector<std::vector<float>>{} : emb.to_vec2<float>();
      std::FILE* out = output == "-" ? stdout : std::fopen(output.c_str(), "w");
      if (!out) {
        std::fprintf(stderr, "wick-embed: cannot write '%s'\n", output.c_str());
        return 1;
      }
      write_json(rows, out);
      if (out != stdout && std::fclose(out) != 0) {
        std::fprintf(stderr, "wick-embed: error writing '%s'\n", output.c_str());
        return 1;
      }
    }
  } catch (const wick::Error& e) {
    std::fprintf(stderr, "wick-embed: %s\n", e.what());
    return 1;
  }
  return 0;
}
