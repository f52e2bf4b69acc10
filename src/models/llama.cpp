#include "wick/llama.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "models/decode_gemv.h"
#include "models/json_file.h"
#include "models/kv_write.h"
#include "models/llama_impl.h"
#include "util.h"
#include "wick/error.h"
#include "wick/nn/attention.h"
#include "wick/nn/decoder_ops.h"

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
  if (bos_token_id && *bos_token_id >= vocab_size) {
    throw FormatError(str(origin, ": bos_token_id ", *bos_token_id, " is outside the vocabulary (",
                          vocab_size, " tokens)"));
  }
  for (uint32_t id : eos_token_ids) {
    if (id >= vocab_size) {
      throw FormatError(str(origin, ": eos_token_id ", id, " is outside the vocabulary (",
                            vocab_size, " tokens)"));
    }
  }
}

// ---- KV cache ----

size_t KvCache::bytes() const {
  size_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i) {
    n += k_[i].elem_count() * size_in_bytes(k_[i].dtype());
    n += v_[i].elem_count() * size_in_bytes(v_[i].dtype());
  }
  return n;
}

void KvCache::set_length(size_t length) {
  if (length > max_len_) {
    throw IndexOutOfRange(str("KvCache::set_length: ", length, " > max_len ", max_len_));
  }
  length_ = length;
}

// ---- the model ----

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

// x (..., in) times w (out, in) transposed, plus bias (w plain or quantized: models/qlinear.h).
Tensor linear(const Tensor& x, const QLinear& w, const Tensor& bias) {
  return w.forward(x, bias);
}

}  // namespace

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

KvCache Llama::make_cache(size_t batch, size_t max_len) const {
  const LlamaConfig& c = impl_->config;
  if (batch == 0 || max_len == 0) {
    throw Error(
        str("Llama::make_cache: batch ", batch, " and max_len ", max_len, " must be positive"));
  }
  KvCache cache;
  cache.batch_ = batch;
  cache.max_len_ = max_len;
  Shape shape{batch, c.num_key_value_heads, max_len, c.head_dim};
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    cache.k_.push_back(Tensor::zeros(shape, impl_->dtype, impl_->device));
    cache.v_.push_back(Tensor::zeros(shape, impl_->dtype, impl_->device));
  }
  // Angles in double, rounded once: transformers computes them in f32 (differences ~1e-7).
  std::vector<double> inv = inverse_frequencies(c);
  size_t half = inv.size();
  std::vector<float> cos_v(max_len * half), sin_v(max_len * half);
  for (size_t p = 0; p < max_len; ++p) {
    for (size_t i = 0; i < half; ++i) {
      // transformers: (f32 position) * (f32 inverse frequency), in f32.
      float angle = static_cast<float>(p) * static_cast<float>(inv[i]);
      cos_v[p * half + i] = std::cos(angle);
      sin_v[p * half + i] = std::sin(angle);
    }
  }
  float fill[2] = {-std::numeric_limits<float>::infinity(), 0.0f};
  cache.mask_fill_ = Tensor::from_vec(std::vector<float>(fill, fill + 2), {2}, impl_->device)
                         .to_dtype(impl_->dtype);
  cache.positions_ = Tensor::arange<uint32_t>(0, static_cast<uint32_t>(max_len), impl_->device);
  cache.cos_ = Tensor::from_vec(cos_v, {max_len, half}, impl_->device).to_dtype(impl_->dtype);
  cache.sin_ = Tensor::from_vec(sin_v, {max_len, half}, impl_->device).to_dtype(impl_->dtype);
  return cache;
}

