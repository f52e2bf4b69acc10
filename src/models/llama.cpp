#include "wick/llama.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend.h"
#include "models/families.h"
#include "models/json_file.h"
#include "models/llama_impl.h"
#include "nn/batch_linear.h"
#include "nn/kv_write.h"
#include "util.h"
#include "wick/error.h"
#include "wick/nn/attention.h"
#include "wick/nn/decoder_ops.h"
#include "wick/nn/paged_attention.h"

namespace wick::models {

namespace {

using json = nlohmann::json;

// A non-negative integer field (FormatError naming origin and key when missing or mistyped).
size_t get_size(const json& j, const char* key, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end()) throw FormatError(str(origin, ": missing field \"", key, "\""));
  return json_file::as_uint(*it, key, origin);
}

// A field that may be absent or null (then `fallback`).
size_t get_size_or(const json& j, const char* key, size_t fallback, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return json_file::as_uint(*it, key, origin);
}

double get_double(const json& j, const char* key, double fallback, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) json_file::bad_field(origin, key, "a number", *it);
  return it->get<double>();
}

// A token id or a list of them; each a 32-bit unsigned integer.
std::vector<uint32_t> token_list(const json& v, const char* key, const std::string& origin) {
  std::vector<uint32_t> out;
  auto one = [&](const json& x) {
    out.push_back(static_cast<uint32_t>(json_file::as_uint(x, key, origin, UINT32_MAX)));
  };
  if (v.is_null()) return out;
  if (v.is_array()) {
    for (const auto& x : v) one(x);
  } else {
    one(v);
  }
  return out;
}

// A positive finite number, or FormatError naming it.
void check_positive(double v, const char* key, const std::string& origin) {
  if (!(std::isfinite(v) && v > 0)) {
    throw FormatError(str(origin, ": ", key, " ", v, " must be a positive finite number"));
  }
}

}  // namespace

// ---- config ----

