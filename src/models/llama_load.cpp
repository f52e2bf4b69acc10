// Llama::load: a Hugging Face folder (config.json + safetensors) or a GGUF file.

#include <filesystem>

#include "formats/json_util.h"
#include "models/families.h"
#include "models/llama_impl.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"
#include "wick/llama.h"
#include "wick/safetensors.h"
#include "wick/tokenizer.h"

namespace wick::models {

namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A 32-bit token id from GGUF metadata; a wider one is a FormatError, not truncated.
uint32_t gguf_id(const gguf::File& f, const char* key) {
  uint64_t v = f.get_uint(key);
  if (v > UINT32_MAX) {
    throw FormatError(
        str("gguf ", f.path(), ": metadata '", key, "' ", v, " does not fit a 32-bit token id"));
  }
  return static_cast<uint32_t>(v);
}

// The shape `name` must have, or FormatError naming the file and tensor.
void expect_shape(const gguf::File& f, const std::string& name, const std::vector<size_t>& dims) {
  const Shape& got = f.info(name).shape;
  if (got != Shape(dims)) {
    throw FormatError(str("gguf ", f.path(), ": tensor '", name, "' has shape ", got,
                          ", the metadata gives ", Shape(dims)));
  }
}

// Every tensor the loaders read, against the shapes the metadata implies.
void check_gguf_shapes(const gguf::File& f, const LlamaConfig& c) {
  size_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim;
  size_t kv = c.num_key_value_heads * c.head_dim, ff = c.intermediate_size;
  auto need = [&](const std::string& name) {
    if (!f.contains(name)) throw FormatError(str("gguf ", f.path(), ": no tensor '", name, "'"));
  };
  for (const char* n : {"token_embd.weight", "output_norm.weight"}) need(n);
  expect_shape(f, "token_embd.weight", {c.vocab_size, h});
  expect_shape(f, "output_norm.weight", {h});
  if (!c.tie_word_embeddings) expect_shape(f, "output.weight", {c.vocab_size, h});
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string g = str("blk.", i, ".");
    const std::pair<const char*, std::vector<size_t>> parts[] = {
        {"attn_norm.weight", {h}},    {"ffn_norm.weight", {h}},   {"attn_q.weight", {q, h}},
        {"attn_k.weight", {kv, h}},   {"attn_v.weight", {kv, h}}, {"attn_output.weight", {h, q}},
        {"ffn_gate.weight", {ff, h}}, {"ffn_up.weight", {ff, h}}, {"ffn_down.weight", {h, ff}},
    };
    for (const auto& [suffix, dims] : parts) {
      need(g + suffix);
      expect_shape(f, g + suffix, dims);
    }
  }
}

}  // namespace

