// wick-embed: sentence embeddings from a sentence-transformers model folder (all-MiniLM-L6-v2 and
// other BERT encoders). One text per input line; the embeddings alone on stdout (or --output),
// as JSON, JSON lines or .npy; progress and errors on stderr (tools/cli.h).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "wick/models.h"
#include "wick/wick.h"

namespace {

namespace fs = std::filesystem;
namespace tools = wick::tools;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  return lines;
}

std::string float_text(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  return buf;
}

// A JSON array of arrays, one embedding per line.
std::string to_json(const std::vector<std::vector<float>>& rows) {
  std::string s = "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    s += i ? ",\n [" : "\n [";
    for (size_t j = 0; j < rows[i].size(); ++j) s += (j ? ", " : "") + float_text(rows[i][j]);
    s += "]";
  }
  s += rows.empty() ? "]\n" : "\n]\n";
  return s;
}

// One {"text": ..., "embedding": [...]} object per line.
std::string to_jsonl(const std::vector<std::string>& texts,
                     const std::vector<std::vector<float>>& rows) {
  std::string s;
  for (size_t i = 0; i < rows.size(); ++i) {
    s += "{\"text\": " +
         nlohmann::json(texts[i]).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         ", \"embedding\": [";
    for (size_t j = 0; j < rows[i].size(); ++j) s += (j ? ", " : "") + float_text(rows[i][j]);
    s += "]}\n";
  }
  return s;
}

// An (n, dim) little-endian f32 .npy file (format 1.0), in memory.
std::string to_npy(const std::vector<std::vector<float>>& rows, size_t dim) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows.size()) + ", " + std::to_string(dim) + "), }";
  // magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string s = "\x93NUMPY";
  s += '\x01';
  s += '\x00';
  s += static_cast<char>(header.size() & 0xff);
  s += static_cast<char>(header.size() >> 8);
  s += header;
  for (const auto& row : rows) {
    s.append(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float));
  }
  return s;
}

// Writes `bytes` to stdout ("-") or to `path`; a file that cannot be written whole is removed.
void write_output(const std::string& path, const std::string& bytes) {
  if (path == "-") {
    if (!tools::write_stdout(bytes.data(), bytes.size())) tools::check_stdout();
    tools::check_stdout();
    return;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw wick::Error("cannot write " + path + ": " + std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(path.c_str());
    throw wick::Error("cannot write " + path + ": " + std::strerror(err != 0 ? err : errno));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wick-embed: sentence embeddings with a sentence-transformers model folder (e.g.\n"
      "all-MiniLM-L6-v2: config.json, model.safetensors, tokenizer.json, modules.json,\n"
      "1_Pooling/config.json). Reads one text per line from INPUT (default: stdin) and writes\n"
      "the embeddings alone to stdout (or --output): a JSON array of arrays (one embedding per\n"
      "line), JSON lines of {\"text\", \"embedding\"}, or an (n, dim) f32 .npy file. Exit codes: "
      "0\n"
      "success, 1 runtime failure, 2 usage error, 3 the asked device is missing."};
  tools::CommonOptions common;
  tools::add_common_options(app, "wick-embed", common);
  std::string model_dir, input = "-", output = "-", device_name = "cpu", format = "json";
  std::string dtype_arg = "f32";
  size_t batch = 32, max_seq_length = 0;
  bool quiet = false, no_normalize = false;
  app.add_option("MODEL_DIR", model_dir, "the model folder")->required();
  app.add_option("INPUT", input, "text file, one sentence per line ('-': stdin)")
      ->capture_default_str();
  app.add_option("--device", device_name, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--dtype", dtype_arg, "compute dtype of the encoder")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--batch", batch, "sentences per forward pass")
      ->check(tools::count_in(1u << 20))
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--max-seq-length", max_seq_length,
                 "tokens kept per sentence, longer ones truncated (default: the model's)")
      ->check(tools::count_in(1u << 20))
      ->check(CLI::Range(2u, 1u << 20));
  app.add_flag("--no-normalize", no_normalize,
               "do not L2-normalise the embeddings (the model's Normalize module is skipped)");
  app.add_option("--format", format, "output format")
      ->check(CLI::IsMember({"json", "jsonl", "npy"}))
      ->capture_default_str();
  app.add_option("-o,--output", output, "output file ('-': stdout)")->capture_default_str();
  app.add_flag("-q,--quiet", quiet, "no progress on stderr");

  return tools::run(app, argc, argv, "wick-embed", common, [&]() -> int {
    // Every argument is checked before the model is read.
    if (format == "npy" && output == "-" && ::isatty(STDOUT_FILENO)) {
      throw tools::UsageError("--format npy writes binary; give --output FILE or redirect stdout");
    }
    const wick::Device device = tools::parse_device(device_name);
    std::error_code ec;
    if (!fs::exists(model_dir, ec)) {
      throw tools::UsageError("MODEL_DIR " + model_dir + ": no such directory");
    }
    if (!fs::is_directory(model_dir, ec)) {
      throw tools::UsageError(
          "MODEL_DIR " + model_dir + " is a file" +
          (fs::path(model_dir).extension() == ".gguf" ? " (GGUF)" : "") +
          ": wick-embed takes a sentence-transformers model folder (config.json, "
          "model.safetensors, tokenizer.json, modules.json)");
    }
    tools::check_input_file("INPUT", input);
    std::vector<std::string> texts = split_lines(tools::read_all(input));

    wick::SentenceEmbedderOptions options;
    options.batch_size = batch;
    options.max_seq_length = max_seq_length;
    options.normalize = !no_normalize;
    options.dtype = dtype_arg == "bf16"  ? wick::DType::BF16
                    : dtype_arg == "f16" ? wick::DType::F16
                                         : wick::DType::F32;
    auto embedder = wick::SentenceEmbedder::load(model_dir, device, options);
    if (max_seq_length > 0 && embedder.max_seq_length() != max_seq_length) {
      throw tools::UsageError("--max-seq-length " + std::to_string(max_seq_length) +
                              ": the model takes at most " +
                              std::to_string(embedder.max_seq_length()) + " tokens");
    }

    // Only for inputs longer than one batch.
    tools::Progress progress(!quiet && texts.size() > batch, "wick-embed");
    wick::Tensor emb =
        embedder
            .embed(texts, [&](size_t done, size_t total) { progress.update(done, total, "texts"); })
            .to_device(wick::Device::cpu());
    std::vector<std::vector<float>> rows =
        texts.empty() ? std::vector<std::vector<float>>{} : emb.to_vec2<float>();

    std::string bytes = format == "npy"     ? to_npy(rows, embedder.dim())
                        : format == "jsonl" ? to_jsonl(texts, rows)
                                            : to_json(rows);
    write_output(output, bytes);
    return tools::kOk;
  });
}
