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

struct LlamaConfig {
  std::string model_type = "llama";  // "llama", "qwen2", "mistral" (same equations)
  size_t vocab_size = 0;
  size_t hidden_size = 0;
  size_t intermediate_size = 0;
  size_t num_hidden_layers = 0;
  size_t num_attention_heads = 0;
  size_t num_key_value_heads = 0;  // GQA; equal to num_attention_heads without it
  size_t head_dim = 0;             // hidden_size / num_attention_heads unless given
  size_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // qwen2 (and "attention_bias": true)
  std::optional<uint32_t> bos_token_id;
  std::vector<uint32_t> eos_token_ids;

  /// From the text of a Hugging Face config.json. FormatError naming the key when one is missing,
  /// mistyped or inconsistent (heads not dividing hidden_size or each other).
  static LlamaConfig from_json(const std::string& json_text, const std::string& origin = "config");
  static LlamaConfig from_file(const std::string& config_json_path);
  /// Throws FormatError when the sizes are inconsistent.
  void validate(const std::string& origin) const;
};

/// Keys and values of every layer, preallocated to `max_len` positions and written in place.
/// One per sequence batch; Llama::forward appends and advances length(). Used by one thread at
/// a time (a forward call writes it).
class KvCache {
 public:
  KvCache() = default;
  size_t batch() const { return batch_; }
  size_t max_len() const { return max_len_; }
  /// Positions filled so far (the next token's position).
  size_t length() const { return length_; }
  size_t layers() const { return k_.size(); }
  /// (batch, kv_heads, max_len, head_dim) of layer `i`; rows [0, length()) are valid.
  const Tensor& k(size_t layer) const { return k_.at(layer); }
  const Tensor& v(size_t layer) const { return v_.at(layer); }
  /// Bytes held by keys and values (all layers, whole max_len).
  size_t bytes() const;
  /// Forgets the contents (length 0); the memory stays.
  void reset() { length_ = 0; }
  /// Sets the length after work that wrote positions itself (the CUDA-graph decode step).
  void set_length(size_t length);
  /// Rope tables (max_len, head_dim / 2) for this cache's positions, in the model's dtype.
  const Tensor& cos() const { return cos_; }
  const Tensor& sin() const { return sin_; }
  /// 0 .. max_len - 1 (U32): the graph-captured decode step masks the keys after its position.
  const Tensor& positions() const { return positions_; }
  /// {-inf, 0} in the model's dtype: the values of that mask.
  const Tensor& mask_fill() const { return mask_fill_; }

 private:
  friend class Llama;
  size_t batch_ = 0, max_len_ = 0, length_ = 0;
  std::vector<Tensor> k_, v_;
  Tensor cos_, sin_;
  Tensor positions_;  // 0..max_len-1, U32: the graph step's mask
  Tensor mask_fill_;  // {-inf, 0} in the model's dtype: the graph step's mask values
};

/// A Llama-family decoder. Copies share the weights. Immutable after load: forward,
/// forward_last and decode_step may run on several threads at once, each with its own KvCache.
class Llama {
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

  const LlamaConfig& config() const;
  Device device() const;
  DType dtype() const;
  /// Bytes of the weights as held (after any fusion at load).
  size_t weight_bytes() const;

  /// A cache for `batch` sequences of up to `max_len` positions, zero-filled.
  KvCache make_cache(size_t batch, size_t max_len) const;

  /// ids (b, s) U32 or I64, placed after cache.length() positions of context. Returns the
  /// logits (b, s, vocab) in the model's dtype, writes keys and values of the s positions into
  /// the cache and advances its length. A whole prompt is one call (prefill).
  Tensor forward(const Tensor& ids, KvCache& cache) const;
  /// As forward, but only the last position's logits: (b, vocab).
  Tensor forward_last(const Tensor& ids, KvCache& cache) const;

  /// One decode step whose position is read from device memory, so that the same work can be
  /// captured once as a CUDA graph and replayed: token (b, 1) U32, position (1) U32 holding
  /// the token's position (< key_window). Attention reads the first `key_window` cache rows
  /// (0: all max_len) with a mask from `position`: a graph captured for a window serves every
  /// position below it, and reads no more of the cache than that. Returns the greedy next token
  /// (b) U32, and the logits (b, vocab) through `logits` when given. Does not change
  /// cache.length() (the host keeps it).
  Tensor decode_step(const Tensor& token, const Tensor& position, KvCache& cache,
                     Tensor* logits = nullptr, size_t key_window = 0) const;

  struct Impl;

 private:
  friend Llama load_gguf_quantized(const std::string& path, const Device& device, DType dtype);
  explicit Llama(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// The byte-level BPE tokenizer stored in a GGUF file's tokenizer.ggml.* metadata.
Tokenizer load_gguf_tokenizer(const std::string& gguf_path);

}  // namespace wick::models
