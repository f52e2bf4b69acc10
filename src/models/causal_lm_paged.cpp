// CausalLM's paged forward for every family: each sequence of the batch runs alone through
// forward_last over a KvCache gathered from its pages, and its new keys and values go back into
// its pages. Families that state their own batched forward (Llama, Qwen2, the decoder families
// of decoder_paged.cpp) override it. Also the batch's tensors (paged_batch_tensors).

#include <algorithm>
#include <string>

#include "util.h"
#include "wick/causal_lm.h"
#include "wick/error.h"
#include "wick/nn/paged_attention.h"

namespace wick::models {

void check_paged_batch(const std::vector<PagedSequence>& batch, const PagedKvCache& cache,
                       size_t vocab_size, size_t max_position, const char* op) {
  if (batch.empty()) throw Error(str(op, ": an empty batch"));
  const size_t ps = cache.page_size();
  for (size_t i = 0; i < batch.size(); ++i) {
    const PagedSequence& s = batch[i];
    if (s.tokens.empty()) throw Error(str(op, ": sequence ", i, " has no new tokens"));
    const size_t end = s.cached + s.tokens.size();
    if (max_position > 0 && end > max_position) {
      throw IndexOutOfRange(str(op, ": sequence ", i, " reaches position ", end,
                                " past the model's context of ", max_position));
    }
    if (s.pages.size() * ps < end) {
      throw IndexOutOfRange(str(op, ": sequence ", i, " has ", s.pages.size(), " pages of ", ps,
                                " positions for ", end, " positions"));
    }
    for (uint32_t p : s.pages) {
      if (p >= cache.pages()) {
        throw IndexOutOfRange(
            str(op, ": sequence ", i, " names page ", p, " of a pool of ", cache.pages()));
      }
    }
    for (uint32_t t : s.tokens) {
      if (t >= vocab_size) {
        throw IndexOutOfRange(str(op, ": token ", t, " of sequence ", i,
                                  " is outside the vocabulary of ", vocab_size));
      }
    }
  }
}

PagedBatchTensors paged_batch_tensors(const std::vector<PagedSequence>& batch, size_t page_size,
                                      const Device& device, size_t width) {
  size_t widest = 0;
  for (const PagedSequence& s : batch) widest = std::max(widest, s.pages.size());
  if (width == 0) width = widest;
  if (widest > width) {
    throw IndexOutOfRange(
        str("paged_batch_tensors: a page table of ", widest, " pages is wider than ", width));
  }
  std::vector<uint32_t> ids, positions, token_seq, slots, last, table(batch.size() * width, 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const PagedSequence& s = batch[i];
    std::copy(s.pages.begin(), s.pages.end(), table.begin() + static_cast<ptrdiff_t>(i * width));
    for (size_t j = 0; j < s.tokens.size(); ++j) {
      const size_t p = s.cached + j;
      ids.push_back(s.tokens[j]);
      positions.push_back(static_cast<uint32_t>(p));
      token_seq.push_back(static_cast<uint32_t>(i));
      slots.push_back(static_cast<uint32_t>(s.pages.at(p / page_size) * page_size + p % page_size));
    }
    last.push_back(static_cast<uint32_t>(ids.size() - 1));
  }
  // One upload (a step's inputs on a GPU), viewed as the six tensors.
  const size_t t = ids.size(), n = batch.size();
  std::vector<uint32_t> all;
  all.reserve(4 * t + n * width + n);
  for (const std::vector<uint32_t>* v : {&ids, &positions, &token_seq, &slots, &table, &last}) {
    all.insert(all.end(), v->begin(), v->end());
  }
  Tensor packed = Tensor::from_vec(all, {all.size()}, device);
  PagedBatchTensors b;
  b.ids = packed.narrow(0, 0, t);
  b.positions = packed.narrow(0, t, t);
  b.token_seq = packed.narrow(0, 2 * t, t);
  b.slots = packed.narrow(0, 3 * t, t);
  b.page_table = packed.narrow(0, 4 * t, n * width).reshape({n, width});
  b.last = packed.narrow(0, 4 * t + n * width, n);
  return b;
}

Tensor CausalLM::forward_paged_tensors(const PagedBatchTensors&, PagedKvCache&) const {
  throw Error(str(config().architecture,
                  " forward_paged_tensors: not implemented (has_paged_tensors() is false)"));
}

PagedKvCache CausalLM::make_paged_cache(size_t pages, size_t page_size) const {
  const CausalLMConfig& c = config();
  return PagedKvCache::allocate(c.num_layers, pages, page_size, c.num_kv_heads, c.head_dim, dtype(),
                                device());
}

Tensor CausalLM::forward_paged(const std::vector<PagedSequence>& batch, PagedKvCache& cache) const {
  const CausalLMConfig& c = config();
  check_paged_batch(batch, cache, c.vocab_size, c.max_position, "CausalLM::forward_paged");
  const Device dev = device();
  const size_t ps = cache.page_size(), h_kv = c.num_kv_heads, hd = c.head_dim;
  std::vector<Tensor> rows;
  for (const PagedSequence& s : batch) {
    const size_t n = s.tokens.size(), total = s.cached + n;
    KvCache kv = make_cache(1, total);
    if (s.cached > 0) {
      const size_t used = (s.cached + ps - 1) / ps;
      std::vector<uint32_t> ids(s.pages.begin(), s.pages.begin() + static_cast<ptrdiff_t>(used));
      Tensor pages = Tensor::from_vec(ids, {used}, dev);
      for (size_t l = 0; l < kv.layers(); ++l) {
        // (used, h_kv, P, d) -> (1, h_kv, used * P, d): the sequence's rows in position order.
        auto gather = [&](const Tensor& pool) {
          return pool.index_select(pages, 0)
              .transpose(0, 1)
              .contiguous()
              .reshape({1, h_kv, used * ps, hd})
              .narrow(2, 0, s.cached);
        };
        kv.k(l).narrow(2, 0, s.cached).assign(gather(cache.k(l)));
        kv.v(l).narrow(2, 0, s.cached).assign(gather(cache.v(l)));
      }
      kv.set_length(s.cached);
    }
    rows.push_back(forward_last(Tensor::from_vec(s.tokens, {1, n}, dev), kv));
    std::vector<uint32_t> slots(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t p = s.cached + i;
      slots[i] = static_cast<uint32_t>(s.pages[p / ps] * ps + p % ps);
    }
    Tensor slot_t = Tensor::from_vec(slots, {n}, dev);
    for (size_t l = 0; l < kv.layers(); ++l) {
      // (1, h_kv, n, d) -> (n, h_kv, d).
      auto fresh = [&](const Tensor& t) {
        return t.narrow(2, s.cached, n).squeeze(0).transpose(0, 1);
      };
      nn::paged_kv_write(cache.k(l), cache.v(l), fresh(kv.k(l)), fresh(kv.v(l)), slot_t);
    }
  }
  return Tensor::cat(rows, 0);
}

}  // namespace wick::models
