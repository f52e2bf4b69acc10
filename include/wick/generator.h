#pragma once
// Text generation with any causal language model (wick/causal_lm.h): prefill of the prompt in one
// forward, then one token per step with a preallocated KV cache. On CUDA, for a model with a
// device-side decode step, that step (all layers and the argmax) is captured once as a CUDA graph
// and replayed per token.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  /// Penalties on the tokens of the last `repeat_last_n` positions (prompt and new tokens; 0: all
  /// of them), applied to the logits before temperature, greedy included. repeat_penalty > 1
  /// divides a positive logit and multiplies a negative one, once per distinct token (1: off).
  double repeat_penalty = 1.0;
  size_t repeat_last_n = 64;
  /// Subtracted once from the logit of every token in the window (0: off).
  double presence_penalty = 0.0;
  /// Subtracted from a token's logit once per occurrence in the window (0: off).
  double frequency_penalty = 0.0;
  /// Sampling keeps only the tokens whose probability is at least min_p times the most likely
  /// one's (0: off), after top-k and before top-p.
  double min_p = 0.0;
  /// Generation ends when the decoded new text contains one of these (a token's text may hold
  /// it and more); the tokens holding any byte of it are dropped from the result (on_token has
  /// seen them). Needs `token_text`.
  std::vector<std::string> stop_strings;
  /// A token's text (bytes, "" for special tokens): what stop_strings are matched against.
  std::function<std::string(uint32_t token)> token_text;
  /// When set, a prompt of more than prefill_chunk ids is prefilled in chunks of that many, and
  /// this is called after each with the ids done and the total (progress of a long prefill).
  std::function<void(size_t done, size_t total)> on_prefill;
  size_t prefill_chunk = 512;
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

/// A Generator serves one thread at a time: generate() and sample() change its random state, its
/// stats and (CUDA) its captured graphs. Use one Generator per thread.
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
  /// Continues the sequence of the last generate() or continue_generation() call (a chat's next
  /// turn): `ids` follow what that call was given and produced, whose keys and values stay in the
  /// KV cache, so only `ids` (and the last new token) are prefilled. The whole conversation must
  /// fit the cache the first call made: set GenerateOptions::max_len for it (Error naming the
  /// lengths otherwise; Error too without an earlier call, or after one that failed).
  std::vector<uint32_t> continue_generation(const std::vector<uint32_t>& ids,
                                            const TokenCallback& on_token = {});
  /// The ids of the sequence so far: prompts and new ids of the calls since the last generate().
  const std::vector<uint32_t>& history() const { return history_; }
  const GenerateStats& stats() const { return stats_; }
  const GenerateOptions& options() const { return options_; }

  /// Picks the next token from `logits` (vocab f32 values) with the options' penalties (over
  /// `history`, the sequence so far), temperature, top-k, min-p and top-p, using this generator's
  /// random state. Temperature 0 is greedy: the largest penalised logit, the lowest id among
  /// equals. A NaN or +inf logit, no finite logit, or a temperature so small that a scaled logit
  /// overflows is an Error naming the token.
  uint32_t sample(const std::vector<float>& logits, const std::vector<uint32_t>& history = {});

 private:
  struct DecodeGraph;
  std::shared_ptr<const models::CausalLM> model_;
  GenerateOptions options_;
  GenerateStats stats_;
  uint64_t rng_state_;
  std::unique_ptr<DecodeGraph> graph_;
  models::KvCache cache_;          // the cache of the calls without a graph
  std::vector<uint32_t> history_;  // the sequence whose keys and values the cache holds, but
                                   // the last id's
  std::vector<uint32_t> run(const std::vector<uint32_t>& ids, bool resume,
                            const TokenCallback& on_token);
};

}  // namespace wick
