// wick-info: what a model file or folder holds: format, architecture and sizes, parameter count,
// tokenizer, metadata and every tensor with its type and shape. For GGUF files, safetensors
// files (or a sharded index) and Hugging Face / sentence-transformers folders. Text on stdout,
// or one JSON object with --json (tools/cli.h).

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "wick/gguf.h"
#include "wick/safetensors.h"
#include "wick/tokenizer.h"
#include "wick/wick.h"

namespace {

namespace fs = std::filesystem;
namespace tools = wick::tools;
using nlohmann::json;

json shape_json(const wick::Shape& shape) {
  json a = json::array();
  for (size_t d : shape.dims()) a.push_back(d);
  return a;
}

size_t elements(const wick::Shape& shape) {
  size_t n = 1;
  for (size_t d : shape.dims()) n *= d;
  return n;
}

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw wick::Error("cannot read " + p.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw wick::FormatError(p.string() + ": " + e.what());
  }
}

// Tensors of a safetensors file or sharded index into `info`.
void add_safetensors(const std::string& path, json& info) {
  auto file = wick::safetensors::ShardedFile::open(path);
  size_t params = 0, bytes = 0;
  json tensors = json::array();
  for (const std::string& name : file.names()) {
    const auto& t = file.info(name);
    tensors.push_back({{"name", name},
                       {"type", t.dtype_name},
                       {"shape", shape_json(t.shape)},
                       {"bytes", t.byte_size}});
    params += elements(t.shape);
    bytes += t.byte_size;
  }
  json meta = json::object();
  for (const auto& [k, v] : file.metadata()) meta[k] = v;
  info["metadata"] = meta;
  info["tensor_count"] = tensors.size();
  info["tensors"] = tensors;
  info["parameters"] = params;
  info["tensor_bytes"] = bytes;
  info["files"] = file.shards().size();
}

json tokenizer_json_summary(const fs::path& dir) {
  fs::path tj = dir / "tokenizer.json";
  if (!fs::exists(tj)) return json();
  json t = {{"file", "tokenizer.json"}};
  try {
    wick::Tokenizer tok = wick::Tokenizer::from_file(tj.string());
    t["vocab_size"] = tok.vocab_size();
    if (auto b = tok.bos_id()) t["bos_id"] = *b;
    if (auto e = tok.eos_id()) t["eos_id"] = *e;
    t["chat_template"] = !tok.chat_template().empty();
  } catch (const std::exception& e) {
    t["error"] = e.what();
  }
  return t;
}

json gguf_info(const std::string& path) {
  wick::gguf::File file = wick::gguf::File::open(path);
  json info = {{"path", path}, {"format", "gguf"}, {"version", file.version()}};
  const std::string arch = file.architecture();
  info["architecture"] = arch;
  json config = json::object(), meta = json::object(), tokenizer = json::object();
  for (const auto& [key, value] : file.metadata()) {
    if (!arch.empty() && key.rfind(arch + ".", 0) == 0) {
      config[key.substr(arch.size() + 1)] = value.to_string();
    } else if (key.rfind("tokenizer.", 0) == 0) {
      tokenizer[key.substr(10)] = value.to_string();
    } else {
      meta[key] = value.to_string();
    }
  }
  if (const auto* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->is_array()) {
    tokenizer["vocab_size"] = tokens->as_array().size();
  }
  info["config"] = config;
  info["tokenizer"] = tokenizer;
  info["metadata"] = meta;
  size_t params = 0, bytes = 0;
  json tensors = json::array();
  for (const std::string& name : file.tensor_names()) {
    const auto& t = file.info(name);
    tensors.push_back({{"name", name},
                       {"type", wick::ggml_type_name(t.type)},
                       {"shape", shape_json(t.shape)},
                       {"bytes", t.byte_size}});
    params += elements(t.shape);
    bytes += t.byte_size;
  }
  info["tensor_count"] = tensors.size();
  info["tensors"] = tensors;
  info["parameters"] = params;
  info["tensor_bytes"] = bytes;
  return info;
}

json folder_info(const fs::path& dir) {
  json info = {{"path", dir.string()}, {"format", "folder"}};
  fs::path config_path = dir / "config.json";
  if (fs::exists(config_path)) {
    json c = read_json_file(config_path);
    json config = json::object();
    for (const auto& [k, v] : c.items()) {
      if (!v.is_object() && !(v.is_array() && v.size() > 8)) config[k] = v;
    }
    info["config"] = config;
    std::string arch = c.value("model_type", std::string());
    if (c.contains("architectures") && c["architectures"].is_array() &&
        !c["architectures"].empty()) {
      arch += (arch.empty() ? "" : " (") + c["architectures"][0].get<std::string>() +
              (arch.empty() ? "" : ")");
    }
    info["architecture"] = arch;
  }
  if (fs::exists(dir / "modules.json")) {
    json mods = read_json_file(dir / "modules.json");
    json names = json::array();
    for (const auto& m : mods) names.push_back(m.value("type", std::string()));
    info["sentence_transformers_modules"] = names;
  }
  fs::path weights = fs::exists(dir / "model.safetensors.index.json")
                         ? dir / "model.safetensors.index.json"
                         : dir / "model.safetensors";
  if (fs::exists(weights)) {
    add_safetensors(weights.string(), info);
  } else {
    info["tensors"] = json::array();
    info["note"] = "no model.safetensors or model.safetensors.index.json";
  }
  json tok = tokenizer_json_summary(dir);
  if (!tok.is_null()) info["tokenizer"] = tok;
  return info;
}

