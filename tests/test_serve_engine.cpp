// serve::Engine: requests decoded together give what each gives alone through Generator; the
// engine's limits (max_tokens, stop strings, the queue, cancellation, drain) and its errors.

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cpu/paged_attention.h"
#include "fused/paged_attention.h"
#include "models/decoder.h"
#include "nn_reference.h"
#include "qmatmul_test_util.h"
#include "serve/decode_graphs.h"
#include "serve/page_pool.h"
#include "test_util.h"
#include "wick/formats.h"
#include "wick/generator.h"
#include "wick/models.h"
#include "wick/nn/paged_attention.h"
#include "wick/numerics.h"
#include "wick/serve.h"
#include "wick/wick.h"

namespace {

using wick::Device;
using wick::DType;
using wick::Error;
using wick::Shape;
using wick::Tensor;
using wick::models::CausalLM;
using wick::models::PagedSequence;
namespace serve = wick::serve;
namespace nn = wick::nn;

// ---- nn::paged_attention ----

// Sequences of `lengths` positions over a pool of `pages` pages of `ps` rows, their pages
// scattered through the pool (a shuffled permutation): the page table (n, width) and each
// sequence's pages.
std::vector<std::vector<uint32_t>> scattered_tables(const std::vector<size_t>& lengths, size_t ps,
                                                    size_t pages) {
  std::vector<uint32_t> order(pages);
  for (size_t i = 0; i < pages; ++i) order[i] = static_cast<uint32_t>(i);
  std::shuffle(order.begin(), order.end(), wick::testing::rng());
  std::vector<std::vector<uint32_t>> tables;
  size_t next = 0;
  for (size_t len : lengths) {
    std::vector<uint32_t> t;
    for (size_t i = 0; i < (len + ps - 1) / ps; ++i) t.push_back(order.at(next++));
    tables.push_back(t);
  }
  return tables;
}

Tensor table_tensor(const std::vector<std::vector<uint32_t>>& tables) {
  size_t width = 0;
  for (const auto& t : tables) width = std::max(width, t.size());
  std::vector<uint32_t> flat(tables.size() * width, 0);
  for (size_t i = 0; i < tables.size(); ++i) {
    std::copy(tables[i].begin(), tables[i].end(), flat.begin() + static_cast<ptrdiff_t>(i * width));
  }
  return Tensor::from_vec(flat, {tables.size(), width}, Device::cpu());
}

// The rows 0..pos of sequence `seq`'s keys (or values) as one (1, h_kv, pos + 1, d) tensor.
Tensor gather_rows(const Tensor& pool, const std::vector<uint32_t>& table, size_t pos) {
  const size_t ps = pool.dims()[2];
  std::vector<Tensor> rows;
  for (size_t p = 0; p <= pos; ++p) rows.push_back(pool.get(table[p / ps]).narrow(1, p % ps, 1));
  return Tensor::cat(rows, 1).unsqueeze(0);
}

class PagedAttentionDType : public ::testing::TestWithParam<DType> {};

TEST_P(PagedAttentionDType, EachTokenWithinItsBoundOfAFloat64Reference) {
  const DType dt = GetParam();
  const size_t h = 6, h_kv = 2, d = 40, ps = 4, pages = 24;
  // Three sequences: a prefill chunk of 5 tokens after 3 cached, one decode token at position 17,
  // and a prefill of 9 from position 0.
  const std::vector<size_t> lengths = {8, 18, 9};
  auto tables = scattered_tables(lengths, ps, pages);
  std::vector<uint32_t> seq, pos;
  for (uint32_t p = 3; p < 8; ++p) seq.push_back(0), pos.push_back(p);
  seq.push_back(1), pos.push_back(17);
  for (uint32_t p = 0; p < 9; ++p) seq.push_back(2), pos.push_back(p);
  const size_t t = seq.size();
  // bf16's bound counts the scores' rounding to bf16 (which this kernel does not do): smaller
  // queries keep it below the outputs.
  const double q_range = dt == DType::BF16 ? 0.25 : 2.0;
  Tensor q = wick::testing::random_tensor({t, h, d}, dt, Device::cpu(), -q_range, q_range);
  Tensor k = wick::testing::random_tensor({pages, h_kv, ps, d}, dt);
  Tensor v = wick::testing::random_tensor({pages, h_kv, ps, d}, dt);
  Tensor out =
      nn::paged_attention(q, k, v, table_tensor(tables), Tensor::from_vec(seq, {t}, Device::cpu()),
                          Tensor::from_vec(pos, {t}, Device::cpu()));
  ASSERT_EQ(out.shape(), q.shape());
  ASSERT_EQ(out.dtype(), dt);
  for (size_t i = 0; i < t; ++i) {
    Tensor qi = q.get(i).unsqueeze(1).unsqueeze(0);  // (1, h, 1, d)
    Tensor ki = gather_rows(k, tables[seq[i]], pos[i]), vi = gather_rows(v, tables[seq[i]], pos[i]);
    Tensor got = out.get(i).unsqueeze(1).unsqueeze(0);
    EXPECT_TRUE(wick::testing::attention_within(got, qi, ki, vi, nn::AttentionOptions{}))
        << "token " << i << " " << dt;
  }
}

INSTANTIATE_TEST_SUITE_P(Floats, PagedAttentionDType,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16, DType::F64));

TEST(PagedAttention, ATokensOutputIsTheSameBitsInAnyBatch) {
  const size_t h = 4, h_kv = 4, d = 64, ps = 16, pages = 12;
  auto tables = scattered_tables({40, 33, 50}, ps, pages);
  Tensor k = wick::testing::random_tensor({pages, h_kv, ps, d}, DType::F32);
  Tensor v = wick::testing::random_tensor({pages, h_kv, ps, d}, DType::F32);
  Tensor table = table_tensor(tables);
  Tensor q = wick::testing::random_tensor({3, h, d}, DType::F32);
  auto run = [&](const Tensor& qs, std::vector<uint32_t> seq, std::vector<uint32_t> pos) {
    const size_t t = seq.size();
    return nn::paged_attention(qs, k, v, table, Tensor::from_vec(seq, {t}, Device::cpu()),
                               Tensor::from_vec(pos, {t}, Device::cpu()))
        .to_vec_f64();
  };
  auto alone = run(q.narrow(0, 1, 1), {1}, {32});
  auto batch = run(q, {0, 1, 2}, {39, 32, 49});
  std::vector<double> row(batch.begin() + h * d, batch.begin() + 2 * h * d);
  EXPECT_EQ(alone, row);
}

TEST(PagedAttention, Errors) {
  const Device cpu = Device::cpu();
  Tensor k = Tensor::zeros({4, 2, 4, 8}, DType::F32, cpu);
  Tensor q = Tensor::ones({1, 4, 8}, DType::F32, cpu);
  Tensor table = Tensor::from_vec(std::vector<uint32_t>{0, 1}, {1, 2}, cpu);
  auto u32 = [&](uint32_t x) { return Tensor::from_vec(std::vector<uint32_t>{x}, {1}, cpu); };
  EXPECT_NO_THROW(nn::paged_attention(q, k, k, table, u32(0), u32(7)));
  // Position 8 needs a third page; sequence 1 does not exist; page 9 is outside the pool.
  EXPECT_THROW(nn::paged_attention(q, k, k, table, u32(0), u32(8)), wick::IndexOutOfRange);
  EXPECT_THROW(nn::paged_attention(q, k, k, table, u32(1), u32(0)), wick::IndexOutOfRange);
  Tensor bad_table = Tensor::from_vec(std::vector<uint32_t>{0, 9}, {1, 2}, cpu);
  EXPECT_THROW(nn::paged_attention(q, k, k, bad_table, u32(0), u32(5)), wick::IndexOutOfRange);
  EXPECT_THROW(nn::paged_attention(q.to_dtype(DType::F16), k, k, table, u32(0), u32(0)),
               wick::DTypeMismatch);
  EXPECT_THROW(
      nn::paged_attention(Tensor::ones({1, 3, 8}, DType::F32, cpu), k, k, table, u32(0), u32(0)),
      wick::ShapeMismatch);
  EXPECT_THROW(nn::paged_attention(q, k, k, table, u32(0).to_dtype(DType::I64), u32(0)),
               wick::DTypeMismatch);
  Tensor kv = Tensor::ones({1, 2, 8}, DType::F32, cpu);
  EXPECT_THROW(nn::paged_kv_write(k, k, kv, kv, u32(16)), wick::IndexOutOfRange);
  EXPECT_THROW(nn::paged_kv_write(k, k, Tensor::ones({1, 3, 8}, DType::F32, cpu), kv, u32(0)),
               wick::ShapeMismatch);
  // A write lands at its page and row, nowhere else.
  Tensor pool = Tensor::zeros({4, 2, 4, 8}, DType::F32, cpu);
  Tensor pool_v = Tensor::zeros({4, 2, 4, 8}, DType::F32, cpu);
  nn::paged_kv_write(pool, pool_v, kv, kv.affine(2, 0), u32(2 * 4 + 3));
  EXPECT_EQ(pool.sum_all().to_vec_f64()[0], 16.0);
  EXPECT_EQ(pool.get(2).narrow(1, 3, 1).sum_all().to_vec_f64()[0], 16.0);
  EXPECT_EQ(pool_v.get(2).narrow(1, 3, 1).sum_all().to_vec_f64()[0], 32.0);
}

