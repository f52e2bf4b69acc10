// The serving engine's decode steps as CUDA graphs (src/serve/decode_graphs.h): over a ragged run
// (sequences joining after their prefill and leaving, the batch moving between buckets), each
// replayed step gives the same bits as the same padded step run eagerly, and (f32) the CPU's
// logits of the same batches within bound; the engine with graphs gives each request what the
// engine without them gives. The eager steps run in the queue's own graph mode (on by default):
// their batches change kernels, launch shapes and input sizes from one bucket to the next, which
// the queue's graph cache must tell apart (src/cuda/graph.cpp, structure_key; the bf16 steps of
// bucket 8 computed other logits when it did not).

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "serve/decode_graphs.h"
#include "test_util.h"
#include "wick/cuda.h"
#include "wick/models.h"
#include "wick/numerics.h"
#include "wick/serve.h"

namespace wick {
namespace {

using models::PagedSequence;
using testing::max_abs_diff;

const Device cpu = Device::cpu();

Device gpu() {
  return Device::cuda(0);
}

struct Live {
  std::vector<uint32_t> tokens;  // prompt, then the greedy tokens
  size_t cached = 0;
  std::vector<uint32_t> pages;
  size_t leave_at = 0;  // the step after which it leaves
};

std::vector<uint32_t> argmax_rows(const Tensor& logits) {
  std::vector<uint32_t> out;
  for (double x : logits.argmax(1).to_device(cpu).to_vec_f64()) {
    out.push_back(static_cast<uint32_t>(x));
  }
  return out;
}

// Sequence i joins at step join[i] (its prompt prefilled eagerly by forward_paged, on the GPU and
// on the CPU) and decodes until leave[i]; the decode steps between run through DecodeGraphs.
void ragged_run(const std::string& path, DType dt, bool compare_cpu) {
  SCOPED_TRACE(::testing::Message() << path << " " << dt);
  std::shared_ptr<const models::CausalLM> model = models::load_causal_lm(path, gpu(), dt);
  std::shared_ptr<const models::CausalLM> host = models::load_causal_lm(path, cpu, dt);
  const size_t ps = 4, pages = 96, scratch = pages - 1;
  models::PagedKvCache cache = model->make_paged_cache(pages, ps);
  models::PagedKvCache host_cache = host->make_paged_cache(pages, ps);
  serve::DecodeGraphs graphs(model, cache, static_cast<uint32_t>(scratch), 16);
  // Batch sizes 1, 2, 4, 7, 10, 11, 9, 7, 5, 3, 1 over the steps: buckets 1 to 16 and back.
  const std::vector<size_t> join = {0, 1, 2, 2, 3, 3, 3, 4, 4, 4, 5};
  const std::vector<size_t> leave = {10, 6, 8, 5, 9, 7, 6, 8, 7, 5, 9};
  std::vector<Live> seqs(join.size());
  uint32_t next_page = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (size_t j = 0; j < 3 + i % 5; ++j) {
      seqs[i].tokens.push_back(static_cast<uint32_t>((i * 17 + j * 5 + 1) % 96));
    }
    for (size_t p = 0; p < 8; ++p) seqs[i].pages.push_back(next_page++);
    seqs[i].leave_at = leave[i];
  }
  ASSERT_LT(next_page, scratch);
  const double u32_bound_scale = 256 * numerics::unit_roundoff(DType::F32);
  for (size_t step = 0; step <= 10; ++step) {
    // New sequences prefill their prompt but its last token.
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (join[i] != step) continue;
      Live& s = seqs[i];
      std::vector<PagedSequence> prefill = {
          {std::vector<uint32_t>(s.tokens.begin(), s.tokens.end() - 1), 0, s.pages}};
      model->forward_paged(prefill, cache);
      if (compare_cpu) host->forward_paged(prefill, host_cache);
      s.cached = s.tokens.size() - 1;
    }
    std::vector<PagedSequence> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (join[i] <= step && step <= seqs[i].leave_at) {
        batch.push_back({{seqs[i].tokens.back()}, seqs[i].cached, seqs[i].pages});
        who.push_back(i);
      }
    }
    if (batch.empty()) continue;
    SCOPED_TRACE(::testing::Message() << "step " << step << ", " << batch.size() << " sequences");
    ASSERT_TRUE(graphs.fits(batch));
    Tensor replayed = graphs.run(batch, true).to_device(cpu);
    Tensor eager = graphs.run(batch, false).to_device(cpu);
    ASSERT_EQ(replayed.shape(), (Shape{batch.size(), model->config().vocab_size}));
    EXPECT_EQ(replayed.to_vec_f64(), eager.to_vec_f64());
    if (compare_cpu) {
      Tensor want = host->forward_paged(batch, host_cache);
      const double bound = u32_bound_scale * testing::range_of(want.to_vec_f64());
      EXPECT_LE(max_abs_diff(replayed.to_vec_f64(), want.to_vec_f64()), bound);
    }
    std::vector<uint32_t> next = argmax_rows(replayed);
    for (size_t r = 0; r < who.size(); ++r) {
      seqs[who[r]].tokens.push_back(next[r]);
      ++seqs[who[r]].cached;
    }
  }
  EXPECT_GE(graphs.graphs(), 5u);  // buckets 1, 2, 4, 8 and 16
}

