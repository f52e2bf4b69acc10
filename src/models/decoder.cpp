// The shared pieces of the composed decoder families (decoder.h): one layer's attention, the
// decode plan's request and the CausalLM plumbing around a family's layers (configuration and
// rope in decoder_config.cpp, weight sources in decoder_weights.cpp).

#include "models/decoder.h"

#include <cmath>

#include "backend.h"
#include "decode_plan.h"
#include "fused/norm.h"
#include "models/llama_impl.h"
#include "nn/batch_linear.h"
#include "nn/kv_write.h"
#include "util.h"
#include "wick/error.h"
#include "wick/nn/attention.h"
#include "wick/nn/decoder_ops.h"

namespace wick::models::decoder {

Decoder::Decoder(DecoderConfig config, Weights weights, const Device& device, DType dtype)
    : config_(std::move(config)), w_(std::move(weights)), device_(device), dtype_(dtype) {
  for (size_t i = 1; i < w_.ropes.size(); ++i) {
    extra_rope_tables_.push_back(w_.ropes[i].tables(config_.head_dim, config_.max_position, 0,
                                                    config_.max_position, dtype_, device_));
  }
}

Decoder::~Decoder() = default;

KvCache Decoder::make_cache(size_t batch, size_t max_len) const {
  if (batch == 0 || max_len == 0) {
    throw Error(str(config_.architecture, " make_cache: batch ", batch, " and max_len ", max_len,
                    " must be positive"));
  }
  // The cache's tables are those of the first rope; the layers take theirs from Weights::ropes.
  auto [cos, sin] = w_.ropes.at(0).tables(config_.head_dim, max_len, 0, max_len, dtype_, device_);
  return KvCache::allocate(config_.num_layers, batch, config_.num_kv_heads, max_len,
                           config_.head_dim, dtype_, device_, cos, sin);
}

Tensor Decoder::head_norm(const Tensor& x, const Tensor& w, double eps) {
  // rms_norm takes an f32 weight of an f16/bf16 x itself: in f32, rounded once.
  if (fused::rms_norm_weight_fits(x.dtype(), w.dtype())) return x.rms_norm(w, eps);
  return x.to_dtype(w.dtype()).rms_norm(w, eps).to_dtype(x.dtype());
}

Tensor Decoder::linear(const QLinear& w, const Tensor& x, const Step& at) {
  return at.pages != nullptr ? nn::detail::batch_linear(w, x) : w.forward(x);
}

Tensor Decoder::attend(const Tensor& in, size_t li, const Step& at) const {
  const size_t start = at.start;
  const Layer& l = w_.layers[li];
  const DecoderConfig& c = config_;
  const size_t b = in.dims()[0], s = in.dims()[1];
  const size_t h = c.num_heads, h_kv = c.num_kv_heads, hd = c.head_dim;
  const size_t len = start + s;
  Tensor qkv = linear(l.wqkv, in, at);  // (b, s, (h + 2 h_kv) hd)
  if (at.position.defined()) return attend_at_position(qkv, li, at);
  auto heads = [&](size_t first, size_t n) {
    return qkv.narrow(2, first * hd, n * hd).contiguous().reshape({b, s, n, hd});
  };
  Tensor q = heads(0, h), k = heads(h, h_kv), v = heads(h + h_kv, h_kv);
  if (l.q_norm.defined()) q = head_norm(q, l.q_norm, c.rms_norm_eps);
  if (l.k_norm.defined()) k = head_norm(k, l.k_norm, c.rms_norm_eps);
  if (at.pages != nullptr) return attend_paged(q, k, v, li, at);
  KvCache& cache = *at.cache;
  const auto& [cos, sin] = at.rope.at(l.attention.rope);
  q = rotate(q.transpose(1, 2).contiguous(), cos, sin);  // (b, h, s, hd)
  k = rotate(k.transpose(1, 2).contiguous(), cos, sin);
  v = v.transpose(1, 2).contiguous();
  nn::AttentionOptions opt;
  opt.scale = l.attention.scale;
  opt.softcap = l.attention.softcap;
  Tensor keys, values;
  if (at.position.defined()) {
    // Decode step: written where the device position says, masked from it (window included).
    nn::detail::write_at_position(cache.k(li), k, cache.v(li), v, at.position);
    keys = cache.k(li).narrow(2, 0, at.keys);
    values = cache.v(li).narrow(2, 0, at.keys);
    opt.mask = l.attention.window > 0 ? at.mask_window : at.mask_all;
    return nn::scaled_dot_product_attention(q, keys, values, opt)
        .transpose(1, 2)
        .reshape({b, s, h * hd});
  }
  cache.k(li).narrow(2, start, s).assign(k);
  cache.v(li).narrow(2, start, s).assign(v);
  keys = cache.k(li).narrow(2, 0, len);
  values = cache.v(li).narrow(2, 0, len);

  // Causal over the cache, within the layer's window, scores soft-capped: the fused attention
  // op takes both (its composition where a backend's kernel does not).
  opt.causal = s > 1;
  opt.window = l.attention.window;
  Tensor att = nn::scaled_dot_product_attention(q, keys, values, opt);
  return att.transpose(1, 2).reshape({b, s, h * hd});
}

Tensor Decoder::attend_at_position(const Tensor& qkv, size_t li, const Step& at) const {
  const Layer& l = w_.layers[li];
  const DecoderConfig& c = config_;
  const size_t b = qkv.dims()[0], h = c.num_heads, h_kv = c.num_kv_heads, hd = c.head_dim;
  KvCache& cache = *at.cache;
  const size_t rope = l.attention.rope;
  const Tensor& cos = rope == 0 ? cache.cos() : extra_rope_tables_.at(rope - 1).first;
  const Tensor& sin = rope == 0 ? cache.sin() : extra_rope_tables_.at(rope - 1).second;
  Tensor q =
      nn::detail::rope_write_at_position(qkv, Tensor(), h, h_kv, cos, sin, cache.k(li), cache.v(li),
                                         at.position, {l.q_norm, l.k_norm, c.rms_norm_eps});
  Tensor keys = cache.k(li).narrow(2, 0, at.keys), values = cache.v(li).narrow(2, 0, at.keys);
  // Attention to the rows up to the position needs no mask where the window covers them all.
  const AttentionSpec& spec = l.attention;
  const bool unmasked = spec.softcap == 0 && (spec.window == 0 || spec.window >= at.keys) &&
                        spec.scale == 1 / std::sqrt(static_cast<double>(hd));
  Tensor att;
  if (!unmasked || !nn::detail::attend_to_position(q, keys, values, at.position, &att)) {
    nn::AttentionOptions opt;
    opt.scale = spec.scale;
    opt.softcap = spec.softcap;
    opt.mask = spec.window > 0 ? at.mask_window : at.mask_all;
    att = nn::scaled_dot_product_attention(q, keys, values, opt);
  }
  return att.transpose(1, 2).reshape({b, 1, h * hd});
}

Tensor Decoder::head(const Tensor& normed, const Step& at) const {
  Tensor logits = linear(w_.lm_head, normed, at);
  if (config_.final_softcap > 0) {
    const double cap = config_.final_softcap;
    logits = logits.affine(1 / cap, 0).tanh().affine(cap, 0);
  }
  return logits;
}

Tensor Decoder::run(const Tensor& ids, KvCache& cache, bool last_only, const char* op) const {
  const std::string name = str(config_.architecture, " ", op);
  check_forward_ids(ids, cache, w_.layers.size(), device_, name);
  const size_t s = ids.dims()[1], start = cache.length();
  if (start + s > cache.max_len()) {
    throw IndexOutOfRange(str(name, ": ", start, " cached + ", s,
                              " new positions exceed the cache's max_len ", cache.max_len()));
  }
  // One token's logits through the backend's host-side step where it has one (the CPU plan).
  if (last_only && s == 1 && plan_) {
    Tensor logits = plan_->forward_one(ids, cache);
    if (logits.defined()) {
      cache.set_length(start + 1);
      return logits;
    }
  }
  Step at;
  at.cache = &cache;
  at.start = start;
  for (const Rope& r : w_.ropes) {
    at.rope.push_back(r.tables(config_.head_dim, cache.max_len(), start, s, dtype_, device_));
  }
  Tensor normed = hidden(ids, at);
  cache.set_length(start + s);
  if (last_only) normed = normed.narrow(1, s - 1, 1).squeeze(1);
  return head(normed, at);
}

Tensor Decoder::decode_step(const Tensor& token, const Tensor& position, KvCache& cache,
                            Tensor* logits, size_t key_window) const {
  const std::string name = str(config_.architecture, " decode_step");
  check_forward_ids(token, cache, w_.layers.size(), device_, name);
  if (token.dims()[1] != 1 || token.dtype() != DType::U32) {
    throw ShapeMismatch(
        str(name, ": token must be (batch, 1) u32, got ", token.shape(), " ", token.dtype()));
  }
  if (position.elem_count() != 1 || position.rank() != 1 || position.dtype() != DType::U32 ||
      position.device() != device_) {
    throw ShapeMismatch(str(name, ": position must be (1) u32 on ", device_, ", got ",
                            position.shape(), " ", position.dtype(), " on ", position.device()));
  }
  if (key_window == 0) key_window = cache.max_len();
  if (key_window > cache.max_len()) {
    throw IndexOutOfRange(
        str(name, ": key_window ", key_window, " > the cache's ", cache.max_len()));
  }
  if (!extra_rope_tables_.empty() && cache.max_len() > config_.max_position) {
    throw IndexOutOfRange(str(name, ": a cache of ", cache.max_len(),
                              " positions exceeds the model's context of ", config_.max_position));
  }
  if (plan_) {
    Tensor next = plan_->step(token, position, cache, logits, key_window);
    if (next.defined()) return next;
  }
  Step at;
  at.cache = &cache;
  at.position = position;
  at.keys = key_window;
  at.rope.emplace_back(cache.cos().index_select(position, 0),
                       cache.sin().index_select(position, 0));
  for (const auto& [cos, sin] : extra_rope_tables_) {
    at.rope.emplace_back(cos.index_select(position, 0), sin.index_select(position, 0));
  }
  at.mask_all = nn::detail::position_mask(cache, position, key_window);
  size_t window = 0;  // the local layers share one window
  for (const Layer& l : w_.layers) {
    if (l.attention.window > 0 && window > 0 && l.attention.window != window) {
      throw Error(str(name, ": layers with different sliding windows (", window, " and ",
                      l.attention.window, ")"));
    }
    window = std::max(window, l.attention.window);
  }
  if (window > 0) at.mask_window = nn::detail::position_mask(cache, position, key_window, window);
  Tensor out = head(hidden(token, at).squeeze(1), at);  // (b, vocab)
  if (logits != nullptr) *logits = out;
  return out.argmax(1);
}

Tensor Decoder::forward(const Tensor& ids, KvCache& cache) const {
  return run(ids, cache, false, "forward");
}

Tensor Decoder::forward_last(const Tensor& ids, KvCache& cache) const {
  return run(ids, cache, true, "forward_last");
}

void Decoder::ask_for_plan(GatedActivation activation, double embed_scale) {
  const size_t rotary_dims = w_.ropes.at(0).rotated_dims(config_.head_dim);
  for (const Rope& r : w_.ropes) {
    if (r.rotated_dims(config_.head_dim) != rotary_dims) return;
  }
  // Norm weights of the dtype, or f32 ones of an f16/bf16 model (Gemma's 1 + w).
  auto norm_ok = [&](const Tensor& w) {
    return !w.defined() || fused::rms_norm_weight_fits(dtype_, w.dtype());
  };
  DecoderWeights plan;
  plan.heads = config_.num_heads;
  plan.kv_heads = config_.num_kv_heads;
  plan.head_dim = config_.head_dim;
  plan.rotary_dims = rotary_dims;
  plan.eps = config_.rms_norm_eps;
  plan.embed_scale = embed_scale;
  plan.activation = activation;
  plan.final_softcap = config_.final_softcap;
  plan.embed = w_.embed;
  plan.norm = w_.norm;
  plan.lm_head = w_.lm_head;
  if (!norm_ok(w_.norm)) return;
  for (const Layer& l : w_.layers) {
    if (l.q_norm.defined() != l.k_norm.defined()) return;
    for (const Tensor* w :
         {&l.attn_norm, &l.ffn_norm, &l.post_attn_norm, &l.post_ffn_norm, &l.q_norm, &l.k_norm}) {
      if (!norm_ok(*w)) return;
    }
    DecoderWeights::Layer p;
    p.ln1 = l.attn_norm;
    p.ln2 = l.ffn_norm;
    p.post_attn_norm = l.post_attn_norm;
    p.post_ffn_norm = l.post_ffn_norm;
    p.wqkv = l.wqkv;
    p.wo = l.wo;
    p.wgate_up = l.wgate_up;
    p.wdown = l.wdown;
    p.q_norm = l.q_norm;
    p.k_norm = l.k_norm;
    if (l.attention.rope > 0) {
      std::tie(p.cos, p.sin) = extra_rope_tables_.at(l.attention.rope - 1);
    }
    p.window = l.attention.window;
    p.scale = l.attention.scale;
    p.softcap = l.attention.softcap;
    plan.layers.push_back(std::move(p));
  }
  plan_ = backend_device(device_).decode_plan(plan);
}

PreNormDecoder::PreNormDecoder(DecoderConfig config, Weights weights, const Device& device,
                               DType dtype)
    : Decoder(std::move(config), std::move(weights), device, dtype) {
  ask_for_plan(GatedActivation::SiLU, 1);
}

Tensor PreNormDecoder::hidden(const Tensor& ids, const Step& at) const {
  const double eps = config_.rms_norm_eps;
  Tensor x = w_.embed.embedding(ids);
  // Each residual add with the norm after it in one op, as Llama's forward and the decode plans
  // compute them: a sequence's logits are then the same bits whichever of them ran its step.
  Tensor normed = x.rms_norm(w_.layers.at(0).attn_norm, eps);
  for (size_t li = 0; li < w_.layers.size(); ++li) {
    const Layer& l = w_.layers[li];
    nn::ResidualNorm r =
        nn::add_rms_norm(x, linear(l.wo, attend(normed, li, at), at), l.ffn_norm, eps);
    Tensor act = nn::silu_mul(linear(l.wgate_up, r.normed, at));
    const Tensor& next = li + 1 < w_.layers.size() ? w_.layers[li + 1].attn_norm : w_.norm;
    r = nn::add_rms_norm(r.residual, linear(l.wdown, act, at), next, eps);
    x = r.residual;
    normed = r.normed;
  }
  return normed;
}

}  // namespace wick::models::decoder