// cpu::paged_attention_f32, which the CPU decode plan calls on its own buffers once a layer: the
// op's bits for a ragged batch (decode tokens and a prefill chunk), without and with a sliding
// window, and the op's checks.
TEST(PagedAttention, BackendEntryGivesTheOpsBits) {
  const Device host = Device::cpu();
  const size_t h = 6, h_kv = 2, d = 40, ps = 4, pages = 24;
  auto tables = scattered_tables({8, 18, 9}, ps, pages);
  const std::vector<uint32_t> seq{1, 0, 0, 0, 2}, pos{17, 5, 6, 7, 8};
  const size_t t = seq.size();
  Tensor q = wick::testing::random_tensor({t, h, d}, DType::F32);
  Tensor k = wick::testing::random_tensor({pages, h_kv, ps, d}, DType::F32);
  Tensor v = wick::testing::random_tensor({pages, h_kv, ps, d}, DType::F32);
  Tensor table = table_tensor(tables), seqs = Tensor::from_vec(seq, {t}, host),
         positions = Tensor::from_vec(pos, {t}, host);
  const std::vector<float> qv = q.flatten_all().to_vec1<float>();
  std::vector<float> got(t * h * d);
  std::vector<double> unwindowed;
  for (size_t window : {size_t{0}, size_t{3}}) {
    wick::cpu::paged_attention_f32(qv.data(), t, h, k, v, table, seqs, positions, window, 0, 0,
                                   got.data());
    const std::vector<double> want =
        nn::paged_attention(q, k, v, table, seqs, positions, 0, window).to_vec_f64();
    EXPECT_EQ(std::vector<double>(got.begin(), got.end()), want) << "window " << window;
    EXPECT_GT(wick::testing::range_of(want), 0.1);
    if (window == 0) {
      unwindowed = want;
    } else {
      EXPECT_NE(want, unwindowed);  // the window hides keys of these positions
    }
  }
  // Scores scaled otherwise and soft-capped (Gemma 2's), with a window.
  wick::cpu::paged_attention_f32(qv.data(), t, h, k, v, table, seqs, positions, 3, 0.4, 0.5,
                                 got.data());
  const std::vector<double> capped =
      nn::paged_attention(q, k, v, table, seqs, positions, 0.4, 3, 0.5).to_vec_f64();
  EXPECT_EQ(std::vector<double>(got.begin(), got.end()), capped);
  EXPECT_NE(capped, unwindowed);
  // Pools of another dtype, indices of another dtype, a position past the sequence's pages.
  EXPECT_THROW(wick::cpu::paged_attention_f32(qv.data(), t, h, k.to_dtype(DType::F16), v, table,
                                              seqs, positions, 0, 0, 0, got.data()),
               wick::Error);
  EXPECT_THROW(
      wick::cpu::paged_attention_f32(qv.data(), t, h, k, v, table, seqs.to_dtype(DType::I64),
                                     positions, 0, 0, 0, got.data()),
      wick::Error);
  const Tensor far = Tensor::from_vec(std::vector<uint32_t>{17, 5, 6, 7, 4 * 5}, {t}, host);
  EXPECT_THROW(
      wick::cpu::paged_attention_f32(qv.data(), t, h, k, v, table, seqs, far, 0, 0, 0, got.data()),
      wick::IndexOutOfRange);
}

// ---- CausalLM::forward_paged ----

std::string llama_data(const std::string& name) {
  return std::string(WICK_TEST_DATA_DIR) + "/llama/" + name;
}

std::vector<uint32_t> to_u32(const Tensor& t) {
  std::vector<uint32_t> out;
  for (double v : t.to_vec_f64()) out.push_back(static_cast<uint32_t>(v));
  return out;
}

class PagedForward : public ::testing::TestWithParam<std::string> {};

// A batch of three sequences over one pool, stepped together: the reference prompt prefilled in
// chunks of 3, the same prompt whole then decoded one position at a time, and an unrelated
// sequence; every logits row of the prompt's positions within transformers' (logits.npy), by
// the model's own batched forward and by CausalLM's default one sequence at a time.
TEST_P(PagedForward, RaggedBatchStepsGiveTransformersLogits) {
  const std::string dir = llama_data(GetParam());
  std::shared_ptr<const CausalLM> model = wick::models::load_causal_lm(dir, Device::cpu());
  auto prompt = to_u32(wick::npy::load(dir + "/prompt.npy", Device::cpu()));
  Tensor ref = wick::npy::load(dir + "/logits.npy", Device::cpu());
  const double range = wick::testing::range_of(ref.to_vec_f64());
  const size_t n = prompt.size(), ps = 4;
  for (bool batched : {true, false}) {
    wick::models::PagedKvCache cache = model->make_paged_cache(32, ps);
    auto tables = scattered_tables({n, n, n + 5}, ps, 32);
    std::vector<uint32_t> other;
    for (size_t i = 0; i < n + 5; ++i) other.push_back(static_cast<uint32_t>((7 * i + 5) % 90));
    size_t at_a = 0, at_b = 0, at_c = 0;
    while (at_a < n || at_b < n) {
      std::vector<PagedSequence> batch;
      std::vector<size_t> want_row;  // the reference row of each sequence's last token
      if (at_a < n) {
        size_t len = std::min<size_t>(3, n - at_a);
        batch.push_back({std::vector<uint32_t>(prompt.begin() + at_a, prompt.begin() + at_a + len),
                         at_a, tables[0]});
        at_a += len;
        want_row.push_back(at_a - 1);
      }
      if (at_b < n) {
        size_t len = at_b == 0 ? n - 2 : 1;
        batch.push_back({std::vector<uint32_t>(prompt.begin() + at_b, prompt.begin() + at_b + len),
                         at_b, tables[1]});
        at_b += len;
        want_row.push_back(at_b - 1);
      }
      size_t len_c = std::min<size_t>(2, n + 5 - at_c);
      if (len_c > 0) {
        batch.push_back({std::vector<uint32_t>(other.begin() + at_c, other.begin() + at_c + len_c),
                         at_c, tables[2]});
        at_c += len_c;
      }
      Tensor logits = batched ? model->forward_paged(batch, cache)
                              : model->CausalLM::forward_paged(batch, cache);
      ASSERT_EQ(logits.dims()[0], batch.size());
      for (size_t i = 0; i < want_row.size(); ++i) {
        EXPECT_LE(wick::testing::max_abs_diff(logits.get(i).to_vec_f64(),
                                              ref.get(want_row[i]).to_vec_f64()),
                  1e-5 * range)
            << "sequence " << i << " at position " << want_row[i] << (batched ? "" : " (default)");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, PagedForward,
                         ::testing::Values("tiny_llama", "tiny_qwen2", "tiny_llama3_scaled"));

TEST(PagedForwardErrors, BadBatches) {
  auto model = wick::models::load_causal_lm(llama_data("tiny_llama"), Device::cpu());
  wick::models::PagedKvCache cache = model->make_paged_cache(4, 4);
  EXPECT_THROW(model->forward_paged({}, cache), Error);
  EXPECT_THROW(model->forward_paged({{{}, 0, {0}}}, cache), Error);
  EXPECT_THROW(model->forward_paged({{{1, 2, 3, 4, 5}, 0, {0}}}, cache), wick::IndexOutOfRange);
  EXPECT_THROW(model->forward_paged({{{1}, 0, {4}}}, cache), wick::IndexOutOfRange);
  EXPECT_THROW(model->forward_paged({{{96}, 0, {0}}}, cache), wick::IndexOutOfRange);
  wick::models::PagedKvCache plain = model->CausalLM::make_paged_cache(4, 4);
  EXPECT_THROW(model->forward_paged({{{1}, 0, {0}}}, plain), wick::ShapeMismatch);
}

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

// The tiny Llama with the logits made NaN for every sequence prefilled from position 0 with
// `poison` first: that request's sampling fails.
class PoisonedLogits final : public CausalLM {
 public:
  PoisonedLogits(std::shared_ptr<const CausalLM> m, uint32_t poison)
      : m_(std::move(m)), poison_(poison) {}
  const wick::models::CausalLMConfig& config() const override { return m_->config(); }
  Device device() const override { return m_->device(); }
  DType dtype() const override { return m_->dtype(); }
  wick::models::KvCache make_cache(size_t batch, size_t max_len) const override {
    return m_->make_cache(batch, max_len);
  }
  Tensor forward(const Tensor& ids, wick::models::KvCache& cache) const override {
    return m_->forward(ids, cache);
  }
  Tensor forward_last(const Tensor& ids, wick::models::KvCache& cache) const override {
    return m_->forward_last(ids, cache);
  }
  wick::models::PagedKvCache make_paged_cache(size_t pages, size_t page_size) const override {
    return m_->make_paged_cache(pages, page_size);
  }
  Tensor forward_paged(const std::vector<PagedSequence>& batch,
                       wick::models::PagedKvCache& cache) const override {
    Tensor logits = m_->forward_paged(batch, cache);
    std::vector<float> v = logits.flatten_all().to_vec1<float>();
    const size_t vocab = logits.dims()[1];
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].cached != 0 || batch[i].tokens[0] != poison_) continue;
      for (size_t j = 0; j < vocab; ++j) v[i * vocab + j] = std::numeric_limits<float>::quiet_NaN();
    }
    return Tensor::from_vec(v, logits.shape(), logits.device());
  }

 private:
  std::shared_ptr<const CausalLM> m_;
  uint32_t poison_;
};

