// wick-serve: an OpenAI-compatible HTTP server over wick's serving engine (decoders: chat and text
// completions, continuously batched) and sentence embedders (embeddings, batched across
// concurrent requests). One log line per request on stderr; SIGTERM or SIGINT stops accepting,
// finishes the requests in flight and exits 0.

#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "serve/client_socket.h"
#include "serve/embed_batcher.h"
#include "serve/metrics.h"
#include "serve/openai.h"
#include "wick/bert.h"
#include "wick/causal_lm.h"
#include "wick/cpu.h"
#include "wick/llama.h"
#include "wick/serve.h"
#include "wick/tokenizer.h"

namespace {

namespace fs = std::filesystem;
namespace tools = wick::tools;
namespace sh = wick::serve_http;
using sh::HttpError;
using sh::json;
using Clock = std::chrono::steady_clock;

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string device = "cpu";
  std::string dtype = "f32";
  size_t max_batch = 64;
  size_t kv_memory = 0;
  size_t page_size = 0;  // 0: wick::serve::preferred_page_size of the device
  size_t max_queue = 256;
  size_t max_tokens = 0;  // 0: the model's context
  size_t max_body = size_t{8} << 20;
  size_t http_threads = 256;
  size_t timeout_s = 30;
  size_t embed_window_us = 5000;
  bool deterministic = false;
  bool cuda_graphs = false;
  size_t greedy_lookahead = wick::serve::EngineOptions{}.greedy_lookahead;
};

// A decoder served for completions.
struct Decoder {
  std::string id;
  std::shared_ptr<const wick::models::CausalLM> model;
  std::shared_ptr<const wick::Tokenizer> tokenizer;
  std::vector<uint32_t> end_of_turn;  // chat completions stop here (and at eos)
  std::unique_ptr<wick::serve::Engine> engine;
  size_t context = 0;
};

// A sentence-transformers folder served for embeddings.
struct Embedder {
  std::string id;
  std::unique_ptr<wick::SentenceEmbedder> embedder;
  std::unique_ptr<sh::EmbedBatcher> batcher;
};

// What the request log line says; one per worker thread, reset when a request starts (the
// handler, the stream it writes and the logger run on the same worker thread).
struct RequestLog {
  uint64_t id = 0;
  Clock::time_point start;
  size_t prompt_tokens = 0, completion_tokens = 0;
  double ttft_ms = -1;
  bool client_gone = false;  // the client disconnected: the request was cancelled
};
thread_local RequestLog t_log;

// The events of one HTTP request's generations (one per prompt), filled by the engine's thread.
struct Generations {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::pair<size_t, wick::serve::TokenEvent>> events;
};

// Counts a request in flight for as long as it lives (SIGTERM waits for none to be left).
class InFlight {
 public:
  explicit InFlight(std::atomic<int64_t>& n) : n_(n) { ++n_; }
  ~InFlight() { --n_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int64_t>& n_;
};

std::string model_id(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  if (p.extension() == ".gguf") return p.stem().string();
  return p.filename().string();
}

bool is_embedder_folder(const fs::path& dir) {
  if (fs::exists(dir / "modules.json")) return true;
  std::ifstream f(dir / "config.json");
  if (!f) return false;
  json config = json::parse(f, nullptr, false);
  return config.is_object() && config.value("model_type", "") == "bert";
}

class Server {
 public:
  explicit Server(ServeOptions options) : opt_(std::move(options)) {}

