// Decoder's paged step (decoder.h): a ragged batch of sequences runs as one row of tokens through
// the family's hidden(), every projection one product over all the tokens, rope at each token's
// own position (rows of tables over the model's context), each token's keys and values written
// into its page slot and attention over its own sequence's pages within the layer's window.

#include "decode_plan.h"
#include "models/decoder.h"
#include "nn/batch_linear.h"
#include "util.h"
#include "wick/error.h"
#include "wick/nn/paged_attention.h"

namespace wick::models::decoder {

PagedKvCache Decoder::make_paged_cache(size_t pages, size_t page_size) const {
  const DecoderConfig& c = config_;
  auto [cos, sin] =
      w_.ropes.at(0).tables(c.head_dim, c.max_position, 0, c.max_position, dtype_, device_);
  return PagedKvCache::allocate(c.num_layers, pages, page_size, c.num_kv_heads, c.head_dim, dtype_,
                                device_, std::move(cos), std::move(sin));
}

Tensor Decoder::forward_paged(const std::vector<PagedSequence>& batch, PagedKvCache& cache) const {
  const std::string name = str(config_.architecture, " forward_paged");
  check_paged_batch(batch, cache, config_.vocab_size, config_.max_position, name.c_str());
  return forward_paged_tensors(paged_batch_tensors(batch, cache.page_size(), device_), cache);
}

Tensor Decoder::forward_paged_tensors(const PagedBatchTensors& b, PagedKvCache& cache) const {
  const std::string name = str(config_.architecture, " forward_paged");
  if (cache.layers() != w_.layers.size() || !cache.cos().defined() ||
      cache.cos().dims()[0] < config_.max_position || cache.k(0).dtype() != dtype_ ||
      cache.k(0).device() != device_) {
    throw ShapeMismatch(str(name, ": a paged cache of ", cache.layers(),
                            " layers (with rope tables) for a model of ", w_.layers.size(),
                            " layers in ", dtype_, " on ", device_,
                            ": make it with make_paged_cache"));
  }
  const Tensor* all[] = {&b.ids, &b.positions, &b.token_seq, &b.slots, &b.page_table, &b.last};
  for (const Tensor* t : all) {
    if (!t->defined() || t->dtype() != DType::U32 || t->device() != device_) {
      throw ShapeMismatch(str(name, ": the batch's tensors must be u32 on ", device_));
    }
  }
  const size_t t = b.ids.elem_count();
  const Shape tokens{t};
  if (b.ids.shape() != tokens || t == 0 || b.positions.shape() != tokens ||
      b.token_seq.shape() != tokens || b.slots.shape() != tokens || b.page_table.rank() != 2 ||
      b.last.shape() != Shape{b.page_table.dims()[0]}) {
    throw ShapeMismatch(str(name, ": ids ", b.ids.shape(), ", positions ", b.positions.shape(),
                            ", token_seq ", b.token_seq.shape(), ", slots ", b.slots.shape(),
                            ", page_table ", b.page_table.shape(), " and last ", b.last.shape(),
                            " do not form a batch of T tokens over n sequences"));
  }
  if (plan_) {
    Tensor logits = plan_->paged_step(b, cache);
    if (logits.defined()) return logits;
  }
  Step at;
  at.pages = &cache;
  at.batch = &b;
  at.rope.emplace_back(cache.cos().index_select(b.positions, 0),
                       cache.sin().index_select(b.positions, 0));
  for (const auto& [cos, sin] : extra_rope_tables_) {
    at.rope.emplace_back(cos.index_select(b.positions, 0), sin.index_select(b.positions, 0));
  }
  Tensor normed = hidden(b.ids.reshape({1, t}), at);  // (1, T, d)
  return head(normed.reshape({t, config_.hidden_size}).index_select(b.last, 0), at);
}

Tensor Decoder::attend_paged(const Tensor& q, const Tensor& k, const Tensor& v, size_t li,
                             const Step& at) const {
  const Layer& l = w_.layers[li];
  const size_t t = q.dims()[1], h = config_.num_heads, h_kv = config_.num_kv_heads;
  const size_t hd = config_.head_dim;
  const PagedKvCache& cache = *at.pages;
  const PagedBatchTensors& b = *at.batch;
  const std::pair<Tensor, Tensor>& table = at.rope.at(l.attention.rope);  // (cos, sin)
  auto rotated = [&](const Tensor& x, size_t heads) {  // (1, T, heads, hd) -> (T, heads, hd)
    return rotate(x.transpose(1, 2).contiguous(), table.first, table.second)
        .transpose(1, 2)
        .reshape({t, heads, hd});
  };
  nn::paged_kv_write(cache.k(li), cache.v(li), rotated(k, h_kv), v.reshape({t, h_kv, hd}), b.slots);
  return nn::paged_attention(rotated(q, h), cache.k(li), cache.v(li), b.page_table, b.token_seq,
                             b.positions, l.attention.scale, l.attention.window,
                             l.attention.softcap)
      .reshape({1, t, h * hd});
}

}  // namespace wick::models::decoder
