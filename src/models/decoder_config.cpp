// The configuration of the composed decoder families (decoder.h): config.json and GGUF metadata
// read into DecoderConfig, and the rope kinds (Rope) with their tables.

#include <cmath>

#include "models/decoder.h"
#include "models/families.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"

namespace wick::models::decoder {

namespace {

using json_file::Json;

double number_or(const Json& j, const char* key, double fallback, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) json_file::bad_field(origin, key, "a number", *it);
  return it->get<double>();
}

size_t size_or(const Json& j, const char* key, size_t fallback, const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return json_file::as_uint(*it, key, origin);
}

std::vector<double> numbers(const Json& j, const char* key, const std::string& origin) {
  std::vector<double> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) json_file::bad_field(origin, key, "a list of numbers", *it);
  for (const Json& v : *it) {
    if (!v.is_number()) json_file::bad_field(origin, key, "a list of numbers", *it);
    out.push_back(v.get<double>());
  }
  return out;
}

std::vector<uint32_t> token_ids(const Json& j, const char* key, const std::string& origin) {
  std::vector<uint32_t> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  auto one = [&](const Json& v) {
    out.push_back(static_cast<uint32_t>(json_file::as_uint(v, key, origin, UINT32_MAX)));
  };
  if (it->is_array()) {
    for (const Json& v : *it) one(v);
  } else {
    one(*it);
  }
  return out;
}

void check_positive(double v, const char* what, const std::string& origin) {
  if (!(std::isfinite(v) && v > 0)) {
    throw FormatError(str(origin, ": ", what, " ", v, " must be a positive finite number"));
  }
}

}  // namespace

// ---- rope ----

size_t Rope::rotated_dims(size_t head_dim) const {
  if (rotary_dim > 0) return rotary_dim;
  return static_cast<size_t>(static_cast<double>(head_dim) * partial_rotary_factor);
}

std::vector<double> Rope::inverse_frequencies(size_t head_dim, size_t context) const {
  const size_t dims = rotated_dims(head_dim), half = dims / 2;
  std::vector<double> inv(half);
  for (size_t i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(dims));
  }
  if (type == "linear") {
    for (double& f : inv) f /= factor;
  } else if (type == "llama3") {
    double low_wavelen = original_max_position / low_freq_factor;
    double high_wavelen = original_max_position / high_freq_factor;
    for (double& f : inv) {
      double wavelen = 2 * M_PI / f;
      if (wavelen > low_wavelen) {
        f /= factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (original_max_position / wavelen - low_freq_factor) /
                        (high_freq_factor - low_freq_factor);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  } else if (type == "longrope") {
    const auto& ext =
        static_cast<double>(context) > original_max_position ? long_factor : short_factor;
    for (size_t i = 0; i < half; ++i) inv[i] /= ext[i];
  }
  return inv;
}

std::pair<Tensor, Tensor> Rope::tables(size_t head_dim, size_t context, size_t start, size_t n,
                                       DType dtype, const Device& device) const {
  std::vector<double> inv = inverse_frequencies(head_dim, context);
  size_t half = inv.size();
  std::vector<float> cos_v(n * half), sin_v(n * half);
  const float scale = static_cast<float>(attention_factor);
  for (size_t p = 0; p < n; ++p) {
    for (size_t i = 0; i < half; ++i) {
      // transformers: (f32 position) * (f32 inverse frequency) in f32, cos and sin times the
      // attention factor in f32.
      float angle = static_cast<float>(start + p) * static_cast<float>(inv[i]);
      cos_v[p * half + i] = std::cos(angle) * scale;
      sin_v[p * half + i] = std::sin(angle) * scale;
    }
  }
  return {Tensor::from_vec(cos_v, {n, half}, device).to_dtype(dtype),
          Tensor::from_vec(sin_v, {n, half}, device).to_dtype(dtype)};
}

void Rope::validate(size_t head_dim, const std::string& origin) const {
  check_positive(theta, "rope_theta", origin);
  if (!(std::isfinite(partial_rotary_factor) && partial_rotary_factor > 0 &&
        partial_rotary_factor <= 1)) {
    throw FormatError(
        str(origin, ": partial_rotary_factor ", partial_rotary_factor, " must be in (0, 1]"));
  }
  const size_t dims = rotated_dims(head_dim);
  if (dims == 0 || dims % 2 != 0 || dims > head_dim) {
    throw FormatError(str(origin, ": rope rotates ", dims, " dims of head_dim ", head_dim,
                          rotary_dim > 0
                              ? " (rope dimension_count)"
                              : str(" (partial_rotary_factor ", partial_rotary_factor, ")"),
                          "; they must be even, positive and at most head_dim"));
  }
  check_positive(factor, "rope factor", origin);
  check_positive(attention_factor, "rope attention_factor", origin);
  if (type == "llama3") {
    check_positive(original_max_position, "rope original_max_position_embeddings", origin);
    check_positive(low_freq_factor, "rope low_freq_factor", origin);
    if (!(high_freq_factor > low_freq_factor)) {
      throw FormatError(str(origin, ": rope high_freq_factor ", high_freq_factor,
                            " must be above low_freq_factor ", low_freq_factor));
    }
  } else if (type == "longrope") {
    check_positive(original_max_position, "rope original_max_position_embeddings", origin);
    for (const auto* f : {&short_factor, &long_factor}) {
      if (f->size() != dims / 2) {
        throw FormatError(str(origin, ": longrope ", f == &short_factor ? "short" : "long",
                              "_factor has ", f->size(), " entries, the rotated dims / 2 are ",
                              dims / 2));
      }
      for (double v : *f) check_positive(v, "longrope factor", origin);
    }
  } else if (type != "default" && type != "linear") {
    throw FormatError(str(origin, ": rope type \"", type,
                          "\" is not supported (default, linear, llama3, longrope)"));
  }
}

Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const size_t d = x.dims().back(), dims = 2 * cos.dims().back();
  if (dims == d) return x.rope(cos, sin);
  return Tensor::cat({x.narrow(3, 0, dims).rope(cos, sin), x.narrow(3, dims, d - dims)}, 3);
}

