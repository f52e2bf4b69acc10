// Llama::load: a Hugging Face folder (config.json + safetensors) or a GGUF file.

#include <filesystem>

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

}  // namespace

LlamaConfig gguf_config(const gguf::File& f) {
  std::string arch = f.architecture();
  if (arch != "llama") {
    throw FormatError(
        str(f.path(), ": general.architecture is \"", arch, "\", Llama::load reads \"llama\""));
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
  c.head_dim = f.contains_key("llama.rope.dimension_count")
                   ? f.get_uint("llama.rope.dimension_count")
                   : c.hidden_size / c.num_attention_heads;
  if (f.contains_key("llama.context_length")) {
    c.max_position_embeddings = f.get_uint("llama.context_length");
  }
  c.rms_norm_eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
  if (f.contains_key("llama.rope.freq_base")) c.rope_theta = f.get_float("llama.rope.freq_base");
  if (f.contains_key("llama.vocab_size")) {
    c.vocab_size = f.get_uint("llama.vocab_size");
  } else {
    c.vocab_size = f.info("token_embd.weight").shape[0];
  }
  c.tie_word_embeddings = !f.contains("output.weight");
  if (f.contains_key("tokenizer.ggml.bos_token_id")) {
    c.bos_token_id = static_cast<uint32_t>(f.get_uint("tokenizer.ggml.bos_token_id"));
  }
  if (f.contains_key("tokenizer.ggml.eos_token_id")) {
    c.eos_token_ids = {static_cast<uint32_t>(f.get_uint("tokenizer.ggml.eos_token_id"))};
  }
  c.validate(f.path());
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
  std::string weights_path = fs::exists(index) ? index.string() : single.string();
  if (!fs::exists(weights_path)) {
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
  if (fs::is_directory(path)) return load_folder(path, device, dtype);
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
  if (f.contains_key("tokenizer.ggml.model")) v.model = f.get_string("tokenizer.ggml.model");
  if (f.contains_key("tokenizer.ggml.pre")) v.pre = f.get_string("tokenizer.ggml.pre");
  v.tokens = f.get_string_array("tokenizer.ggml.tokens");
  if (f.contains_key("tokenizer.ggml.merges")) {
    v.merges = f.get_string_array("tokenizer.ggml.merges");
  }
  if (f.contains_key("tokenizer.ggml.token_type")) {
    for (int64_t t : f.get_int_array("tokenizer.ggml.token_type")) {
      v.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  auto id = [&](const char* key) -> std::optional<uint32_t> {
    if (!f.contains_key(key)) return std::nullopt;
    return static_cast<uint32_t>(f.get_uint(key));
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
  return Tokenizer::from_gguf_vocab(v);
}

}  // namespace wick::models