  void load(const std::vector<std::string>& paths) {
    wick::Device device = tools::parse_device(opt_.device);
    if (opt_.deterministic) {
      wick::set_batch_invariant(true);
      std::fprintf(stderr,
                   "wick-serve: deterministic: each result's bits do not depend on the requests "
                   "sharing its batch (batch-invariant kernels%s)\n",
                   device.is_cpu() ? "" : "; embeddings one text at a time");
    }
    wick::DType dtype = opt_.dtype == "f16"    ? wick::DType::F16
                        : opt_.dtype == "bf16" ? wick::DType::BF16
                                               : wick::DType::F32;
    for (const std::string& path : paths) {
      std::string id = model_id(path);
      if (decoders_.count(id) || embedders_.count(id)) {
        throw tools::UsageError("two models have the id '" + id + "' (" + path + ")");
      }
      if (!fs::exists(path)) throw tools::UsageError(path + ": no such file or folder");
      auto t0 = Clock::now();
      if (fs::is_directory(path) && is_embedder_folder(path)) {
        wick::SentenceEmbedderOptions eo;
        eo.dtype = dtype;
        auto e = std::make_unique<Embedder>();
        e->id = id;
        e->embedder = std::make_unique<wick::SentenceEmbedder>(
            wick::SentenceEmbedder::load(path, device, eo));
        // CUDA's encoder attention splits by the batch's padded length: under --deterministic
        // each text goes alone, and waiting for more requests to batch would only add latency.
        const bool text_by_text = opt_.deterministic && !device.is_cpu();
        e->batcher = std::make_unique<sh::EmbedBatcher>(
            *e->embedder, std::chrono::microseconds(text_by_text ? 0 : opt_.embed_window_us), 256,
            text_by_text);
        std::fprintf(stderr, "wick-serve: embeddings model '%s' (%zu dims) from %s in %.1f s\n",
                     id.c_str(), e->embedder->dim(), path.c_str(), seconds_since(t0));
        embedders_[id] = std::move(e);
        continue;
      }
      auto d = std::make_unique<Decoder>();
      d->id = id;
      d->model = wick::models::load_causal_lm(path, device, dtype);
      if (fs::is_directory(path)) {
        d->tokenizer = std::make_shared<wick::Tokenizer>(wick::Tokenizer::from_file(path));
      } else {
        d->tokenizer = std::make_shared<wick::Tokenizer>(wick::models::load_gguf_tokenizer(path));
      }
      if (!d->tokenizer->chat_template().empty()) {
        try {
          d->end_of_turn = d->tokenizer->end_of_turn_ids();
          for (uint32_t e : d->model->config().eos_token_ids) d->end_of_turn.push_back(e);
        } catch (const wick::Error& e) {
          std::fprintf(stderr, "wick-serve: %s: its chat template is not read (%s)\n", id.c_str(),
                       e.what());
        }
      }
      d->context = d->model->config().max_position;
      wick::serve::EngineOptions eo;
      eo.kv_memory = opt_.kv_memory;
      eo.page_size = opt_.page_size != 0 ? opt_.page_size
                                         : wick::serve::preferred_page_size(d->model->device());
      eo.max_batch = opt_.max_batch;
      eo.max_queue = opt_.max_queue;
      eo.cuda_graphs = opt_.cuda_graphs;
      eo.greedy_lookahead = opt_.greedy_lookahead;
      d->engine = std::make_unique<wick::serve::Engine>(d->model, d->tokenizer, eo);
      std::fprintf(stderr,
                   "wick-serve: completions model '%s' (%s, context %zu) from %s in %.1f s\n",
                   id.c_str(), d->model->config().architecture.c_str(), d->context, path.c_str(),
                   seconds_since(t0));
      decoders_[id] = std::move(d);
    }
  }

  // Binds, then serves until stop(); returns false when the address cannot be bound.
  bool serve() {
    configure();
    // httplib's library listens with a backlog of 5: a burst of connections overflows it and
    // loopback clients see resets. The listening socket is kept here and listened on again with
    // the system's largest backlog (Linux takes a new backlog for a listening socket).
    http_.set_socket_options([this](int sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd_ = sock;
    });
    int port = opt_.port;
    if (port == 0) {
      port = http_.bind_to_any_port(opt_.host);
      if (port < 0) return false;
    } else if (!http_.bind_to_port(opt_.host, port)) {
      return false;
    }
    if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
    std::fprintf(stderr, "wick-serve: listening on http://%s:%d\n", opt_.host.c_str(), port);
    std::fflush(stderr);
    return http_.listen_after_bind();
  }

