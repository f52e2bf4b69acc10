#pragma once
// The serving engine: many concurrent completion requests over one causal LM, decoded together
// (continuous batching) by one engine thread over a paged KV cache. The HTTP layer (wick-serve)
// tokenizes, applies chat templates and streams the events this engine produces.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "wick/causal_lm.h"
#include "wick/error.h"
#include "wick/tokenizer.h"

namespace wick::serve {

struct SamplingParams {
  double temperature = 1.0;       // 0: greedy (the largest logit, the lowest id among equals)
  double top_p = 1.0;             // in (0, 1]
  std::optional<uint64_t> seed;   // none: a per-request seed from the engine's counter
  std::vector<std::string> stop;  // stop strings (not included in the output)
  size_t max_tokens = 256;        // new tokens at most (0: the request ends at once, Length)
  /// Token ids that end the request (not included in the output). Empty: the model's eos ids.
  std::vector<uint32_t> stop_tokens;
};

struct CompletionRequest {
  std::vector<uint32_t> prompt;  // token ids (the HTTP layer tokenizes and applies chat templates)
  SamplingParams sampling;
};

enum class FinishReason { None, Stop, Length, Cancelled, Error };

/// "stop", "length", "cancelled", "error" ("" for None): OpenAI's finish_reason words.
const char* finish_reason_name(FinishReason reason);

/// The engine's events of one request: one per generated token (finish == None), then a final
/// one (finish != None, token 0) carrying any text held back and the request's counts.
/// Concatenating the `text` of all events gives the completion: UTF-8 characters whole, stop
/// strings and stop tokens left out (text that may begin a stop string is held back until it
/// cannot, so a streamed stop string never appears).
struct TokenEvent {
  uint32_t token = 0;
  std::string text;                          // new text this event completes (may be "")
  FinishReason finish = FinishReason::None;  // set on the last event of the request
  std::string error;                         // when finish == Error
  // On the final event:
  size_t prompt_tokens = 0;        // the prompt's length
  size_t cached_tokens = 0;        // prompt tokens whose keys and values came from the prefix cache
  size_t completion_tokens = 0;    // tokens generated (a stop token included)
  double queue_seconds = 0;        // submit to admission
  double first_token_seconds = 0;  // submit to the first token (0: none)
  double total_seconds = 0;        // submit to the end
};

struct EngineOptions {
  // Bytes for the paged KV pool (0: room for max(256 x max_batch, min(context, 4096)) positions).
  size_t kv_memory = 0;
  size_t page_size = 16;       // positions per page (preferred_page_size: the device's choice)
  size_t max_batch = 64;       // sequences decoded per step
  size_t max_queue = 256;      // waiting requests beyond which submit throws QueueFull
  size_t prefill_chunk = 256;  // prompt tokens per step and sequence
  /// Tokens per step over all sequences (decode tokens first, then prefill chunks; 0: no limit):
  /// bounds a step's time, so that long prompts arriving do not stall running streams.
  size_t max_step_tokens = 2048;
  bool prefix_caching = true;
  /// On a CUDA device, steps where every sequence decodes one token replay a CUDA graph captured
  /// once per batch-size bucket (1, 2, 4, ... up to max_batch's) instead of launching each op;
  /// prefill steps run eagerly. The model must implement CausalLM::forward_paged_tensors; no
  /// other thread may use the device while a graph is first captured; should a capture fail, the
  /// engine runs every later step op by op. No effect on the CPU. Off by default, since a
  /// capture records whatever any thread enqueues on the device meanwhile (another model served
  /// from the same GPU, say): turn it on where the engine has the device to itself.
  bool cuda_graphs = false;
  /// On a CUDA device, while every running sequence decodes greedily (temperature 0) and no
  /// request waits, up to this many decode steps are queued at once, each fed the token of the
  /// step before on the device, and their tokens read back together: the GPU does not wait for
  /// the host between them. Tokens then reach clients in groups of up to this many; a stop ends
  /// its sequence at its token (the steps past it are discarded). 0 or 1: a round trip every
  /// step.
  /// No effect on the CPU.
  size_t greedy_lookahead = 8;
};

/// The page size the engine runs fastest with on `device`: 64 positions on the CPU, whose
/// attention streams a sequence's rows page by page (longer contiguous runs), 16 on CUDA (one
/// tensor-core tile of keys, the finest sharing of prefixes).
size_t preferred_page_size(const Device& device);

/// A latency histogram in Prometheus' shape: `cumulative[i]` counts the observations <= bounds[i]
/// (seconds, ascending); `count` all of them (the +Inf bucket), `sum` their total in seconds.
struct Histogram {
  std::vector<double> bounds;
  std::vector<uint64_t> cumulative;
  uint64_t count = 0;
  double sum = 0;
};

struct EngineStats {
  size_t waiting = 0;  // queued, not yet admitted
  size_t running = 0;  // admitted (prefilling or decoding)
  size_t kv_pages_used = 0;
  size_t kv_pages_total = 0;
  size_t kv_page_size = 0;     // positions per page
  uint64_t requests_done = 0;  // ended, for any reason
  uint64_t prompt_tokens = 0;
  uint64_t cached_prompt_tokens = 0;  // prompt tokens served by the prefix cache
  uint64_t generated_tokens = 0;
  uint64_t preemptions = 0;  // running sequences whose pages were taken back (prefilled again)
  uint64_t graph_steps = 0;  // steps replayed as CUDA graphs (EngineOptions::cuda_graphs)
  uint64_t steps_ahead = 0;  // steps queued behind another without a read-back (greedy_lookahead)
  Histogram time_to_first_token;  // submit to first token, per request
  Histogram inter_token_latency;  // between consecutive tokens of a request
};

/// Thrown by submit when max_queue requests wait already (the HTTP layer answers 429).
class QueueFull : public Error {
 public:
  using Error::Error;
};

class Engine {
 public:
  /// Allocates the page pool and starts the engine thread. Error for a null model, a zero
  /// page_size, max_batch or prefill_chunk, or a kv_memory that holds no page.
  Engine(std::shared_ptr<const models::CausalLM> model, std::shared_ptr<const Tokenizer> tokenizer,
         EngineOptions options = {});
  /// Finishes nothing: every request not ended gets its final Cancelled event; joins the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request; `on_event` is called from the engine's thread, in order, ending with an
  /// event whose finish != None (it must not block for long: it holds up every request). Returns
  /// the request id. Throws QueueFull; Error for an empty prompt, a prompt longer than the model's
  /// context (the message naming both lengths), a prompt + max_tokens needing more pages than the
  /// pool holds, bad sampling parameters, stop strings without a tokenizer, or after drain();
  /// IndexOutOfRange for an id outside the vocabulary.
  uint64_t submit(CompletionRequest request, std::function<void(const TokenEvent&)> on_event);
  /// Ends a request (waiting or running) at the next step: its pages are freed and its final
  /// event is Cancelled. Unknown or ended ids are ignored.
  void cancel(uint64_t id);
  /// Stops taking requests (submit throws Error) and returns when every request has ended.
  void drain();
  EngineStats stats() const;
  const models::CausalLM& model() const;
  const EngineOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wick::serve
