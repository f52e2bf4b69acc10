// Mistral (transformers' MistralForCausalLM): Llama's decoder with sliding-window attention, each
// query seeing the `sliding_window` latest positions (itself included). Per layer:
//   x += wo attention_window(rope(q), rope(k), v) of wqkv rms_norm(x)
//   x += wdown (silu(gate) * up) of wgate_up rms_norm(x)
// logits = lm_head rms_norm(x). Without a window (or one covering the whole context) the model is
// exactly Llama, and loads as one (llama.cpp, with its fused decode paths). GGUF files of Mistral
// models are architecture llama; one whose metadata sets llama.attention.sliding_window below its
// context loads here.

#include <cmath>
#include <filesystem>

#include "models/decoder.h"
#include "models/families.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"

namespace wick::models {

namespace {

using namespace decoder;

const std::map<std::string, std::string> kGgufNames = {
    {"input_layernorm", "attn_norm"}, {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.q_proj", "attn_q"},   {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"},
    {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};

// A llama GGUF file's sliding window, 0 when it has none or one covering its whole context.
size_t gguf_window(const gguf::File& f) {
  const std::string key = "llama.attention.sliding_window";
  const size_t window = f.contains_key(key) ? f.get_uint(key) : 0;
  const size_t context =
      f.contains_key("llama.context_length") ? f.get_uint("llama.context_length") : 0;
  return context > 0 && window >= context ? 0 : window;
}

std::unique_ptr<CausalLM> build(DecoderConfig c, const Rope& rope, size_t window,
                                const WeightSource& src, const std::string& origin,
                                const Device& device, DType dtype) {
  c.validate(origin);
  rope.validate(c.head_dim, origin);
  Weights w;
  w.ropes = {rope};
  read_embedding_and_head(src, c, w);
  w.norm = src.dense("model.norm.weight", {c.hidden_size});
  for (size_t i = 0; i < c.num_layers; ++i) {
    std::string p = str("model.layers.", i, ".");
    Layer l;
    l.attn_norm = src.dense(p + "input_layernorm.weight", {c.hidden_size});
    l.ffn_norm = src.dense(p + "post_attention_layernorm.weight", {c.hidden_size});
    read_projections(src, c, i, l);
    l.attention.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    l.attention.window = window;
    w.layers.push_back(std::move(l));
  }
  return std::make_unique<PreNormDecoder>(std::move(c), std::move(w), device, dtype);
}

// A GGUF file of architecture llama with a sliding window below its context.
std::unique_ptr<CausalLM> load_mistral_gguf(const std::string& path, const gguf::File& f,
                                            size_t window, const Device& device, DType dtype) {
  DecoderConfig c = DecoderConfig::from_gguf(f, "llama");
  c.architecture = "mistral";
  Rope rope;
  if (f.contains_key("llama.rope.freq_base")) rope.theta = f.get_float("llama.rope.freq_base");
  auto src = gguf_weights(path, device, dtype, kGgufNames, c.head_dim);
  return build(std::move(c), rope, window, *src, "gguf " + path, device, dtype);
}

}  // namespace

std::unique_ptr<CausalLM> load_mistral(const std::string& path, const Device& device, DType dtype) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return load_llama_architecture(path, device, dtype);
  const std::string origin = (std::filesystem::path(path) / "config.json").string();
  json_file::Json j = json_file::read(origin);
  DecoderConfig c = DecoderConfig::from_json(j, origin);
  auto it = j.find("sliding_window");
  const size_t window =
      it == j.end() || it->is_null() ? 0 : json_file::as_uint(*it, "sliding_window", origin);
  if (window == 0 || window >= c.max_position) return load_llama_family(path, device, dtype);
  if (c.architecture != "mistral") {
    throw FormatError(str(origin, ": model_type \"", c.architecture, "\" is not mistral"));
  }
  if (json_file::get_bool(j, "attention_bias", origin, false)) {
    throw FormatError(str(origin, ": attention_bias is not supported for mistral"));
  }
  Rope rope = parse_config_rope(j, 10000.0, c.max_position, origin);
  auto src = folder_weights(path, device, dtype);
  return build(std::move(c), rope, window, *src, origin, device, dtype);
}

std::unique_ptr<CausalLM> load_llama_architecture(const std::string& path, const Device& device,
                                                  DType dtype) {
  std::error_code ec;
  const bool gguf_file = !std::filesystem::is_directory(path, ec) && path.size() >= 5 &&
                         path.compare(path.size() - 5, 5, ".gguf") == 0;
  if (gguf_file) {
    gguf::File f = gguf::File::open(path);
    if (f.architecture() == "llama") {
      if (size_t window = gguf_window(f); window > 0) {
        return load_mistral_gguf(path, f, window, device, dtype);
      }
    }
  }
  return load_llama_family(path, device, dtype);
}

}  // namespace wick::models
