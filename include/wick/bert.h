#pragma once
// BERT encoders (models::Bert) and sentence embeddings on top of them (SentenceEmbedder), read
// from a Hugging Face / sentence-transformers model folder such as all-MiniLM-L6-v2's.

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/tensor.h"

namespace wick::models {

/// The fields of a BERT config.json that the encoder uses.
struct BertConfig {
  size_t vocab_size = 30522;
  size_t hidden_size = 768;
  size_t num_hidden_layers = 12;
  size_t num_attention_heads = 12;
  size_t intermediate_size = 3072;
  size_t max_position_embeddings = 512;
  size_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;

  /// Reads config.json. Throws FormatError naming the file and the field that is missing, of the
  /// wrong type or inconsistent (hidden_size not a multiple of num_attention_heads, an activation
  /// other than gelu, a position embedding other than absolute).
  static BertConfig from_file(const std::filesystem::path& config_json);
};

/// A BERT encoder: word + position + token-type embeddings and a layer norm, then
/// num_hidden_layers post-norm layers (self-attention, GELU (erf) feed-forward). Copies share the
/// weights; encode() may be called from several threads.
class Bert {
 public:
  /// Loads config.json and the *.safetensors weights of `model_dir` (names with or without a
  /// "bert." prefix), converted to `dtype` (F32, F16 or BF16) on `device`. Throws FormatError for a
  /// missing or malformed folder, naming the file (and the tensor, for a weight of another shape
  /// than config.json implies or of a non-float dtype).
  static Bert load(const std::filesystem::path& model_dir, const Device& device,
                   DType dtype = DType::F32);

  /// As load(model_dir, device, dtype), with the weights of the dense projections (query, key,
  /// value, attention output, intermediate, output) stored in `matmul_dtype` and their products
  /// computed in it. `matmul_dtype` == `dtype` is load(); the other pair accepted is F32 with BF16:
  /// each projection rounds its f32 input to bf16, multiplies exactly and sums in f32, while the
  /// embeddings, norms, attention, GELU and hidden states stay f32 (within a bf16 matmul's bound
  /// of the f32 model). The CPU runs these products on AMX tiles where it has them
  /// (wick-info's "bf16 GEMM" line). UnsupportedDType for any other pair.
  static Bert load(const std::filesystem::path& model_dir, const Device& device, DType dtype,
                   DType matmul_dtype);

  /// Last hidden states (b, s, hidden_size) in the model's dtype. `ids` is (b, s), U32 or I64,
  /// s <= max_position_embeddings; `attention_mask` is (b, s), any dtype, 1 for a token and 0
  /// for padding (padded keys get no attention). Token types are all 0. Inputs on another device
  /// are moved to the model's.
  Tensor encode(const Tensor& ids, const Tensor& attention_mask) const;

  /// Last hidden states (t, hidden_size) of sequences packed without padding: `ids` (t), U32 or
  /// I64, holds them one after another, `lengths` their token counts (each 1 to
  /// max_position_embeddings, summing to t). Each sequence attends to its own tokens only, so its
  /// rows are encode()'s for it alone, within the bounds of the ops (the projections and the
  /// FFN run over the t tokens, no padding). Token types are all 0. ShapeMismatch for other
  /// lengths, UnsupportedDType for other ids.
  Tensor encode_packed(const Tensor& ids, const std::vector<size_t>& lengths) const;

  const BertConfig& config() const;
  Device device() const;
  DType dtype() const;
  /// The dtype of the dense projections' weights and products (load's matmul_dtype).
  DType matmul_dtype() const;

  struct Impl;

 private:
  explicit Bert(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace wick::models

namespace wick {

/// How token embeddings become one sentence embedding (sentence-transformers' Pooling module).
enum class Pooling { Mean, Cls, Max, MeanSqrtLen };

/// Options of SentenceEmbedder::load; the folder's own files decide everything else.
struct SentenceEmbedderOptions {
  /// Compute dtype of the encoder (F32, F16, BF16); embeddings are always returned as F32. BF16 on
  /// the CPU computes the dense projections in bf16 (bf16 weights, f32 sums) and keeps the rest in
  /// f32: Bert::load(dir, device, F32, BF16).
  DType dtype = DType::F32;
  /// Sentences per forward pass (at most).
  size_t batch_size = 32;
  /// Padded tokens per forward pass (at most; a longer sentence still goes alone). 0: 2048 on the
  /// CPU, where passes whose activations stay in cache run faster, no limit on a GPU.
  size_t max_batch_tokens = 0;
  /// Token limit per sentence (longer ones are truncated); 0 takes the folder's
  /// sentence_bert_config.json max_seq_length, else the model's max_position_embeddings.
  size_t max_seq_length = 0;
  /// false: no L2 normalisation even when modules.json lists a Normalize module.
  bool normalize = true;
};

/// Sentence embeddings as sentence-transformers computes them for a Transformer + Pooling
/// (+ Normalize) model folder: tokenize (truncating), encode with BERT, pool with the attention
/// mask, L2-normalise when modules.json lists a Normalize module. Immutable after load: copies
/// share the model, and embed() and tokenize() may be called from several threads at once.
class SentenceEmbedder {
 public:
  /// Reads modules.json (optional: Transformer + mean pooling without it), 1_Pooling/config.json,
  /// sentence_bert_config.json, tokenizer.json and the BERT weights from `model_dir`. Throws
  /// FormatError naming the file for a missing or malformed folder, or an unsupported module.
  static SentenceEmbedder load(const std::filesystem::path& model_dir, const Device& device,
                               const SentenceEmbedderOptions& options = {});

  /// Called after each batch with the number of sentences done and the total.
  using Progress = std::function<void(size_t done, size_t total)>;

  /// Embeddings (texts.size(), dim()) as F32 on the embedder's device, row i for texts[i].
  /// Sentences are sorted by length and batched internally (batch_size() sentences and
  /// max_batch_tokens() padded tokens at most per pass) so that padding stays small.
  /// ShapeMismatch when a text has no tokens at all (a tokenizer without special tokens given
  /// an empty text): BERT has no embedding for an empty sequence.
  Tensor embed(const std::vector<std::string>& texts, const Progress& progress = {}) const;

  /// Token ids of `text` as embed() feeds them to the encoder (special tokens, truncation).
  std::vector<uint32_t> tokenize(const std::string& text) const;

  size_t dim() const;
  size_t max_seq_length() const;
  size_t batch_size() const;
  size_t max_batch_tokens() const;
  Pooling pooling() const;
  bool normalizes() const;
  const models::Bert& bert() const;

  struct Impl;

 private:
  explicit SentenceEmbedder(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace wick
