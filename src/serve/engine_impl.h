#pragma once
// The engine's state, shared by engine.cpp (the public calls, the thread, the events) and
// scheduler.cpp (one step: admission, page allocation, the batched forward, sampling).

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "serve/decode_graphs.h"
#include "serve/page_pool.h"
#include "serve/text_stream.h"
#include "wick/generator.h"
#include "wick/paged_kv_cache.h"
#include "wick/serve.h"

namespace wick::serve {

using Clock = std::chrono::steady_clock;

// One request from submit to its final event.
struct Sequence {
  uint64_t id = 0;
  CompletionRequest request;
  std::function<void(const TokenEvent&)> on_event;
  Clock::time_point submitted, admitted, first_token, last_token;
  bool has_first_token = false;
  std::optional<Generator> sampler;  // sample() with the request's temperature, top_p and seed
  std::optional<TextStream> text;
  std::vector<uint32_t> stop_tokens;
  // The prompt then the generated tokens; keys and values of the first kv_len are in `pages`.
  std::vector<uint32_t> tokens;
  size_t kv_len = 0;
  std::vector<uint32_t> pages;
  std::vector<uint64_t> page_hashes;  // the chain hash of each full page published or found
  size_t cached_tokens = 0;           // positions the prefix cache gave at first admission
  bool was_admitted = false;
  uint64_t order = 0;  // admission order: the newest is preempted first
  size_t generated = 0;
  size_t step_tokens = 0;  // tokens this step feeds
  bool cancelled = false;
  FinishReason finish = FinishReason::None;
  std::string error;
};

struct Engine::Impl {
  std::shared_ptr<const models::CausalLM> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  EngineOptions options;
  size_t page_bytes = 0;
  size_t pages_total = 0;
  models::PagedKvCache cache;
  std::unique_ptr<PagePool> pool;        // the engine thread's
  std::unique_ptr<DecodeGraphs> graphs;  // CUDA decode steps; its scratch page is the cache's last
  bool graph_replay = false;             // graphs replayed (options.cuda_graphs, until one fails)

  mutable std::mutex mutex;
  std::condition_variable wake;     // the engine thread: work arrived or stop
  std::condition_variable drained;  // drain(): a request ended
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<uint64_t> cancels;
  size_t running_count = 0;
  size_t live = 0;  // submitted, final event not yet sent
  size_t pages_used = 0;
  bool stopping = false;
  bool draining = false;
  uint64_t next_id = 1;
  uint64_t seed_counter = 0x5eed;
  uint64_t admissions = 0;
  EngineStats totals;

  std::vector<std::unique_ptr<Sequence>> running;  // the engine thread's own
  std::thread thread;

  void loop();
  /// One step over the running sequences; the ended ones are moved to `ended`.
  void step(std::vector<std::unique_ptr<Sequence>>& ended);
  void admit_and_cancel(std::vector<std::unique_ptr<Sequence>>& ended);
  bool admit(Sequence& s);
  void release_pages(Sequence& s);
  void preempt(size_t index);
  bool grow(size_t index, size_t positions);
  /// Greedy decode steps to queue at once (EngineOptions::greedy_lookahead) from `offset`
  /// positions past each running sequence's kv_len (steps queued already), 1 when they cannot be:
  /// a request waits or is cancelled, a sequence samples, prefills, has ended or is at its token
  /// limit or the context, or the pool lacks their pages. The sequences' pages grown for them.
  size_t lookahead(size_t offset);
  /// Queues `steps` greedy steps of `batch` (members' tokens, or after `after`'s: see
  /// DecodeGraphs::queue_greedy) into *queued; false, with the members ended in error, when that
  /// fails eagerly too.
  bool queue_ahead(const std::vector<models::PagedSequence>& batch,
                   const std::vector<Sequence*>& members, size_t steps,
                   const DecodeGraphs::QueuedSteps* after, DecodeGraphs::QueuedSteps* queued);
  /// `steps` greedy steps of `batch` (members' tokens), their tokens taken in order; while the
  /// lookahead allows, the next steps are queued before each window's tokens are read.
  void run_ahead(std::vector<models::PagedSequence> batch, const std::vector<Sequence*>& members,
                 size_t steps);
  void publish_full_pages(Sequence& s);
  void take_token(Sequence& s, uint32_t token);
  void finish_events(std::vector<std::unique_ptr<Sequence>>& ended);
  size_t pages_for(const Sequence& s) const;
};

/// Adds one observation (seconds) to a histogram.
void observe(Histogram& h, double seconds);

inline double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace wick::serve
