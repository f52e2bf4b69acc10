// serve::Engine: requests decoded together give what each gives alone through Generator; the
// engine's limits (max_tokens, stop strings, the queue, cancellation, drain) and its errors.

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "wick/generator.h"
#include "wick/serve.h"
#include "wick/wick.h"

namespace {

using wick::Device;
using wick::Error;
using wick::models::CausalLM;
namespace serve = wick::serve;

std::shared_ptr<const CausalLM> tiny_llama() {
  static const std::shared_ptr<const CausalLM> model = wick::models::load_causal_lm(
      std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama", Device::cpu());
  return model;
}

// What one request produced: the tokens of its events, their text, and the final event.
struct Result {
  std::vector<uint32_t> tokens;
  std::string text;
  serve::TokenEvent last;
};

// Collects a request's events; wait() returns them once the final one came.
class Collector {
 public:
  std::function<void(const serve::TokenEvent&)> callback() {
    return [this](const serve::TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      EXPECT_FALSE(done_) << "an event after the final one";
      if (e.finish == serve::FinishReason::None) {
        result_.tokens.push_back(e.token);
      } else {
        result_.last = e;
        done_ = true;
        cv_.notify_all();
      }
      result_.text += e.text;
    };
  }
  Result wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    return result_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  Result result_;
};

serve::CompletionRequest greedy_request(std::vector<uint32_t> prompt, size_t max_tokens) {
  serve::CompletionRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.stop_tokens = {9999};  // no stop token: every request runs to max_tokens
  return r;
}

// Distinct prompts of different lengths over the tiny model's vocabulary (96 ids).
std::vector<uint32_t> prompt_of(size_t i) {
  std::vector<uint32_t> p;
  for (size_t j = 0; j < 3 + (i * 5) % 17; ++j)
    p.push_back(static_cast<uint32_t>((i * 31 + j * 7 + 3) % 96));
  return p;
}

std::vector<uint32_t> generate_alone(const std::shared_ptr<const CausalLM>& model,
                                     const std::vector<uint32_t>& prompt, size_t max_new) {
  wick::GenerateOptions o;
  o.max_new_tokens = max_new;
  o.stop_tokens = {9999};
  wick::Generator g(model, o);
  return g.generate(prompt);
}

TEST(ServeEngine, ConcurrentGreedyRequestsEachGiveWhatTheyGiveAlone) {
  auto model = tiny_llama();
  serve::Engine engine(model, nullptr);
  constexpr size_t kRequests = 12;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (size_t i = 0; i < kRequests; ++i) {
    collectors.push_back(std::make_unique<Collector>());
    engine.submit(greedy_request(prompt_of(i), 8 + i), collectors.back()->callback());
  }
  for (size_t i = 0; i < kRequests; ++i) {
    Result r = collectors[i]->wait();
    EXPECT_EQ(r.last.finish, serve::FinishReason::Length);
    EXPECT_EQ(r.last.completion_tokens, 8 + i);
    EXPECT_EQ(r.last.prompt_tokens, prompt_of(i).size());
    EXPECT_EQ(r.tokens, generate_alone(model, prompt_of(i), 8 + i)) << "request " << i;
  }
  engine.drain();
  serve::EngineStats s = engine.stats();
  EXPECT_EQ(s.requests_done, kRequests);
  EXPECT_EQ(s.kv_pages_used, 0u);
  EXPECT_EQ(s.running, 0u);
  EXPECT_EQ(s.time_to_first_token.count, kRequests);
}

TEST(ServeEngine, ErrorsAtSubmit) {
  serve::Engine engine(tiny_llama(), nullptr);
  auto ignore = [](const serve::TokenEvent&) {};
  EXPECT_THROW(engine.submit(greedy_request({}, 4), ignore), Error);
  try {
    engine.submit(greedy_request(std::vector<uint32_t>(65, 1), 4), ignore);
    FAIL() << "a prompt longer than the context was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("65"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine.submit(greedy_request({1, 96}, 4), ignore), wick::IndexOutOfRange);
  serve::CompletionRequest bad = greedy_request({1, 2}, 4);
  bad.sampling.top_p = 0;
  EXPECT_THROW(engine.submit(bad, ignore), Error);
  bad = greedy_request({1, 2}, 4);
  bad.sampling.stop = {"x"};
  EXPECT_THROW(engine.submit(bad, ignore), Error);  // no tokenizer
}

TEST(ServeEngine, QueueFullBeyondMaxQueue) {
  serve::EngineOptions o;
  o.max_batch = 1;
  o.max_queue = 2;
  serve::Engine engine(tiny_llama(), nullptr, o);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<bool> blocked{false};
  // The first request's first event blocks the engine thread until the queue has been tested.
  Collector first;
  auto cb = first.callback();
  engine.submit(greedy_request({1, 2, 3}, 2), [&, cb](const serve::TokenEvent& e) {
    if (!blocked.exchange(true)) gate.wait();
    cb(e);
  });
  while (!blocked) std::this_thread::yield();
  Collector a, b;
  engine.submit(greedy_request({4, 5}, 2), a.callback());
  engine.submit(greedy_request({6, 7}, 2), b.callback());
  EXPECT_THROW(engine.submit(greedy_request({8, 9}, 2), [](const serve::TokenEvent&) {}),
               serve::QueueFull);
  EXPECT_EQ(engine.stats().waiting, 2u);
  release.set_value();
  EXPECT_EQ(first.wait().tokens.size(), 2u);
  EXPECT_EQ(a.wait().last.finish, serve::FinishReason::Length);
  EXPECT_EQ(b.wait().last.finish, serve::FinishReason::Length);
}

TEST(ServeEngine, CancelEndsARequestAndFreesItsPages) {
  serve::Engine engine(tiny_llama(), nullptr);
  std::promise<uint64_t> id_promise;
  std::shared_future<uint64_t> id = id_promise.get_future().share();
  Collector c;
  auto cb = c.callback();
  serve::Engine* e = &engine;
  // The id is known only after submit returns: the callback waits for it.
  const uint64_t got =
      engine.submit(greedy_request({1, 2, 3}, 40), [&, cb, e](const serve::TokenEvent& ev) {
        cb(ev);
        if (ev.finish == serve::FinishReason::None) e->cancel(id.get());
      });
  id_promise.set_value(got);
  Result r = c.wait();
  EXPECT_EQ(r.last.finish, serve::FinishReason::Cancelled);
  EXPECT_LT(r.tokens.size(), 40u);
  engine.drain();
  EXPECT_EQ(engine.stats().kv_pages_used, 0u);
}

TEST(ServeEngine, DrainWaitsForEveryRequestThenRefusesNewOnes) {
  serve::Engine engine(tiny_llama(), nullptr);
  std::vector<std::unique_ptr<Collector>> cs;
  for (size_t i = 0; i < 4; ++i) {
    cs.push_back(std::make_unique<Collector>());
    engine.submit(greedy_request(prompt_of(i), 6), cs.back()->callback());
  }
  engine.drain();
  EXPECT_EQ(engine.stats().requests_done, 4u);
  for (auto& c : cs) EXPECT_EQ(c->wait().tokens.size(), 6u);
  EXPECT_THROW(engine.submit(greedy_request({1}, 1), [](const serve::TokenEvent&) {}), Error);
}

TEST(ServeEngine, DestructorCancelsWhatIsLeft) {
  std::vector<std::unique_ptr<Collector>> cs;
  {
    serve::EngineOptions o;
    o.max_batch = 1;
    serve::Engine engine(tiny_llama(), nullptr, o);
    for (size_t i = 0; i < 6; ++i) {
      cs.push_back(std::make_unique<Collector>());
      engine.submit(greedy_request(prompt_of(i), 40), cs.back()->callback());
    }
  }
  size_t cancelled = 0;
  for (auto& c : cs) cancelled += c->wait().last.finish == serve::FinishReason::Cancelled;
  EXPECT_GE(cancelled, 1u);
}

}  // namespace