namespace {

// Where the positions of this forward come from: a host offset (prefill and plain decode) or
// one device U32 (the graph-captured decode step, attending to the first `window` cache rows).
struct Positions {
  size_t start = 0;
  Tensor device_pos;  // defined: graph step
  size_t window = 0;  // graph step: keys [0, window) are read, those after the position masked
};

// The residual stream after the last layer, and its final norm when the composed path made it.
struct Hidden {
  Tensor residual, normed;
};

Hidden run_layers(const Llama::Impl& m, const Tensor& ids, KvCache& cache, const Positions& pos) {
  const LlamaConfig& c = m.config;
  size_t b = ids.dims()[0], s = ids.dims()[1];
  size_t h = c.num_attention_heads, h_kv = c.num_key_value_heads, hd = c.head_dim;
  bool graph_step = pos.device_pos.defined();
  size_t len = graph_step ? pos.window : pos.start + s;  // keys attended to
  Tensor position = graph_step
                        ? pos.device_pos
                        : Tensor::from_vec(std::vector<uint32_t>{static_cast<uint32_t>(pos.start)},
                                           {1}, m.device);

  // Graph step: keys after the position are hidden, the window's rows past it holding stale or
  // zero values; by the attention kernel itself where it can, else by a mask (in the model's
  // dtype, as attention wants) made once per step.
  Tensor mask;
  auto position_mask = [&] {
    if (!mask.defined()) {
      Tensor later = cache.positions().narrow(0, 0, len).gt(pos.device_pos.broadcast_as({len}));
      mask = later.where_cond(cache.mask_fill().narrow(0, 0, 1), cache.mask_fill().narrow(0, 1, 1))
                 .reshape({1, len});
    }
    return mask;
  };

  // Per layer: norm, qkv projection, rope + cache write, attention, output projection, residual
  // add, norm, gate/up projection, silu * up, down projection, residual add. One token on CUDA
  // fuses each projection with the norm before it and what follows it (models/decode_gemv.h);
  // otherwise the ops are composed, each add fused with the norm after it.
  bool single = b * s == 1 && m.device.is_cuda();
  double eps = c.rms_norm_eps;
  Tensor x = m.embed.embedding(ids);  // (b, s, d): the residual stream
  Tensor normed;                      // x.rms_norm(the next norm), when the composed path made it
  auto normed_by = [&](const Tensor& w) {
    if (!normed.defined()) normed = x.rms_norm(w, eps);
    return normed;
  };
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const auto& l = m.layers[li];
    Tensor q;
    if (!(single && !normed.defined() &&
          detail::fused_qkv_rope(x, l.ln1, eps, l.wqkv, l.bqkv, h, h_kv, cache.cos(), cache.sin(),
                                 cache.k(li), cache.v(li), position, &q))) {
      Tensor in = normed_by(l.ln1), qkv, bias = l.bqkv;
      if (bias.defined() && m.dtype != DType::F32 && !l.wqkv.quantized()) {
        // transformers' f16/bf16 nn.Linear rounds the product and its bias once (the bias
        // joins the f32 accumulation); adding it to the rounded product would round twice.
        size_t n = l.wqkv.dense().dims()[0];
        qkv = in.reshape({b * s, c.hidden_size})
                  .to_dtype(DType::F32)
                  .matmul(l.wqkv.dense().to_dtype(DType::F32).t())
                  .broadcast_add(bias.to_dtype(DType::F32))
                  .to_dtype(m.dtype)
                  .reshape({b, s, n});
        bias = Tensor();
      } else {
        qkv = linear(in, l.wqkv, Tensor());  // the bias is added by the rope kernel
      }
      q = detail::rope_write_at_position(qkv, bias, h, h_kv, cache.cos(), cache.sin(), cache.k(li),
                                         cache.v(li), position);
    }
    normed = Tensor();
    Tensor keys = cache.k(li).narrow(2, 0, len), values = cache.v(li).narrow(2, 0, len);
    // Prefill: causal, aligned to the end of the keys; graph step: later rows hidden.
    Tensor att;  // (b, h, s, hd)
    // A plain output projection launches as the attention starts and asks the L2 for its rows
    // on the multiprocessors the attention leaves free (H200, graph decode tok/s, three rounds:
    // Llama-1B bf16 1,213.0-1,215.3 without, 1,222.4-1,226.5 with, 1,208.4-1,210.4 with only the
    // L2 requests, 1,213.9-1,216.7 with only the early launch; SmolLM2 bf16 2,094.9-2,095.1
    // against 2,141.7-2,142.4). The early launch alone slowed the Q4_0 pairs kernel: Llama-1B
    // Q4_0 2,106.8-2,110.3 against 2,071.3-2,071.9.
    const bool plain_o = !l.wo.quantized();
    if (single && graph_step && plain_o) detail::ask_l2_aside(q, l.wgate_up);
    const bool attended =
        graph_step && detail::attend_to_position(q, keys, values, position, &att, plain_o);
    if (!attended) {
      nn::AttentionOptions opts;
      opts.causal = !graph_step && s > 1;
      if (graph_step) opts.mask = position_mask();
      att = nn::scaled_dot_product_attention(q, keys, values, opts);
    }
    att = att.transpose(1, 2).reshape({b, s, h * hd});
    // Each residual add: fused into the projection, or composed with the norm that follows.
    auto project_add = [&](const Tensor& in, const QLinear& w, const Tensor& next_norm,
                           bool early = false, const QLinear* next = nullptr) {
      Tensor sum;
      if (single && detail::fused_project_add(in, w, x, &sum, early, next)) {
        x = sum;
      } else {
        nn::ResidualNorm r = nn::add_rms_norm(x, linear(in, w, Tensor()), next_norm, eps);
        x = r.residual;
        normed = r.normed;
      }
    };
    project_add(att, l.wo, l.ln2, attended && plain_o, &l.wgate_up);
    Tensor act;
    if (!(single && !normed.defined() &&
          detail::fused_gate_up_silu(x, l.ln2, eps, l.wgate_up, &act, &l.wdown))) {
      act = nn::silu_mul(linear(normed_by(l.ln2), l.wgate_up, Tensor()));
    }
    normed = Tensor();
    const bool last = li + 1 == m.layers.size();
    project_add(act, l.wdown, last ? m.norm : m.layers[li + 1].ln1, false,
                last ? &m.lm_head : &m.layers[li + 1].wqkv);
  }
  return {x, normed};
}