// A request whose logits are not finite ends with an Error event naming the token (the sampler's
// check), greedy or sampled; the others of its steps go on and give what they give alone.
TEST(ServeEngine, NonFiniteLogitsEndTheirRequestAlone) {
  auto model = std::make_shared<const PoisonedLogits>(tiny_llama(), 95);
  serve::Engine engine(model, nullptr);
  std::vector<std::vector<uint32_t>> prompts;
  for (size_t i = 0; i < 6; ++i) {
    prompts.push_back(prompt_of(i));
    if (i % 3 == 1) prompts.back()[0] = 95;
  }
  std::vector<std::unique_ptr<Collector>> collectors;
  for (size_t i = 0; i < prompts.size(); ++i) {
    collectors.push_back(std::make_unique<Collector>());
    serve::CompletionRequest r = greedy_request(prompts[i], 6);
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8;
      r.sampling.seed = i;
    }
    engine.submit(r, collectors.back()->callback());
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    Result r = collectors[i]->wait();
    if (i % 3 == 1) {
      EXPECT_EQ(r.last.finish, serve::FinishReason::Error) << i;
      EXPECT_NE(r.last.error.find("is nan"), std::string::npos) << r.last.error;
      EXPECT_TRUE(r.tokens.empty()) << i;
    } else {
      EXPECT_EQ(r.last.finish, serve::FinishReason::Length) << i;
      if (i % 2 == 0) {
        EXPECT_EQ(r.tokens, generate_alone(tiny_llama(), prompts[i], 6)) << i;
      }
      EXPECT_EQ(r.tokens.size(), 6u) << i;
    }
  }
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

namespace {

// Runs `requests` through `engine`, all submitted at once, and returns each one's result.
std::vector<Result> run_all(serve::Engine& engine,
                            const std::vector<serve::CompletionRequest>& requests) {
  std::vector<std::unique_ptr<Collector>> cs;
  for (const auto& r : requests) {
    cs.push_back(std::make_unique<Collector>());
    engine.submit(r, cs.back()->callback());
  }
  std::vector<Result> out;
  for (auto& c : cs) out.push_back(c->wait());
  return out;
}

// Each request alone: submitted after the one before has ended.
std::vector<Result> run_each_alone(serve::Engine& engine,
                                   const std::vector<serve::CompletionRequest>& requests) {
  std::vector<Result> out;
  for (const auto& r : requests) out.push_back(run_all(engine, {r})[0]);
  return out;
}

// SmolLM2-135M-Instruct Q4_1 (quantized matmuls): 12 concurrent chat requests sharing a system
// prompt, greedy and sampled with fixed seeds, each the same tokens as when it runs alone.
TEST(ServeEngineSmolLM2, TwelveConcurrentRequestsEachGiveWhatTheyGiveAlone) {
  WICK_REQUIRE_SMOLLM2(path);
  std::shared_ptr<const CausalLM> model = wick::models::load_causal_lm(path, Device::cpu());
  auto tok = std::make_shared<const wick::Tokenizer>(wick::models::load_gguf_tokenizer(path));
  const std::vector<std::string> questions = {"What is the capital of France?",
                                              "Write a haiku about the sea.",
                                              "What is 17 times 3?",
                                              "Name three primary colors.",
                                              "Who wrote Hamlet?",
                                              "Explain gravity in one sentence.",
                                              "What is the boiling point of water?",
                                              "Give me a synonym for happy.",
                                              "Translate 'good morning' into Spanish.",
                                              "What is the largest planet?",
                                              "Describe a cat in five words.",
                                              "What day comes after Monday?"};
  std::vector<serve::CompletionRequest> requests;
  for (size_t i = 0; i < questions.size(); ++i) {
    std::string text = tok->apply_chat_template(
        {{"system", "You are a helpful assistant who answers briefly and accurately."},
         {"user", questions[i]}});
    serve::CompletionRequest r;
    r.prompt = tok->encode(text, false);
    r.sampling.max_tokens = 20;
    r.sampling.temperature = i % 3 == 2 ? 0.8 : 0.0;
    r.sampling.seed = 1000 + i;
    requests.push_back(r);
  }
  serve::EngineOptions o;
  o.page_size = 16;
  o.prefill_chunk = 32;
  serve::Engine engine(model, tok, o);
  std::vector<Result> alone = run_each_alone(engine, requests);
  std::vector<Result> together = run_all(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_FALSE(alone[i].tokens.empty());
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << "request " << i << ": " << questions[i];
    EXPECT_EQ(together[i].text, alone[i].text);
  }
  // The system prompt's full pages were prefilled once: every later request found them cached.
  serve::EngineStats s = engine.stats();
  EXPECT_GT(s.cached_prompt_tokens, 0u);
  EXPECT_GT(together[5].last.cached_tokens, 0u);
  EXPECT_EQ(s.kv_pages_used, 0u);
}

}  // namespace