LlamaConfig gguf_config(const gguf::File& f) {
  std::string arch = f.architecture();
  if (arch != "llama") {
    throw FormatError(str("gguf ", f.path(), ": general.architecture is ",
                          formats::quote_prefix(arch), ", Llama::load reads \"llama\""));
  }
  LlamaConfig c;
  c.model_type = "llama";
  c.hidden_size = f.get_uint("llama.embedding_length");
  c.intermediate_size = f.get_uint("llama.feed_forward_length");
  c.num_hidden_layers = f.get_uint("llama.block_count");
  c.num_attention_heads = f.get_uint("llama.attention.head_count");
  c.num_key_value_heads = f.contains_key("llama.attention.head_count_kv")
                              ? f.get_uint("llama.attention.head_count_kv")
                              : c.num_attention_heads;
  if (f.contains_key("llama.rope.dimension_count")) {
    c.head_dim = f.get_uint("llama.rope.dimension_count");
  } else if (c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      throw FormatError(str("gguf ", f.path(), ": llama.embedding_length ", c.hidden_size,
                            " is not a multiple of llama.attention.head_count ",
                            c.num_attention_heads, " (and no llama.rope.dimension_count)"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }  // else 0: validate() names it
  if (f.contains_key("llama.context_length")) {
    c.max_position_embeddings = f.get_uint("llama.context_length");
  }
  // A Mistral's window (load_causal_lm reads such a file, mistral.cpp); Llama has none.
  if (f.contains_key("llama.attention.sliding_window")) {
    const uint64_t window = f.get_uint("llama.attention.sliding_window");
    if (window > 0 &&
        (!f.contains_key("llama.context_length") || window < c.max_position_embeddings)) {
      throw FormatError(str("gguf ", f.path(), ": llama.attention.sliding_window ", window,
                            " is below the context: Llama has no sliding window "
                            "(load_causal_lm reads this model)"));
    }
  }
  c.rms_norm_eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
  if (f.contains_key("llama.rope.freq_base")) c.rope_theta = f.get_float("llama.rope.freq_base");
  if (!f.contains("token_embd.weight")) {
    throw FormatError(str("gguf ", f.path(), ": no tensor 'token_embd.weight'"));
  }
  const Shape& embd = f.info("token_embd.weight").shape;
  if (f.contains_key("llama.vocab_size")) {
    c.vocab_size = f.get_uint("llama.vocab_size");
  } else if (embd.rank() == 2) {
    c.vocab_size = embd[0];
  }
  c.tie_word_embeddings = !f.contains("output.weight");
  if (f.contains_key("tokenizer.ggml.bos_token_id")) {
    c.bos_token_id = gguf_id(f, "tokenizer.ggml.bos_token_id");
  }
  if (f.contains_key("tokenizer.ggml.eos_token_id")) {
    c.eos_token_ids = {gguf_id(f, "tokenizer.ggml.eos_token_id")};
  }
  c.validate("gguf " + f.path());
  check_gguf_shapes(f, c);
  return c;
}

namespace {

// GGUF stores q and k rows permuted for interleaved rope (llama.cpp's convert script):
// rows (heads, 2, head_dim / 2) became (heads, head_dim / 2, 2). Undone here, so one
// rotate-half rope serves both formats.
Tensor unpermute_rows(const Tensor& w, size_t heads, size_t head_dim) {
  size_t in = w.dims()[1];
  return w.reshape({heads, head_dim / 2, 2, in})
      .transpose(1, 2)
      .contiguous()
      .reshape({heads * head_dim, in});
}

Llama load_gguf(const std::string& path, const Device& device, DType dtype) {
  gguf::File f = gguf::File::open(path);
  LlamaConfig c = gguf_config(f);
  std::map<std::string, Tensor> w;
  // Dequantised on the CPU (f32), then converted and moved by from_weights.
  auto get = [&](const std::string& name) { return f.get(name, Device::cpu()); };
  w["model.embed_tokens.weight"] = get("token_embd.weight");
  w["model.norm.weight"] = get("output_norm.weight");
  if (!c.tie_word_embeddings) w["lm_head.weight"] = get("output.weight");
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string g = str("blk.", i, "."), h = str("model.layers.", i, ".");
    w[h + "input_layernorm.weight"] = get(g + "attn_norm.weight");
    w[h + "post_attention_layernorm.weight"] = get(g + "ffn_norm.weight");
    w[h + "self_attn.q_proj.weight"] =
        unpermute_rows(get(g + "attn_q.weight"), c.num_attention_heads, c.head_dim);
    w[h + "self_attn.k_proj.weight"] =
        unpermute_rows(get(g + "attn_k.weight"), c.num_key_value_heads, c.head_dim);
    w[h + "self_attn.v_proj.weight"] = get(g + "attn_v.weight");
    w[h + "self_attn.o_proj.weight"] = get(g + "attn_output.weight");
    w[h + "mlp.gate_proj.weight"] = get(g + "ffn_gate.weight");
    w[h + "mlp.up_proj.weight"] = get(g + "ffn_up.weight");
    w[h + "mlp.down_proj.weight"] = get(g + "ffn_down.weight");
  }
  return Llama::from_weights(c, w, device, dtype);
}

Llama load_folder(const std::string& dir, const Device& device, DType dtype) {
  LlamaConfig c = LlamaConfig::from_file((fs::path(dir) / "config.json").string());
  return load_llama_weights(dir, c, device, dtype);
}

}  // namespace

Llama load_llama_weights(const std::string& dir, const LlamaConfig& c, const Device& device,
                         DType dtype) {
  fs::path folder(dir);
  fs::path index = folder / "model.safetensors.index.json";
  fs::path single = folder / "model.safetensors";
  auto exists = [](const fs::path& p) {
    std::error_code ec;
    bool found = fs::exists(p, ec);
    if (ec) throw FormatError(str(p.string(), ": cannot be checked: ", ec.message()));
    return found;
  };
  std::string weights_path = exists(index) ? index.string() : single.string();
  if (!exists(weights_path)) {
    throw FormatError(str(dir, ": neither model.safetensors nor model.safetensors.index.json"));
  }
  auto file = safetensors::ShardedFile::open(weights_path);
  std::map<std::string, Tensor> w;
  for (const auto& name : file.names()) {
    if (ends_with(name, "rotary_emb.inv_freq")) continue;
    w[name] = file.get(name, device);
  }
  return Llama::from_weights(c, w, device, dtype);
}

std::unique_ptr<CausalLM> load_llama_family(const std::string& path, const Device& device,
                                            DType dtype) {
  return std::make_unique<Llama>(Llama::load(path, device, dtype, /*keep_quantized=*/true));
}

Llama Llama::load(const std::string& path, const Device& device, DType dtype, bool keep_quantized) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_folder(path, device, dtype);
  if (ends_with(path, ".gguf")) {
    return keep_quantized ? load_gguf_quantized(path, device, dtype)
                          : load_gguf(path, device, dtype);
  }
  if (ends_with(path, "config.json")) {
    return load_folder(fs::path(path).parent_path().string(), device, dtype);
  }
  throw FormatError(
      str("Llama::load: ", path, " is neither a folder with config.json nor a .gguf file"));
}