LlamaConfig LlamaConfig::from_json(const std::string& json_text, const std::string& origin) {
  json j = json_file::parse(json_text, origin);
  if (!j.is_object()) throw FormatError(str(origin, ": not a JSON object"));
  LlamaConfig c;
  c.model_type = json_file::get_string(j, "model_type", origin, "llama");
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral") {
    throw FormatError(str(origin, ": model_type ", formats::quote_prefix(c.model_type),
                          " is not a Llama-family decoder (llama, qwen2, mistral)"));
  }
  c.vocab_size = get_size(j, "vocab_size", origin);
  c.hidden_size = get_size(j, "hidden_size", origin);
  c.intermediate_size = get_size(j, "intermediate_size", origin);
  c.num_hidden_layers = get_size(j, "num_hidden_layers", origin);
  c.num_attention_heads = get_size(j, "num_attention_heads", origin);
  c.num_key_value_heads = get_size_or(j, "num_key_value_heads", c.num_attention_heads, origin);
  auto hd = j.find("head_dim");
  if (hd != j.end() && !hd->is_null()) {
    c.head_dim = json_file::as_uint(*hd, "head_dim", origin);
  } else if (c.num_attention_heads > 0) {
    // Without head_dim the heads must split hidden_size exactly.
    if (c.hidden_size % c.num_attention_heads != 0) {
      throw FormatError(str(origin, ": hidden_size ", c.hidden_size,
                            " is not a multiple of num_attention_heads ", c.num_attention_heads,
                            " (and no head_dim is given)"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings =
      get_size_or(j, "max_position_embeddings", c.max_position_embeddings, origin);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", 1e-6, origin);
  c.rope_theta = get_double(j, "rope_theta", 10000.0, origin);
  c.tie_word_embeddings = json_file::get_bool(j, "tie_word_embeddings", origin, false);
  c.qkv_bias = c.model_type == "qwen2" || json_file::get_bool(j, "attention_bias", origin, false);
  // transformers < 5: rope_theta and rope_scaling at the top; 5: both in rope_parameters.
  const json* rope = nullptr;
  auto rp = j.find("rope_parameters");
  auto rsc = j.find("rope_scaling");
  if (rp != j.end() && rp->is_object()) {
    rope = &*rp;
    c.rope_theta = get_double(*rope, "rope_theta", c.rope_theta, origin);
  } else if (rsc != j.end() && rsc->is_object()) {
    rope = &*rsc;
  } else if (rsc != j.end() && !rsc->is_null()) {
    json_file::bad_field(origin, "rope_scaling", "an object or null", *rsc);
  }
  if (rope != nullptr) {
    const json& rs = *rope;
    std::string type = json_file::get_string(rs, "type", origin, "");
    type = json_file::get_string(rs, "rope_type", origin, type);
    if (type == "llama3") {
      Llama3RopeScaling s;
      s.factor = get_double(rs, "factor", s.factor, origin);
      s.low_freq_factor = get_double(rs, "low_freq_factor", s.low_freq_factor, origin);
      s.high_freq_factor = get_double(rs, "high_freq_factor", s.high_freq_factor, origin);
      s.original_max_position_embeddings = get_double(rs, "original_max_position_embeddings",
                                                      s.original_max_position_embeddings, origin);
      c.rope_scaling = s;
    } else if (!type.empty() && type != "default") {
      throw FormatError(
          str(origin, ": rope type ", formats::quote_prefix(type), " is not supported"));
    }
  }
  if (json_file::get_bool(j, "use_sliding_window", origin, false)) {
    throw FormatError(str(origin, ": sliding-window attention is not supported"));
  }
  // Mistral's window applies whenever it is set (mistral.cpp composes it; Llama's path has none).
  auto window = j.find("sliding_window");
  const size_t window_size = window == j.end() || window->is_null()
                                 ? 0
                                 : json_file::as_uint(*window, "sliding_window", origin);
  if (c.model_type == "mistral" && window_size > 0 && window_size < c.max_position_embeddings) {
    throw FormatError(str(origin, ": sliding_window ", *window,
                          " is below max_position_embeddings: Llama has no sliding window "
                          "(load_causal_lm reads this model)"));
  }
  auto bos = j.find("bos_token_id");
  if (bos != j.end()) {
    auto b = token_list(*bos, "bos_token_id", origin);
    if (!b.empty()) c.bos_token_id = b[0];
  }
  auto eos = j.find("eos_token_id");
  if (eos != j.end()) c.eos_token_ids = token_list(*eos, "eos_token_id", origin);
  c.validate(origin);
  return c;
}

LlamaConfig LlamaConfig::from_file(const std::string& path) {
  return from_json(formats::read_file_bounded(path, json_file::kMaxConfigBytes), path);
}

void LlamaConfig::validate(const std::string& origin) const {
  if (vocab_size == 0 || hidden_size == 0 || intermediate_size == 0 || num_hidden_layers == 0 ||
      num_attention_heads == 0 || num_key_value_heads == 0 || head_dim == 0 ||
      max_position_embeddings == 0) {
    throw FormatError(str(origin, ": sizes must be positive (vocab ", vocab_size, ", hidden ",
                          hidden_size, ", intermediate ", intermediate_size, ", layers ",
                          num_hidden_layers, ", heads ", num_attention_heads, "/",
                          num_key_value_heads, ", head_dim ", head_dim, ", max positions ",
                          max_position_embeddings, ")"));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    throw FormatError(str(origin, ": num_attention_heads ", num_attention_heads,
                          " is not a multiple of num_key_value_heads ", num_key_value_heads));
  }
  if (head_dim % 2 != 0) throw FormatError(str(origin, ": head_dim ", head_dim, " is odd"));
  // Products that size the weights and the cache must not wrap.
  size_t q_rows = 0, kv_rows = 0, embed = 0;
  if (__builtin_mul_overflow(num_attention_heads, head_dim, &q_rows) ||
      __builtin_mul_overflow(num_key_value_heads, head_dim, &kv_rows) ||
      __builtin_mul_overflow(vocab_size, hidden_size, &embed)) {
    throw FormatError(str(origin, ": sizes overflow (heads ", num_attention_heads, "/",
                          num_key_value_heads, " x head_dim ", head_dim, ", vocab ", vocab_size,
                          " x hidden ", hidden_size, ")"));
  }
  check_positive(rms_norm_eps, "rms_norm_eps", origin);
  check_positive(rope_theta, "rope_theta", origin);
  if (rope_scaling) {
    const Llama3RopeScaling& s = *rope_scaling;
    check_positive(s.factor, "rope factor", origin);
    check_positive(s.low_freq_factor, "rope low_freq_factor", origin);
    check_positive(s.high_freq_factor, "rope high_freq_factor", origin);
    check_positive(s.original_max_position_embeddings, "rope original_max_position_embeddings",
                   origin);
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      throw FormatError(str(origin, ": rope high_freq_factor ", s.high_freq_factor,
                            " must be above low_freq_factor ", s.low_freq_factor));
    }
  }
  check_special_tokens(*this, origin);
}

void LlamaConfig::derive_common() {
  architecture = model_type;
  num_layers = num_hidden_layers;
  num_heads = num_attention_heads;
  num_kv_heads = num_key_value_heads;
  max_position = max_position_embeddings;
  if (head_dim == 0 && num_attention_heads > 0) head_dim = hidden_size / num_attention_heads;
}

// ---- the model ----
// Per layer: x += o(attention(rope(q), rope(k), v)) of qkv(rms_norm(x)), then
// x += down(silu(gate) * up) of gate_up(rms_norm(x)); the logits are lm_head(rms_norm(x)).

namespace {

// 1 / theta^(2i/d), with Llama 3's smooth scaling of the low frequencies.
std::vector<double> inverse_frequencies(const LlamaConfig& c) {
  size_t half = c.head_dim / 2;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
  }
  if (c.rope_scaling) {
    const Llama3RopeScaling& s = *c.rope_scaling;
    double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    for (double& f : inv) {
      double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace

Llama::Llama(std::shared_ptr<Impl> impl) {
  impl->config.derive_common();
  impl->heads = impl->config.num_attention_heads;
  impl->kv_heads = impl->config.num_key_value_heads;
  impl->head_dim = impl->config.head_dim;
  impl->rotary_dims = impl->config.head_dim;  // Llama's rope turns whole heads
  impl->eps = impl->config.rms_norm_eps;
  impl->plan = backend_device(impl->device).decode_plan(*impl);
  impl_ = std::move(impl);
}

const LlamaConfig& Llama::config() const {
  return impl_->config;
}
Device Llama::device() const {
  return impl_->device;
}
DType Llama::dtype() const {
  return impl_->dtype;
}

size_t Llama::weight_bytes() const {
  size_t n = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined()) n += t.elem_count() * size_in_bytes(t.dtype());
  };
  add(impl_->embed);
  add(impl_->norm);
  if (!impl_->config.tie_word_embeddings || impl_->lm_head.quantized()) {
    n += impl_->lm_head.bytes();
  }
  for (const auto& l : impl_->layers) {
    for (const Tensor* t : {&l.ln1, &l.ln2, &l.bqkv}) add(*t);
    for (const QLinear* w : {&l.wqkv, &l.wo, &l.wgate_up, &l.wdown}) n += w->bytes();
  }
  return n;
}

Llama Llama::from_weights(const LlamaConfig& config, const std::map<std::string, Tensor>& weights,
                          const Device& device, DType dtype) {
  config.validate("Llama::from_weights");
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    throw UnsupportedDType(str("Llama: weights must be f32, f16 or bf16, got ", dtype));
  }
  auto impl = std::make_shared<Impl>();
  impl->config = config;
  impl->device = device;
  impl->dtype = dtype;
  const LlamaConfig& c = config;
  auto get = [&](const std::string& name, const Shape& shape) {
    auto it = weights.find(name);
    if (it == weights.end()) throw FormatError(str("Llama: missing weight ", name));
    if (it->second.shape() != shape) {
      throw ShapeMismatch(
          str("Llama: weight ", name, " has shape ", it->second.shape(), ", expected ", shape));
    }
    DType stored = it->second.dtype();
    if (stored != DType::F32 && stored != DType::F16 && stored != DType::BF16 &&
        stored != DType::F64) {
      throw FormatError(str("Llama: weight ", name, " is ", stored, ", not a float dtype"));
    }
    return it->second.to_device(device).to_dtype(dtype);
  };
  size_t d = c.hidden_size, q_out = c.num_attention_heads * c.head_dim;
  size_t kv_out = c.num_key_value_heads * c.head_dim, inter = c.intermediate_size;
  impl->embed = get("model.embed_tokens.weight", {c.vocab_size, d});
  impl->norm = get("model.norm.weight", {d});
  if (c.tie_word_embeddings || weights.count("lm_head.weight") == 0) {
    impl->lm_head = impl->embed;
    impl->config.tie_word_embeddings = true;
  } else {
    impl->lm_head = get("lm_head.weight", {c.vocab_size, d});
  }
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = str("model.layers.", i, ".");
    Impl::Layer l;
    l.ln1 = get(p + "input_layernorm.weight", {d});
    l.ln2 = get(p + "post_attention_layernorm.weight", {d});
    // q, k and v as one matrix (and gate with up): one matmul each instead of three (two).
    l.wqkv = Tensor::cat({get(p + "self_attn.q_proj.weight", {q_out, d}),
                          get(p + "self_attn.k_proj.weight", {kv_out, d}),
                          get(p + "self_attn.v_proj.weight", {kv_out, d})},
                         0);
    if (c.qkv_bias) {
      l.bqkv = Tensor::cat(
          {get(p + "self_attn.q_proj.bias", {q_out}), get(p + "self_attn.k_proj.bias", {kv_out}),
           get(p + "self_attn.v_proj.bias", {kv_out})},
          0);
    }
    l.wo = get(p + "self_attn.o_proj.weight", {d, q_out});
    l.wgate_up = Tensor::cat(
        {get(p + "mlp.gate_proj.weight", {inter, d}), get(p + "mlp.up_proj.weight", {inter, d})},
        0);
    l.wdown = get(p + "mlp.down_proj.weight", {d, inter});
    impl->layers.push_back(std::move(l));
  }
  return Llama(std::move(impl));
}

namespace {

// Rope tables (positions, head_dim / 2) in the model's dtype. Angles in double, rounded once:
// transformers computes them in f32 (differences ~1e-7).
std::pair<Tensor, Tensor> rope_tables_of(const Llama::Impl& m, size_t positions) {
  std::vector<double> inv = inverse_frequencies(m.config);
  size_t half = inv.size();
  std::vector<float> cos_v(positions * half), sin_v(positions * half);
  for (size_t p = 0; p < positions; ++p) {
    for (size_t i = 0; i < half; ++i) {
      // transformers: (f32 position) * (f32 inverse frequency), in f32.
      float angle = static_cast<float>(p) * static_cast<float>(inv[i]);
      cos_v[p * half + i] = std::cos(angle);
      sin_v[p * half + i] = std::sin(angle);
    }
  }
  const Device& dev = m.device;
  return {Tensor::from_vec(cos_v, {positions, half}, dev).to_dtype(m.dtype),
          Tensor::from_vec(sin_v, {positions, half}, dev).to_dtype(m.dtype)};
}

}  // namespace

KvCache Llama::make_cache(size_t batch, size_t max_len) const {
  const LlamaConfig& c = impl_->config;
  if (batch == 0 || max_len == 0) {
    throw Error(
        str("Llama::make_cache: batch ", batch, " and max_len ", max_len, " must be positive"));
  }
  auto [cos, sin] = rope_tables_of(*impl_, max_len);
  return KvCache::allocate(c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim,
                           impl_->dtype, impl_->device, std::move(cos), std::move(sin));
}

PagedKvCache Llama::make_paged_cache(size_t pages, size_t page_size) const {
  const LlamaConfig& c = impl_->config;
  auto [cos, sin] = rope_tables_of(*impl_, c.max_position_embeddings);
  return PagedKvCache::allocate(c.num_hidden_layers, pages, page_size, c.num_key_value_heads,
                                c.head_dim, impl_->dtype, impl_->device, std::move(cos),
                                std::move(sin));
}

namespace {

// Where the positions of this forward come from: a host offset (prefill and plain decode) or
// one device U32 (the graph-captured decode step, attending to the first `window` cache rows).
struct Positions {
  size_t start = 0;
  Tensor device_pos;  // defined: graph step
  size_t window = 0;  // graph step: keys [0, window) are read, those after the position masked
};

using Layer = DecoderWeights::Layer;

// The residual stream after the last layer and its final norm.
struct Hidden {
  Tensor residual, normed;
};

Hidden run_layers(const Llama::Impl& m, const Tensor& ids, KvCache& cache, const Positions& pos) {
  const LlamaConfig& c = m.config;
  size_t b = ids.dims()[0], s = ids.dims()[1];
  size_t h = c.num_attention_heads, h_kv = c.num_key_value_heads, hd = c.head_dim;
  const bool graph_step = pos.device_pos.defined();
  const size_t len = graph_step ? pos.window : pos.start + s;  // keys attended to
  Tensor position = graph_step
                        ? pos.device_pos
                        : Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(pos.start)},
                                           {1}, m.device);
  nn::AttentionOptions attention;
  attention.causal = !graph_step && s > 1;  // prefill: aligned to the end of the keys
  // Graph step: the window's rows after the position hold stale or zero values.
  if (graph_step) attention.mask = nn::detail::position_mask(cache, position, len);
  const double eps = c.rms_norm_eps;
  Tensor x = m.embed.embedding(ids);  // (b, s, d): the residual stream
  Tensor normed = x.rms_norm(m.layers.at(0).ln1, eps);
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const Layer& l = m.layers[li];
    Tensor bias;
    Tensor qkv = nn::detail::project_qkv(normed, l.wqkv, l.bqkv, &bias);
    Tensor q = nn::detail::rope_write_at_position(qkv, bias, h, h_kv, cache.cos(), cache.sin(),
                                                  cache.k(li), cache.v(li), position);
    Tensor att = nn::scaled_dot_product_attention(q, cache.k(li).narrow(2, 0, len),
                                                  cache.v(li).narrow(2, 0, len), attention);
    att = att.transpose(1, 2).reshape({b, s, h * hd});
    nn::ResidualNorm r = nn::add_rms_norm(x, l.wo.forward(att), l.ln2, eps);
    Tensor act = nn::silu_mul(l.wgate_up.forward(r.normed));
    const Tensor& next_norm = li + 1 == m.layers.size() ? m.norm : m.layers[li + 1].ln1;
    r = nn::add_rms_norm(r.residual, l.wdown.forward(act), next_norm, eps);
    x = r.residual;
    normed = r.normed;
  }
  return {x, normed};
}

