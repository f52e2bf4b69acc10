// Phi-3 (transformers' Phi3ForCausalLM; GGUF architecture phi3): Llama's pre-norm decoder whose
// checkpoints hold q/k/v as one matrix (qkv_proj) and gate/up as one (gate_up_proj, gate rows
// first), used fused as they are; long-rope scaling (rope type longrope, formerly su) with short
// and long per-frequency factors and an attention factor on cos and sin; partial rotary
// (Phi-4-mini: rope on the first partial_rotary_factor of each head's dims, the rest passing
// through); sliding-window attention where the config sets a window. Per layer:
//   x += wo attention(rope(q), rope(k), v) of qkv_proj rms_norm(x)
//   x += wdown (silu(gate) * up) of gate_up_proj rms_norm(x)
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
    {"input_layernorm", "attn_norm"},   {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.qkv_proj", "attn_qkv"}, {"self_attn.o_proj", "attn_output"},
    {"mlp.gate_up_proj", "ffn_up"},     {"mlp.down_proj", "ffn_down"},
};

std::vector<double> factors(const gguf::File& f, const char* name, size_t n) {
  if (!f.contains(name)) throw FormatError(str("gguf ", f.path(), ": no tensor '", name, "'"));
  Tensor t = f.get(name, Device::cpu());
  if (t.elem_count() != n) {
    throw FormatError(str("gguf ", f.path(), ": tensor '", name, "' has ", t.elem_count(),
                          " values, one per rotated pair: ", n, " expected"));
  }
  return t.to_vec_f64();
}

}  // namespace

std::unique_ptr<CausalLM> load_phi3(const std::string& path, const Device& device, DType dtype) {
  DecoderConfig c;
  Rope rope;
  size_t window = 0;
  std::unique_ptr<WeightSource> src;
  std::string origin;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    origin = (std::filesystem::path(path) / "config.json").string();
    json_file::Json j = json_file::read(origin);
    c = DecoderConfig::from_json(j, origin);
    if (c.architecture != "phi3") {
      throw FormatError(str(origin, ": model_type \"", c.architecture, "\" is not phi3"));
    }
    rope = parse_config_rope(j, 10000.0, c.max_position, origin);
    auto it = j.find("sliding_window");
    if (it != j.end() && !it->is_null()) window = json_file::as_uint(*it, "sliding_window", origin);
    src = folder_weights(path, device, dtype);
  } else {
    origin = "gguf " + path;
    gguf::File f = gguf::File::open(path);
    c = DecoderConfig::from_gguf(f, "phi3");
    // llama.cpp writes the rotated dims as rope.dimension_count (below head_dim for partial
    // rotary) and no key_length: the head is hidden / heads, as llama.cpp takes it.
    if (!f.contains_key("phi3.attention.key_length") && c.num_heads > 0) {
      if (c.hidden_size % c.num_heads != 0) {
        throw FormatError(str(origin, ": phi3.embedding_length ", c.hidden_size,
                              " is not a multiple of phi3.attention.head_count ", c.num_heads));
      }
      c.head_dim = c.hidden_size / c.num_heads;
    }
    if (f.contains_key("phi3.rope.dimension_count")) {
      const uint64_t dims = f.get_uint("phi3.rope.dimension_count");
      if (dims == 0 || dims % 2 != 0 || dims > c.head_dim) {
        throw FormatError(str(origin, ": phi3.rope.dimension_count ", dims,
                              " must be even, positive and at most the head size ", c.head_dim));
      }
      rope.rotary_dim = static_cast<size_t>(dims);
    }
    if (f.contains_key("phi3.rope.freq_base")) rope.theta = f.get_float("phi3.rope.freq_base");
    if (f.contains_key("phi3.attention.sliding_window")) {
      window = f.get_uint("phi3.attention.sliding_window");
    }
    if (f.contains("rope_factors_long.weight")) {
      rope.type = "longrope";
      rope.long_factor = factors(f, "rope_factors_long.weight", rope.rotated_dims(c.head_dim) / 2);
      rope.short_factor =
          factors(f, "rope_factors_short.weight", rope.rotated_dims(c.head_dim) / 2);
      rope.original_max_position =
          static_cast<double>(f.get_uint("phi3.rope.scaling.original_context_length"));
      if (f.contains_key("phi3.rope.scaling.attn_factor")) {
        rope.attention_factor = f.get_float("phi3.rope.scaling.attn_factor");
      }
    }
    src = gguf_weights(path, device, dtype, kGgufNames);
  }
  c.validate(origin);
  rope.validate(c.head_dim, origin);
  if (window >= c.max_position) window = 0;
  Weights w;
  w.ropes = {rope};
  read_embedding_and_head(*src, c, w);
  w.norm = src->dense("model.norm.weight", {c.hidden_size});
  const size_t d = c.hidden_size, ff = c.intermediate_size;
  const size_t qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  for (size_t i = 0; i < c.num_layers; ++i) {
    std::string p = str("model.layers.", i, ".");
    Layer l;
    l.attn_norm = src->dense(p + "input_layernorm.weight", {d});
    l.ffn_norm = src->dense(p + "post_attention_layernorm.weight", {d});
    l.wqkv = src->linear({{p + "self_attn.qkv_proj.weight", {qkv, d}}});
    l.wo = src->linear({{p + "self_attn.o_proj.weight", {d, c.num_heads * c.head_dim}}});
    l.wgate_up = src->linear({{p + "mlp.gate_up_proj.weight", {2 * ff, d}}});
    l.wdown = src->linear({{p + "mlp.down_proj.weight", {d, ff}}});
    l.attention.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    l.attention.window = window;
    w.layers.push_back(std::move(l));
  }
  return std::make_unique<PreNormDecoder>(std::move(c), std::move(w), device, dtype);
}

}  // namespace wick::models
