// One engine step: cancellations, admission of waiting requests whose pages fit (their prompt's
// full pages found in the prefix cache shared, not prefilled again), pages for each running
// sequence's next tokens (the newest sequences preempted when the pool runs out: their pages
// freed and their tokens prefilled again later), one batched forward over every running
// sequence (a prefill chunk or one decode token each), then sampling and the token events.

#include <algorithm>

#include "serve/engine_impl.h"
#include "util.h"

namespace wick::serve {

void Engine::Impl::release_pages(Sequence& s) {
  // Last page first: the pool hands free pages out last in, first out, so the next sequence's
  // pages come in ascending order (rows the CPU's prefetchers stream), and a prefix's cached
  // pages are evicted from its end, which keeps its start reachable.
  for (auto p = s.pages.rbegin(); p != s.pages.rend(); ++p) pool->release(*p);
  s.pages.clear();
  s.page_hashes.clear();
  s.kv_len = 0;
}

// Takes the prompt's (and, after a preemption, the generated tokens') full pages from the prefix
// cache, then admits the sequence when the pages of the rest of its tokens are free besides one
// page for each running sequence's next token. The last token is always computed (its logits
// pick the next one), so the cache gives at most tokens.size() - 1 positions.
bool Engine::Impl::admit(Sequence& s) {
  const size_t ps = options.page_size;
  const size_t shareable = (s.tokens.size() - 1) / ps;
  uint64_t hash = 0;
  for (size_t i = 0; i < shareable; ++i) {
    hash = PagePool::chain_hash(hash, s.tokens.data() + i * ps, ps);
    std::optional<uint32_t> page = pool->lookup(hash);
    if (!page) break;
    s.pages.push_back(*page);
    s.page_hashes.push_back(hash);
  }
  s.kv_len = s.pages.size() * ps;
  const size_t need = (s.tokens.size() + ps - 1) / ps - s.pages.size();
  if (pool->available() < need + running.size()) {
    release_pages(s);
    return false;
  }
  if (!s.was_admitted) {
    s.was_admitted = true;
    s.admitted = Clock::now();
    s.cached_tokens = s.kv_len;
    std::lock_guard<std::mutex> lock(mutex);
    totals.prompt_tokens += s.request.prompt.size();
    totals.cached_prompt_tokens += s.kv_len;
  }
  s.order = admissions++;
  return true;
}

void Engine::Impl::admit_and_cancel(std::vector<std::unique_ptr<Sequence>>& ended) {
  std::lock_guard<std::mutex> lock(mutex);
  for (uint64_t id : cancels) {
    for (auto& s : running) {
      if (s->id == id) s->cancelled = true;
    }
    auto it = std::find_if(waiting.begin(), waiting.end(), [&](auto& s) { return s->id == id; });
    if (it != waiting.end()) {
      (*it)->finish = FinishReason::Cancelled;
      ended.push_back(std::move(*it));
      waiting.erase(it);
    }
  }
  cancels.clear();
  for (auto& s : running) {
    if (s->cancelled) {
      s->finish = FinishReason::Cancelled;
      ended.push_back(std::move(s));
    }
  }
  std::erase_if(running, [](const auto& s) { return !s; });
  while (!waiting.empty() && running.size() < options.max_batch) {
    Sequence& s = *waiting.front();
    if (s.request.sampling.max_tokens == 0) {
      s.finish = FinishReason::Length;
      ended.push_back(std::move(waiting.front()));
      waiting.pop_front();
      continue;
    }
    // admit() takes the mutex for its counters: step out of it for the call.
    mutex.unlock();
    const bool ok = admit(s);
    mutex.lock();
    if (!ok) break;
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
  }
  running_count = running.size();
}

// Frees running[index]'s pages and puts it first in the queue: its tokens are prefilled again
// when it is admitted again (its full pages probably still in the prefix cache).
void Engine::Impl::preempt(size_t index) {
  std::unique_ptr<Sequence> s = std::move(running[index]);
  running.erase(running.begin() + static_cast<ptrdiff_t>(index));
  release_pages(*s);
  std::lock_guard<std::mutex> lock(mutex);
  ++totals.preemptions;
  waiting.push_front(std::move(s));
  running_count = running.size();
}

// Pages for the first `positions` positions of running[index], preempting the newest other
// sequences when the pool runs out. False when running[index] itself had to be preempted.
bool Engine::Impl::grow(size_t index, size_t positions) {
  const size_t ps = options.page_size;
  while (running[index]->pages.size() * ps < positions) {
    if (std::optional<uint32_t> page = pool->allocate()) {
      running[index]->pages.push_back(*page);
      continue;
    }
    size_t victim = index;
    for (size_t i = index + 1; i < running.size(); ++i) {
      if (running[i]->order > running[victim]->order) victim = i;
    }
    preempt(victim);
    if (victim == index) return false;
  }
  return true;
}

// Publishes the pages the last step filled to the prefix cache.
void Engine::Impl::publish_full_pages(Sequence& s) {
  const size_t ps = options.page_size;
  while (s.page_hashes.size() < s.kv_len / ps) {
    const size_t i = s.page_hashes.size();
    const uint64_t prev = i == 0 ? 0 : s.page_hashes.back();
    const uint64_t hash = PagePool::chain_hash(prev, s.tokens.data() + i * ps, ps);
    pool->publish(s.pages[i], hash);
    s.page_hashes.push_back(hash);
  }
}

// A new token of `s`: the stop checks, its event (none for a stop token), the latencies.
void Engine::Impl::take_token(Sequence& s, uint32_t token) {
  const Clock::time_point now = Clock::now();
  const SamplingParams& p = s.request.sampling;
  s.tokens.push_back(token);
  ++s.generated;
  std::string text;
  if (std::find(s.stop_tokens.begin(), s.stop_tokens.end(), token) != s.stop_tokens.end()) {
    s.finish = FinishReason::Stop;
  } else {
    text = s.text->push(token);
    if (s.text->stopped()) s.finish = FinishReason::Stop;
  }
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!s.has_first_token) {
      observe(totals.time_to_first_token, seconds_between(s.submitted, now));
    } else {
      observe(totals.inter_token_latency, seconds_between(s.last_token, now));
    }
    ++totals.generated_tokens;
  }
  if (!s.has_first_token) s.first_token = now;
  s.has_first_token = true;
  s.last_token = now;
  if (s.finish == FinishReason::None) {
    // The next step would write the keys of position tokens.size() - 1.
    const size_t context = model->config().max_position;
    if (s.generated >= p.max_tokens || (context > 0 && s.tokens.size() > context)) {
      s.finish = FinishReason::Length;
    }
  }
  if (s.finish == FinishReason::Stop && !s.text->stopped()) return;  // a stop token: no event
  TokenEvent e;
  e.token = token;
  e.text = std::move(text);
  s.on_event(e);
}