void check_room(const KvCache& cache, size_t s, const char* op) {
  if (cache.length() + s > cache.max_len()) {
    throw IndexOutOfRange(str(op, ": ", cache.length(), " cached + ", s,
                              " new positions exceed the cache's max_len ", cache.max_len()));
  }
}

}  // namespace

Tensor Llama::forward(const Tensor& ids, KvCache& cache) const {
  check_forward_ids(ids, cache, impl_->layers.size(), impl_->device, "Llama::forward");
  size_t s = ids.dims()[1];
  check_room(cache, s, "Llama::forward");
  Hidden hidden = run_layers(*impl_, ids, cache, Positions{cache.length(), Tensor()});
  cache.set_length(cache.length() + s);
  return impl_->lm_head.forward(hidden.normed);
}

Tensor Llama::forward_last(const Tensor& ids, KvCache& cache) const {
  check_forward_ids(ids, cache, impl_->layers.size(), impl_->device, "Llama::forward_last");
  size_t s = ids.dims()[1];
  check_room(cache, s, "Llama::forward_last");
  if (impl_->plan && s == 1) {
    Tensor logits = impl_->plan->forward_one(ids, cache);
    if (logits.defined()) {
      cache.set_length(cache.length() + 1);
      return logits;
    }
  }
  Hidden hidden = run_layers(*impl_, ids, cache, Positions{cache.length(), Tensor()});
  cache.set_length(cache.length() + s);
  Tensor normed = hidden.normed.narrow(1, s - 1, 1).squeeze(1);
  // A quantized head computes in f32 on the CPU: its logits stay f32, so that greedy picks from
  // f32 logits whatever the compute dtype (f16/bf16 rounding ties the top logits).
  if (impl_->lm_head.quantized() && normed.device().is_cpu()) normed = normed.to_dtype(DType::F32);
  return impl_->lm_head.forward(normed);
}

