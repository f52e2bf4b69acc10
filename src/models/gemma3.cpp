// Gemma 3 text (transformers' Gemma3ForCausalLM, model_type gemma3_text; GGUF architecture
// gemma3): Gemma 2's decoder (gemma.h) with (1 + w) RMS norms over each query and key head before
// rope, a local:global layer pattern (layer_types, or every sliding_window_pattern-th layer
// global) whose local layers attend through the sliding window with their own rope base
// (rope_local_base_freq) and whose global layers use the configured rope scaling; soft-capping
// only where the config sets it (off by default).

#include <filesystem>

#include "models/families.h"
#include "models/gemma.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"

namespace wick::models {

std::unique_ptr<CausalLM> load_gemma3(const std::string& path, const Device& device, DType dtype) {
  using namespace decoder;
  gemma::GemmaConfig g;
  g.qk_norm = true;
  DecoderConfig& c = g.common;
  Rope global, local;
  global.theta = 1000000.0;
  local.theta = 10000.0;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const std::string origin = (std::filesystem::path(path) / "config.json").string();
    json_file::Json j = json_file::read(origin);
    c = DecoderConfig::from_json(j, origin);
    if (c.architecture != "gemma3_text") {
      throw FormatError(str(origin, ": model_type \"", c.architecture, "\" is not gemma3_text"));
    }
    gemma::check_activation(j, origin);
    if (json_file::get_bool(j, "attention_bias", origin, false) ||
        json_file::get_bool(j, "use_bidirectional_attention", origin, false)) {
      throw FormatError(
          str(origin, ": attention_bias and use_bidirectional_attention are not supported"));
    }
    c.validate(origin);
    g.query_pre_attn_scalar = json_file::get_number(j, "query_pre_attn_scalar", origin, 256);
    g.attn_softcap = gemma::number_or_off(j, "attn_logit_softcapping", 0, origin);
    g.sliding_window = static_cast<size_t>(gemma::number_or_off(j, "sliding_window", 4096, origin));
    // transformers 5: rope_parameters per layer type; 4: rope_theta and rope_scaling for the
    // global layers, rope_local_base_freq for the local ones.
    auto rp = j.find("rope_parameters");
    if (rp != j.end() && rp->is_object() && rp->contains("full_attention")) {
      global = parse_rope((*rp)["full_attention"], global, origin);
      if (rp->contains("sliding_attention") && !(*rp)["sliding_attention"].is_null()) {
        local = parse_rope((*rp)["sliding_attention"], local, origin);
      }
    } else {
      global = parse_config_rope(j, 1000000.0, c.max_position, origin);
      local.theta = json_file::get_number(j, "rope_local_base_freq", origin, 10000.0);
    }
    auto types = sliding_layers(j, c.num_layers, origin);
    if (!types) {
      const size_t every_sixth = 6;
      size_t pattern = json_file::get_size(j, "sliding_window_pattern", origin, &every_sixth);
      if (pattern == 0) throw FormatError(str(origin, ": sliding_window_pattern is 0"));
      types = std::vector<bool>(c.num_layers);
      for (size_t i = 0; i < c.num_layers; ++i) (*types)[i] = (i + 1) % pattern != 0;
    }
    g.sliding = *types;
    global.validate(c.head_dim, origin);
    local.validate(c.head_dim, origin);
  } else {
    const std::string origin = "gguf " + path;
    gguf::File f = gguf::File::open(path);
    c = DecoderConfig::from_gguf(f, "gemma3");
    c.validate(origin);
    if (f.contains_key("gemma3.rope.freq_base"))
      global.theta = f.get_float("gemma3.rope.freq_base");
    if (f.contains_key("gemma3.rope.freq_base_swa")) {
      local.theta = f.get_float("gemma3.rope.freq_base_swa");
    }
    if (f.contains_key("gemma3.rope.scaling.type")) {
      std::string type = f.get_string("gemma3.rope.scaling.type");
      if (type == "linear") {
        global.type = "linear";
        global.factor = f.get_float("gemma3.rope.scaling.factor");
      } else if (type != "none") {
        throw FormatError(str(origin, ": rope scaling type \"", type, "\" is not supported"));
      }
    }
    if (f.contains_key("gemma3.attn_logit_softcapping")) {
      g.attn_softcap = f.get_float("gemma3.attn_logit_softcapping");
    }
    g.sliding_window = f.contains_key("gemma3.attention.sliding_window")
                           ? f.get_uint("gemma3.attention.sliding_window")
                           : 4096;
    g.query_pre_attn_scalar = gemma::gguf_query_scalar(f, "gemma3", c);
    // The pattern: a list of per-layer flags, or every n-th layer global (llama.cpp: 6).
    g.sliding.assign(c.num_layers, false);
    const std::string key = "gemma3.attention.sliding_window_pattern";
    const gguf::Value* pattern = f.find(key);
    if (pattern != nullptr && pattern->is_array()) {
      if (pattern->array_size() != c.num_layers) {
        throw FormatError(str(origin, ": ", key, " has ", pattern->array_size(), " entries for ",
                              c.num_layers, " layers"));
      }
      for (size_t i = 0; i < c.num_layers; ++i) g.sliding[i] = pattern->at(i).as_bool();
    } else {
      uint64_t n = pattern != nullptr ? pattern->as_uint() : 6;
      if (n == 0) throw FormatError(str(origin, ": ", key, " is 0"));
      for (size_t i = 0; i < c.num_layers; ++i) g.sliding[i] = (i + 1) % n != 0;
    }
    global.validate(c.head_dim, origin);
    local.validate(c.head_dim, origin);
  }
  g.ropes = {global, local};
  return gemma::load_gemma(path, std::move(g), device, dtype);
}

}  // namespace wick::models