namespace {

// ---- the page pool and the engine's use of it ----

TEST(PagePool, ReferenceCountsPrefixCacheAndEviction) {
  wick::serve::PagePool pool(3, true);
  auto a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  ASSERT_TRUE(a && b && c);
  EXPECT_FALSE(pool.allocate());
  EXPECT_EQ(pool.used(), 3u);
  const uint32_t t1[2] = {5, 6}, t2[2] = {7, 8};
  const uint64_t h1 = wick::serve::PagePool::chain_hash(0, t1, 2);
  const uint64_t h2 = wick::serve::PagePool::chain_hash(h1, t2, 2);
  EXPECT_NE(h2, wick::serve::PagePool::chain_hash(0, t2, 2));  // the chain, not the page alone
  pool.publish(*a, h1);
  pool.publish(*b, h2);
  pool.publish(*c, h1);  // h1 is held by a already: c stays private
  EXPECT_EQ(pool.cached(), 2u);
  // A second holder shares a; released by both, a stays cached (evictable, not in use).
  EXPECT_EQ(pool.lookup(h1), a);
  EXPECT_EQ(pool.holders(*a), 2u);
  pool.release(*a);
  pool.release(*a);
  EXPECT_EQ(pool.used(), 2u);
  EXPECT_EQ(pool.lookup(h1), a);
  EXPECT_EQ(pool.used(), 3u);
  pool.release(*a);
  pool.release(*b);
  pool.release(*c);
  EXPECT_EQ(pool.used(), 0u);
  EXPECT_EQ(pool.available(), 3u);
  // c (never cached) is free and goes first; then the least recently released cached page (a).
  EXPECT_EQ(pool.allocate(), c);
  EXPECT_EQ(pool.allocate(), a);
  EXPECT_FALSE(pool.lookup(h1));
  EXPECT_EQ(pool.lookup(h2), b);
  pool.release(*c);  // held once: the second release throws
  EXPECT_THROW(pool.release(*c), Error);
}

TEST(PagePool, ReleasingAPageNobodyHoldsThrows) {
  wick::serve::PagePool pool(1, false);
  auto a = pool.allocate();
  pool.release(*a);
  EXPECT_THROW(pool.release(*a), Error);
  const uint32_t t[1] = {1};
  pool.publish(*pool.allocate(), wick::serve::PagePool::chain_hash(0, t, 1));
  EXPECT_EQ(pool.cached(), 0u);  // caching off
}

// A request whose prompt repeats an earlier one's takes its full pages from the prefix cache: its
// cached positions are not prefilled, and it gives the same tokens.
TEST(ServeEngine, PrefixCacheSharesFullPagesOfARepeatedPrompt) {
  serve::EngineOptions o;
  o.page_size = 4;
  serve::Engine engine(tiny_llama(), nullptr, o);
  std::vector<uint32_t> prompt = prompt_of(3);
  while (prompt.size() < 30) prompt.push_back(static_cast<uint32_t>(prompt.size() * 11 % 96));
  Result first = run_all(engine, {greedy_request(prompt, 10)})[0];
  EXPECT_EQ(first.last.cached_tokens, 0u);
  // While the first request runs again, a third one joins: pages in use are fewer than the two
  // sequences' positions need, because the prompt's 7 full pages are held by both.
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  std::atomic<int> events{0};
  Collector a, b;
  auto cb = a.callback();
  size_t shared_seen = 0;
  engine.submit(greedy_request(prompt, 10), [&, cb](const serve::TokenEvent& e) {
    if (events++ == 0) gate.wait();
    cb(e);
  });
  while (events == 0) std::this_thread::yield();
  auto bcb = b.callback();
  serve::Engine* ep = &engine;
  engine.submit(greedy_request(prompt, 10), [&, bcb, ep](const serve::TokenEvent& e) {
    if (e.finish == serve::FinishReason::None && shared_seen == 0) {
      shared_seen = ep->stats().kv_pages_used;
    }
    bcb(e);
  });
  go.set_value();
  Result ra = a.wait(), rb = b.wait();
  EXPECT_EQ(ra.tokens, first.tokens);
  EXPECT_EQ(rb.tokens, first.tokens);
  EXPECT_EQ(ra.last.cached_tokens, 28u);  // (30 - 1) / 4 full pages of the first run
  EXPECT_EQ(rb.last.cached_tokens, 28u);
  // Unshared, the two would hold at least 2 x 8 pages (31 positions and more each).
  EXPECT_GT(shared_seen, 0u);
  EXPECT_LT(shared_seen, 16u);
  engine.drain();
  serve::EngineStats s = engine.stats();
  EXPECT_EQ(s.cached_prompt_tokens, 56u);
  EXPECT_EQ(s.prompt_tokens, 90u);
  EXPECT_EQ(s.kv_pages_used, 0u);
}

TEST(ServeEngine, ARequestWaitsWhileThePoolIsFull) {
  auto model = tiny_llama();
  serve::EngineOptions o;
  o.page_size = 4;
  o.prefix_caching = false;
  // 10 pages: one request of 20 + 19 positions needs all 10 of them.
  o.kv_memory = 10 * wick::models::paged_page_bytes(2, 4, 2, 8, DType::F32);
  serve::Engine engine(model, nullptr, o);
  EXPECT_EQ(engine.stats().kv_pages_total, 10u);
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  std::atomic<int> events{0};
  Collector a, b;
  auto cb = a.callback();
  std::vector<uint32_t> pa = prompt_of(1), pb = prompt_of(2);
  while (pa.size() < 20) pa.push_back(static_cast<uint32_t>(pa.size()));
  while (pb.size() < 20) pb.push_back(static_cast<uint32_t>(pb.size() + 40));
  engine.submit(greedy_request(pa, 20), [&, cb](const serve::TokenEvent& e) {
    if (events++ == 0) gate.wait();
    cb(e);
  });
  while (events == 0) std::this_thread::yield();
  engine.submit(greedy_request(pb, 20), b.callback());
  // The second request waits: the first holds 5 pages and grows into the rest.
  EXPECT_EQ(engine.stats().waiting, 1u);
  go.set_value();
  Result ra = a.wait(), rb = b.wait();
  EXPECT_EQ(ra.tokens, generate_alone(model, pa, 20));
  EXPECT_EQ(rb.tokens, generate_alone(model, pb, 20));
  // A request that can never fit is refused at once, naming the pages.
  EXPECT_THROW(engine.submit(greedy_request(pa, 40), [](const serve::TokenEvent&) {}), Error);
}

// A pool too small for every running sequence's growth: the newest are preempted and prefilled
// again later, and every request still gives what it gives alone.
TEST(ServeEngine, PreemptedRequestsGiveWhatTheyGiveAlone) {
  auto model = tiny_llama();
  serve::EngineOptions o;
  o.page_size = 4;
  o.prefill_chunk = 5;
  o.kv_memory = 12 * wick::models::paged_page_bytes(2, 4, 2, 8, DType::F32);
  serve::Engine engine(model, nullptr, o);
  std::vector<serve::CompletionRequest> requests;
  for (size_t i = 0; i < 4; ++i) requests.push_back(greedy_request(prompt_of(i + 4), 26));
  std::vector<Result> got = run_all(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].tokens, generate_alone(model, requests[i].prompt, 26)) << "request " << i;
    EXPECT_EQ(got[i].last.finish, serve::FinishReason::Length);
  }
  EXPECT_GT(engine.stats().preemptions, 0u);
  EXPECT_EQ(engine.stats().kv_pages_used, 0u);
}

// A byte-level vocabulary of the tiny model's 96 ids: id i is the character 33 + i (94 of them),
// then "ab" and "cd".
std::shared_ptr<const wick::Tokenizer> tiny_tokenizer() {
  wick::GgufVocab v;
  v.pre = "gpt2";
  for (int i = 0; i < 94; ++i) v.tokens.push_back(std::string(1, static_cast<char>(33 + i)));
  v.tokens.push_back("ab");
  v.tokens.push_back("cd");
  v.merges = {"a b", "c d"};
  return std::make_shared<const wick::Tokenizer>(wick::Tokenizer::from_gguf_vocab(v));
}

TEST(ServeEngine, StopStringsEndTheTextBeforeThemAcrossTokens) {
  auto model = tiny_llama();
  auto tok = tiny_tokenizer();
  serve::Engine engine(model, tok);
  serve::CompletionRequest r = greedy_request(prompt_of(7), 24);
  Result whole = run_all(engine, {r})[0];
  ASSERT_EQ(whole.tokens.size(), 24u);
  EXPECT_EQ(whole.text, tok->decode(whole.tokens));
  // A stop string of the 6th and 7th tokens' text: two tokens, so it spans a boundary.
  const std::string stop = tok->decode({whole.tokens[5], whole.tokens[6]});
  const size_t at = whole.text.find(stop);
  ASSERT_NE(at, std::string::npos);
  r.sampling.stop = {"never-there", stop};
  Result stopped = run_all(engine, {r})[0];
  EXPECT_EQ(stopped.last.finish, serve::FinishReason::Stop);
  EXPECT_EQ(stopped.text, whole.text.substr(0, at));
  EXPECT_EQ(stopped.text.find(stop), std::string::npos);
  EXPECT_LE(stopped.tokens.size(), 7u);
  // A stop token ends the request too, without its text.
  r.sampling.stop.clear();
  r.sampling.stop_tokens = {whole.tokens[3]};
  Result by_token = run_all(engine, {r})[0];
  size_t first =
      std::find(whole.tokens.begin(), whole.tokens.end(), whole.tokens[3]) - whole.tokens.begin();
  EXPECT_EQ(by_token.last.finish, serve::FinishReason::Stop);
  EXPECT_EQ(by_token.text,
            tok->decode(std::vector<uint32_t>(whole.tokens.begin(), whole.tokens.begin() + first)));
  EXPECT_EQ(by_token.last.completion_tokens, first + 1);
}

TEST(ServeEngine, MaxTokensAndTheContextEndARequestWithLength) {
  serve::Engine engine(tiny_llama(), nullptr);
  Result none = run_all(engine, {greedy_request({1, 2, 3}, 0)})[0];
  EXPECT_EQ(none.last.finish, serve::FinishReason::Length);
  EXPECT_TRUE(none.tokens.empty());
  Result three = run_all(engine, {greedy_request({1, 2, 3}, 3)})[0];
  EXPECT_EQ(three.tokens.size(), 3u);
  EXPECT_EQ(three.last.completion_tokens, 3u);
  // A prompt of 60 in a context of 64: tokens at positions 60..63 are fed, so 5 new tokens.
  Result full = run_all(engine, {greedy_request(std::vector<uint32_t>(60, 5), 100)})[0];
  EXPECT_EQ(full.last.finish, serve::FinishReason::Length);
  EXPECT_EQ(full.tokens.size(), 5u);
}

}  // namespace