// A ragged batch as one sequence of all new tokens: the projections, norms and FFN see rows
// only; rope takes each token's own position, and attention each token's own sequence's pages.
Tensor Llama::forward_paged(const std::vector<PagedSequence>& batch, PagedKvCache& cache) const {
  const Impl& m = *impl_;
  check_paged_batch(batch, cache, m.config.vocab_size, m.config.max_position_embeddings,
                    "Llama::forward_paged");
  return forward_paged_tensors(paged_batch_tensors(batch, cache.page_size(), m.device), cache);
}

Tensor Llama::forward_paged_tensors(const PagedBatchTensors& b, PagedKvCache& cache) const {
  const Impl& m = *impl_;
  const LlamaConfig& c = m.config;
  constexpr const char* kOp = "Llama::forward_paged";
  if (cache.layers() != m.layers.size() || !cache.cos().defined() ||
      cache.cos().dims()[0] < c.max_position_embeddings) {
    throw ShapeMismatch(str(kOp, ": a paged cache of ", cache.layers(),
                            " layers (with rope tables) for a model of ", m.layers.size(),
                            " layers: make it with make_paged_cache"));
  }
  const size_t t = b.ids.elem_count();
  const Shape tokens{t};
  const Tensor* all[] = {&b.ids, &b.positions, &b.token_seq, &b.slots, &b.page_table, &b.last};
  for (const Tensor* x : all) {
    if (!x->defined() || x->dtype() != DType::U32 || x->device() != m.device) {
      throw ShapeMismatch(str(kOp, ": the batch's tensors must be u32 on ", m.device));
    }
  }
  if (t == 0 || b.ids.shape() != tokens || b.positions.shape() != tokens ||
      b.token_seq.shape() != tokens || b.slots.shape() != tokens || b.page_table.rank() != 2 ||
      b.last.shape() != Shape{b.page_table.dims()[0]}) {
    throw ShapeMismatch(str(kOp, ": ids ", b.ids.shape(), ", page_table ", b.page_table.shape(),
                            " and last ", b.last.shape(), " do not form a batch"));
  }
  if (m.plan) {
    Tensor logits = m.plan->paged_step(b, cache);
    if (logits.defined()) return logits;
  }
  const size_t h = c.num_attention_heads, h_kv = c.num_key_value_heads, hd = c.head_dim;
  Tensor cos = cache.cos().index_select(b.positions, 0);
  Tensor sin = cache.sin().index_select(b.positions, 0);
  const double eps = c.rms_norm_eps;
  Tensor x = m.embed.embedding(b.ids.reshape({1, t}));  // (1, t, d)
  Tensor normed = x.rms_norm(m.layers.at(0).ln1, eps);
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const Layer& l = m.layers[li];
    Tensor bias;
    Tensor qkv = nn::detail::batch_project_qkv(normed, l.wqkv, l.bqkv, &bias);
    if (bias.defined()) qkv = qkv.broadcast_add(bias);
    Tensor qk = qkv.narrow(2, 0, (h + h_kv) * hd)
                    .reshape({1, t, h + h_kv, hd})
                    .transpose(1, 2)
                    .rope(cos, sin)
                    .transpose(1, 2)
                    .reshape({t, h + h_kv, hd});
    Tensor v = qkv.narrow(2, (h + h_kv) * hd, h_kv * hd).reshape({t, h_kv, hd});
    nn::paged_kv_write(cache.k(li), cache.v(li), qk.narrow(1, h, h_kv), v, b.slots);
    Tensor att = nn::paged_attention(qk.narrow(1, 0, h), cache.k(li), cache.v(li), b.page_table,
                                     b.token_seq, b.positions)
                     .reshape({1, t, h * hd});
    nn::ResidualNorm r = nn::add_rms_norm(x, nn::detail::batch_linear(l.wo, att), l.ln2, eps);
    Tensor act = nn::silu_mul(nn::detail::batch_linear(l.wgate_up, r.normed));
    const Tensor& next_norm = li + 1 == m.layers.size() ? m.norm : m.layers[li + 1].ln1;
    r = nn::add_rms_norm(r.residual, nn::detail::batch_linear(l.wdown, act), next_norm, eps);
    x = r.residual;
    normed = r.normed;
  }
  Tensor rows = normed.reshape({t, c.hidden_size}).index_select(b.last, 0);
  // As forward_last: a quantized head on the CPU computes in f32.
  if (m.lm_head.quantized() && rows.device().is_cpu()) rows = rows.to_dtype(DType::F32);
  return nn::detail::batch_linear(m.lm_head, rows);
}

