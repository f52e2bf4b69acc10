// Serving throughput of serve::Engine (continuous batching over the paged KV cache) at several
// numbers of concurrent streams, beside a Generator's single-stream decode of the same model in
// the same run: aggregate output tok/s, p50/p99 time to first token and inter-token latency.
// WICK_BATCH_INVARIANT=0 in the environment measures the non-invariant dense projections;
// --compare-invariant adds rows under wick::set_batch_invariant(true) (wick-serve
// --deterministic), interleaved with the default's; --temperature above 0 samples each stream
// with its own seed (the cost of sampling).
//
//   bench_serve_engine --model PATH [--device cpu|cuda] [--dtype f32] [--streams 1,4,16,64]
//                      [--prompt-len 32] [--new 64] [--dequantize] [--per-sequence]
//                      [--compare-graphs] [--compare-invariant] [--temperature 0] [--top-p 1]

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/tuning_env.h"
#include "wick/generator.h"
#include "wick/llama.h"
#include "wick/serve.h"
#include "wick/wick.h"

namespace {

using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

std::vector<uint32_t> prompt_for(size_t stream, size_t len, size_t vocab) {
  std::vector<uint32_t> p;
  for (size_t i = 0; i < len; ++i) {
    p.push_back(static_cast<uint32_t>((stream * 7919 + i * 104729 + 13) % (vocab - 1) + 1));
  }
  return p;
}

// The model with CausalLM's default forward_paged (each sequence alone through a KvCache gathered
// from its pages): the engine as it runs a family without its own batched forward.
class PerSequence final : public wick::models::CausalLM {
 public:
  explicit PerSequence(std::shared_ptr<const wick::models::CausalLM> m) : m_(std::move(m)) {}
  const wick::models::CausalLMConfig& config() const override { return m_->config(); }
  wick::Device device() const override { return m_->device(); }
  wick::DType dtype() const override { return m_->dtype(); }
  wick::models::KvCache make_cache(size_t batch, size_t max_len) const override {
    return m_->make_cache(batch, max_len);
  }
  wick::Tensor forward(const wick::Tensor& ids, wick::models::KvCache& cache) const override {
    return m_->forward(ids, cache);
  }
  wick::Tensor forward_last(const wick::Tensor& ids, wick::models::KvCache& cache) const override {
    return m_->forward_last(ids, cache);
  }