size_t Engine::Impl::lookahead(size_t offset) {
  if (!graphs || options.greedy_lookahead <= 1 || running.empty()) return 1;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!waiting.empty() || !cancels.empty()) return 1;  // they are served at the next step
  }
  // Every sequence decoding greedily, no further than its token limit and the model's context.
  const size_t context = model->config().max_position;
  size_t steps = options.greedy_lookahead;
  for (const auto& s : running) {
    if (s->finish != FinishReason::None || s->step_tokens != 1 ||
        s->tokens.size() - s->kv_len != 1 || s->request.sampling.temperature != 0 ||
        s->generated + offset >= s->request.sampling.max_tokens ||
        (context > 0 && s->kv_len + offset >= context)) {
      return 1;
    }
    steps = std::min(steps, s->request.sampling.max_tokens - s->generated - offset);
    if (context > 0) steps = std::min(steps, context - s->kv_len - offset);
  }
  if (steps <= 1) return 1;
  // The pages of the steps ahead, when the pool has them all (no preemption for them).
  const size_t ps = options.page_size;
  size_t need = 0;
  for (const auto& s : running) {
    const size_t pages = (s->kv_len + offset + steps + ps - 1) / ps;
    need += pages > s->pages.size() ? pages - s->pages.size() : 0;
  }
  if (need > pool->available()) return 1;
  for (size_t i = 0; i < running.size(); ++i) grow(i, running[i]->kv_len + offset + steps);
  return steps;
}

bool Engine::Impl::queue_ahead(const std::vector<models::PagedSequence>& batch,
                               const std::vector<Sequence*>& members, size_t steps,
                               const DecodeGraphs::QueuedSteps* after,
                               DecodeGraphs::QueuedSteps* queued) {
  try {
    *queued = graphs->queue_greedy(batch, steps, graph_replay, after);
    std::lock_guard<std::mutex> lock(mutex);
    if (graph_replay) totals.graph_steps += steps;
    totals.steps_ahead += steps - (after == nullptr ? 1 : 0);
    return true;
  } catch (const std::exception& e) {
    if (graph_replay) {
      // As a step that cannot be captured: op by op from now on (the steps run again).
      graph_replay = false;
      return queue_ahead(batch, members, steps, after, queued);
    }
    for (Sequence* s : members) {
      s->finish = FinishReason::Error;
      s->error = e.what();
    }
    return false;
  }
}