namespace {

// forward_paged's logits of sequence x alone, and inside a batch with two other sequences (more
// rows for every projection), for a prefill step and a decode step: (alone, in the batch).
std::pair<std::vector<double>, std::vector<double>> alone_and_batched(const CausalLM& model,
                                                                      size_t vocab) {
  const size_t ps = 8;
  std::vector<uint32_t> x, y, z;
  for (uint32_t i = 0; i < 10; ++i) x.push_back((i * 13 + 1) % static_cast<uint32_t>(vocab));
  for (uint32_t i = 0; i < 21; ++i) y.push_back((i * 7 + 2) % static_cast<uint32_t>(vocab));
  for (uint32_t i = 0; i < 7; ++i) z.push_back((i * 5 + 3) % static_cast<uint32_t>(vocab));
  std::vector<double> alone, batched;
  {
    wick::models::PagedKvCache cache = model.make_paged_cache(16, ps);
    auto l1 = model.forward_paged({{x, 0, {3, 4}}}, cache).to_vec_f64();
    auto l2 = model.forward_paged({{{5}, 10, {3, 4}}}, cache).to_vec_f64();
    alone.insert(alone.end(), l1.begin(), l1.end());
    alone.insert(alone.end(), l2.begin(), l2.end());
  }
  {
    wick::models::PagedKvCache cache = model.make_paged_cache(16, ps);
    Tensor l1 = model.forward_paged({{y, 0, {0, 1, 2}}, {x, 0, {9, 7}}, {z, 0, {12}}}, cache);
    Tensor l2 =
        model.forward_paged({{{6}, 21, {0, 1, 2}}, {{5}, 10, {9, 7}}, {{8}, 7, {12}}}, cache);
    auto r1 = l1.get(1).to_vec_f64(), r2 = l2.get(1).to_vec_f64();
    batched.insert(batched.end(), r1.begin(), r1.end());
    batched.insert(batched.end(), r2.begin(), r2.end());
  }
  return {alone, batched};
}

TEST(ServeEngineSmolLM2, QuantizedLogitsOfASequenceAreTheSameBitsInAnyBatch) {
  WICK_REQUIRE_SMOLLM2(path);
  auto model = wick::models::load_causal_lm(path, Device::cpu());
  auto [alone, batched] = alone_and_batched(*model, model->config().vocab_size);
  EXPECT_EQ(alone, batched);
}

// Dense weights (BLAS would change a row's bits with the number of rows): f32, f16 and bf16, the
// Llama and the Qwen2 (q/k/v bias) families.
TEST(PagedForward, DenseLogitsOfASequenceAreTheSameBitsInAnyBatch) {
  for (const char* family : {"tiny_llama", "tiny_qwen2"}) {
    for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
      auto model = wick::models::load_causal_lm(llama_data(family), Device::cpu(), dt);
      auto [alone, batched] = alone_and_batched(*model, 96);
      EXPECT_EQ(alone, batched) << family << " " << dt;
    }
  }
}

}  // namespace

namespace {

// A step budget smaller than the prompts: prefill chunks wait for the decode tokens and share
// what is left; every request still gives what it gives alone.
TEST(ServeEngine, AStepTokenBudgetSplitsPrefillsAndKeepsEveryResult) {
  auto model = tiny_llama();
  serve::EngineOptions o;
  o.max_step_tokens = 4;
  o.prefill_chunk = 3;
  serve::Engine engine(model, nullptr, o);
  std::vector<serve::CompletionRequest> requests;
  for (size_t i = 0; i < 6; ++i) requests.push_back(greedy_request(prompt_of(i + 9), 7));
  std::vector<Result> got = run_all(engine, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i].tokens, generate_alone(model, requests[i].prompt, 7)) << "request " << i;
  }
}

}  // namespace

namespace {

TEST(ServeEngine, CancellingAWaitingRequestEndsItBeforeItStarts) {
  serve::EngineOptions o;
  o.max_batch = 1;
  serve::Engine engine(tiny_llama(), nullptr, o);
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  std::atomic<int> events{0};
  Collector first, second;
  auto cb = first.callback();
  engine.submit(greedy_request({1, 2, 3}, 5), [&, cb](const serve::TokenEvent& e) {
    if (events++ == 0) gate.wait();
    cb(e);
  });
  while (events == 0) std::this_thread::yield();
  const uint64_t id = engine.submit(greedy_request({4, 5, 6}, 5), second.callback());
  engine.cancel(id);
  engine.cancel(id + 100);  // unknown: ignored
  go.set_value();
  Result r = second.wait();
  EXPECT_EQ(r.last.finish, serve::FinishReason::Cancelled);
  EXPECT_TRUE(r.tokens.empty());
  EXPECT_EQ(r.last.completion_tokens, 0u);
  EXPECT_EQ(r.last.first_token_seconds, 0.0);
  EXPECT_EQ(first.wait().tokens.size(), 5u);
  engine.drain();
  serve::EngineStats s = engine.stats();
  EXPECT_EQ(s.requests_done, 2u);
  EXPECT_EQ(s.generated_tokens, 5u);
  // One first token and four gaps between tokens, each counted once in its histogram.
  EXPECT_EQ(s.time_to_first_token.count, 1u);
  EXPECT_EQ(s.inter_token_latency.count, 4u);
  EXPECT_LE(s.inter_token_latency.cumulative.front(), s.inter_token_latency.cumulative.back());
  EXPECT_GT(s.time_to_first_token.sum, 0.0);
  EXPECT_EQ(std::string(serve::finish_reason_name(serve::FinishReason::Length)), "length");
}

}  // namespace

