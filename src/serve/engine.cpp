// The engine thread: admits waiting requests, runs one step over every running one (a prefill
// chunk or a decode token each), samples per request and sends the events.

#include <algorithm>
#include <cmath>

#include "serve/engine_impl.h"
#include "util.h"
#include "wick/serve.h"

namespace wick::serve {

size_t preferred_page_size(const Device& device) {
  return device.is_cpu() ? 64 : 16;
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::None:
      return "";
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Cancelled:
      return "cancelled";
    case FinishReason::Error:
      return "error";
  }
  return "";
}

namespace {

// Bucket bounds (seconds) of the latency histograms.
Histogram make_histogram(std::vector<double> bounds) {
  Histogram h;
  h.cumulative.assign(bounds.size(), 0);
  h.bounds = std::move(bounds);
  return h;
}

// splitmix64 over the engine's counter: the seed of a request that names none.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

void observe(Histogram& h, double seconds) {
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    if (seconds <= h.bounds[i]) ++h.cumulative[i];
  }
  ++h.count;
  h.sum += seconds;
}

Engine::Engine(std::shared_ptr<const models::CausalLM> model,
               std::shared_ptr<const Tokenizer> tokenizer, EngineOptions options)
    : impl_(std::make_unique<Impl>()) {
  if (!model) throw Error("serve::Engine: no model");
  if (options.page_size == 0 || options.max_batch == 0 || options.prefill_chunk == 0) {
    throw Error(str("serve::Engine: page_size ", options.page_size, ", max_batch ",
                    options.max_batch, " and prefill_chunk ", options.prefill_chunk,
                    " must be positive"));
  }
  Impl& m = *impl_;
  m.model = std::move(model);
  m.tokenizer = std::move(tokenizer);
  m.options = options;
  const models::CausalLMConfig& c = m.model->config();
  m.page_bytes = models::paged_page_bytes(c.num_layers, options.page_size, c.num_kv_heads,
                                          c.head_dim, m.model->dtype());
  if (m.options.kv_memory == 0) {
    // Room for max_batch sequences of 256 positions, or one of 4096 (the context when shorter),
    // whichever is more: a long-context model does not reserve its whole context by default.
    const size_t one = c.max_position > 0 ? std::min<size_t>(c.max_position, 4096) : 4096;
    const size_t positions = std::max(one, options.max_batch * 256);
    m.options.kv_memory = (positions + options.page_size - 1) / options.page_size * m.page_bytes;
  }
  m.pages_total = m.options.kv_memory / m.page_bytes;
  if (m.pages_total == 0) {
    throw Error(str("serve::Engine: kv_memory ", m.options.kv_memory, " bytes hold no page of ",
                    m.page_bytes, " bytes"));
  }
  // Decode steps through DecodeGraphs (replayed, or queued ahead) pad their batch with rows that
  // write to a scratch page past the pool's.
  const bool graphs = m.model->device().is_cuda() && m.model->has_paged_tensors();
  m.cache = m.model->make_paged_cache(m.pages_total + (graphs ? 1 : 0), options.page_size);
  m.pool = std::make_unique<PagePool>(m.pages_total, options.prefix_caching);
  if (graphs) {
    m.graphs = std::make_unique<DecodeGraphs>(
        m.model, m.cache, static_cast<uint32_t>(m.pages_total), options.max_batch);
    m.graph_replay = options.cuda_graphs;
  }
  m.totals.time_to_first_token =
      make_histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  m.totals.inter_token_latency =
      make_histogram({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5});
  m.thread = std::thread([this] { impl_->loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

const models::CausalLM& Engine::model() const {
  return *impl_->model;
}

const EngineOptions& Engine::options() const {
  return impl_->options;
}

uint64_t Engine::submit(CompletionRequest request,
                        std::function<void(const TokenEvent&)> on_event) {
  Impl& m = *impl_;
  const models::CausalLMConfig& c = m.model->config();
  const SamplingParams& p = request.sampling;
  if (request.prompt.empty()) throw Error("serve::Engine::submit: empty prompt");
  if (c.max_position > 0 && request.prompt.size() > c.max_position) {
    throw Error(str("serve::Engine::submit: a prompt of ", request.prompt.size(),
                    " tokens is longer than the model's context of ", c.max_position,
                    " positions"));
  }
  for (uint32_t t : request.prompt) {
    if (t >= c.vocab_size) {
      throw IndexOutOfRange(str("serve::Engine::submit: token id ", t,
                                " is outside the vocabulary of ", c.vocab_size));
    }
  }
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature)) {
    throw Error(
        str("serve::Engine::submit: temperature must be finite and >= 0, got ", p.temperature));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    throw Error(str("serve::Engine::submit: top_p must be in (0, 1], got ", p.top_p));
  }
  if (!m.tokenizer &&
      std::any_of(p.stop.begin(), p.stop.end(), [](const std::string& s) { return !s.empty(); })) {
    throw Error("serve::Engine::submit: stop strings need the engine's tokenizer");
  }
  if (!on_event) throw Error("serve::Engine::submit: no event callback");

  auto s = std::make_unique<Sequence>();
  s->request = std::move(request);
  s->on_event = std::move(on_event);
  s->submitted = Clock::now();
  s->stop_tokens =
      s->request.sampling.stop_tokens.empty() ? c.eos_token_ids : s->request.sampling.stop_tokens;
  const size_t need = m.pages_for(*s);
  if (need > m.pages_total) {
    throw Error(str("serve::Engine::submit: a prompt of ", s->request.prompt.size(),
                    " tokens with max_tokens ", s->request.sampling.max_tokens, " needs ", need,
                    " KV pages; the pool holds ", m.pages_total, " (kv_memory)"));
  }
  std::lock_guard<std::mutex> lock(m.mutex);
  if (m.draining || m.stopping) throw Error("serve::Engine::submit: the engine is draining");
  if (m.waiting.size() >= m.options.max_queue) {
    throw QueueFull(str("serve::Engine::submit: ", m.waiting.size(),
                        " requests are waiting (max_queue ", m.options.max_queue, ")"));
  }
  s->id = m.next_id++;
  GenerateOptions g;
  g.temperature = s->request.sampling.temperature;
  g.top_p = s->request.sampling.top_p;
  g.seed = s->request.sampling.seed ? *s->request.sampling.seed : mix(m.seed_counter++);
  s->sampler.emplace(m.model, g);
  s->text.emplace(m.tokenizer.get(), s->request.sampling.stop);
  s->tokens = s->request.prompt;
  const uint64_t id = s->id;
  m.waiting.push_back(std::move(s));
  ++m.live;
  m.wake.notify_all();
  return id;
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->cancels.push_back(id);
  }
  impl_->wake.notify_all();
}