Rope parse_rope(const Json& p, Rope r, const std::string& origin) {
  if (!p.is_object()) json_file::bad_field(origin, "rope_parameters", "an object", p);
  std::string type = json_file::get_string(p, "type", origin, "");
  type = json_file::get_string(p, "rope_type", origin, type);
  if (type == "su") type = "longrope";  // Phi-3's first name for it
  if (!type.empty()) r.type = type;
  r.theta = number_or(p, "rope_theta", r.theta, origin);
  r.factor = number_or(p, "factor", r.factor, origin);
  r.low_freq_factor = number_or(p, "low_freq_factor", r.low_freq_factor, origin);
  r.high_freq_factor = number_or(p, "high_freq_factor", r.high_freq_factor, origin);
  r.original_max_position =
      number_or(p, "original_max_position_embeddings", r.original_max_position, origin);
  r.partial_rotary_factor = number_or(p, "partial_rotary_factor", r.partial_rotary_factor, origin);
  if (r.type == "longrope") {
    r.short_factor = numbers(p, "short_factor", origin);
    r.long_factor = numbers(p, "long_factor", origin);
  }
  auto af = p.find("attention_factor");
  if (af != p.end() && !af->is_null())
    r.attention_factor = number_or(p, "attention_factor", 1, origin);
  return r;
}

Rope parse_config_rope(const Json& j, double default_theta, size_t max_position,
                       const std::string& origin) {
  Rope r;
  r.theta = number_or(j, "rope_theta", default_theta, origin);
  r.original_max_position = number_or(j, "original_max_position_embeddings", 0, origin);
  r.partial_rotary_factor = number_or(j, "partial_rotary_factor", 1.0, origin);
  auto rp = j.find("rope_parameters");
  auto rs = j.find("rope_scaling");
  bool explicit_attention_factor = false;
  if (rp != j.end() && !rp->is_null()) {
    r = parse_rope(*rp, r, origin);
    explicit_attention_factor =
        rp->contains("attention_factor") && !(*rp)["attention_factor"].is_null();
  } else if (rs != j.end() && !rs->is_null()) {
    r = parse_rope(*rs, r, origin);
    explicit_attention_factor =
        rs->contains("attention_factor") && !(*rs)["attention_factor"].is_null();
  }
  if (r.type == "longrope" && !explicit_attention_factor && r.original_max_position > 0) {
    // transformers: factor max / original, attention factor sqrt(1 + ln(factor) / ln(original)).
    double factor = static_cast<double>(max_position) / r.original_max_position;
    r.attention_factor =
        factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(r.original_max_position));
  }
  return r;
}

// ---- configuration ----