namespace {

// ---- windows and soft-caps in paged attention; the decoder families' batched forward ----

// softmax(cap(scale q k^T)) v of token t over the keys first..pos[t] of its sequence, in
// float64 from the pools' values.
std::vector<double> paged_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::vector<std::vector<uint32_t>>& tables,
                                    const std::vector<uint32_t>& seq,
                                    const std::vector<uint32_t>& pos, double scale, size_t window,
                                    double cap, double* max_score) {
  const size_t t = q.dims()[0], h = q.dims()[1], d = q.dims()[2];
  const size_t h_kv = k.dims()[1], ps = k.dims()[2];
  const auto qv = q.to_vec_f64(), kv = k.to_vec_f64(), vv = v.to_vec_f64();
  std::vector<double> out(t * h * d, 0.0);
  for (size_t i = 0; i < t; ++i) {
    const size_t first = window > 0 && pos[i] + 1 > window ? pos[i] + 1 - window : 0;
    for (size_t hi = 0; hi < h; ++hi) {
      const size_t g = hi / (h / h_kv);
      auto row = [&](const std::vector<double>& pool, size_t j) {
        const size_t page = tables[seq[i]][j / ps];
        return pool.data() + ((page * h_kv + g) * ps + j % ps) * d;
      };
      std::vector<double> sc;
      for (size_t j = first; j <= pos[i]; ++j) {
        double x = 0;
        for (size_t e = 0; e < d; ++e) x += qv[(i * h + hi) * d + e] * row(kv, j)[e];
        x *= scale;
        if (cap > 0) x = cap * std::tanh(x / cap);
        *max_score = std::max(*max_score, std::abs(x));
        sc.push_back(x);
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (size_t j = first; j <= pos[i]; ++j) {
        for (size_t e = 0; e < d; ++e) {
          out[(i * h + hi) * d + e] += sc[j - first] / sum * row(vv, j)[e];
        }
      }
    }
  }
  return out;
}

// Windows shorter and longer than the positions, each soft-cap, the CPU kernel and the composed
// fallback, against float64.
TEST(PagedAttention, WindowsAndSoftCapsWithinTheirBoundOfAFloat64Reference) {
  const size_t h = 4, h_kv = 2, d = 16, ps = 4, pages = 24;
  const std::vector<size_t> lengths = {8, 30, 13};
  auto tables = scattered_tables(lengths, ps, pages);
  std::vector<uint32_t> seq, pos;
  for (uint32_t p = 3; p < 8; ++p) seq.push_back(0), pos.push_back(p);
  seq.push_back(1), pos.push_back(29);
  for (uint32_t p = 0; p < 13; ++p) seq.push_back(2), pos.push_back(p);
  const size_t t = seq.size();
  const Device cpu = Device::cpu();
  for (DType dt : {DType::F64, DType::F32, DType::F16}) {
    Tensor q = wick::testing::random_tensor({t, h, d}, dt, cpu, -1.5, 1.5);
    Tensor k = wick::testing::random_tensor({pages, h_kv, ps, d}, dt, cpu, -1.5, 1.5);
    Tensor v = wick::testing::random_tensor({pages, h_kv, ps, d}, dt);
    Tensor table = table_tensor(tables), seq_t = Tensor::from_vec(seq, {t}, cpu);
    Tensor pos_t = Tensor::from_vec(pos, {t}, cpu);
    const double scale = 1 / std::sqrt(static_cast<double>(d));
    for (size_t window : {size_t{0}, size_t{1}, size_t{6}, size_t{40}}) {
      for (double cap : {0.0, 0.7, 5.0}) {
        SCOPED_TRACE(::testing::Message() << dt << " window " << window << " cap " << cap);
        double max_score = 0;
        auto want = paged_reference(q, k, v, tables, seq, pos, scale, window, cap, &max_score);
        // The score errors (the dot product's d-long sum of |q k| <= 2.25, the scaling and
        // soft-cap roundings, in T where the composition rounds them) move the probabilities by
        // twice as much relative, then a key-long sum and the output's rounding.
        const double u = wick::numerics::unit_roundoff(dt);
        const double uc = wick::numerics::compute_roundoff(dt);
        const double score_error =
            5 * u * max_score + 2 * std::sqrt(double(d)) * uc * 2.25 * d * scale;
        const double bound = 2 * score_error + 2 * std::sqrt(30.0) * uc + 2 * u;
        auto kernel = nn::paged_attention(q, k, v, table, seq_t, pos_t, 0, window, cap);
        EXPECT_LE(wick::testing::max_abs_diff(kernel.to_vec_f64(), want), bound);
        auto composed = wick::fused::PagedAttentionOp(scale, window, cap)
                            .fallback({q, k, v, table, seq_t, pos_t})[0];
        EXPECT_LE(wick::testing::max_abs_diff(composed.to_vec_f64(), want), bound);
        double biggest = 0;
        for (double x : want) biggest = std::max(biggest, std::abs(x));
        EXPECT_GT(biggest, 4 * bound);  // zeros, or another window's outputs, would not pass
      }
    }
  }
  Tensor q = Tensor::ones({1, 4, 16}, DType::F32, cpu);
  Tensor k = Tensor::zeros({2, 2, 4, 16}, DType::F32, cpu);
  auto u32 = [&](uint32_t x) { return Tensor::from_vec(std::vector<uint32_t>{x}, {1}, cpu); };
  Tensor table = Tensor::from_vec(std::vector<uint32_t>{0, 1}, {1, 2}, cpu);
  EXPECT_THROW(nn::paged_attention(q, k, k, table, u32(0), u32(3), 0, 2, -1.0), Error);
  EXPECT_THROW(nn::paged_attention(q, k, k, table, u32(0), u32(3), 0, 2, NAN), Error);
}

std::string family_data(const std::string& name) {
  return std::string(WICK_TEST_DATA_DIR) + "/families/" + name;
}

class FamilyPaged : public ::testing::TestWithParam<std::string> {};

// Both reference prompts (12 tokens, past the window of 8) and an unrelated sequence stepped
// together over one pool: the first prompt prefilled in chunks of 5, the second 9 tokens then one
// at a time, the third two at a time. Every row within 256 f32 roundoffs of the logits' range of
// transformers' (logits.npy) and of the family's own forward_last over one sequence's cache.
TEST_P(FamilyPaged, RaggedBatchStepsGiveTransformersAndPerSequenceLogits) {
  const std::string dir = family_data(GetParam());
  std::shared_ptr<const CausalLM> model = wick::models::load_causal_lm(dir, Device::cpu());
  ASSERT_TRUE(model->has_paged_tensors());
  Tensor prompts = wick::npy::load(dir + "/prompt.npy", Device::cpu());  // (2, 12)
  Tensor ref = wick::npy::load(dir + "/logits.npy", Device::cpu());      // (2, 12, vocab)
  const double bound =
      256 * wick::numerics::unit_roundoff(DType::F32) * wick::testing::range_of(ref.to_vec_f64());
  const size_t n = 12, ps = 4, context = model->config().max_position;
  std::vector<std::vector<uint32_t>> prompt = {to_u32(prompts.get(0)), to_u32(prompts.get(1))};
  std::vector<uint32_t> other;
  for (size_t i = 0; i < 20; ++i) other.push_back(static_cast<uint32_t>((7 * i + 5) % 96));
  wick::models::PagedKvCache cache = model->make_paged_cache(32, ps);
  auto tables = scattered_tables({n, n, other.size()}, ps, 32);
  // Per-sequence caches over the model's context (the rope tables forward_paged uses).
  std::vector<wick::models::KvCache> alone = {model->make_cache(1, context),
                                              model->make_cache(1, context)};
  size_t at[3] = {0, 0, 0};
  while (at[0] < n || at[1] < n) {
    std::vector<PagedSequence> batch;
    std::vector<size_t> which;
    const size_t want[3] = {5, at[1] == 0 ? size_t{9} : size_t{1}, 2};
    for (size_t i = 0; i < 3; ++i) {
      const std::vector<uint32_t>& toks = i < 2 ? prompt[i] : other;
      const size_t len = std::min(want[i], toks.size() - at[i]);
      if (len == 0) continue;
      batch.push_back({std::vector<uint32_t>(toks.begin() + at[i], toks.begin() + at[i] + len),
                       at[i], tables[i]});
      which.push_back(i);
      at[i] += len;
    }
    Tensor logits = model->forward_paged(batch, cache);
    ASSERT_EQ(logits.shape(), (Shape{batch.size(), 96}));
    for (size_t r = 0; r < batch.size(); ++r) {
      const size_t i = which[r];
      if (i == 2) continue;
      auto got = logits.get(r).to_vec_f64();
      EXPECT_LE(wick::testing::max_abs_diff(got, ref.get(i).get(at[i] - 1).to_vec_f64()), bound)
          << "prompt " << i << " at position " << at[i] - 1;
      Tensor ids = Tensor::from_vec(batch[r].tokens, {1, batch[r].tokens.size()}, Device::cpu());
      auto own = model->forward_last(ids, alone[i]).to_vec_f64();
      EXPECT_LE(wick::testing::max_abs_diff(got, own), bound)
          << "prompt " << i << " at position " << at[i] - 1 << " against forward_last";
    }
  }
}

// A sequence's logits are the same bits alone as among others, prefilling (10 tokens, past the
// window) and decoding, in each float dtype.
TEST_P(FamilyPaged, LogitsOfASequenceAreTheSameBitsInAnyBatch) {
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    auto model = wick::models::load_causal_lm(family_data(GetParam()), Device::cpu(), dt);
    auto [alone, batched] = alone_and_batched(*model, 96);
    EXPECT_EQ(alone, batched) << dt;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyPaged,
                         ::testing::Values("qwen3", "mistral", "phi3", "gemma2", "gemma3_text",
                                           "phi3_partial", "phi3_partial_longrope"));

// A family's test GGUF with random Q8_0 blocks for every projection and the output head (one
// added where the head is tied to the embedding) and its FFN 64 wide (Q8_0 rows are blocks of
// 32), with `edits` to its metadata (nullopt erases the key); written, loaded on the CPU and
// removed. The CPU decode plan takes such a model.
std::shared_ptr<const CausalLM> quantized_family(
    const std::string& family,
    const std::map<std::string, std::optional<wick::gguf::Value>>& edits) {
  wick::gguf::File f = wick::gguf::File::open(family_data(family) + "/model.gguf");
  const std::string arch = f.get_string("general.architecture");
  const size_t ffn = 64;
  std::map<std::string, Tensor> dense;
  std::map<std::string, wick::QTensor> blocks;
  for (const std::string& name : f.tensor_names()) {
    Tensor t = f.get(name);
    if (t.rank() != 2 || name == "token_embd.weight") {
      dense[name] = t;
      continue;
    }
    size_t n = t.dims()[0], k = t.dims()[1];
    // Phi-3's ffn_up holds gate and up rows; the others have ffn_gate and ffn_up of ffn rows.
    if (name.find("ffn_up") != std::string::npos) n = arch == "phi3" ? 2 * ffn : ffn;
    if (name.find("ffn_gate") != std::string::npos) n = ffn;
    if (name.find("ffn_down") != std::string::npos) k = ffn;
    blocks[name] = wick::testing::random_qtensor(wick::GgmlType::Q8_0, n, k);
  }
  if (!blocks.count("output.weight")) {
    const Tensor& embed = dense.at("token_embd.weight");
    blocks["output.weight"] =
        wick::testing::random_qtensor(wick::GgmlType::Q8_0, embed.dims()[0], embed.dims()[1]);
  }
  std::map<std::string, wick::gguf::Value> metadata(f.metadata().begin(), f.metadata().end());
  metadata[arch + ".feed_forward_length"] = wick::gguf::Value::u64(ffn, wick::gguf::ValueType::U32);
  for (const auto& [key, value] : edits) {
    metadata.erase(key);
    if (value) metadata[key] = *value;
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("wick_" + family + "_q8.gguf")).string();
  wick::gguf::save(dense, path, metadata, blocks);
  std::shared_ptr<const CausalLM> model = wick::models::load_causal_lm(path, Device::cpu());
  std::remove(path.c_str());
  return model;
}

// The plan taken, and a decode token through its paged step gets the bits the family's composed
// step of a larger batch gives it; over a plain cache, forward_last of one token (the plan's
// host step, windows, scales and score caps in its attention) gives forward's logits within 64
// f32 roundoffs of their range (another attention kernel: other bits).
void expect_plan_with_the_batchs_bits(const CausalLM& model) {
  const auto* decoder = dynamic_cast<const wick::models::decoder::Decoder*>(&model);
  ASSERT_NE(decoder, nullptr);
  EXPECT_TRUE(decoder->has_decode_plan());
  auto [alone, batched] = alone_and_batched(model, 96);
  ASSERT_EQ(alone.size(), 2 * 96u);
  EXPECT_GT(wick::testing::range_of(alone), 0.0);
  EXPECT_EQ(alone, batched);
  std::vector<uint32_t> prompt;
  for (uint32_t i = 0; i < 10; ++i) prompt.push_back((i * 13 + 1) % 96);
  Tensor ids = Tensor::from_vec(prompt, {1, prompt.size()}, Device::cpu());
  Tensor token = Tensor::from_vec(std::vector<uint32_t>{5}, {1, 1}, Device::cpu());
  wick::models::KvCache a = model.make_cache(1, 16), b = model.make_cache(1, 16);
  model.forward(ids, a);
  model.forward(ids, b);
  const std::vector<double> step = model.forward_last(token, a).to_vec_f64();
  const std::vector<double> want = model.forward(token, b).to_vec_f64();
  EXPECT_EQ(a.length(), 11u);
  EXPECT_LE(wick::testing::max_abs_diff(step, want),
            64 * wick::numerics::unit_roundoff(DType::F32) * wick::testing::range_of(want));
}

// The CPU decode plan for Phi-3's layout, partial rotary and sliding windows included
// (Phi-4-mini: quantized projections, the first dims of each head rotating): rotating 4, 6 and
// all 8 of each head's dims, without a window and with windows of 4 (shorter than the decode
// token's 10 earlier keys) and 8.
TEST(FamilyPaged, QuantizedPhi3TakesThePlanWithTheBatchsBits) {
  for (auto [rotated, window] :
       {std::pair<uint64_t, uint64_t>{4, 0}, {6, 0}, {8, 0}, {6, 4}, {8, 8}}) {
    SCOPED_TRACE("rotating " + std::to_string(rotated) + " of 8 dims, window " +
                 std::to_string(window));
    using wick::gguf::Value, wick::gguf::ValueType;
    expect_plan_with_the_batchs_bits(*quantized_family(
        "phi3_partial",
        {{"phi3.attention.sliding_window",
          window > 0 ? std::optional(Value::u64(window, ValueType::U32)) : std::nullopt},
         {"phi3.rope.dimension_count", Value::u64(rotated, ValueType::U32)}}));
  }
}

// The same for Qwen3's layout (per-head q/k RMS norms before rope): the plan normalises each
// head as Tensor::rms_norm does.
TEST(FamilyPaged, QuantizedQwen3TakesThePlanWithTheBatchsBits) {
  expect_plan_with_the_batchs_bits(*quantized_family("qwen3", {}));
}

// Gemma 3's layout in the CPU plan: the scaled embedding, the post-norms after attention and
// the FFN, the GELU gate, q/k head norms and the local layers' own rope tables.
TEST(FamilyPaged, QuantizedGemma3TakesThePlanWithTheBatchsBits) {
  expect_plan_with_the_batchs_bits(*quantized_family("gemma3_text", {}));
}

// Gemma 2's: scores scaled by query_pre_attn_scalar and soft-capped (both steps' attention takes
// them, with and without the window), the final logits capped after the plan's head; and without
// the score cap and scale.
TEST(FamilyPaged, QuantizedGemma2TakesThePlanWithTheBatchsBits) {
  auto model = quantized_family("gemma2", {});
  // (The file caps the final logits at 3.)
  wick::models::KvCache cache = model->make_cache(1, 4);
  Tensor ids = Tensor::from_vec(std::vector<uint32_t>{3, 1, 4}, {1, 3}, Device::cpu());
  for (double v : model->forward(ids, cache).to_vec_f64()) EXPECT_LE(std::abs(v), 3.0);
  expect_plan_with_the_batchs_bits(*model);
  expect_plan_with_the_batchs_bits(
      *quantized_family("gemma2", {{"gemma2.attention.sliding_window", std::nullopt}}));
  expect_plan_with_the_batchs_bits(*quantized_family(
      "gemma2",
      {{"gemma2.attn_logit_softcapping", std::nullopt}, {"gemma2.attention.scale", std::nullopt}}));
}

TEST(FamilyPaged, Errors) {
  auto model = wick::models::load_causal_lm(family_data("gemma2"), Device::cpu());
  const Device cpu = Device::cpu();
  wick::models::PagedKvCache cache = model->make_paged_cache(4, 4);
  std::vector<PagedSequence> batch = {{{1, 2, 3}, 0, {2}}};
  EXPECT_THROW(model->forward_paged({{{1, 2, 3, 4, 5}, 0, {0}}}, cache), wick::IndexOutOfRange);
  EXPECT_THROW(model->forward_paged({{{96}, 0, {0}}}, cache), wick::IndexOutOfRange);
  wick::models::PagedKvCache plain = model->CausalLM::make_paged_cache(4, 4);
  EXPECT_THROW(model->forward_paged(batch, plain), wick::ShapeMismatch);
  wick::models::PagedBatchTensors b = wick::models::paged_batch_tensors(batch, 4, cpu);
  EXPECT_EQ(to_u32(b.slots), (std::vector<uint32_t>{8, 9, 10}));
  EXPECT_EQ(to_u32(b.last), (std::vector<uint32_t>{2}));
  EXPECT_NO_THROW(model->forward_paged_tensors(b, cache));
  wick::models::PagedBatchTensors bad = b;
  bad.last = Tensor::from_vec(std::vector<uint32_t>{0, 1}, {2}, cpu);
  EXPECT_THROW(model->forward_paged_tensors(bad, cache), wick::ShapeMismatch);
  bad = b;
  bad.positions = b.positions.to_dtype(DType::I64);
  EXPECT_THROW(model->forward_paged_tensors(bad, cache), wick::ShapeMismatch);
  EXPECT_THROW(wick::models::paged_batch_tensors({{{1}, 4, {0, 1}}}, 4, cpu, 1),
               wick::IndexOutOfRange);
}

}  // namespace