std::string value_text(const json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : v.dump();
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  for (char& c : s) {
    if (c == '\n') c = ' ';
  }
  return s;
}

void print_section(std::ostringstream& out, const char* title, const json& obj) {
  if (!obj.is_object() || obj.empty()) return;
  out << title << ":\n";
  for (const auto& [k, v] : obj.items()) out << "  " << k << ": " << value_text(v) << "\n";
}

std::string to_text(const json& info, bool tensors) {
  std::ostringstream out;
  out << "path: " << info["path"].get<std::string>() << "\n";
  out << "format: " << info["format"].get<std::string>();
  if (info.contains("version")) out << " (version " << info["version"].dump() << ")";
  out << "\n";
  if (info.contains("architecture")) {
    out << "architecture: " << info["architecture"].get<std::string>() << "\n";
  }
  if (info.contains("parameters")) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "parameters: %s (%.1f MiB of tensor data, %zu tensors)\n",
                  info["parameters"].dump().c_str(), info["tensor_bytes"].get<double>() / 1048576.0,
                  info["tensor_count"].get<size_t>());
    out << buf;
  }
  if (info.contains("sentence_transformers_modules")) {
    out << "sentence-transformers modules: " << info["sentence_transformers_modules"].dump()
        << "\n";
  }
  if (info.contains("note")) out << "note: " << info["note"].get<std::string>() << "\n";
  if (info.contains("cpu")) {
    const auto& cpu = info["cpu"];
    out << "cpu kernels: " << cpu["isa"].get<std::string>() << ", f32 GEMM "
        << cpu["gemm"].get<std::string>() << ", bf16 GEMM " << cpu["bf16_gemm"].get<std::string>()
        << ", quantized GEMM " << cpu["quantized_gemm"].get<std::string>() << "; threads "
        << cpu["threads"].get<size_t>() << "\n";
  }
  if (info.contains("config")) print_section(out, "config", info["config"]);
  if (info.contains("tokenizer")) print_section(out, "tokenizer", info["tokenizer"]);
  if (info.contains("metadata")) print_section(out, "metadata", info["metadata"]);
  if (tensors && info.contains("tensors") && !info["tensors"].empty()) {
    out << "tensors:\n";
    for (const auto& t : info["tensors"]) {
      out << "  " << t["name"].get<std::string>() << "  " << t["type"].get<std::string>() << "  "
          << t["shape"].dump() << "  " << t["bytes"].dump() << " bytes\n";
    }
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wick-info: what a model holds: format, architecture, sizes, parameter count, tokenizer,\n"
      "metadata and every tensor with its type and shape. PATH: a .gguf file, a .safetensors\n"
      "file (or model.safetensors.index.json) or a model folder. Exit codes: 0 success, 1 a\n"
      "malformed file, 2 usage error."};
  tools::CommonOptions common;
  tools::add_common_options(app, "wick-info", common);
  std::string path;
  bool as_json = false, no_tensors = false;
  app.add_option("PATH", path, "the model file or folder")->required();
  app.add_flag("--json", as_json, "one JSON object instead of text");
  app.add_flag("--no-tensors", no_tensors, "leave out the tensor list");

  return tools::run(app, argc, argv, "wick-info", common, [&]() -> int {
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw tools::UsageError("PATH " + path + ": no such file or directory");
    json info;
    const std::string ext = fs::path(path).extension().string();
    if (fs::is_directory(path, ec)) {
      info = folder_info(path);
    } else if (ext == ".gguf") {
      info = gguf_info(path);
    } else if (ext == ".safetensors" || ext == ".json") {
      info = {{"path", path}, {"format", "safetensors"}};
      add_safetensors(path, info);
    } else {
      throw tools::UsageError("PATH " + path +
                              ": not a .gguf, .safetensors or .safetensors.index.json file, nor a "
                              "folder");
    }
    if (no_tensors) info.erase("tensors");
    // The kernels this machine runs the model with (a bf16 GEMM of "none": f32 ops composed).
    const std::string bf16_gemm = wick::cpu_bf16_gemm();
    info["cpu"] = {{"isa", wick::cpu_isa()},
                   {"gemm", wick::cpu_gemm()},
                   {"bf16_gemm", bf16_gemm.empty() ? "none" : bf16_gemm},
                   {"quantized_gemm", wick::cpu_qmatmul_isa()},
                   {"threads", wick::cpu_threads()}};
    std::string text = as_json ? info.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"
                               : to_text(info, !no_tensors);
    tools::write_stdout(text.data(), text.size());
    return tools::kOk;
  });
}