DecoderConfig DecoderConfig::from_json(const Json& j, const std::string& origin) {
  if (!j.is_object()) throw FormatError(str(origin, ": not a JSON object"));
  DecoderConfig c;
  c.architecture = json_file::get_string(j, "model_type", origin, "");
  c.vocab_size = json_file::get_size(j, "vocab_size", origin);
  c.hidden_size = json_file::get_size(j, "hidden_size", origin);
  c.intermediate_size = json_file::get_size(j, "intermediate_size", origin);
  c.num_layers = json_file::get_size(j, "num_hidden_layers", origin);
  c.num_heads = json_file::get_size(j, "num_attention_heads", origin);
  c.num_kv_heads = size_or(j, "num_key_value_heads", c.num_heads, origin);
  c.head_dim = size_or(j, "head_dim", 0, origin);
  if (c.head_dim == 0 && c.num_heads > 0) {
    if (c.hidden_size % c.num_heads != 0) {
      throw FormatError(str(origin, ": hidden_size ", c.hidden_size,
                            " is not a multiple of num_attention_heads ", c.num_heads,
                            " (and no head_dim is given)"));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.max_position = size_or(j, "max_position_embeddings", 2048, origin);
  c.rms_norm_eps = number_or(j, "rms_norm_eps", 1e-6, origin);
  c.tie_word_embeddings = json_file::get_bool(j, "tie_word_embeddings", origin, false);
  c.final_softcap = number_or(j, "final_logit_softcapping", 0, origin);
  auto bos = token_ids(j, "bos_token_id", origin);
  if (!bos.empty()) c.bos_token_id = bos[0];
  c.eos_token_ids = token_ids(j, "eos_token_id", origin);
  return c;
}

DecoderConfig DecoderConfig::from_gguf(const gguf::File& f, const std::string& arch) {
  auto key = [&](const char* k) { return arch + "." + k; };
  DecoderConfig c;
  c.architecture = arch;
  c.hidden_size = f.get_uint(key("embedding_length"));
  c.intermediate_size = f.get_uint(key("feed_forward_length"));
  c.num_layers = f.get_uint(key("block_count"));
  c.num_heads = f.get_uint(key("attention.head_count"));
  c.num_kv_heads = f.contains_key(key("attention.head_count_kv"))
                       ? f.get_uint(key("attention.head_count_kv"))
                       : c.num_heads;
  if (f.contains_key(key("attention.key_length"))) {
    c.head_dim = f.get_uint(key("attention.key_length"));
  } else if (f.contains_key(key("rope.dimension_count"))) {
    c.head_dim = f.get_uint(key("rope.dimension_count"));
  } else if (c.num_heads > 0) {
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.max_position = f.contains_key(key("context_length")) ? f.get_uint(key("context_length")) : 2048;
  c.rms_norm_eps = f.get_float(key("attention.layer_norm_rms_epsilon"));
  if (f.contains_key(key("final_logit_softcapping"))) {
    c.final_softcap = f.get_float(key("final_logit_softcapping"));
  }
  if (!f.contains("token_embd.weight")) {
    throw FormatError(str("gguf ", f.path(), ": no tensor 'token_embd.weight'"));
  }
  const Shape& embd = f.info("token_embd.weight").shape;
  c.vocab_size = f.contains_key(key("vocab_size")) ? f.get_uint(key("vocab_size"))
                 : embd.rank() == 2                ? embd[0]
                                                   : 0;
  c.tie_word_embeddings = !f.contains("output.weight");
  auto id = [&](const char* k) -> std::optional<uint32_t> {
    if (!f.contains_key(k)) return std::nullopt;
    uint64_t v = f.get_uint(k);
    if (v > UINT32_MAX) throw FormatError(str("gguf ", f.path(), ": ", k, " ", v, " too large"));
    return static_cast<uint32_t>(v);
  };
  c.bos_token_id = id("tokenizer.ggml.bos_token_id");
  if (auto eos = id("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {*eos};
  return c;
}

void DecoderConfig::validate(const std::string& origin) const {
  if (vocab_size == 0 || hidden_size == 0 || intermediate_size == 0 || num_layers == 0 ||
      num_heads == 0 || num_kv_heads == 0 || head_dim == 0 || max_position == 0) {
    throw FormatError(str(origin, ": sizes must be positive (vocab ", vocab_size, ", hidden ",
                          hidden_size, ", intermediate ", intermediate_size, ", layers ",
                          num_layers, ", heads ", num_heads, "/", num_kv_heads, ", head_dim ",
                          head_dim, ", max positions ", max_position, ")"));
  }
  if (num_heads % num_kv_heads != 0) {
    throw FormatError(str(origin, ": num_attention_heads ", num_heads,
                          " is not a multiple of num_key_value_heads ", num_kv_heads));
  }
  if (head_dim % 2 != 0) throw FormatError(str(origin, ": head_dim ", head_dim, " is odd"));
  size_t q_rows = 0, embed = 0, ffn = 0, gate_up = 0;
  if (__builtin_mul_overflow(num_heads, head_dim, &q_rows) ||
      __builtin_mul_overflow(vocab_size, hidden_size, &embed) ||
      __builtin_mul_overflow(intermediate_size, hidden_size, &ffn) ||
      __builtin_mul_overflow(intermediate_size, size_t{2}, &gate_up)) {
    throw FormatError(str(origin, ": sizes overflow"));
  }
  check_positive(rms_norm_eps, "rms_norm_eps", origin);
  if (final_softcap < 0 || !std::isfinite(final_softcap)) {
    throw FormatError(str(origin, ": final_logit_softcapping ", final_softcap, " is negative"));
  }
  check_special_tokens(*this, origin);
}

std::optional<std::vector<bool>> sliding_layers(const Json& j, size_t layers,
                                                const std::string& origin) {
  auto it = j.find("layer_types");
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_array() || it->size() != layers) {
    json_file::bad_field(origin, "layer_types", str("a list of ", layers, " strings").c_str(), *it);
  }
  std::vector<bool> out;
  for (const Json& t : *it) {
    if (t == "sliding_attention") {
      out.push_back(true);
    } else if (t == "full_attention") {
      out.push_back(false);
    } else {
      json_file::bad_field(origin, "layer_types",
                           "a list of \"sliding_attention\" or \"full_attention\"", *it);
    }
  }
  return out;
}

}  // namespace wick::models::decoder
