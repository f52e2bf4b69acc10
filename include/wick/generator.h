#pragma once
// Text generation with any causal language model (wick/causal_lm.h): prefill of the prompt in one
// forward, then one token per step with a preallocated KV cache. On CUDA, for a model with a
// device-side decode step, that step (all layers and the argmax) is captured once as a CUDA graph
// and replayed per token.

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "wick/causal_lm.h"
#include "wick/llama.h"

namespace wick {

struct GenerateOptions {
  size_t max_new_tokens = 64;
  /// 0: greedy (argmax). Otherwise logits are divided by it before sampling.
  double temperature = 0.0;
  /// Keep only the k most likely tokens (0: all).
  size_t top_k = 0;
  /// Keep the smallest set of most likely tokens whose probability reaches p (1: all).
  double top_p = 1.0;
  uint64_t seed = 299792458;
  /// Generation ends after any of these (it is included in the result). Empty: the model's eos.
  std::vector<uint32_t> stop_tokens;
  /// KV-cache length; 0: prompt length + max_new_tokens.
  size_t max_len = 0;
  /// CUDA: replay the decode step as one captured CUDA graph (WICK_DECODE_GRAPH=0 turns it off).
  bool cuda_graph = true;
};

/// Timings of the last generate() call.
struct GenerateStats {
  size_t prompt_tokens = 0;
  size_t new_tokens = 0;
  double prompt_seconds = 0;  // prefill, up to the first new token known on the host
  double decode_seconds = 0;  // the remaining new tokens
  size_t kv_cache_bytes = 0;
  bool used_cuda_graph = false;
  size_t graph_nodes = 0;  // kernel and copy nodes of the last decode graph replayed
  double prompt_tokens_per_second() const {
    return prompt_seconds > 0 ? static_cast<double>(prompt_tokens) / prompt_seconds : 0;
  }
  /// Tokens after the first, per second of decode.
  double decode_tokens_per_second() const {
    return decode_seconds > 0 && new_tokens > 1
               ? static_cast<double>(new_tokens - 1) / decode_seconds
               : 0;
  }
};

class Generator {
 public:
  /// Called with each new token as soon as it is known; return false to stop.
  using TokenCallback = std::function<bool(uint32_t token)>;

  /// A generator over `model`, which it keeps alive.
  Generator(std::shared_ptr<const models::CausalLM> model, GenerateOptions options = {});
  /// A generator over `model`, which must outlive it.
  Generator(const models::CausalLM& model, GenerateOptions options = {});
  /// A generator over a copy of `model` (copies share the weights).
  Generator(models::Llama model, GenerateOptions options = {});
  ~Generator();
  Generator(Generator&&) noexcept;
  Generator& operator=(Generator&&) noexcept;

  /// The new ids after `prompt_ids` (batch 1), stop token included when one was met.
  std::vector<uint32_t> generate(const std::vector<uint32_t>& prompt_ids,
                                 const TokenCallback& on_token = {});
  const GenerateStats& stats() const { return stats_; }
  const GenerateOptions& options() const { return options_; }

  /// Picks the next token from `logits` (vocab floats) with the options' temperature, top-k and
  /// top-p, using this generator's random state (greedy when temperature is 0).
  uint32_t sample(const std::vector<float>& logits);

 private:
  struct DecodeGraph;
  std::shared_ptr<const models::CausalLM> model_;
  GenerateOptions options_;
  GenerateStats stats_;
  uint64_t rng_state_;
  std::unique_ptr<DecodeGraph> graph_;
};

}  // namespace wick
