#include "wick/generator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

#include "cuda_config.h"
#include "token_mailbox.h"
#include "util.h"
#include "wick/cuda.h"
#include "wick/error.h"

namespace wick {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// splitmix64: a small, well-mixed generator; the same seed gives the same tokens everywhere.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool graph_allowed_by_env() {
  return cuda::config().decode_graph;
}

// Greedy decode steps a captured graph runs (4; WICK_GRAPH_STEPS for benchmarks): more steps a
// graph save the gaps between graphs; after a stop, up to 2 x steps - 1 run in vain.
size_t graph_steps() {
  const int forced = cuda::config().graph_steps;
  return forced > 0 ? static_cast<size_t>(forced) : 4;
}

}  // namespace

// The decode step captured as CUDA graphs, one per key window (a multiple of kWindowStep cache
// rows, captured when the sequence first reaches it) and number of steps, so that attention reads
// only about as much of the cache as is filled. Inputs (token, position) and each graph's outputs
// (next token, logits) sit at fixed device addresses; the host writes the inputs and replays.
constexpr size_t kWindowStep = 256;

struct Generator::DecodeGraph {
  struct Window {
    Tensor logits;  // (1, vocab), written by the graph
    CudaGraph graph;
  };
  explicit DecodeGraph(const Device& dev) : mailbox(dev) {}
  models::KvCache cache;
  Tensor input;                  // (2) U32: token, position; the graph advances both (greedy token)
  Tensor token;                  // (1, 1) view of input
  Tensor position;               // (1) view of input
  detail::TokenMailbox mailbox;  // each step's greedy token, for the host
  std::map<std::pair<size_t, size_t>, Window> windows;  // by (key window, steps)
};

Generator::Generator(models::Llama model, GenerateOptions options)
    : Generator(std::make_shared<const models::Llama>(std::move(model)), std::move(options)) {}

Generator::Generator(const models::CausalLM& model, GenerateOptions options)
    : Generator(std::shared_ptr<const models::CausalLM>(&model, [](const models::CausalLM*) {}),
                std::move(options)) {}

Generator::Generator(std::shared_ptr<const models::CausalLM> model, GenerateOptions options)
    : model_(std::move(model)), options_(std::move(options)), rng_state_(options_.seed) {
  if (!model_) throw Error("Generator: no model");
  if (options_.top_p <= 0 || options_.top_p > 1) {
    throw Error(str("Generator: top_p must be in (0, 1], got ", options_.top_p));
  }
  if (options_.temperature < 0 || !std::isfinite(options_.temperature)) {
    throw Error(str("Generator: temperature must be >= 0, got ", options_.temperature));
  }
}

Generator::~Generator() = default;
Generator::Generator(Generator&&) noexcept = default;
Generator& Generator::operator=(Generator&&) noexcept = default;

namespace {

// The options sample() reads, checked where it reads them (NaN fails every comparison).
void check_sampling_options(const GenerateOptions& o) {
  if (!(o.repeat_penalty > 0) || !std::isfinite(o.repeat_penalty)) {
    throw Error(str("Generator: repeat_penalty must be finite and > 0, got ", o.repeat_penalty));
  }
  if (!std::isfinite(o.presence_penalty) || !std::isfinite(o.frequency_penalty)) {
    throw Error(str("Generator: presence_penalty and frequency_penalty must be finite, got ",
                    o.presence_penalty, " and ", o.frequency_penalty));
  }
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    throw Error(str("Generator: top_p must be in (0, 1], got ", o.top_p));
  }
  if (!(o.min_p >= 0 && o.min_p <= 1)) {
    throw Error(str("Generator: min_p must be in [0, 1], got ", o.min_p));
  }
}

bool penalises(const GenerateOptions& o) {
  return o.repeat_penalty != 1.0 || o.presence_penalty != 0.0 || o.frequency_penalty != 0.0;
}

// Greedy without penalties: the argmax may be taken where the logits are (device, graph).
bool plain_greedy(const GenerateOptions& o) {
  return o.temperature == 0 && !penalises(o);
}