Tensor Llama::decode_step(const Tensor& token, const Tensor& position, KvCache& cache,
                          Tensor* logits, size_t key_window) const {
  check_forward_ids(token, cache, impl_->layers.size(), impl_->device, "Llama::decode_step");
  if (token.dims()[1] != 1 || token.dtype() != DType::U32) {
    throw ShapeMismatch(str("Llama::decode_step: token must be (batch, 1) u32, got ", token.shape(),
                            " ", token.dtype()));
  }
  if (position.elem_count() != 1 || position.rank() != 1 || position.dtype() != DType::U32 ||
      position.device() != impl_->device) {
    throw ShapeMismatch(str("Llama::decode_step: position must be (1) u32 on ", impl_->device,
                            ", got ", position.shape(), " ", position.dtype(), " on ",
                            position.device()));
  }
  if (key_window == 0) key_window = cache.max_len();
  if (key_window > cache.max_len()) {
    throw IndexOutOfRange(
        str("Llama::decode_step: key_window ", key_window, " > the cache's ", cache.max_len()));
  }
  if (impl_->plan) {
    Tensor next = impl_->plan->step(token, position, cache, logits, key_window);
    if (next.defined()) return next;
  }
  Hidden hidden = run_layers(*impl_, token, cache, Positions{0, position, key_window});
  Tensor out = impl_->lm_head.forward(hidden.normed.squeeze(1));  // (b, vocab)
  if (logits != nullptr) *logits = out;
  return out.argmax(1);
}

}  // namespace wick::models