Tokenizer load_gguf_tokenizer(const std::string& gguf_path) {
  gguf::File f = gguf::File::open(gguf_path);
  GgufVocab v;
  v.source = gguf_path;
  if (f.contains_key("tokenizer.ggml.model")) v.model = f.get_string("tokenizer.ggml.model");
  if (f.contains_key("tokenizer.ggml.pre")) v.pre = f.get_string("tokenizer.ggml.pre");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.contains_key("tokenizer.ggml.merges")) {
    v.merges = f.get_string_array("tokenizer.ggml.merges");
  }
  if (f.contains_key("tokenizer.ggml.scores")) {
    for (double score : f.get_float_array("tokenizer.ggml.scores")) {
      v.scores.push_back(static_cast<float>(score));
    }
  }
  if (f.contains_key("tokenizer.ggml.add_space_prefix")) {
    v.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix");
  }
  if (f.contains_key("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) {
      v.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  auto id = [&](const char* key) -> std::optional<uint32_t> {
    if (!f.contains_key(key)) return std::nullopt;
    return gguf_id(f, key);
  };
  v.bos_id = id("tokenizer.ggml.bos_token_id");
  v.eos_id = id("tokenizer.ggml.eos_token_id");
  v.unk_id = id("tokenizer.ggml.unknown_token_id");
  v.pad_id = id("tokenizer.ggml.padding_token_id");
  if (f.contains_key("tokenizer.ggml.add_bos_token")) {
    v.add_bos = f.get_bool("tokenizer.ggml.add_bos_token");
  }
  if (f.contains_key("tokenizer.ggml.add_eos_token")) {
    v.add_eos = f.get_bool("tokenizer.ggml.add_eos_token");
  }
  if (f.contains_key("tokenizer.chat_template")) {
    v.chat_template = f.get_string("tokenizer.chat_template");
  }
  try {
    return Tokenizer::from_gguf_vocab(v);
  } catch (const TokenizerError& e) {
    throw TokenizerError(str(e.what(), " (in '", gguf_path, "')"));
  }
}

}  // namespace wick::models