  // SIGTERM: new requests get 503, those in flight finish, then the listener closes.
  void shut_down() {
    draining_ = true;
    std::fprintf(stderr, "wick-serve: stopping: finishing %lld request(s) in flight\n",
                 static_cast<long long>(in_flight_.load()));
    while (in_flight_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto& [id, d] : decoders_) d->engine->drain();
    http_.stop();
  }

 private:
  // How often a non-streamed completion checks that its client is still connected.
  static constexpr std::chrono::milliseconds kClientCheck{250};
  // The status logged for a request whose client disconnected (nginx's "client closed request");
  // no client reads it.
  static constexpr int kClientClosed = 499;

  static double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  static void send_error(httplib::Response& res, const HttpError& e) {
    res.status = e.status;
    if (e.status == 429) res.set_header("Retry-After", "1");
    res.set_content(sh::error_body(e.status, e.what(), e.param, e.code), "application/json");
  }

  // Runs a handler, answering its HttpError (or any other exception, as 500) in OpenAI's shape.
  template <typename F>
  httplib::Server::Handler guarded(F f) {
    return [f](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const HttpError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, HttpError(500, std::string("internal error: ") + e.what()));
      }
    };
  }

  void configure() {
    http_.new_task_queue = [n = opt_.http_threads] { return new httplib::ThreadPool(n); };
    http_.set_payload_max_length(opt_.max_body);
    http_.set_read_timeout(static_cast<time_t>(opt_.timeout_s));
    http_.set_write_timeout(static_cast<time_t>(opt_.timeout_s));
    http_.set_keep_alive_max_count(1000);
    http_.set_tcp_nodelay(true);
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_log = RequestLog{++next_id_, Clock::now()};
      res.set_header("x-request-id", "req-" + std::to_string(t_log.id));
      if (!opt_.api_key.empty() && !key_matches(req.get_header_value("Authorization"))) {
        send_error(res, HttpError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                  "", "invalid_api_key"));
        return httplib::Server::HandlerResponse::Handled;
      }
      if (draining_) {
        res.set_header("Connection", "close");
        send_error(res, HttpError(503, "the server is shutting down"));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // httplib's own answers (unknown path 404, body too large 413, malformed request 400) get
    // OpenAI's error body too.
    http_.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                    httplib::Response& res) {
      if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
      std::string message = res.status == 413   ? "the request body is too large"
                            : res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
                            : res.status == 400 ? "malformed HTTP request"
                                                : "HTTP error " + std::to_string(res.status);
      res.set_content(sh::error_body(res.status, message), "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }));
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      std::string endpoint = known_endpoint(req.path) ? req.path : "other";
      metrics_.count_request(endpoint, res.status);
      double total_ms =
          std::chrono::duration<double, std::milli>(Clock::now() - t_log.start).count();
      char ttft[32] = "-";
      if (t_log.ttft_ms >= 0) std::snprintf(ttft, sizeof ttft, "%.1f", t_log.ttft_ms);
      std::fprintf(stderr,
                   "wick-serve: req-%llu %s %s %d prompt_tokens=%zu completion_tokens=%zu "
                   "ttft_ms=%s total_ms=%.1f%s\n",
                   static_cast<unsigned long long>(t_log.id), req.method.c_str(), req.path.c_str(),
                   res.status, t_log.prompt_tokens, t_log.completion_tokens, ttft, total_ms,
                   t_log.client_gone ? " cancelled=client_gone" : "");
    });

    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"status", "ok"}}.dump(), "application/json");
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::vector<std::pair<std::string, wick::serve::EngineStats>> stats;
      for (auto& [id, d] : decoders_) stats.emplace_back(id, d->engine->stats());
      std::vector<std::pair<std::string, uint64_t>> batches;
      for (auto& [id, e] : embedders_) batches.emplace_back(id, e->batcher->batches());
      res.set_content(metrics_.render(stats, batches), "text/plain; version=0.0.4");
    });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json data = json::array();
      auto add = [&](const std::string& id) {
        data.push_back(
            {{"id", id}, {"object", "model"}, {"created", created_}, {"owned_by", "wick"}});
      };
      for (auto& [id, d] : decoders_) add(id);
      for (auto& [id, e] : embedders_) add(id);
      res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
    });
    http_.Post("/v1/chat/completions",
               guarded([this](const httplib::Request& req, httplib::Response& res) {
                 complete(req, res, true);
               }));
    http_.Post("/v1/completions",
               guarded([this](const httplib::Request& req, httplib::Response& res) {
                 complete(req, res, false);
               }));
    http_.Post("/v1/embeddings", guarded([this](const httplib::Request& req,
                                                httplib::Response& res) { embed(req, res); }));
  }

  static bool known_endpoint(const std::string& path) {
    return path == "/health" || path == "/metrics" || path == "/v1/models" ||
           path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/embeddings";
  }

  bool key_matches(const std::string& header) const {
    const std::string expect = "Bearer " + opt_.api_key;
    if (header.size() != expect.size()) return false;
    unsigned diff = 0;
    for (size_t i = 0; i < header.size(); ++i) diff |= unsigned(header[i] ^ expect[i]);
    return diff == 0;
  }

  Decoder& decoder(const std::string& id) {
    auto it = decoders_.find(id);
    if (it != decoders_.end()) return *it->second;
    if (embedders_.count(id)) {
      throw HttpError(400, "the model '" + id + "' serves embeddings only", "model");
    }
    throw HttpError(404, "the model '" + id + "' does not exist", "model", "model_not_found");
  }

  std::vector<uint32_t> chat_prompt(const Decoder& d, const std::vector<wick::ChatMessage>& msgs) {
    std::string text;
    try {
      text = d.tokenizer->apply_chat_template(msgs, true);
    } catch (const wick::Error& e) {
      throw HttpError(400,
                      std::string("the chat template cannot render these messages: ") + e.what(),
                      "messages");
    }
    return d.tokenizer->encode(text, false);
  }

  // Sizes max_tokens to the room the context leaves; 400 when the prompt leaves none.
  static void fit_context(const Decoder& d, size_t prompt_len, sh::GenerationParams& p,
                          const char* param) {
    if (prompt_len == 0) throw HttpError(400, "the prompt is empty", param);
    if (prompt_len >= d.context) {
      throw HttpError(400,
                      "the prompt is " + std::to_string(prompt_len) +
                          " tokens, and this model's maximum context length is " +
                          std::to_string(d.context) + " tokens",
                      param, "context_length_exceeded");
    }
    size_t room = d.context - prompt_len;
    p.sampling.max_tokens = p.max_tokens_given ? std::min(p.sampling.max_tokens, room) : room;
  }

  void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
    auto guard = std::make_shared<InFlight>(in_flight_);
    json body = sh::parse_body(req.body);
    Decoder& d = decoder(sh::model_field(body));
    size_t limit = opt_.max_tokens > 0 ? opt_.max_tokens : d.context;
    sh::GenerationParams params = sh::parse_generation(body, limit);

    std::vector<std::vector<uint32_t>> prompts;
    if (chat) {
      prompts.push_back(chat_prompt(d, sh::parse_messages(body)));
      params.sampling.stop_tokens = d.end_of_turn;
    } else {
      for (sh::Prompt& p : sh::parse_prompts(body, 64)) {
        if (p.is_ids) {
          for (uint32_t id : p.ids) {
            if (id >= d.model->config().vocab_size) {
              throw HttpError(400,
                              "token id " + std::to_string(id) +
                                  " is outside the model's vocabulary of " +
                                  std::to_string(d.model->config().vocab_size),
                              "prompt");
            }
          }
          prompts.push_back(std::move(p.ids));
        } else {
          prompts.push_back(d.tokenizer->encode(p.text, true));
        }
      }
    }
    std::vector<sh::GenerationParams> per_prompt;
    for (const auto& ids : prompts) {
      sh::GenerationParams p = params;
      fit_context(d, ids.size(), p, chat ? "messages" : "prompt");
      per_prompt.push_back(std::move(p));
    }

    auto gens = std::make_shared<Generations>();
    std::vector<uint64_t> ids;
    try {
      for (size_t i = 0; i < prompts.size(); ++i) {
        wick::serve::CompletionRequest cr{prompts[i], per_prompt[i].sampling};
        ids.push_back(d.engine->submit(std::move(cr), [gens, i](const wick::serve::TokenEvent& e) {
          {
            std::lock_guard<std::mutex> lock(gens->mutex);
            gens->events.emplace_back(i, e);
          }
          gens->cv.notify_all();
        }));
      }
    } catch (const wick::serve::QueueFull& e) {
      for (uint64_t id : ids) d.engine->cancel(id);
      throw HttpError(429, std::string("the server is busy (") + e.what() + "); retry later");
    } catch (const wick::Error& e) {
      for (uint64_t id : ids) d.engine->cancel(id);
      throw HttpError(draining_ ? 503 : 400, e.what());
    }

    std::string cid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(t_log.id);
    json head = {{"id", cid},
                 {"object", chat ? "chat.completion" : "text_completion"},
                 {"created", std::time(nullptr)},
                 {"model", d.id}};
    if (!params.stream) {
      std::vector<std::string> texts(prompts.size());
      std::vector<wick::serve::TokenEvent> finals(prompts.size());
      size_t done = 0, generated = 0;
      // Nothing is written until the end, so the connection's socket is watched: a client that
      // leaves (timed out, killed) cancels the request's generations and frees their pages.
      sh::ClientWatch client(req, kClientCheck);
      while (done < prompts.size()) {
        if (auto ev = next_event(*gens, kClientCheck)) {
          auto& [i, e] = *ev;
          texts[i] += e.text;
          if (e.finish != wick::serve::FinishReason::None) {
            finals[i] = e;
            ++done;
          } else {
            ++generated;
          }
        }
        if (done < prompts.size() && client.gone()) {
          for (uint64_t id : ids) d.engine->cancel(id);
          metrics_.count_cancelled(req.path);
          t_log.client_gone = true;
          t_log.completion_tokens = generated;
          res.status = kClientClosed;
          res.set_header("Connection", "close");
          return;
        }
      }
      json choices = json::array();
      size_t prompt_tokens = 0, completion_tokens = 0, cached = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const auto& f = finals[i];
        if (f.finish == wick::serve::FinishReason::Error) throw HttpError(500, f.error);
        if (f.finish == wick::serve::FinishReason::Cancelled) {
          throw HttpError(503, "the request was cancelled (the server is shutting down)");
        }
        prompt_tokens += f.prompt_tokens;
        completion_tokens += f.completion_tokens;
        cached += f.cached_tokens;
        t_log.ttft_ms = std::max(t_log.ttft_ms, f.first_token_seconds * 1e3);
        if (chat) {
          choices.push_back({{"index", i},
                             {"message", {{"role", "assistant"}, {"content", texts[i]}}},
                             {"logprobs", nullptr},
                             {"finish_reason", sh::finish_reason_json(f.finish)}});
        } else {
          choices.push_back({{"index", i},
                             {"text", texts[i]},
                             {"logprobs", nullptr},
                             {"finish_reason", sh::finish_reason_json(f.finish)}});
        }
      }
      t_log.prompt_tokens = prompt_tokens;
      t_log.completion_tokens = completion_tokens;
      json out = head;
      out["choices"] = choices;
      out["usage"] = sh::usage_json(prompt_tokens, completion_tokens, cached);
      res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
      return;
    }

    // Streaming: the provider runs on this worker thread after the handler returns; it writes
    // each event as it comes, and a client that goes away cancels the request's generations.
    head["object"] = chat ? "chat.completion.chunk" : "text_completion";
    res.set_header("Cache-Control", "no-cache");
    wick::serve::Engine* engine = d.engine.get();
    sh::Metrics* metrics = &metrics_;
    std::string path = req.path;
    size_t n = prompts.size();
    bool include_usage = params.include_usage;
    auto start = Clock::now();
    res.set_chunked_content_provider("text/event-stream", [gens, guard, engine, metrics, path, ids,
                                                           n, chat, head, include_usage,
                                                           start](size_t, httplib::DataSink& sink) {
      auto chunk = [&](size_t i, json delta_or_text, json finish) {
        json c = head;
        json choice = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", finish}};
        choice[chat ? "delta" : "text"] = std::move(delta_or_text);
        c["choices"] = json::array({choice});
        if (include_usage) c["usage"] = nullptr;
        return sh::sse(c);
      };
      auto cancel_all = [&] {
        for (uint64_t id : ids) engine->cancel(id);
        metrics->count_cancelled(path);
        t_log.client_gone = true;
      };
      auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
      if (chat) {
        for (size_t i = 0; i < n; ++i) {
          if (!write(chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr))) {
            cancel_all();
            return false;
          }
        }
      }
      size_t done = 0, prompt_tokens = 0, completion_tokens = 0, cached = 0;
      while (done < n) {
        auto ev = next_event(*gens, std::chrono::seconds(1));
        if (!ev) {
          // Nothing for a second (queued, or a long prefill): a comment line, which also
          // finds out whether the client is still there.
          if (!write(": keep-alive\n\n")) {
            cancel_all();
            return false;
          }
          continue;
        }
        auto& [i, e] = *ev;
        if (t_log.ttft_ms < 0 && !e.text.empty()) {
          t_log.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        }
        bool ok = true;
        if (!e.text.empty()) {
          ok = write(chat ? chunk(i, {{"content", e.text}}, nullptr) : chunk(i, e.text, nullptr));
        }
        if (ok && e.finish != wick::serve::FinishReason::None) {
          ++done;
          prompt_tokens += e.prompt_tokens;
          completion_tokens += e.completion_tokens;
          cached += e.cached_tokens;
          if (e.finish == wick::serve::FinishReason::Error ||
              e.finish == wick::serve::FinishReason::Cancelled) {
            std::string msg = e.finish == wick::serve::FinishReason::Error
                                  ? e.error
                                  : "the request was cancelled (the server is shutting down)";
            ok = write("data: " + sh::error_body(500, msg) + "\n\n");
          } else {
            ok = write(chat ? chunk(i, json::object(), sh::finish_reason_json(e.finish))
                            : chunk(i, "", sh::finish_reason_json(e.finish)));
          }
        }
        if (!ok) {
          cancel_all();
          return false;
        }
      }
      t_log.prompt_tokens = prompt_tokens;
      t_log.completion_tokens = completion_tokens;
      if (include_usage) {
        json c = head;
        c["choices"] = json::array();
        c["usage"] = sh::usage_json(prompt_tokens, completion_tokens, cached);
        if (!write(sh::sse(c))) return false;
      }
      if (!write("data: [DONE]\n\n")) return false;
      sink.done();
      return true;
    });
  }

  // The next event, waiting at most `wait` (forever when none); nullopt on timeout.
  static std::optional<std::pair<size_t, wick::serve::TokenEvent>> next_event(
      Generations& g, std::optional<std::chrono::milliseconds> wait) {
    std::unique_lock<std::mutex> lock(g.mutex);
    auto ready = [&] { return !g.events.empty(); };
    if (wait) {
      if (!g.cv.wait_for(lock, *wait, ready)) return std::nullopt;
    } else {
      g.cv.wait(lock, ready);
    }
    auto e = std::move(g.events.front());
    g.events.pop_front();
    return e;
  }

  void embed(const httplib::Request& req, httplib::Response& res) {
    InFlight guard(in_flight_);
    json body = sh::parse_body(req.body);
    std::string id = sh::model_field(body);
    auto it = embedders_.find(id);
    if (it == embedders_.end()) {
      if (decoders_.count(id)) {
        throw HttpError(400, "the model '" + id + "' does not serve embeddings", "model");
      }
      throw HttpError(404, "the model '" + id + "' does not exist", "model", "model_not_found");
    }
    Embedder& e = *it->second;
    sh::EmbeddingParams p = sh::parse_embeddings(body, 2048, e.embedder->dim());
    size_t tokens = 0;
    for (const std::string& text : p.inputs) tokens += e.embedder->tokenize(text).size();
    std::vector<std::vector<float>> rows;
    try {
      rows = e.batcher->embed(p.inputs);
    } catch (const wick::ShapeMismatch& err) {
      throw HttpError(400, err.what(), "input");
    }
    json data = json::array();
    for (size_t i = 0; i < rows.size(); ++i) {
      json emb = p.base64 ? json(sh::base64_floats(rows[i].data(), rows[i].size())) : json(rows[i]);
      data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", std::move(emb)}});
    }
    metrics_.count_embedding(id, p.inputs.size(), tokens);
    t_log.prompt_tokens = tokens;
    json out = {{"object", "list"},
                {"data", std::move(data)},
                {"model", id},
                {"usage", {{"prompt_tokens", tokens}, {"total_tokens", tokens}}}};
    res.set_content(out.dump(), "application/json");
  }

  ServeOptions opt_;
  httplib::Server http_;
  std::map<std::string, std::unique_ptr<Decoder>> decoders_;
  std::map<std::string, std::unique_ptr<Embedder>> embedders_;
  sh::Metrics metrics_;
  std::atomic<uint64_t> next_id_{0};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  int listen_fd_ = -1;
  int64_t created_ = static_cast<int64_t>(std::time(nullptr));
};

