// Qwen3 (transformers' Qwen3ForCausalLM; GGUF architecture qwen3): Llama's pre-norm decoder with
// an RMS norm over each query and key head before rope, and no q/k/v bias. Per layer:
//   q, k, v = split(wqkv rms_norm(x));  q = rope(rms_norm_head(q)), k = rope(rms_norm_head(k))
//   x += wo attention(q, k, v)          (sliding window on the layers layer_types marks)
//   x += wdown (silu(gate) * up) of wgate_up rms_norm(x)
// logits = lm_head rms_norm(x).

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
    {"input_layernorm", "attn_norm"},    {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},      {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"},
    {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
};

}  // namespace

std::unique_ptr<CausalLM> load_qwen3(const std::string& path, const Device& device, DType dtype) {
  DecoderConfig c;
  std::vector<bool> sliding;
  size_t window = 0;
  Rope rope;
  std::unique_ptr<WeightSource> src;
  std::string origin;
  if (std::filesystem::is_directory(path)) {
    origin = (std::filesystem::path(path) / "config.json").string();
    json_file::Json j = json_file::read(origin);
    c = DecoderConfig::from_json(j, origin);
    if (c.architecture != "qwen3") {
      throw FormatError(str(origin, ": model_type \"", c.architecture, "\" is not qwen3"));
    }
    if (json_file::get_bool(j, "attention_bias", origin, false)) {
      throw FormatError(str(origin, ": attention_bias is not supported for qwen3"));
    }
    rope = parse_config_rope(j, 1000000.0, c.max_position, origin);
    auto types = sliding_layers(j, c.num_layers, origin);
    if (json_file::get_bool(j, "use_sliding_window", origin, false)) {
      window = json_file::get_size(j, "sliding_window", origin);
      if (!types) {
        size_t from = json_file::get_size(j, "max_window_layers", origin);
        types = std::vector<bool>(c.num_layers);
        for (size_t i = 0; i < c.num_layers; ++i) (*types)[i] = i >= from;
      }
    }
    sliding = types.value_or(std::vector<bool>(c.num_layers, false));
    src = folder_weights(path, device, dtype);
  } else {
    origin = "gguf " + path;
    gguf::File f = gguf::File::open(path);
    c = DecoderConfig::from_gguf(f, "qwen3");
    rope.theta =
        f.contains_key("qwen3.rope.freq_base") ? f.get_float("qwen3.rope.freq_base") : 1000000.0;
    sliding.assign(c.num_layers, false);
    src = gguf_weights(path, device, dtype, kGgufNames);
  }
  c.validate(origin);
  rope.validate(c.head_dim, origin);
  Weights w;
  w.ropes = {rope};
  read_embedding_and_head(*src, c, w);
  w.norm = src->dense("model.norm.weight", {c.hidden_size});
  for (size_t i = 0; i < c.num_layers; ++i) {
    std::string p = str("model.layers.", i, ".");
    Layer l;
    l.attn_norm = src->dense(p + "input_layernorm.weight", {c.hidden_size});
    l.ffn_norm = src->dense(p + "post_attention_layernorm.weight", {c.hidden_size});
    l.q_norm = src->dense(p + "self_attn.q_norm.weight", {c.head_dim});
    l.k_norm = src->dense(p + "self_attn.k_norm.weight", {c.head_dim});
    read_projections(*src, c, i, l);
    l.attention.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    l.attention.window = sliding[i] ? window : 0;
    w.layers.push_back(std::move(l));
  }
  return std::make_unique<PreNormDecoder>(std::move(c), std::move(w), device, dtype);
}

}  // namespace wick::models