void Engine::Impl::run_ahead(std::vector<models::PagedSequence> batch,
                             const std::vector<Sequence*>& members, size_t steps) {
  DecodeGraphs::QueuedSteps window;
  if (!queue_ahead(batch, members, steps, nullptr, &window)) return;
  while (true) {
    // The next steps, fed on the device by this window's last tokens, are queued before this
    // window's tokens are read: the GPU runs them while the host takes these. When a sequence
    // ends in this window, the next one's steps for it are wasted (its tokens dropped).
    DecodeGraphs::QueuedSteps next;
    const size_t more = lookahead(window.steps);
    bool queued_next = false;
    if (more > 1) {
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i].cached += window.steps;
        batch[i].pages = members[i]->pages;
      }
      queued_next = queue_ahead(batch, members, more, &window, &next);
    }
    std::vector<uint32_t> tokens;
    try {
      tokens = DecodeGraphs::read_greedy(window);
    } catch (const std::exception& e) {
      for (Sequence* s : members) {
        s->finish = FinishReason::Error;
        s->error = e.what();
      }
      return;
    }
    // Step j fed each sequence's token at position kv_len + j; a sequence that ends drops the
    // rest.
    const size_t n = members.size();
    for (size_t j = 0; j < window.steps; ++j) {
      for (size_t i = 0; i < n; ++i) {
        Sequence& s = *members[i];
        if (s.finish != FinishReason::None) continue;
        s.kv_len += 1;
        publish_full_pages(s);
        try {
          take_token(s, tokens[j * n + i]);
        } catch (const std::exception& e) {
          s.finish = FinishReason::Error;
          s.error = e.what();
        }
      }
    }
    if (!queued_next) return;
    window = std::move(next);
  }
}

void Engine::Impl::step(std::vector<std::unique_ptr<Sequence>>& ended) {
  admit_and_cancel(ended);
  // Each running sequence's tokens of this step: its last token (decoding), or a prefill chunk
  // of up to prefill_chunk tokens while the step's budget of max_step_tokens lasts (decode
  // tokens first). grow() preempts only sequences after the one it serves, so the pages of those
  // before stay.
  size_t decoders = 0;
  for (auto& s : running) decoders += s->tokens.size() - s->kv_len == 1;
  size_t budget = options.max_step_tokens == 0         ? SIZE_MAX
                  : options.max_step_tokens > decoders ? options.max_step_tokens - decoders
                                                       : 0;
  for (auto& s : running) {
    const size_t left = s->tokens.size() - s->kv_len;
    s->step_tokens = left == 1 ? 1 : std::min({options.prefill_chunk, left, budget});
    if (left > 1) budget -= s->step_tokens;
  }
  for (size_t i = 0; i < running.size();) {
    if (grow(i, running[i]->kv_len + running[i]->step_tokens)) ++i;
  }
  const size_t ahead = lookahead(0);
  std::vector<models::PagedSequence> batch;
  std::vector<Sequence*> members;
  for (auto& sp : running) {
    Sequence& s = *sp;
    if (s.step_tokens == 0) continue;
    const auto from = s.tokens.begin() + static_cast<ptrdiff_t>(s.kv_len);
    batch.push_back({std::vector<uint32_t>(from, from + static_cast<ptrdiff_t>(s.step_tokens)),
                     s.kv_len, s.pages});
    members.push_back(&s);
  }
  if (ahead > 1) {
    run_ahead(batch, members, ahead);
  } else if (!batch.empty()) {
    Tensor logits;
    try {
      if (graph_replay && graphs->fits(batch)) {
        try {
          logits = graphs->run(batch, true);
          std::lock_guard<std::mutex> lock(mutex);
          ++totals.graph_steps;
        } catch (const std::exception&) {
          // A step that cannot be captured runs op by op, now and from now on (graph_steps stays
          // where it is); a replay's slots are written again with the same keys and values.
          graph_replay = false;
        }
      }
      if (!logits.defined()) logits = model->forward_paged(batch, cache);
    } catch (const std::exception& e) {
      for (Sequence* s : members) {
        s->finish = FinishReason::Error;
        s->error = e.what();
      }
    }
    if (logits.defined()) {
      // On the CPU every row goes to sample() (which also checks the logits are finite). On a GPU
      // the greedy rows' argmax is taken there, in the model's dtype, and only the sampled rows
      // are copied back (as the Generator does).
      const size_t vocab = logits.dims()[1];
      const bool on_host = logits.device().is_cpu();
      std::vector<float> all;
      std::vector<uint32_t> greedy;
      if (on_host) {
        all = logits.to_dtype(DType::F32).flatten_all().to_vec1<float>();
      } else {
        greedy = logits.argmax(1).to_vec1<uint32_t>();
      }
      for (size_t i = 0; i < members.size(); ++i) {
        Sequence& s = *members[i];
        s.kv_len += batch[i].tokens.size();
        publish_full_pages(s);
        if (s.kv_len < s.tokens.size()) continue;  // a prefill chunk short of the prompt's end
        try {
          if (!on_host && s.request.sampling.temperature == 0) {
            take_token(s, greedy[i]);
            continue;
          }
          std::vector<float> row =
              on_host ? std::vector<float>(all.begin() + static_cast<ptrdiff_t>(i * vocab),
                                           all.begin() + static_cast<ptrdiff_t>((i + 1) * vocab))
                      : logits.get(i).to_dtype(DType::F32).to_vec1<float>();
          take_token(s, s.sampler->sample(row));
        } catch (const std::exception& e) {
          s.finish = FinishReason::Error;
          s.error = e.what();
        }
      }
    }
  }
  for (auto& s : running) {
    if (s->finish != FinishReason::None) ended.push_back(std::move(s));
  }
  std::erase_if(running, [](const auto& s) { return !s; });
}

}  // namespace wick::serve