TEST(CudaServeGraphs, ReplayIsTheSameBitsAsEagerOverARaggedRun) {
  WICK_REQUIRE_GPU();
  // The same GEMM for the capture and the eager steps (Auto may switch to cuBLASLt between).
  const CudaMatmulPath path = cuda_matmul_path();
  cuda_set_matmul_path(CudaMatmulPath::Cublas);
  const std::string data = WICK_TEST_DATA_DIR;
  ragged_run(data + "/llama/tiny_llama", DType::F32, true);
  ragged_run(data + "/llama/tiny_qwen2", DType::BF16, false);
  ragged_run(data + "/families/gemma2", DType::F32, true);
  ragged_run(data + "/families/qwen3", DType::BF16, false);
  cuda_set_matmul_path(path);
}

TEST(CudaServeGraphs, InputsOfTheWrongShapeAreRefused) {
  WICK_REQUIRE_GPU();
  std::shared_ptr<const models::CausalLM> model =
      models::load_causal_lm(std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama", gpu());
  models::PagedKvCache cache = model->make_paged_cache(8, 4);
  EXPECT_THROW(serve::DecodeGraphs(model, cache, 8, 4), IndexOutOfRange);
  serve::DecodeGraphs graphs(model, cache, 7, 4);
  EXPECT_FALSE(graphs.fits({{{1, 2}, 0, {0}}}));
  EXPECT_THROW(graphs.run({{{1, 2}, 0, {0}}}, true), Error);
  EXPECT_THROW(graphs.run({{{1}, 4, {0}}}, true), IndexOutOfRange);  // no page for position 4
  EXPECT_EQ(graphs.graphs(), 0u);
}

// Twelve greedy requests of different lengths at once: with graphs, the decode steps replay
// (graph_steps counts them) and each request gets the tokens it gets without them.
// Twelve greedy requests of different prompts and lengths through an engine; each one's tokens
// and how it finished.
struct Served {
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<serve::FinishReason> finish;
  serve::EngineStats stats;
};

Served serve_twelve(const std::shared_ptr<const models::CausalLM>& model,
                    const serve::EngineOptions& o, const std::vector<uint32_t>& stop_tokens) {
  serve::Engine engine(model, nullptr, o);
  Served out;
  out.tokens.resize(12);
  out.finish.assign(12, serve::FinishReason::None);
  std::mutex mutex;
  std::condition_variable cv;
  for (size_t i = 0; i < 12; ++i) {
    serve::CompletionRequest r;
    for (size_t j = 0; j < 3 + (i * 5) % 17; ++j) {
      r.prompt.push_back(static_cast<uint32_t>((i * 31 + j * 7 + 3) % 96));
    }
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 6 + i;
    r.sampling.stop_tokens = {stop_tokens.empty() ? 9999 : stop_tokens[i]};
    engine.submit(r, [&, i](const serve::TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mutex);
      if (e.finish == serve::FinishReason::None) {
        out.tokens[i].push_back(e.token);
      } else {
        EXPECT_TRUE(e.error.empty()) << e.error;
        out.finish[i] = e.finish;
        cv.notify_all();
      }
    });
  }
  std::unique_lock<std::mutex> lock(mutex);
  cv.wait(lock, [&] {
    return std::none_of(out.finish.begin(), out.finish.end(),
                        [](serve::FinishReason f) { return f == serve::FinishReason::None; });
  });
  lock.unlock();
  engine.drain();
  out.stats = engine.stats();
  return out;
}