namespace {

// ---- decode steps padded to a batch-size bucket (src/serve/decode_graphs.h) ----

TEST(DecodeGraphs, BucketsAndThePackedInputs) {
  EXPECT_EQ(serve::decode_bucket(1), 1u);
  EXPECT_EQ(serve::decode_bucket(2), 2u);
  EXPECT_EQ(serve::decode_bucket(3), 4u);
  EXPECT_EQ(serve::decode_bucket(64), 64u);
  EXPECT_EQ(serve::decode_bucket(65), 128u);
  // Two sequences in a bucket of 4, tables 3 pages wide, pages of 4, scratch page 9.
  auto in = serve::decode_inputs({{{5}, 6, {3, 1}}, {{7}, 0, {2}}}, 4, 3, 4, 9);
  const std::vector<uint32_t> want = {
      5,         7,     0,     0,      // ids
      6,         0,     0,     0,      // positions
      0,         1,     2,     3,      // token_seq
      1 * 4 + 2, 2 * 4, 9 * 4, 9 * 4,  // slots: position 6 is page 1 row 2; padding: scratch
      0,         1,     2,     3,      // last
      3,         1,     9,     2,     9, 9,
      9,         9,     9,     9,     9, 9,  // tables, padded with the scratch page
  };
  EXPECT_EQ(in, want);
  EXPECT_THROW(serve::decode_inputs({{{5}, 0, {1}}, {{7}, 0, {2}}}, 1, 3, 4, 9), Error);
  EXPECT_THROW(serve::decode_inputs({{{5, 6}, 0, {1}}}, 1, 3, 4, 9), Error);
  EXPECT_THROW(serve::decode_inputs({{{5}, 0, {1, 2, 3, 4}}}, 1, 3, 4, 9), Error);
}

// Decode steps of a ragged run (batches of 1 to 7 in buckets of 1 to 8) padded as the graphs pad
// them give the same bits as the unpadded batch (the CPU's rows do not depend on the batch), and
// the padding writes the scratch page alone.
TEST(DecodeGraphs, PaddedStepsAreTheSameBitsAsTheBatchAndWriteOnlyTheScratchPage) {
  for (const std::string& path : {llama_data("tiny_llama"), family_data("gemma2")}) {
    SCOPED_TRACE(path);
    std::shared_ptr<const CausalLM> model = wick::models::load_causal_lm(path, Device::cpu());
    const size_t ps = 4, pages = 64, scratch = 63;
    wick::models::PagedKvCache cache = model->make_paged_cache(pages, ps);
    serve::DecodeGraphs graphs(model, cache, scratch, 8);
    // The scratch page poisoned: padding rows overwrite its row 0.
    for (size_t l = 0; l < cache.layers(); ++l) {
      Tensor page = cache.k(l).narrow(0, scratch, 1);
      page.assign(Tensor::ones(page.shape(), page.dtype(), Device::cpu()).affine(7, 0));
    }
    std::vector<std::vector<uint32_t>> tokens(7), tables(7);
    for (size_t i = 0; i < 7; ++i) {
      for (size_t j = 0; j < 2 + i; ++j) tokens[i].push_back(static_cast<uint32_t>(i * 11 + j));
      for (size_t p = 0; p < 6; ++p) tables[i].push_back(static_cast<uint32_t>(i * 6 + p));
      model->forward_paged({{tokens[i], 0, tables[i]}}, cache);
    }
    const std::vector<std::vector<size_t>> steps = {
        {0}, {0, 1}, {0, 1, 2, 3, 4}, {1, 2, 3, 4, 5, 6}, {2, 6}, {4, 5, 6}, {5}};
    for (const auto& members : steps) {
      std::vector<PagedSequence> batch;
      for (size_t i : members)
        batch.push_back({{tokens[i].back()}, tokens[i].size() - 1, tables[i]});
      // Each member re-feeds its last token at its last position: the keys written are the same.
      ASSERT_TRUE(graphs.fits(batch));
      Tensor padded = graphs.run(batch, false);
      Tensor plain = model->forward_paged(batch, cache);
      EXPECT_EQ(padded.to_vec_f64(), plain.to_vec_f64()) << members.size() << " sequences";
      for (size_t r = 0; r < members.size(); ++r) {
        tokens[members[r]].push_back(static_cast<uint32_t>((members[r] * 5 + r) % 96));
      }
    }
    for (size_t l = 0; l < cache.layers(); ++l) {
      for (size_t p = 42; p < pages; ++p) {
        const double written = cache.k(l).get(p).abs().sum_all().to_vec_f64()[0];
        if (p == scratch) {
          EXPECT_NE(cache.k(l).get(p).narrow(1, 0, 1).to_vec_f64(),
                    std::vector<double>(cache.k(l).get(p).narrow(1, 0, 1).elem_count(), 7.0));
          EXPECT_EQ(cache.k(l).get(p).narrow(1, 1, 3).to_vec_f64(),
                    std::vector<double>(cache.k(l).get(p).narrow(1, 1, 3).elem_count(), 7.0));
        } else {
          EXPECT_EQ(written, 0.0) << "page " << p;
        }
      }
    }
    EXPECT_FALSE(graphs.fits({{{1, 2}, 0, {0}}}));
    EXPECT_THROW(graphs.run({{{1}, 4, {0}}}, false), wick::IndexOutOfRange);
    // A graph needs a CUDA device.
    EXPECT_THROW(graphs.run({{{1}, 0, {0}}}, true), Error);
    EXPECT_EQ(graphs.graphs(), 0u);
  }
}

// Greedy steps queued ahead (run_greedy, as the engine's lookahead runs them; here op by op on the
// CPU) give the tokens of the same steps run one at a time, each fed the argmax of the one before,
// and write the same keys; a run past a sequence's pages is refused.
TEST(DecodeGraphs, GreedyStepsQueuedAheadEqualStepsOneAtATime) {
  for (const std::string& path : {llama_data("tiny_llama"), family_data("gemma2")}) {
    SCOPED_TRACE(path);
    std::shared_ptr<const CausalLM> model = wick::models::load_causal_lm(path, Device::cpu());
    const size_t ps = 4, pages = 32, scratch = 31, steps = 5;
    wick::models::PagedKvCache ahead = model->make_paged_cache(pages, ps);
    wick::models::PagedKvCache one = model->make_paged_cache(pages, ps);
    serve::DecodeGraphs graphs(model, ahead, scratch, 8);
    std::vector<PagedSequence> batch;
    for (size_t i = 0; i < 3; ++i) {
      std::vector<uint32_t> prompt;
      for (size_t j = 0; j < 3 + 2 * i; ++j) prompt.push_back(static_cast<uint32_t>(i * 13 + j));
      std::vector<uint32_t> table;
      for (size_t p = 0; p < 4; ++p) table.push_back(static_cast<uint32_t>(i * 4 + p));
      for (auto* cache : {&ahead, &one}) {
        model->forward_paged({{std::vector<uint32_t>(prompt.begin(), prompt.end() - 1), 0, table}},
                             *cache);
      }
      batch.push_back({{prompt.back()}, prompt.size() - 1, table});
    }
    // Three steps, then two queued after them (fed their last tokens on the device, the batch's
    // own tokens placeholders) before the first three are read.
    const serve::DecodeGraphs::QueuedSteps first = graphs.queue_greedy(batch, 3, false);
    std::vector<PagedSequence> later = batch;
    for (PagedSequence& s : later) {
      s.tokens = {0};
      s.cached += 3;
    }
    const serve::DecodeGraphs::QueuedSteps second = graphs.queue_greedy(later, 2, false, &first);
    std::vector<uint32_t> got = serve::DecodeGraphs::read_greedy(first);
    const std::vector<uint32_t> rest = serve::DecodeGraphs::read_greedy(second);
    got.insert(got.end(), rest.begin(), rest.end());
    ASSERT_EQ(got.size(), steps * batch.size());
    std::vector<PagedSequence> step = batch;
    std::vector<uint32_t> want;
    for (size_t j = 0; j < steps; ++j) {
      std::vector<uint32_t> next = model->forward_paged(step, one).argmax(1).to_vec1<uint32_t>();
      want.insert(want.end(), next.begin(), next.end());
      for (size_t i = 0; i < step.size(); ++i) {
        step[i].tokens = {next[i]};
        ++step[i].cached;
      }
    }
    EXPECT_EQ(got, want);
    for (size_t l = 0; l < ahead.layers(); ++l) {
      EXPECT_EQ(ahead.k(l).narrow(0, 0, 12).to_vec_f64(), one.k(l).narrow(0, 0, 12).to_vec_f64());
      EXPECT_EQ(ahead.v(l).narrow(0, 0, 12).to_vec_f64(), one.v(l).narrow(0, 0, 12).to_vec_f64());
    }
    // The third sequence stands at position 6 of its 16: 10 steps fit, 11 need 17.
    EXPECT_NO_THROW(graphs.run_greedy(batch, 10, false));
    EXPECT_THROW(graphs.run_greedy(batch, 11, false), wick::IndexOutOfRange);
  }
}

TEST(DecodeGraphs, TheEngineOnTheCpuReplaysNoGraph) {
  serve::EngineOptions o;
  o.cuda_graphs = true;
  serve::Engine engine(tiny_llama(), nullptr, o);
  Collector c;
  engine.submit(greedy_request(prompt_of(1), 6), c.callback());
  EXPECT_EQ(c.wait().tokens, generate_alone(tiny_llama(), prompt_of(1), 6));
  engine.drain();
  EXPECT_EQ(engine.stats().graph_steps, 0u);
}

}  // namespace