 private:
  std::shared_ptr<const wick::models::CausalLM> m_;
};

struct Run {
  double tok_s = 0, ttft_p50 = 0, ttft_p99 = 0, itl_p50 = 0, itl_p99 = 0;
  double decode_tok_s = 0;  // tokens after each stream's first, per second after the first one
};

// How the streams pick their tokens: greedy at temperature 0, greedy steps queued `lookahead` at
// a time (EngineOptions::greedy_lookahead); and the engine's pages of page_size positions (0:
// serve::preferred_page_size).
struct Sampling {
  double temperature = 0;
  double top_p = 1;
  size_t lookahead = wick::serve::EngineOptions{}.greedy_lookahead;
  size_t page_size = 0;
};

Run run_streams(const std::shared_ptr<const wick::models::CausalLM>& model, size_t streams,
                size_t prompt_len, size_t new_tokens, const Sampling& sampling,
                bool graphs = false) {
  wick::serve::EngineOptions o;
  o.max_batch = std::max<size_t>(streams, 1);
  o.cuda_graphs = graphs;
  o.greedy_lookahead = sampling.lookahead;
  o.page_size = sampling.page_size != 0 ? sampling.page_size
                                        : wick::serve::preferred_page_size(model->device());
  wick::serve::Engine engine(model, nullptr, o);
  std::mutex mu;
  std::condition_variable cv;
  size_t done = 0, tokens = 0;
  std::vector<double> ttft, itl;
  std::vector<Clock::time_point> last(streams);
  const Clock::time_point t0 = Clock::now();
  for (size_t s = 0; s < streams; ++s) {
    wick::serve::CompletionRequest r;
    r.prompt = prompt_for(s, prompt_len, model->config().vocab_size);
    r.sampling.temperature = sampling.temperature;
    r.sampling.top_p = sampling.top_p;
    r.sampling.seed = s + 1;
    r.sampling.max_tokens = new_tokens;
    r.sampling.stop_tokens = {0xffffffffu};
    engine.submit(r, [&, s](const wick::serve::TokenEvent& e) {
      const Clock::time_point now = Clock::now();
      std::lock_guard<std::mutex> lock(mu);
      if (e.finish != wick::serve::FinishReason::None) {
        ++done;
        cv.notify_all();
        return;
      }
      if (tokens == 0 || last[s] == Clock::time_point{}) {
        ttft.push_back(std::chrono::duration<double>(now - t0).count());
      } else {
        itl.push_back(std::chrono::duration<double>(now - last[s]).count());
      }
      last[s] = now;
      ++tokens;
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == streams; });
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  Run r;
  r.tok_s = static_cast<double>(tokens) / secs;
  double itl_sum = 0;
  for (double v : itl) itl_sum += v;
  r.decode_tok_s =
      itl_sum > 0 ? static_cast<double>(itl.size()) * static_cast<double>(streams) / itl_sum : 0;
  r.ttft_p50 = percentile(ttft, 0.5);
  r.ttft_p99 = percentile(ttft, 0.99);
  r.itl_p50 = percentile(itl, 0.5);
  r.itl_p99 = percentile(itl, 0.99);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  wick::cuda::apply_tuning_env();  // the benchmark variables of bench/README.md
  CLI::App app{"bench_serve_engine: serve::Engine throughput and latencies by concurrent streams"};
  std::string model_path, device_name = "cpu", dtype_name = "f32";
  std::vector<size_t> streams = {1, 4, 16, 64};
  size_t prompt_len = 32, new_tokens = 64;
  app.add_option("--model", model_path, "a .gguf file or HF folder")->required();
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", dtype_name, "f32, f16 or bf16")->capture_default_str();
  app.add_option("--streams", streams, "concurrent streams")->delimiter(',');
  app.add_option("--prompt-len", prompt_len)->capture_default_str();
  app.add_option("--new", new_tokens, "tokens generated per stream")->capture_default_str();
  Sampling sampling;
  app.add_option("--temperature", sampling.temperature, "0: greedy; above: sampled, seeded")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--top-p", sampling.top_p, "nucleus sampling's p, in (0, 1]")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  bool dequantize = false, per_sequence = false, compare_graphs = false, compare_invariant = false;
  app.add_option("--page-size", sampling.page_size,
                 "positions per KV page (0: serve::preferred_page_size, 64 CPU / 16 CUDA)")
      ->capture_default_str();
  app.add_option("--greedy-lookahead", sampling.lookahead,
                 "greedy decode steps queued at once on CUDA (EngineOptions::greedy_lookahead)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--dequantize", dequantize, "a GGUF's matrices dequantised to --dtype at load");
  app.add_flag("--per-sequence", per_sequence,
               "also the engine over CausalLM's per-sequence forward_paged, interleaved");
  app.add_flag("--compare-graphs", compare_graphs,
               "also the engine with CUDA graphs (EngineOptions::cuda_graphs, off by default), "
               "interleaved");
  app.add_flag("--compare-invariant", compare_invariant,
               "also the engine under batch invariance (wick::set_batch_invariant(true), as "
               "wick-serve --deterministic), interleaved");
  CLI11_PARSE(app, argc, argv);
  try {
    const wick::Device dev = wick::Device::parse(device_name);
    const wick::DType dt = dtype_name == "bf16"  ? wick::DType::BF16
                           : dtype_name == "f16" ? wick::DType::F16
                                                 : wick::DType::F32;
    std::shared_ptr<const wick::models::CausalLM> model =
        dequantize ? std::make_shared<const wick::models::Llama>(
                         wick::models::Llama::load(model_path, dev, dt))
                   : std::shared_ptr<const wick::models::CausalLM>(
                         wick::models::load_causal_lm(model_path, dev, dt));
    // The peer: one stream through a Generator (its decode rate after the first token), and the
    // engine's single stream, interleaved three times each: the medians.
    wick::GenerateOptions g;
    g.max_new_tokens = new_tokens;
    g.stop_tokens = {0xffffffffu};
    g.temperature = sampling.temperature;
    g.top_p = sampling.top_p;
    wick::Generator gen(model, g);
    const auto prompt = prompt_for(0, prompt_len, model->config().vocab_size);
    gen.generate(prompt);
    run_streams(model, 1, prompt_len, 4, sampling);  // warm-up
    std::vector<double> gen_rates, engine_rates;
    for (int i = 0; i < 3; ++i) {
      gen.generate(prompt);
      gen_rates.push_back(gen.stats().decode_tokens_per_second());
      engine_rates.push_back(run_streams(model, 1, prompt_len, new_tokens, sampling).decode_tok_s);
    }
    std::printf(
        "1 stream decode, median of 3 interleaved: generator %.1f tok/s, engine %.1f tok/s\n",
        percentile(gen_rates, 0.5), percentile(engine_rates, 0.5));
    std::printf("%8s %12s %12s %12s %12s %12s\n", "streams", "out tok/s", "ttft p50 ms",
                "ttft p99 ms", "itl p50 ms", "itl p99 ms");
    auto print = [](const char* what, size_t s, const Run& r) {
      std::printf("%8zu %12.1f %12.1f %12.1f %12.1f %12.1f %s\n", s, r.tok_s, r.ttft_p50 * 1e3,
                  r.ttft_p99 * 1e3, r.itl_p50 * 1e3, r.itl_p99 * 1e3, what);
    };
    auto per_seq = std::make_shared<const PerSequence>(model);
    for (size_t s : streams) {
      print("", s, run_streams(model, s, prompt_len, new_tokens, sampling));
      if (per_sequence) {
        print("per-sequence", s, run_streams(per_seq, s, prompt_len, new_tokens, sampling));
        print("", s, run_streams(model, s, prompt_len, new_tokens, sampling));
        print("per-sequence", s, run_streams(per_seq, s, prompt_len, new_tokens, sampling));
      }
      if (compare_invariant) {
        const bool was = wick::batch_invariant();
        auto invariant = [&] {
          wick::set_batch_invariant(true);
          Run r = run_streams(model, s, prompt_len, new_tokens, sampling);
          wick::set_batch_invariant(was);
          return r;
        };
        print("invariant", s, invariant());
        print("", s, run_streams(model, s, prompt_len, new_tokens, sampling));
        print("invariant", s, invariant());
      }
      if (compare_graphs) {
        print("graphs", s, run_streams(model, s, prompt_len, new_tokens, sampling, true));
        print("", s, run_streams(model, s, prompt_len, new_tokens, sampling));
        print("graphs", s, run_streams(model, s, prompt_len, new_tokens, sampling, true));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_serve_engine: %s\n", e.what());
    return 1;
  }
  return 0;
}
