// DecodeGraphs (decode_graphs.h): padding, the packed inputs and the graphs by bucket.

#include "serve/decode_graphs.h"

#include <algorithm>

#include "util.h"
#include "wick/error.h"

namespace wick::serve {

namespace {

// Tables at least this many pages wide: fewer graphs for short sequences.
constexpr size_t kMinWidth = 8;

}  // namespace

size_t decode_bucket(size_t n) {
  size_t b = 1;
  while (b < n) b *= 2;
  return b;
}

std::vector<uint32_t> decode_inputs(const std::vector<models::PagedSequence>& batch, size_t bucket,
                                    size_t width, size_t page_size, uint32_t scratch_page) {
  if (batch.size() > bucket) {
    throw Error(str("decode_inputs: ", batch.size(), " sequences for a bucket of ", bucket));
  }
  std::vector<uint32_t> in(5 * bucket + bucket * width, 0);
  uint32_t* ids = in.data();
  uint32_t* positions = ids + bucket;
  uint32_t* token_seq = positions + bucket;
  uint32_t* slots = token_seq + bucket;
  uint32_t* last = slots + bucket;
  uint32_t* table = last + bucket;
  std::fill(table, table + bucket * width, scratch_page);
  for (size_t i = 0; i < bucket; ++i) {
    token_seq[i] = static_cast<uint32_t>(i);
    last[i] = static_cast<uint32_t>(i);
    slots[i] = static_cast<uint32_t>(scratch_page * page_size);
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const models::PagedSequence& s = batch[i];
    if (s.tokens.size() != 1 || s.pages.size() > width) {
      throw Error(str("decode_inputs: sequence ", i, " has ", s.tokens.size(), " tokens and ",
                      s.pages.size(), " pages (one token, at most ", width, " pages)"));
    }
    ids[i] = s.tokens[0];
    positions[i] = static_cast<uint32_t>(s.cached);
    slots[i] =
        static_cast<uint32_t>(s.pages.at(s.cached / page_size) * page_size + s.cached % page_size);
    std::copy(s.pages.begin(), s.pages.end(), table + i * width);
  }
  return in;
}

DecodeGraphs::DecodeGraphs(std::shared_ptr<const models::CausalLM> model,
                           models::PagedKvCache& cache, uint32_t scratch_page, size_t max_batch)
    : model_(std::move(model)), cache_(&cache), scratch_(scratch_page), max_batch_(max_batch) {
  if (!model_ || !model_->has_paged_tensors()) {
    throw Error("DecodeGraphs: the model has no forward_paged_tensors");
  }
  if (scratch_page >= cache.pages()) {
    throw IndexOutOfRange(
        str("DecodeGraphs: scratch page ", scratch_page, " of a pool of ", cache.pages()));
  }
  // No sequence holds more pages than the pool has, nor more than its context needs.
  const size_t context = model_->config().max_position;
  max_width_ = cache.pages();
  if (context > 0) {
    max_width_ = std::min(max_width_, (context + cache.page_size() - 1) / cache.page_size());
  }
}

bool DecodeGraphs::fits(const std::vector<models::PagedSequence>& batch) const {
  return !batch.empty() && batch.size() <= max_batch_ &&
         std::all_of(batch.begin(), batch.end(),
                     [](const models::PagedSequence& s) { return s.tokens.size() == 1; });
}

models::PagedBatchTensors DecodeGraphs::views(const Tensor& input, size_t bucket,
                                              size_t width) const {
  models::PagedBatchTensors b;
  b.ids = input.narrow(0, 0, bucket);
  b.positions = input.narrow(0, bucket, bucket);
  b.token_seq = input.narrow(0, 2 * bucket, bucket);
  b.slots = input.narrow(0, 3 * bucket, bucket);
  b.last = input.narrow(0, 4 * bucket, bucket);
  b.page_table = input.narrow(0, 5 * bucket, bucket * width).reshape({bucket, width});
  return b;
}

DecodeGraphs::Graph& DecodeGraphs::prepare(const std::vector<models::PagedSequence>& batch,
                                           size_t positions_ahead, bool pad,
                                           std::pair<size_t, size_t>* key) {
  const models::CausalLMConfig& c = model_->config();
  check_paged_batch(batch, *cache_, c.vocab_size, c.max_position, "serve decode step");
  if (!fits(batch)) {
    throw Error(str("serve decode step: a batch of ", batch.size(),
                    " sequences, each of one token and at most ", max_batch_,
                    " of them, expected"));
  }
  const size_t page_size = cache_->page_size();
  size_t pages = 1;
  for (const models::PagedSequence& s : batch) {
    const size_t last = s.cached + positions_ahead;
    if (last > s.pages.size() * page_size || (c.max_position > 0 && last > c.max_position)) {
      throw IndexOutOfRange(str("serve decode step: ", positions_ahead, " steps from position ",
                                s.cached, " need ", last, " positions; the sequence's ",
                                s.pages.size(), " pages hold ", s.pages.size() * page_size,
                                ", the model's context ", c.max_position));
    }
    pages = std::max(pages, s.pages.size());
  }
  const size_t bucket = pad ? decode_bucket(batch.size()) : batch.size();
  const size_t width = std::min(max_width_, std::max(kMinWidth, decode_bucket(pages)));
  *key = {bucket, width};
  auto [it, fresh] = graphs_.try_emplace(*key);
  Graph& g = it->second;
  std::vector<uint32_t> host = decode_inputs(batch, bucket, width, page_size, scratch_);
  Tensor values = Tensor::from_vec(host, {host.size()}, model_->device());
  if (fresh)
    g.input = values;
  else
    g.input.assign(values);
  return g;
}

Tensor DecodeGraphs::forward(Graph& g, const std::pair<size_t, size_t>& key, bool replay) {
  const size_t bucket = key.first, width = key.second;
  if (!replay) return model_->forward_paged_tensors(views(g.input, bucket, width), *cache_);
  if (!g.graph.defined()) {
    g.graph = CudaGraph::capture(model_->device(), [&] {
      g.logits = model_->forward_paged_tensors(views(g.input, bucket, width), *cache_);
    });
  }
  g.graph.replay();
  return g.logits;
}

Tensor DecodeGraphs::run(const std::vector<models::PagedSequence>& batch, bool replay) {
  std::pair<size_t, size_t> key;
  Graph& g = prepare(batch, 1, true, &key);
  return forward(g, key, replay).narrow(0, 0, batch.size());
}

DecodeGraphs::QueuedSteps DecodeGraphs::queue_greedy(
    const std::vector<models::PagedSequence>& batch, size_t steps, bool replay,
    const QueuedSteps* after) {
  if (steps == 0) throw Error("serve decode steps: 0 steps queued");
  std::pair<size_t, size_t> key;
  // Run eagerly, the steps need no padding rows.
  Graph& g = prepare(batch, steps, replay, &key);
  const size_t n = batch.size(), bucket = key.first, page_size = cache_->page_size();
  if (after != nullptr && (after->n != n || after->bucket != bucket)) {
    throw Error(str("serve decode steps: queued after steps of ", after->n,
                    " sequences in a bucket of ", after->bucket, ", not ", n, " in ", bucket));
  }
  // The positions and slots of steps 1.. (the padding rows' as decode_inputs writes them).
  std::vector<uint32_t> ahead(2 * (steps - 1) * bucket);
  for (size_t j = 1; j < steps; ++j) {
    uint32_t* positions = ahead.data() + 2 * (j - 1) * bucket;
    uint32_t* slots = positions + bucket;
    for (size_t i = 0; i < bucket; ++i) {
      slots[i] = scratch_ * static_cast<uint32_t>(page_size);
      positions[i] = 0;
    }
    for (size_t i = 0; i < n; ++i) {
      const size_t at = batch[i].cached + j;
      positions[i] = static_cast<uint32_t>(at);
      slots[i] = static_cast<uint32_t>(batch[i].pages[at / page_size] * page_size + at % page_size);
    }
  }
  Tensor later;
  if (steps > 1) later = Tensor::from_vec(ahead, {ahead.size()}, model_->device());
  const models::PagedBatchTensors v = views(g.input, bucket, key.second);
  if (after != nullptr) v.ids.assign(after->last);
  std::vector<Tensor> tokens;
  for (size_t j = 0; j < steps; ++j) {
    if (j > 0) {
      v.ids.assign(tokens.back());
      v.positions.assign(later.narrow(0, 2 * (j - 1) * bucket, bucket));
      v.slots.assign(later.narrow(0, (2 * j - 1) * bucket, bucket));
    }
    tokens.push_back(forward(g, key, replay).argmax(1));
  }
  QueuedSteps q;
  q.steps = steps;
  q.n = n;
  q.bucket = bucket;
  q.last = tokens.back();
  q.tokens = Tensor::cat(tokens, 0);
  if (q.tokens.device().is_cuda()) q.copy = std::make_shared<detail::PendingTokens>(q.tokens);
  return q;
}

std::vector<uint32_t> DecodeGraphs::read_greedy(const QueuedSteps& queued) {
  // Rows of the bucket, of which the batch's first n.
  const std::vector<uint32_t> flat =
      queued.copy ? queued.copy->wait() : queued.tokens.to_vec1<uint32_t>();
  std::vector<uint32_t> out;
  out.reserve(queued.steps * queued.n);
  for (size_t j = 0; j < queued.steps; ++j) {
    out.insert(out.end(), flat.begin() + static_cast<ptrdiff_t>(j * queued.bucket),
               flat.begin() + static_cast<ptrdiff_t>(j * queued.bucket + queued.n));
  }
  return out;
}

std::vector<uint32_t> DecodeGraphs::run_greedy(const std::vector<models::PagedSequence>& batch,
                                               size_t steps, bool replay) {
  if (steps == 0) return {};
  return read_greedy(queue_greedy(batch, steps, replay));
}

size_t DecodeGraphs::graphs() const {
  size_t n = 0;
  for (const auto& [key, g] : graphs_) n += g.graph.defined();
  return n;
}

}  // namespace wick::serve