void Engine::drain() {
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->draining = true;
  impl_->drained.wait(lock, [&] { return impl_->live == 0; });
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  EngineStats s = impl_->totals;
  s.waiting = impl_->waiting.size();
  s.running = impl_->running_count;
  s.kv_pages_used = impl_->pages_used;
  s.kv_pages_total = impl_->pages_total;
  s.kv_page_size = impl_->options.page_size;
  return s;
}

// Pages for the prompt and max_tokens new tokens (the last new token's keys are never written),
// within the model's context.
size_t Engine::Impl::pages_for(const Sequence& s) const {
  size_t positions =
      s.request.prompt.size() + std::max<size_t>(s.request.sampling.max_tokens, 1) - 1;
  const size_t context = model->config().max_position;
  if (context > 0) positions = std::min(positions, context);
  return (positions + options.page_size - 1) / options.page_size;
}

void Engine::Impl::loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      wake.wait(lock, [&] {
        return stopping || !waiting.empty() || !cancels.empty() || !running.empty();
      });
      if (stopping) break;
    }
    std::vector<std::unique_ptr<Sequence>> ended;
    step(ended);
    finish_events(ended);
  }
  // Stopping: every request not ended gets its final Cancelled event.
  std::vector<std::unique_ptr<Sequence>> ended;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& s : waiting) ended.push_back(std::move(s));
    waiting.clear();
  }
  for (auto& s : running) ended.push_back(std::move(s));
  running.clear();
  for (auto& s : ended) s->finish = FinishReason::Cancelled;
  finish_events(ended);
}

void Engine::Impl::finish_events(std::vector<std::unique_ptr<Sequence>>& ended) {
  const Clock::time_point now = Clock::now();
  // The counters first: a caller that sees a final event sees the pages freed and the request
  // counted.
  for (auto& s : ended) release_pages(*s);
  {
    std::lock_guard<std::mutex> lock(mutex);
    totals.requests_done += ended.size();
    running_count = running.size();
    pages_used = pool->used();
  }
  for (auto& s : ended) {
    TokenEvent e;
    e.finish = s->finish;
    e.error = s->error;
    if (s->finish == FinishReason::Length ||
        (s->finish == FinishReason::Stop && !s->text->stopped())) {
      e.text = s->text->finish();
    }
    e.prompt_tokens = s->request.prompt.size();
    e.cached_tokens = s->cached_tokens;
    e.completion_tokens = s->generated;
    e.queue_seconds = seconds_between(s->submitted, s->was_admitted ? s->admitted : now);
    e.first_token_seconds = s->has_first_token ? seconds_between(s->submitted, s->first_token) : 0;
    e.total_seconds = seconds_between(s->submitted, now);
    try {
      s->on_event(e);
    } catch (...) {
      // A callback that throws ends nothing else.
    }
    std::lock_guard<std::mutex> lock(mutex);
    --live;
  }
  drained.notify_all();
}

}  // namespace wick::serve