// Logits of positions [from, s) of the hidden states: the final norm, then the output head. One
// row takes the fused kernel on CUDA where it applies (models/decode_gemv.h), the norm inside it;
// with `argmax` asked for, also their argmax where that kernel gives it (else left undefined).
Tensor output_head(const Llama::Impl& m, const Hidden& hidden, size_t from,
                   Tensor* argmax = nullptr) {
  size_t s = hidden.residual.dims()[1];
  Tensor x = hidden.residual.narrow(1, from, s - from);
  if (x.dims()[0] * x.dims()[1] == 1 && !hidden.normed.defined() &&
      detail::fused_linear_preferred(m.lm_head)) {
    Tensor y;
    const double eps = m.config.rms_norm_eps;
    if ((argmax != nullptr &&
         detail::fused_linear(x.squeeze(1), m.norm, eps, m.lm_head, &y, argmax)) ||
        detail::fused_linear(x.squeeze(1), m.norm, eps, m.lm_head, &y)) {
      return y;
    }
  }
  Tensor normed = hidden.normed.defined() ? hidden.normed.narrow(1, from, s - from)
                                          : x.rms_norm(m.norm, m.config.rms_norm_eps);
  return linear(from + 1 == s ? normed.squeeze(1) : normed, m.lm_head, Tensor());
}

void check_ids(const Llama::Impl& m, const Tensor& ids, const KvCache& cache, const char* op) {
  if (ids.rank() != 2 || ids.dims()[1] == 0) {
    throw ShapeMismatch(str(op, ": ids must be (batch, seq) with seq > 0, got ", ids.shape()));
  }
  if (ids.dtype() != DType::U32 && ids.dtype() != DType::I64) {
    throw DTypeMismatch(str(op, ": ids must be u32 or i64, got ", ids.dtype()));
  }
  if (cache.layers() != m.layers.size() || cache.batch() != ids.dims()[0]) {
    throw ShapeMismatch(str(op, ": cache for batch ", cache.batch(), " and ", cache.layers(),
                            " layers, ids ", ids.shape(), " for a model of ", m.layers.size(),
                            " layers"));
  }
  if (ids.device() != m.device) {
    throw DeviceMismatch(str(op, ": ids on ", ids.device(), ", model on ", m.device));
  }
}

}  // namespace

Tensor Llama::forward(const Tensor& ids, KvCache& cache) const {
  check_ids(*impl_, ids, cache, "Llama::forward");
  size_t s = ids.dims()[1];
  if (cache.length() + s > cache.max_len()) {
    throw IndexOutOfRange(str("Llama::forward: ", cache.length(), " cached + ", s,
                              " new positions exceed the cache's max_len ", cache.max_len()));
  }
  Hidden hidden = run_layers(*impl_, ids, cache, Positions{cache.length(), Tensor()});
  cache.length_ += s;
  Tensor normed = hidden.normed.defined()
                      ? hidden.normed
                      : hidden.residual.rms_norm(impl_->norm, impl_->config.rms_norm_eps);
  return linear(normed, impl_->lm_head, Tensor());
}

Tensor Llama::forward_last(const Tensor& ids, KvCache& cache) const {
  check_ids(*impl_, ids, cache, "Llama::forward_last");
  size_t s = ids.dims()[1];
  if (cache.length() + s > cache.max_len()) {
    throw IndexOutOfRange(str("Llama::forward_last: ", cache.length(), " cached + ", s,
                              " new positions exceed the cache's max_len ", cache.max_len()));
  }
  Hidden hidden = run_layers(*impl_, ids, cache, Positions{cache.length(), Tensor()});
  cache.length_ += s;
  return output_head(*impl_, hidden, s - 1);
}

Tensor Llama::decode_step(const Tensor& token, const Tensor& position, KvCache& cache,
                          Tensor* logits, size_t key_window) const {
  check_ids(*impl_, token, cache, "Llama::decode_step");
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
  Hidden hidden = run_layers(*impl_, token, cache, Positions{0, position, key_window});
  Tensor next;
  Tensor out = output_head(*impl_, hidden, 0, &next);  // (b, vocab)
  if (logits != nullptr) *logits = out;
  return next.defined() ? next : out.argmax(1);
}

}  // namespace wick::models