// The logits as doubles, penalised by the tokens of the window at the end of `history`.
std::vector<double> penalised_logits(const std::vector<float>& logits,
                                     const std::vector<uint32_t>& history,
                                     const GenerateOptions& o) {
  std::vector<double> v(logits.begin(), logits.end());
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i]) || v[i] == std::numeric_limits<double>::infinity()) {
      throw Error(str("Generator::sample: the logit of token ", i, " is ", logits[i],
                      " (the model's output is not finite)"));
    }
  }
  if (!penalises(o) || history.empty()) return v;
  size_t from = o.repeat_last_n > 0 && history.size() > o.repeat_last_n
                    ? history.size() - o.repeat_last_n
                    : 0;
  std::map<uint32_t, size_t> counts;
  for (size_t i = from; i < history.size(); ++i) {
    if (history[i] < v.size()) ++counts[history[i]];
  }
  for (const auto& [token, count] : counts) {
    double& l = v[token];
    l = l > 0 ? l / o.repeat_penalty : l * o.repeat_penalty;
    l -= o.presence_penalty + static_cast<double>(count) * o.frequency_penalty;
  }
  return v;
}

// Scratch buffers of sample(), kept per thread between calls (a vocabulary's worth each), so that
// a draw allocates nothing.
struct SampleScratch {
  std::vector<uint32_t> pool;    // top-k's candidates
  std::vector<double> weights;   // by id
  std::vector<uint8_t> bands;    // by id (kNoBand: not a candidate)
  std::vector<uint32_t> tokens;  // the candidates band by band
};

SampleScratch& sample_scratch() {
  thread_local SampleScratch s;
  return s;
}

constexpr size_t kBands = 17;
constexpr uint8_t kNoBand = 0xff;

// The band of a token whose scaled logit lies `below` (>= 0, or +inf) under the largest: band b
// holds [b, b + 1) x 4 ln 2 (weights in (2^(-4(b+1)), 2^(-4b)]), the last band every token further.
size_t band_of(double below) {
  constexpr double kWidth = 4 * 0.69314718055994530942;  // 4 ln 2
  return below < (kBands - 1) * kWidth ? static_cast<size_t>(below / kWidth) : kBands - 1;
}

// The candidates of one draw in sampling order (the larger logit first, the lower id among equals),
// grouped in bands (band_of). Every token of a band comes before every token of the next, so the
// top-p cut and the draw step over whole bands by their weight sums and sort only the band they
// end in, and that only as far as they read it: at(b, i) selects (nth_element over the rest of the
// band) and sorts 64 tokens, then 3 times what the band has sorted, at a time. A nucleus of a few
// hundred tokens out of tens of thousands costs a few linear passes over the vocabulary and the
// sort of a few hundred tokens.
template <class T>
class BandedOrder {
 public:
  // `bands[id]` for every id of `ids` (id order, or the top-k's order), its weight `weights[id]`.
  BandedOrder(const std::vector<T>& logits, const std::vector<uint32_t>* ids, SampleScratch& s)
      : logits_(logits), tokens_(s.tokens) {
    auto each = [&](auto&& f) {
      if (ids == nullptr) {
        for (uint32_t id = 0; id < logits.size(); ++id) f(id);
      } else {
        for (uint32_t id : *ids) f(id);
      }
    };
    each([&](uint32_t id) {
      if (s.bands[id] == kNoBand) return;
      ++begin_[s.bands[id] + 1];
      sums_[s.bands[id]] += s.weights[id];
    });
    for (size_t b = 0; b < kBands; ++b) begin_[b + 1] += begin_[b];
    std::array<size_t, kBands> next;
    std::copy(begin_.begin(), begin_.end() - 1, next.begin());
    tokens_.resize(begin_[kBands]);
    each([&](uint32_t id) {
      if (s.bands[id] != kNoBand) tokens_[next[s.bands[id]]++] = id;
    });
  }

  size_t size(size_t b) const { return begin_[b + 1] - begin_[b]; }
  // Band b's weight, summed in the candidates' order.
  double sum(size_t b) const { return sums_[b]; }

  // The i-th token of band b in sampling order.
  uint32_t at(size_t b, size_t i) {
    if (i >= sorted_[b]) sort(b, i + 1);
    return tokens_[begin_[b] + i];
  }

 private:
  void sort(size_t b, size_t need) {
    const size_t to =
        std::min(size(b), std::max(need, sorted_[b] + std::max<size_t>(64, 3 * sorted_[b])));
    auto by_logit = [&](uint32_t x, uint32_t y) {
      return logits_[x] > logits_[y] || (logits_[x] == logits_[y] && x < y);
    };
    const auto band = tokens_.begin() + static_cast<ptrdiff_t>(begin_[b]);
    const auto from = band + static_cast<ptrdiff_t>(sorted_[b]);
    const auto mid = band + static_cast<ptrdiff_t>(to);
    const auto last = band + static_cast<ptrdiff_t>(size(b));
    if (mid != last) std::nth_element(from, mid, last, by_logit);
    std::sort(from, mid, by_logit);
    sorted_[b] = to;
  }