// With graphs or without, and with greedy steps queued ahead or a read-back every step, each
// request gets the same tokens.
TEST(CudaServeGraphs, EngineGivesEachRequestWhatItGivesWithoutGraphs) {
  WICK_REQUIRE_GPU();
  std::shared_ptr<const models::CausalLM> model =
      models::load_causal_lm(std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama", gpu());
  auto options = [](bool graphs, size_t lookahead) {
    serve::EngineOptions o;
    o.cuda_graphs = graphs;
    o.prefill_chunk = 4;
    o.greedy_lookahead = lookahead;
    return o;
  };
  const Served plain = serve_twelve(model, options(false, 1), {});
  EXPECT_EQ(plain.stats.graph_steps, 0u);
  EXPECT_EQ(plain.stats.steps_ahead, 0u);
  for (bool graphs : {true, false}) {
    // 3: windows of steps queued one after another, each before the one before is read.
    for (size_t lookahead : {size_t{1}, size_t{3}, size_t{8}}) {
      SCOPED_TRACE(::testing::Message() << "graphs " << graphs << ", lookahead " << lookahead);
      const Served a = serve_twelve(model, options(graphs, lookahead), {});
      EXPECT_EQ(a.stats.graph_steps > 0, graphs);
      EXPECT_EQ(a.stats.steps_ahead > 0, lookahead > 1);
      for (size_t i = 0; i < 12; ++i) {
        EXPECT_EQ(a.tokens[i].size(), 6 + i);
        EXPECT_EQ(a.finish[i], serve::FinishReason::Length);
        EXPECT_EQ(a.tokens[i], plain.tokens[i]) << "request " << i;
      }
    }
  }
}

// Steps queued ahead past a request's stop token: the request ends at that token, as it does with
// a read-back every step, and the tokens after it are never sent.
TEST(CudaServeGraphs, StepsQueuedAheadEndEachRequestAtItsStopToken) {
  WICK_REQUIRE_GPU();
  std::shared_ptr<const models::CausalLM> model =
      models::load_causal_lm(std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama", gpu());
  serve::EngineOptions o;
  o.prefill_chunk = 4;
  o.greedy_lookahead = 1;
  const Served free_run = serve_twelve(model, o, {});
  // Each request's third token stops it.
  std::vector<uint32_t> stops;
  for (const auto& t : free_run.tokens) stops.push_back(t.at(2));
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "graphs " << graphs);
    o.cuda_graphs = graphs;
    o.greedy_lookahead = 8;
    const Served a = serve_twelve(model, o, stops);
    EXPECT_GT(a.stats.steps_ahead, 0u);
    for (size_t i = 0; i < 12; ++i) {
      const auto& all = free_run.tokens[i];
      const size_t first =
          static_cast<size_t>(std::find(all.begin(), all.end(), stops[i]) - all.begin());
      EXPECT_EQ(a.finish[i], serve::FinishReason::Stop) << "request " << i;
      EXPECT_EQ(a.tokens[i], std::vector<uint32_t>(all.begin(), all.begin() + first))
          << "request " << i;
    }
  }
}

}  // namespace
}  // namespace wick
