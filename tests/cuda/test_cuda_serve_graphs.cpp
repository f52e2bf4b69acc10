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
TEST(CudaServeGraphs, EngineGivesEachRequestWhatItGivesWithoutGraphs) {
  WICK_REQUIRE_GPU();
  std::shared_ptr<const models::CausalLM> model =
      models::load_causal_lm(std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama", gpu());
  auto run = [&](bool graphs, serve::EngineStats* stats) {
    serve::EngineOptions o;
    o.cuda_graphs = graphs;
    o.prefill_chunk = 4;
    serve::Engine engine(model, nullptr, o);
    std::vector<std::vector<uint32_t>> out(12);
    std::vector<bool> done(12, false);
    std::mutex mutex;
    std::condition_variable cv;
    for (size_t i = 0; i < 12; ++i) {
      serve::CompletionRequest r;
      for (size_t j = 0; j < 3 + (i * 5) % 17; ++j) {
        r.prompt.push_back(static_cast<uint32_t>((i * 31 + j * 7 + 3) % 96));
      }
      r.sampling.temperature = 0;
      r.sampling.max_tokens = 6 + i;
      r.sampling.stop_tokens = {9999};
      engine.submit(r, [&, i](const serve::TokenEvent& e) {
        std::lock_guard<std::mutex> lock(mutex);
        if (e.finish == serve::FinishReason::None) {
          out[i].push_back(e.token);
        } else {
          EXPECT_EQ(e.finish, serve::FinishReason::Length) << e.error;
          done[i] = true;
          cv.notify_all();
        }
      });
    }
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); });
    lock.unlock();
    engine.drain();
    *stats = engine.stats();
    return out;
  };
  serve::EngineStats with, without;
  auto a = run(true, &with), b = run(false, &without);
  EXPECT_GT(with.graph_steps, 0u);
  EXPECT_EQ(without.graph_steps, 0u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(a[i].size(), 6 + i);
    EXPECT_EQ(a[i], b[i]) << "request " << i;
  }
}

}  // namespace
}  // namespace wick
