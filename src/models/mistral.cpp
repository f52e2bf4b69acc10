// Mistral (transformers' MistralForCausalLM): Llama's decoder with sliding-window attention, each
// query seeing the `sliding_window` latest positions (itself included). Per layer:
//   x += wo attention_window(rope(q), rope(k), v) of wqkv rms_norm(x)
//   x += wdown (silu(gate) * up) of wgate_up rms_norm(x)
// logits = lm_head rms_norm(x). Without a window (or one covering the whole context) the model is
// exactly Llama, and loads as one (llama.cpp, with its fused decode paths); GGUF files of Mistral
// models are architecture llama.

#include <cmath>
#include <filesystem>

#include "models/decoder.h"
#include "models/families.h"
#include "util.h"
#include "wick/error.h"

namespace wick::models {

using namespace decoder;

std::unique_ptr<CausalLM> load_mistral(const std::string& path, const Device& device, DType dtype) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return load_llama_family(path, device, dtype);
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
  c.validate(origin);
  Rope rope = parse_config_rope(j, 10000.0, c.max_position, origin);
  rope.validate(c.head_dim, origin);
  auto src = folder_weights(path, device, dtype);
  Weights w;
  w.ropes = {rope};
  read_embedding_and_head(*src, c, w);
  w.norm = src->dense("model.norm.weight", {c.hidden_size});
  for (size_t i = 0; i < c.num_layers; ++i) {
    std::string p = str("model.layers.", i, ".");
    Layer l;
    l.attn_norm = src->dense(p + "input_layernorm.weight", {c.hidden_size});
    l.ffn_norm = src->dense(p + "post_attention_layernorm.weight", {c.hidden_size});
    read_projections(*src, c, i, l);
    l.attention.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    l.attention.window = window;
    w.layers.push_back(std::move(l));
  }
  return std::make_unique<PreNormDecoder>(std::move(c), std::move(w), device, dtype);
}

}  // namespace wick::models
