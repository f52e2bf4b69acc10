#pragma once
// The interface every decoder-only language model implements (Llama, Qwen2, ...), and the loader
// that picks the implementation from a model folder's config.json or a GGUF file's architecture.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/kv_cache.h"
#include "wick/paged_kv_cache.h"
#include "wick/tensor.h"

namespace wick::models {

/// What every causal LM states about itself. Family-specific configurations derive from it.
struct CausalLMConfig {
  std::string architecture;  // as the file names it: config.json model_type or GGUF architecture
  size_t vocab_size = 0;
  size_t hidden_size = 0;
  size_t num_layers = 0;
  size_t num_heads = 0;
  size_t num_kv_heads = 0;
  size_t head_dim = 0;
  size_t max_position = 0;  // the context length the model was trained for
  std::optional<uint32_t> bos_token_id;
  std::vector<uint32_t> eos_token_ids;
};

/// A ragged batch of T new tokens over n sequences in device memory, as forward_paged_tensors
/// reads it (every tensor U32 on the model's device).
struct PagedBatchTensors {
  Tensor ids;         // (T) token ids
  Tensor positions;   // (T) each token's position in its sequence
  Tensor token_seq;   // (T) each token's sequence: its row of page_table
  Tensor slots;       // (T) where its keys and values are written: page * page_size + row
  Tensor page_table;  // (n, width) each sequence's pages
  Tensor last;        // (n) the token of each sequence whose logits are returned (its last)
};

/// A decoder-only language model. Its methods are const and may be called from several threads
/// at once, each with its own KvCache.
class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const CausalLMConfig& config() const = 0;
  virtual Device device() const = 0;
  virtual DType dtype() const = 0;
  /// A cache for `batch` sequences of up to `max_len` positions, zero-filled.
  virtual KvCache make_cache(size_t batch, size_t max_len) const = 0;
  /// ids (b, s) U32 or I64, placed after cache.length() positions of context: the logits
  /// (b, s, vocab) in the model's dtype; writes the keys and values of the s positions into the
  /// cache and advances its length.
  virtual Tensor forward(const Tensor& ids, KvCache& cache) const = 0;
  /// As forward, but only the last position's logits: (b, vocab).
  virtual Tensor forward_last(const Tensor& ids, KvCache& cache) const;
  /// Whether decode_step is implemented (a step whose position lives in device memory, so that
  /// it can be captured once as a CUDA graph and replayed).
  virtual bool has_decode_step() const { return false; }
  /// One decode step: token (b, 1) U32, position (1) U32 on the model's device holding the
  /// token's position; attention reads the first `key_window` cache rows (0: all). Returns the
  /// greedy next token (b) U32 and the logits (b, vocab) through `logits` when given; does not
  /// change cache.length(). Error when has_decode_step() is false.
  virtual Tensor decode_step(const Tensor& token, const Tensor& position, KvCache& cache,
                             Tensor* logits = nullptr, size_t key_window = 0) const;

  /// A paged cache of `pages` pages of `page_size` positions for forward_paged (the serving
  /// engine's pool), zero-filled.
  virtual PagedKvCache make_paged_cache(size_t pages, size_t page_size) const;
  /// One step of a ragged batch over a paged cache: each sequence's new tokens placed after its
  /// cached positions; writes their keys and values into the pages its table names. Returns the
  /// logits (batch.size(), vocab) of each sequence's last new token, as forward_last would give
  /// them (a sequence's row does not depend on the other sequences of the batch where the
  /// family implements it itself). This default runs each sequence alone through a KvCache
  /// gathered from its pages (every family has it); Llama, Qwen2 and the decoder families
  /// (Qwen3, Mistral, Phi-3, Gemma 2 and 3) run the batch as one.
  /// IndexOutOfRange for a page table that does not cover a sequence or names a page outside
  /// the pool; Error for a sequence without new tokens.
  virtual Tensor forward_paged(const std::vector<PagedSequence>& batch, PagedKvCache& cache) const;
  /// Whether forward_paged_tensors is implemented (a paged step whose inputs live in device
  /// memory, so that it can be captured once as a CUDA graph per batch shape and replayed).
  virtual bool has_paged_tensors() const { return false; }
  /// forward_paged over a batch already in device memory (paged_batch_tensors): the logits
  /// (n, vocab) of the tokens `last` names. The values are not read back: the caller checks the
  /// batch (check_paged_batch) before writing it (on the CPU a page outside the pool is still
  /// IndexOutOfRange; on CUDA such a token reads and writes nothing). ShapeMismatch for shapes
  /// that do not agree or a cache not made by make_paged_cache; Error where has_paged_tensors()
  /// is false.
  virtual Tensor forward_paged_tensors(const PagedBatchTensors& batch, PagedKvCache& cache) const;
};

/// The tensors of `batch` on `device` for a pool of pages of `page_size` positions: its tokens in
/// order, each sequence's table padded with page 0 to `width` pages (0: the longest table's).
/// IndexOutOfRange for a table wider than `width`.
PagedBatchTensors paged_batch_tensors(const std::vector<PagedSequence>& batch, size_t page_size,
                                      const Device& device, size_t width = 0);

/// The checks every forward, forward_last and decode_step makes: `ids` is (batch, seq) with
/// seq > 0, u32 or i64, on `device`, and `cache` holds `layers` layers for that batch. `op` names
/// the caller in the messages.
void check_forward_ids(const Tensor& ids, const KvCache& cache, size_t layers, const Device& device,
                       const std::string& op);

/// The checks every forward_paged makes: each sequence has new tokens below `vocab_size`, its
/// table covers its positions (within `max_position` when it is not 0) and names pages of the
/// pool. `op` names the caller in the messages.
void check_paged_batch(const std::vector<PagedSequence>& batch, const PagedKvCache& cache,
                       size_t vocab_size, size_t max_position, const char* op);

/// A folder with config.json (`model_type` among those listed by causal_lm_architectures()) and
/// safetensors, or a `.gguf` file (quantized weights kept quantized). Weights in `dtype` (F32,
/// F16 or BF16) on `device`. An architecture it does not know is a FormatError naming it and
/// listing those it knows.
std::unique_ptr<CausalLM> load_causal_lm(const std::string& path, const Device& device,
                                         DType dtype = DType::F32);

/// The config.json model types load_causal_lm reads.
std::vector<std::string> causal_lm_architectures();

}  // namespace wick::models
