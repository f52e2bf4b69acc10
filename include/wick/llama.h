#pragma once
// Llama-family decoders (Llama 2/3, SmolLM, Qwen2): configuration, the preallocated KV cache and
// the model. Written from the architecture's equations; checked against Hugging Face
// transformers on the same weights (tests/test_llama.cpp, scripts/make_llama_refs.py).

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "wick/causal_lm.h"
#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/tensor.h"

namespace wick {
class Tokenizer;
}

namespace wick::models {

/// Llama 3's frequency-dependent rope scaling ("rope_type": "llama3").
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192;
};

/// The configuration of a Llama-family decoder (config.json keys). The CausalLMConfig part
/// (architecture, num_layers, num_heads, num_kv_heads, max_position) is derived from these fields
/// by derive_common(); a model's config() has it filled in.
struct LlamaConfig : CausalLMConfig {
  std::string model_type = "llama";  // "llama", "qwen2", "mistral" (same equations)
  size_t intermediate_size = 0;
  size_t num_hidden_layers = 0;
  size_t num_attention_heads = 0;
  size_t num_key_value_heads = 0;  // GQA; equal to num_attention_heads without it
  size_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // qwen2 (and "attention_bias": true)

  /// From the text of a Hugging Face config.json. FormatError naming the key when one is missing,
  /// mistyped or inconsistent (heads not dividing hidden_size or each other).
  static LlamaConfig from_json(const std::string& json_text, const std::string& origin = "config");
  static LlamaConfig from_file(const std::string& config_json_path);
  /// Throws FormatError when the sizes are inconsistent.
  void validate(const std::string& origin) const;
  /// The CausalLMConfig fields from the Llama ones (head_dim too, when 0).
  void derive_common();
};

/// A Llama-family decoder. Copies share the weights. Immutable after load: forward,
/// forward_last and decode_step may run on several threads at once, each with its own KvCache.
class Llama : public CausalLM {
 public:
  /// A folder with config.json and model.safetensors (or model.safetensors.index.json with its
  /// shards), or a `.gguf` file (architecture llama). Weights are converted to `dtype` (F32, F16
  /// or BF16) on `device`. A GGUF file's quantized matrices are dequantised at load, or with
  /// `keep_quantized` kept as their blocks and multiplied by qmatmul (wick/quantized.h; types
  /// qmatmul_supports() rejects are still dequantised; the token embedding is dequantised for
  /// the lookup and kept quantized as the tied output head). FormatError naming the file for
  /// malformed metadata or config.json, and (GGUF, on both paths) naming the tensor whose shape
  /// differs from the one the metadata implies.
  static Llama load(const std::string& path, const Device& device, DType dtype = DType::F32,
                    bool keep_quantized = false);
  /// From Hugging Face-named tensors ("model.layers.0.self_attn.q_proj.weight", ...), any dtype
  /// and device; they are converted to `dtype` on `device`.
  static Llama from_weights(const LlamaConfig& config, const std::map<std::string, Tensor>& weights,
                            const Device& device, DType dtype = DType::F32);

  const LlamaConfig& config() const override;
  Device device() const override;
  DType dtype() const override;
  /// Bytes of the weights as held (after any fusion at load).
  size_t weight_bytes() const;

  /// A cache for `batch` sequences of up to `max_len` positions, zero-filled.
  KvCache make_cache(size_t batch, size_t max_len) const override;

  /// ids (b, s) U32 or I64, placed after cache.length() positions of context. Returns the
  /// logits (b, s, vocab) in the model's dtype, writes keys and values of the s positions into
  /// the cache and advances its length. A whole prompt is one call (prefill).
  Tensor forward(const Tensor& ids, KvCache& cache) const override;
  /// As forward, but only the last position's logits: (b, vocab); f32 whatever the model's dtype
  /// when the output head is quantized and on the CPU (where it computes in f32).
  Tensor forward_last(const Tensor& ids, KvCache& cache) const override;

  /// One decode step whose position is read from device memory, so that the same work can be
  /// captured once as a CUDA graph and replayed: token (b, 1) U32, position (1) U32 holding
  /// the token's position (< key_window). Attention reads the first `key_window` cache rows
  /// (0: all max_len) with a mask from `position`: a graph captured for a window serves every
  /// position below it, and reads no more of the cache than that. Returns the greedy next token
  /// (b) U32, and the logits (b, vocab) through `logits` when given. Does not change
  /// cache.length() (the host keeps it).
  Tensor decode_step(const Tensor& token, const Tensor& position, KvCache& cache,
                     Tensor* logits = nullptr, size_t key_window = 0) const override;
  bool has_decode_step() const override { return true; }
  /// The pool with this model's rope tables (every position of its context).
  PagedKvCache make_paged_cache(size_t pages, size_t page_size) const override;
  /// The whole batch as one: projections over all new tokens at once, nn::paged_attention for
  /// each token over its own sequence's pages.
  Tensor forward_paged(const std::vector<PagedSequence>& batch, PagedKvCache& cache) const override;
  bool has_paged_tensors() const override { return true; }
  Tensor forward_paged_tensors(const PagedBatchTensors& batch, PagedKvCache& cache) const override;

  struct Impl;

 private:
  friend Llama load_gguf_quantized(const std::string& path, const Device& device, DType dtype);
  /// Derives the config's common part and asks the backend for its decode plan.
  explicit Llama(std::shared_ptr<Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

/// The byte-level BPE tokenizer stored in a GGUF file's tokenizer.ggml.* metadata.
Tokenizer load_gguf_tokenizer(const std::string& gguf_path);

}  // namespace wick::models
