#pragma once
// wick-serve's /metrics: request counters kept here, the engines' gauges and latency histograms
// read from their stats, all written in Prometheus' text format (version 0.0.4).

#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "wick/serve.h"

namespace wick::serve_http {

class Metrics {
 public:
  /// Counts one answered request (endpoint: the path for known ones, "other" else).
  void count_request(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++requests_[{endpoint, status}];
  }
  /// Counts a completion request cancelled because its client went away (streamed or not).
  void count_cancelled(const std::string& endpoint) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++cancelled_[endpoint];
  }
  /// Counts the tokens of an embeddings request.
  void count_embedding(const std::string& model, uint64_t inputs, uint64_t tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& e = embeddings_[model];
    e.first += inputs;
    e.second += tokens;
  }

  /// The whole exposition: the counters, each embedder's batches, then each decoder's engine
  /// stats.
  std::string render(const std::vector<std::pair<std::string, serve::EngineStats>>& engines,
                     const std::vector<std::pair<std::string, uint64_t>>& embed_batches) const {
    std::ostringstream out;
    out.precision(9);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      out << "# HELP wick_requests_total HTTP requests answered, by endpoint and status.\n"
          << "# TYPE wick_requests_total counter\n";
      for (const auto& [key, n] : requests_) {
        out << "wick_requests_total{endpoint=\"" << escape(key.first) << "\",status=\""
            << key.second << "\"} " << n << "\n";
      }
      out << "# HELP wick_requests_cancelled_total Completion requests cancelled because their "
             "client disconnected, by endpoint.\n"
          << "# TYPE wick_requests_cancelled_total counter\n";
      for (const auto& [endpoint, n] : cancelled_) {
        out << "wick_requests_cancelled_total{endpoint=\"" << escape(endpoint) << "\"} " << n
            << "\n";
      }
      out << "# HELP wick_embedding_inputs_total Texts embedded.\n"
          << "# TYPE wick_embedding_inputs_total counter\n";
      for (const auto& [model, e] : embeddings_) {
        out << "wick_embedding_inputs_total{model=\"" << escape(model) << "\"} " << e.first << "\n";
      }
      out << "# HELP wick_embedding_tokens_total Tokens of the texts embedded.\n"
          << "# TYPE wick_embedding_tokens_total counter\n";
      for (const auto& [model, e] : embeddings_) {
        out << "wick_embedding_tokens_total{model=\"" << escape(model) << "\"} " << e.second
            << "\n";
      }
    }
    out << "# HELP wick_embedding_batches_total Embedder calls (each serves one or more "
           "requests).\n# TYPE wick_embedding_batches_total counter\n";
    for (const auto& [model, n] : embed_batches) {
      out << "wick_embedding_batches_total{model=\"" << escape(model) << "\"} " << n << "\n";
    }
    auto gauge = [&](const char* name, const char* type, const char* help, auto get) {
      out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
      for (const auto& [model, s] : engines) {
        out << name << "{model=\"" << escape(model) << "\"} " << get(s) << "\n";
      }
    };
    using S = serve::EngineStats;
    gauge("wick_prompt_tokens_total", "counter", "Prompt tokens of completion requests.",
          [](const S& s) { return s.prompt_tokens; });
    gauge("wick_cached_prompt_tokens_total", "counter", "Prompt tokens served by the prefix cache.",
          [](const S& s) { return s.cached_prompt_tokens; });
    gauge("wick_generated_tokens_total", "counter", "Tokens generated.",
          [](const S& s) { return s.generated_tokens; });
    gauge("wick_engine_requests_done_total", "counter", "Completion requests ended.",
          [](const S& s) { return s.requests_done; });
    gauge("wick_preemptions_total", "counter",
          "Running requests whose KV pages were taken back (prefilled again).",
          [](const S& s) { return s.preemptions; });
    gauge("wick_queue_depth", "gauge", "Requests waiting for admission.",
          [](const S& s) { return s.waiting; });
    gauge("wick_running_batch_size", "gauge", "Requests admitted (prefilling or decoding).",
          [](const S& s) { return s.running; });
    gauge("wick_kv_pages_used", "gauge", "KV cache pages in use.",
          [](const S& s) { return s.kv_pages_used; });
    gauge("wick_kv_pages_total", "gauge", "KV cache pages in the pool.",
          [](const S& s) { return s.kv_pages_total; });
    histogram(out, "wick_time_to_first_token_seconds", "Submit to first token, per request.",
              engines, [](const S& s) -> const serve::Histogram& { return s.time_to_first_token; });
    histogram(out, "wick_inter_token_latency_seconds", "Between consecutive tokens of a request.",
              engines, [](const S& s) -> const serve::Histogram& { return s.inter_token_latency; });
    return out.str();
  }

 private:
  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '\\' || c == '"') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return out;
  }

  template <typename Get>
  static void histogram(std::ostringstream& out, const char* name, const char* help,
                        const std::vector<std::pair<std::string, serve::EngineStats>>& engines,
                        Get get) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
    for (const auto& [model, s] : engines) {
      const serve::Histogram& h = get(s);
      std::string label = "model=\"" + escape(model) + "\"";
      for (size_t i = 0; i < h.bounds.size() && i < h.cumulative.size(); ++i) {
        out << name << "_bucket{" << label << ",le=\"" << h.bounds[i] << "\"} " << h.cumulative[i]
            << "\n";
      }
      out << name << "_bucket{" << label << ",le=\"+Inf\"} " << h.count << "\n";
      out << name << "_sum{" << label << "} " << h.sum << "\n";
      out << name << "_count{" << label << "} " << h.count << "\n";
    }
  }

  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> cancelled_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> embeddings_;
};

}  // namespace wick::serve_http