  const std::vector<T>& logits_;
  std::vector<uint32_t>& tokens_;
  std::array<size_t, kBands + 1> begin_{};  // each band's first position in tokens_, then the end
  std::array<size_t, kBands> sorted_{};     // each band's positions sorted so far
  std::array<double, kBands> sums_{};
};

// The first largest logit (ties to the lowest id); Error for a NaN or +inf logit (the first in id
// order) or when every logit is -inf.
template <class T>
size_t checked_argmax(const std::vector<T>& logits) {
  size_t best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<T>::infinity()) {
      throw Error(str("Generator::sample: the logit of token ", i, " is ", logits[i],
                      " (the model's output is not finite)"));
    }
    if (logits[i] > logits[best]) best = i;
  }
  if (logits[best] == -std::numeric_limits<T>::infinity()) {
    throw Error("Generator::sample: every logit is -inf");
  }
  return best;
}

// Sampling at temperature o.temperature > 0 from `v` (its largest at `best`), in the order of the
// tokens by logit: each token's weight is exp(logit / temperature - top) (top: the largest scaled
// logit), over the candidates (every token, or the top_k first), those of weight at least min_p
// (the first token's weight is 1), then the shortest prefix whose weight reaches top_p of the
// candidates' (top_p = 1: all of them); one draw u in [0, 1) times that prefix's weight picks the
// token where the prefix's running weight passes it. Weights are summed in id order, by band
// (BandedOrder): sums differ from the sorted order's only by rounding.
template <class T>
uint32_t draw(const std::vector<T>& v, size_t best, const GenerateOptions& o, uint64_t& rng) {
  const double t = o.temperature;
  const double top = static_cast<double>(v[best]) / t;
  if (!std::isfinite(top)) {
    throw Error(str("Generator::sample: temperature ", t, " scales the logit of token ", best, " (",
                    v[best], ") to a non-finite value; use temperature 0 for greedy"));
  }
  SampleScratch& s = sample_scratch();
  s.weights.resize(v.size());
  s.bands.resize(v.size());
  // The candidates: every token, or top-k's (the rest marked kNoBand).
  const std::vector<uint32_t>* ids = nullptr;
  if (o.top_k > 0 && o.top_k < v.size()) {
    s.pool.resize(v.size());
    std::iota(s.pool.begin(), s.pool.end(), 0u);
    std::nth_element(
        s.pool.begin(), s.pool.begin() + static_cast<ptrdiff_t>(o.top_k), s.pool.end(),
        [&](uint32_t a, uint32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
    for (size_t i = o.top_k; i < v.size(); ++i) s.bands[s.pool[i]] = kNoBand;
    s.pool.resize(o.top_k);
    ids = &s.pool;
  }
  // Weights and bands; min-p keeps the tokens at least min_p times as likely as the first.
  double total = 0;
  auto weigh = [&](uint32_t id) {
    const double d = static_cast<double>(v[id]) / t - top;
    const double x = std::exp(d);
    if (o.min_p > 0 && x < o.min_p) {
      s.bands[id] = kNoBand;
      return;
    }
    s.weights[id] = x;
    total += x;
    s.bands[id] = static_cast<uint8_t>(band_of(-d));
  };
  if (ids == nullptr) {
    for (uint32_t id = 0; id < v.size(); ++id) weigh(id);
  } else {
    for (uint32_t id : *ids) weigh(id);
  }
  BandedOrder<T> order(v, ids, s);
  const std::vector<double>& w = s.weights;
  // top-p: the whole bands before band `cut` and the first `cut_len` tokens of that one.
  size_t cut = kBands - 1, cut_len = order.size(kBands - 1);
  double mass = total;
  if (o.top_p < 1) {
    double acc = 0;
    bool found = false;
    for (size_t b = 0; b < kBands && !found; ++b) {
      if ((acc + order.sum(b)) / total < o.top_p) {
        acc += order.sum(b);
        continue;
      }
      for (size_t i = 0; i < order.size(b); ++i) {
        acc += w[order.at(b, i)];
        if (acc / total >= o.top_p) {
          cut = b;
          cut_len = i + 1;
          found = true;
          break;
        }
      }
    }
    mass = acc;
  }
  // The draw: u in [0, mass), the token where the prefix's running weight passes it.
  double u = static_cast<double>(next_random(rng) >> 11) * 0x1.0p-53 * mass;
  for (size_t b = 0; b <= cut; ++b) {
    if (b < cut && u >= order.sum(b)) {
      u -= order.sum(b);
      continue;
    }
    const size_t len = b < cut ? order.size(b) : cut_len;
    for (size_t i = 0; i < len; ++i) {
      u -= w[order.at(b, i)];
      if (u < 0) return order.at(b, i);
    }
  }
  // Rounding left u at or above the nucleus' weight: its last token.
  for (size_t b = cut + 1; b-- > 0;) {
    const size_t len = b < cut ? order.size(b) : cut_len;
    if (len > 0) return order.at(b, len - 1);
  }
  throw Error("Generator::sample: no candidate token");  // unreachable: the top token weighs 1
}

}  // namespace

uint32_t Generator::sample(const std::vector<float>& logits, const std::vector<uint32_t>& history) {
  if (logits.empty()) throw Error("Generator::sample: no logits");
  check_sampling_options(options_);
  if (!penalises(options_) || history.empty()) {
    // The logits as they are, no copy.
    const size_t best = checked_argmax(logits);
    if (options_.temperature == 0) return static_cast<uint32_t>(best);
    return draw(logits, best, options_, rng_state_);
  }
  const std::vector<double> v = penalised_logits(logits, history, options_);
  const size_t best = checked_argmax(v);
  if (options_.temperature == 0) return static_cast<uint32_t>(best);
  return draw(v, best, options_, rng_state_);
}

namespace {

// Stop strings: appends `token`'s text to `text` (the new text so far; `ends` the end offset of
// each token's text in it) and, when a stop string now occurs in it, drops the tokens holding
// any of its bytes from `out` and returns true.
bool hits_stop_string(const GenerateOptions& o, uint32_t token, std::string& text,
                      std::vector<size_t>& ends, std::vector<uint32_t>& out) {
  if (o.stop_strings.empty()) return false;
  if (!o.token_text) throw Error("Generator: stop_strings need GenerateOptions::token_text");
  const size_t before = text.size();
  text += o.token_text(token);
  ends.push_back(text.size());
  size_t found = std::string::npos;
  for (const std::string& s : o.stop_strings) {
    if (s.empty()) continue;
    size_t from = before >= s.size() - 1 ? before - (s.size() - 1) : 0;
    size_t at = text.find(s, from);
    if (at != std::string::npos) found = std::min(found, at);
  }
  if (found == std::string::npos) return false;
  while (!ends.empty() && !out.empty() && ends.back() > found) {
    ends.pop_back();
    out.pop_back();
  }
  return true;
}

// The tokens the penalties look at: the last repeat_last_n of the prompt and the new ones.
std::vector<uint32_t> penalty_window(const GenerateOptions& o, const std::vector<uint32_t>& prompt,
                                     const std::vector<uint32_t>& out) {
  if (!penalises(o)) return {};
  size_t n = prompt.size() + out.size();
  size_t skip = o.repeat_last_n > 0 && n > o.repeat_last_n ? n - o.repeat_last_n : 0;
  std::vector<uint32_t> w;
  w.reserve(n - skip);
  for (size_t i = skip; i < prompt.size(); ++i) w.push_back(prompt[i]);
  for (size_t i = skip > prompt.size() ? skip - prompt.size() : 0; i < out.size(); ++i) {
    w.push_back(out[i]);
  }
  return w;
}

}  // namespace

std::vector<uint32_t> Generator::generate(const std::vector<uint32_t>& prompt_ids,
                                          const TokenCallback& on_token) {
  if (prompt_ids.empty()) throw Error("Generator::generate: empty prompt");
  return run(prompt_ids, false, on_token);
}

std::vector<uint32_t> Generator::continue_generation(const std::vector<uint32_t>& ids,
                                                     const TokenCallback& on_token) {
  if (ids.empty()) throw Error("Generator::continue_generation: no ids");
  if (history_.empty()) {
    throw Error("Generator::continue_generation: no sequence to continue (call generate first)");
  }
  return run(ids, true, on_token);
}

std::vector<uint32_t> Generator::run(const std::vector<uint32_t>& ids, bool resume,
                                     const TokenCallback& on_token) {
  // The whole sequence so far, and what this call prefills: the new ids, after the last new
  // token of the call before when resuming (its keys and values are not in the cache yet).
  std::vector<uint32_t> sequence = resume ? history_ : std::vector<uint32_t>{};
  const size_t cached = resume ? history_.size() - 1 : 0;
  sequence.insert(sequence.end(), ids.begin(), ids.end());
  const std::vector<uint32_t> prompt_ids(sequence.begin() + static_cast<ptrdiff_t>(cached),
                                         sequence.end());
  history_.clear();  // until this call succeeds
  stats_ = GenerateStats{};
  stats_.prompt_tokens = prompt_ids.size();
  std::vector<uint32_t> out;
  if (options_.max_new_tokens == 0) {
    history_ = sequence;
    return out;
  }
  rng_state_ = options_.seed;
  const Device dev = model_->device();
  const size_t context = model_->config().max_position;
  if (context > 0 && sequence.size() > context) {
    throw Error(str("Generator: a prompt of ", sequence.size(),
                    " tokens is longer than the model's context of ", context, " positions"));
  }
  bool use_graph =
      dev.is_cuda() && options_.cuda_graph && graph_allowed_by_env() && model_->has_decode_step();
  stats_.used_cuda_graph = use_graph;
  if (resume) {
    models::KvCache& kept = use_graph && graph_ ? graph_->cache : cache_;
    if (kept.length() != cached) {
      throw Error("Generator::continue_generation: the cache no longer holds the sequence");
    }
    if (sequence.size() + options_.max_new_tokens > kept.max_len()) {
      throw Error(str("Generator::continue_generation: ", sequence.size(), " tokens + ",
                      options_.max_new_tokens, " new exceed the cache's max_len ", kept.max_len(),
                      " (GenerateOptions::max_len)"));
    }
  }
  size_t max_len =
      options_.max_len > 0 ? options_.max_len : prompt_ids.size() + options_.max_new_tokens;
  if (!resume && prompt_ids.size() + options_.max_new_tokens > max_len) {
    throw Error(str("Generator::generate: prompt of ", prompt_ids.size(), " tokens + ",
                    options_.max_new_tokens, " new exceed max_len ", max_len));
  }
  const std::vector<uint32_t>& stops =
      options_.stop_tokens.empty() ? model_->config().eos_token_ids : options_.stop_tokens;

  // A graph is tied to its cache: reuse both while the cache is long enough.
  if (!resume && use_graph && (!graph_ || graph_->cache.max_len() < max_len)) graph_.reset();
  models::KvCache& cache = use_graph && graph_ ? graph_->cache : cache_;
  if (!resume) {
    if (!use_graph || !graph_) cache = model_->make_cache(1, max_len);
    cache.reset();
  }
  stats_.kv_cache_bytes = cache.bytes();

  auto pick = [&](const Tensor& logits) -> uint32_t {
    // On a GPU plain greedy reads back the argmax alone; the CPU's logits are at hand, and
    // sample() checks that they are finite.
    if (plain_greedy(options_) && !dev.is_cpu()) return logits.argmax(1).to_vec1<uint32_t>()[0];
    return sample(logits.to_dtype(DType::F32).flatten_all().to_vec1<float>(),
                  penalty_window(options_, sequence, out));
  };
  std::string stop_text;
  std::vector<size_t> stop_ends;
  auto emit = [&](uint32_t t) {
    out.push_back(t);
    bool go_on = on_token ? on_token(t) : true;
    bool stop = std::find(stops.begin(), stops.end(), t) != stops.end() ||
                hits_stop_string(options_, t, stop_text, stop_ends, out);
    return go_on && !stop && out.size() < options_.max_new_tokens;
  };

  auto t0 = std::chrono::steady_clock::now();
  Tensor prompt = Tensor::from_vec(prompt_ids, {1, prompt_ids.size()}, dev);
  const size_t n = prompt_ids.size();
  const size_t chunk =
      options_.on_prefill && options_.prefill_chunk > 0 ? options_.prefill_chunk : n;
  Tensor last;
  for (size_t at = 0; at < n; at += chunk) {
    const size_t len = std::min(chunk, n - at);
    last = model_->forward_last(len == n ? prompt : prompt.narrow(1, at, len), cache);
    if (options_.on_prefill) options_.on_prefill(at + len, n);
  }
  uint32_t next = pick(last);
  stats_.prompt_seconds = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  bool more = emit(next);

  if (more && use_graph) {
    if (!graph_) {
      auto g = std::make_unique<DecodeGraph>(dev);
      g->cache = std::move(cache);
      g->input = Tensor::zeros({2}, DType::U32, dev);
      g->token = g->input.narrow(0, 0, 1).reshape({1, 1});
      g->position = g->input.narrow(0, 1, 1);
      graph_ = std::move(g);
    }
    DecodeGraph& g = *graph_;
    g.mailbox.clear();  // the prefill's read-back waited for every earlier step
    // Enqueues `steps` steps from position pos: the graph of their key window, captured at first
    // use (the step at pos writes cache row pos and leaves the token for pos + 1).
    auto replay_at = [&](size_t pos, size_t steps) {
      size_t window = std::min(g.cache.max_len(), (pos / kWindowStep + 1) * kWindowStep);
      auto it = g.windows.find({window, steps});
      if (it == g.windows.end()) {
        DecodeGraph::Window w;
        w.graph = CudaGraph::capture(dev, [&] {
          for (size_t i = 0; i < steps; ++i) {
            Tensor next = model_->decode_step(g.token, g.position, g.cache, &w.logits, window);
            g.mailbox.advance(next, g.input);
          }
        });
        it = g.windows.emplace(std::make_pair(window, steps), std::move(w)).first;
      }
      it->second.graph.replay();
      stats_.graph_nodes = it->second.graph.node_count() / steps;
      return &it->second;
    };
    // Greedy: each step leaves its token and the next position in `input`, and the token in the
    // mailbox, so the host queues a graph of the next steps before it reads this one's token and
    // the GPU does not wait for the host; steps past a stop (or an end asked by on_token) are
    // wasted, harmlessly (they write cache rows after the cache's length). Several steps a graph
    // (one key window) save the gap between graphs. Sampling picks on the host between steps.
    const bool greedy = plain_greedy(options_);
    const size_t run = greedy ? graph_steps() : 1;
    size_t pos = g.cache.length();
    // Steps are queued for positions [pos, queued); the last one that may be wanted is at
    // limit - 1 (its token is the last new one, its cache row the last one).
    const size_t limit = std::min(g.cache.max_len(), pos + options_.max_new_tokens - out.size());
    size_t queued = pos;
    auto queue_steps = [&] {
      size_t steps = run;
      if (queued + steps > limit || queued / kWindowStep != (queued + steps - 1) / kWindowStep) {
        steps = 1;  // a graph's steps share their key window
      }
      DecodeGraph::Window* w = replay_at(queued, steps);
      queued += steps;
      return w;
    };
    g.input.assign(
        Tensor::from_vec(std::vector<uint32_t>{next, static_cast<uint32_t>(pos)}, {2}, dev));
    DecodeGraph::Window* step = queue_steps();
    while (more) {
      pos = g.cache.length();
      // Greedy: the steps after pos, up to a graph's worth, are queued before its token is read.
      while (greedy && queued < std::min(limit, pos + 1 + run)) step = queue_steps();
      next = greedy ? g.mailbox.wait(static_cast<uint32_t>(pos + 1)) : pick(step->logits);
      g.cache.set_length(pos + 1);
      more = emit(next);
      if (more && !greedy) {
        g.input.assign(Tensor::from_vec(std::vector<uint32_t>{next, static_cast<uint32_t>(pos + 1)},
                                        {2}, dev));
        queued = pos + 1;
        step = queue_steps();
      }
    }
  } else {
    // On a GPU the model's device-side step (its backend's decode plan) also serves steps that
    // are not captured; elsewhere one token is a forward of length 1.
    const bool device_step = dev.is_cuda() && model_->has_decode_step();
    while (more) {
      Tensor tok = Tensor::from_vec(std::vector<uint32_t>{next}, {1, 1}, dev);
      if (device_step) {
        const size_t pos = cache.length();
        Tensor position =
            Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(pos)}, {1}, dev);
        Tensor logits;
        Tensor greedy = model_->decode_step(tok, position, cache, &logits, pos + 1);
        cache.set_length(pos + 1);
        next = options_.temperature == 0 ? greedy.to_vec1<uint32_t>()[0] : pick(logits);
      } else {
        next = pick(model_->forward_last(tok, cache));
      }
      more = emit(next);
    }
  }
  stats_.new_tokens = out.size();
  stats_.decode_seconds = seconds_since(t1);
  history_ = std::move(sequence);
  history_.insert(history_.end(), out.begin(), out.end());
  return out;
}

}  // namespace wick
