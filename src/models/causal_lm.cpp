// load_causal_lm: the architecture named by a model folder's config.json (model_type) or a GGUF
// file (general.architecture) picks the family's loader from one table.

#include "wick/causal_lm.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/families.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"

namespace wick::models {

void check_special_tokens(const CausalLMConfig& c, const std::string& origin) {
  if (c.bos_token_id && *c.bos_token_id >= c.vocab_size) {
    throw FormatError(str(origin, ": bos_token_id ", *c.bos_token_id,
                          " is outside the vocabulary (", c.vocab_size, " tokens)"));
  }
  for (uint32_t id : c.eos_token_ids) {
    if (id >= c.vocab_size) {
      throw FormatError(str(origin, ": eos_token_id ", id, " is outside the vocabulary (",
                            c.vocab_size, " tokens)"));
    }
  }
}

Tensor CausalLM::forward_last(const Tensor& ids, KvCache& cache) const {
  Tensor logits = forward(ids, cache);
  size_t s = logits.dims()[1];
  return logits.narrow(1, s - 1, 1).squeeze(1);
}

Tensor CausalLM::decode_step(const Tensor&, const Tensor&, KvCache&, Tensor*, size_t) const {
  throw Error(str("decode_step: the ", config().architecture,
                  " model has no device-side decode step (has_decode_step() is false)"));
}

void check_forward_ids(const Tensor& ids, const KvCache& cache, size_t layers, const Device& device,
                       const std::string& op) {
  if (ids.rank() != 2 || ids.dims()[1] == 0) {
    throw ShapeMismatch(str(op, ": ids must be (batch, seq) with seq > 0, got ", ids.shape()));
  }
  if (ids.dtype() != DType::U32 && ids.dtype() != DType::I64) {
    throw DTypeMismatch(str(op, ": ids must be u32 or i64, got ", ids.dtype()));
  }
  if (cache.layers() != layers || cache.batch() != ids.dims()[0]) {
    throw ShapeMismatch(str(op, ": cache for batch ", cache.batch(), " and ", cache.layers(),
                            " layers, ids ", ids.shape(), " for a model of ", layers, " layers"));
  }
  if (ids.device() != device) {
    throw DeviceMismatch(str(op, ": ids on ", ids.device(), ", model on ", device));
  }
}

namespace {

namespace fs = std::filesystem;

using Loader = std::function<std::unique_ptr<CausalLM>(const std::string& path,
                                                       const Device& device, DType dtype)>;

struct Family {
  const char* model_type;  // config.json
  const char* gguf_arch;   // general.architecture, or nullptr
  Loader load;
};

// One row per architecture: its config.json model_type, its GGUF architecture, its loader.
const std::vector<Family>& families() {
  static const std::vector<Family> table = {
      {"llama", "llama", load_llama_architecture},
      {"mistral", nullptr, load_mistral},
      {"qwen2", nullptr, load_qwen2},
      {"qwen3", "qwen3", load_qwen3},
      {"phi3", "phi3", load_phi3},
      {"gemma2", "gemma2", load_gemma2},
      {"gemma3_text", "gemma3", load_gemma3},
  };
  return table;
}

std::string known_list() {
  std::string out;
  for (const Family& f : families()) out += (out.empty() ? "" : ", ") + std::string(f.model_type);
  return out;
}

std::string model_type_of(const fs::path& config) {
  std::ifstream in(config, std::ios::binary);
  if (!in) throw FormatError(str(config.string(), ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw FormatError(str(config.string(), ": not a JSON object"));
  }
  auto it = j.find("model_type");
  if (it == j.end()) return "llama";
  if (!it->is_string()) throw FormatError(str(config.string(), ": \"model_type\" is not a string"));
  return it->get<std::string>();
}

}  // namespace

std::vector<std::string> causal_lm_architectures() {
  std::vector<std::string> out;
  for (const Family& f : families()) out.emplace_back(f.model_type);
  return out;
}

std::unique_ptr<CausalLM> load_causal_lm(const std::string& path, const Device& device,
                                         DType dtype) {
  std::error_code ec;
  const bool is_gguf = path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
  if (is_gguf) {
    std::string arch = gguf::File::open(path).architecture();
    for (const Family& f : families()) {
      if (f.gguf_arch != nullptr && arch == f.gguf_arch) return f.load(path, device, dtype);
    }
    throw FormatError(str(path, ": GGUF architecture \"", arch,
                          "\" is not a known causal LM (known: ", known_list(), ")"));
  }
  fs::path dir(path);
  if (fs::is_regular_file(dir, ec) && dir.filename() == "config.json") dir = dir.parent_path();
  if (!fs::is_directory(dir, ec)) {
    throw FormatError(str("load_causal_lm: ", path,
                          " is neither a model folder with config.json nor a .gguf file"));
  }
  std::string type = model_type_of(dir / "config.json");
  for (const Family& f : families()) {
    if (type == f.model_type) return f.load(dir.string(), device, dtype);
  }
  throw FormatError(str((dir / "config.json").string(), ": model_type \"", type,
                        "\" is not a known causal LM (known: ", known_list(), ")"));
}

}  // namespace wick::models
