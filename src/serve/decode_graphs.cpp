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

Tensor DecodeGraphs::run(const std::vector<models::PagedSequence>& batch, bool replay) {
  const models::CausalLMConfig& c = model_->config();
  check_paged_batch(batch, *cache_, c.vocab_size, c.max_position, "serve decode step");
  if (!fits(batch)) {
    throw Error(str("serve decode step: a batch of ", batch.size(),
                    " sequences, each of one token and at most ", max_batch_,
                    " of them, expected"));
  }
  const size_t bucket = decode_bucket(batch.size());
  size_t pages = 1;
  for (const models::PagedSequence& s : batch) pages = std::max(pages, s.pages.size());
  const size_t width = std::min(max_width_, std::max(kMinWidth, decode_bucket(pages)));
  const Device dev = model_->device();
  auto [it, fresh] = graphs_.try_emplace({bucket, width});
  Graph& g = it->second;
  std::vector<uint32_t> host = decode_inputs(batch, bucket, width, cache_->page_size(), scratch_);
  Tensor values = Tensor::from_vec(host, {host.size()}, dev);
  if (fresh)
    g.input = values;
  else
    g.input.assign(values);
  if (!replay) {
    return model_->forward_paged_tensors(views(g.input, bucket, width), *cache_)
        .narrow(0, 0, batch.size());
  }
  if (!g.graph.defined()) {
    g.graph = CudaGraph::capture(dev, [&] {
      g.logits = model_->forward_paged_tensors(views(g.input, bucket, width), *cache_);
    });
  }
  g.graph.replay();
  return g.logits.narrow(0, 0, batch.size());
}

size_t DecodeGraphs::graphs() const {
  size_t n = 0;
  for (const auto& [key, g] : graphs_) n += g.graph.defined();
  return n;
}

}  // namespace wick::serve