int g_signal_pipe[2] = {-1, -1};

void on_stop_signal(int sig) {
  char c = static_cast<char>(sig);
  (void)!::write(g_signal_pipe[1], &c, 1);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wick-serve: an OpenAI-compatible HTTP server. Each PATH is a .gguf file or a model folder:\n"
      "a decoder serves /v1/chat/completions and /v1/completions (continuous batching over a\n"
      "paged KV cache), a sentence-transformers folder serves /v1/embeddings. A model's id is its\n"
      "file name without .gguf, or its folder's name. Also GET /v1/models, /health and /metrics\n"
      "(Prometheus). One log line per request on stderr. SIGTERM or SIGINT: stop accepting, "
      "finish\n"
      "the requests in flight, exit 0. Exit codes: 1 runtime failure (a model that does not load,\n"
      "an address that cannot be bound), 2 usage error, 3 the asked device is missing."};
  tools::CommonOptions common;
  tools::add_common_options(app, "wick-serve", common);
  ServeOptions opt;
  std::vector<std::string> paths;
  const uint64_t kMaxCount = 1ull << 40;
  app.add_option("PATH", paths, "models to serve: .gguf files or model folders")->required();
  app.add_option("--host", opt.host, "address to listen on (0.0.0.0: every interface)")
      ->capture_default_str();
  app.add_option("--port", opt.port, "TCP port (0: any free one, printed on stderr)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--api-key", opt.api_key,
                 "every request then needs the header 'Authorization: Bearer KEY'");
  app.add_option("--device", opt.device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--dtype", opt.dtype, "weights' dtype (f32, f16, bf16; GGUF stays quantized)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--max-batch", opt.max_batch, "sequences decoded together per step")
      ->check(tools::count_in(65536))
      ->capture_default_str();
  app.add_option("--kv-memory", opt.kv_memory,
                 "bytes for the paged KV cache of each decoder (0: a default from its size)")
      ->check(tools::count_in(kMaxCount * 1024))
      ->capture_default_str();
  app.add_option("--page-size", opt.page_size,
                 "positions per page of the KV cache (0: the device's, 64 on the CPU,\n"
                 "16 on CUDA: wick::serve::preferred_page_size)")
      ->check(tools::count_in(65536))
      ->capture_default_str();
  app.add_option("--max-queue", opt.max_queue,
                 "requests waiting for admission beyond which the server answers 429")
      ->check(tools::count_in(1u << 20))
      ->capture_default_str();
  app.add_option("--max-tokens", opt.max_tokens,
                 "the largest max_tokens a request may ask (0: the model's context)")
      ->check(tools::count_in(kMaxCount))
      ->capture_default_str();
  app.add_option("--max-body", opt.max_body, "bytes of a request body at most (larger: 413)")
      ->check(tools::count_in(size_t{1} << 32))
      ->capture_default_str();
  app.add_option("--http-threads", opt.http_threads,
                 "connections served at once (each stream holds one)")
      ->check(CLI::Range(size_t{4}, size_t{4096}))
      ->capture_default_str();
  app.add_option("--timeout", opt.timeout_s, "seconds a read from or a write to a client may wait")
      ->check(CLI::Range(size_t{1}, size_t{3600}))
      ->capture_default_str();
  app.add_option("--embed-window-us", opt.embed_window_us,
                 "microseconds an embeddings batch waits for more requests")
      ->check(tools::count_in(1000000))
      ->capture_default_str();
  app.add_flag("--deterministic", opt.deterministic,
               "every result the same bits whatever requests share its batch:\n"
               "every dense product and f32 attention take the batch-invariant\n"
               "kernels (as WICK_BATCH_INVARIANT=1; docs/NUMERICS.md, \"Determinism\");\n"
               "on CUDA, wick's own GEMM and quantized kernel, and embeddings one text\n"
               "at a time. Without it, CPU completions are batch-invariant already\n"
               "(unless WICK_BATCH_INVARIANT=0) but embeddings are not. Cost on the\n"
               "CPU: completions none, MiniLM embeddings about the same (measured),\n"
               "any other dense product of 1 to 4 rows 3-4x slower; on CUDA see\n"
               "docs/perf. Sampled requests repeat only with a seed.");

  app.add_flag("--cuda-graphs", opt.cuda_graphs,
               "on CUDA, decode steps replay a CUDA graph captured once per batch\n"
               "size (EngineOptions::cuda_graphs); one model served only, since a\n"
               "capture would record another model's work on the same GPU");
  app.add_option("--greedy-lookahead", opt.greedy_lookahead,
                 "on CUDA, greedy decode steps queued at once while no request waits,\n"
                 "their tokens read back and sent together (EngineOptions::greedy_lookahead;\n"
                 "1: a read-back every step)")
      ->capture_default_str();

  return tools::run(app, argc, argv, "wick-serve", common, [&]() -> int {
    if (opt.max_batch == 0) throw tools::UsageError("--max-batch must be at least 1");
    if (opt.greedy_lookahead == 0) throw tools::UsageError("--greedy-lookahead must be at least 1");
    if (opt.cuda_graphs && (paths.size() != 1 || opt.device.rfind("cuda", 0) != 0)) {
      throw tools::UsageError("--cuda-graphs needs --device cuda and one model (got --device " +
                              opt.device + " and " + std::to_string(paths.size()) +
                              (paths.size() == 1 ? " model)" : " models)"));
    }

    Server server(opt);
    server.load(paths);
    // SIGTERM and SIGINT reach whichever thread runs (OpenBLAS starts its own before main): the
    // handler only writes the signal to a pipe, which one thread reads and then shuts down.
    if (::pipe(g_signal_pipe) != 0) throw wick::Error("cannot create a pipe for signals");
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGINT, &sa, nullptr);
    std::atomic<bool> stopping{false};
    std::thread signals([&] {
      char sig = 0;
      while (::read(g_signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
      }
      if (sig == 0) return;  // woken by main: the listener failed
      stopping = true;
      server.shut_down();
    });
    bool ok = server.serve();
    bool failed = !ok && !stopping;
    if (!stopping) {
      char zero = 0;
      (void)!::write(g_signal_pipe[1], &zero, 1);
    }
    signals.join();
    if (failed) {
      throw wick::Error("cannot listen on " + opt.host + ":" + std::to_string(opt.port) +
                        " (in use, or not an address of this machine)");
    }
    std::fprintf(stderr, "wick-serve: stopped\n");
    return tools::kOk;
  });
}
