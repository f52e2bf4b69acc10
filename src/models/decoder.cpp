// The shared pieces of the composed decoder families (decoder.h): configuration, rope tables,
// weight sources, one layer's attention and the CausalLM plumbing around a family's layers.

#include "models/decoder.h"

#include <cmath>
#include <filesystem>

#include "backend.h"
#include "decode_plan.h"
#include "fused/norm.h"
#include "models/llama_impl.h"
#include "nn/batch_linear.h"
#include "nn/kv_write.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"
#include "wick/nn/attention.h"
#include "wick/nn/decoder_ops.h"
#include "wick/quantized.h"
#include "wick/safetensors.h"

namespace wick::models::decoder {

namespace {

namespace fs = std::filesystem;
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

// ---- weights ----

namespace {

void check_dtype(DType dtype) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    throw UnsupportedDType(str("load_causal_lm: weights must be f32, f16 or bf16, got ", dtype));
  }
}

class FolderWeights : public WeightSource {
 public:
  FolderWeights(const std::string& dir, const Device& device, DType dtype)
      : device_(device), dtype_(dtype) {
    check_dtype(dtype);
    fs::path index = fs::path(dir) / "model.safetensors.index.json";
    fs::path single = fs::path(dir) / "model.safetensors";
    std::error_code ec;
    std::string path = fs::exists(index, ec) ? index.string() : single.string();
    if (!fs::exists(path, ec)) {
      throw FormatError(str(dir, ": neither model.safetensors nor model.safetensors.index.json"));
    }
    file_ = std::make_unique<safetensors::ShardedFile>(safetensors::ShardedFile::open(path));
  }
  bool is_gguf() const override { return false; }
  bool contains(const std::string& name) const override { return file_->contains(name); }
  Tensor dense_as(const std::string& name, const Shape& shape, DType as) const override {
    if (!file_->contains(name)) throw FormatError(str("load_causal_lm: missing weight ", name));
    Tensor t = file_->get(name, device_);
    if (t.shape() != shape) {
      throw ShapeMismatch(
          str("load_causal_lm: weight ", name, " has shape ", t.shape(), ", expected ", shape));
    }
    DType d = t.dtype();
    if (d != DType::F32 && d != DType::F16 && d != DType::BF16 && d != DType::F64) {
      throw FormatError(str("load_causal_lm: weight ", name, " is ", d, ", not a float dtype"));
    }
    return t.to_dtype(as);
  }
  QLinear linear(const std::vector<std::pair<std::string, Shape>>& parts) const override {
    std::vector<Tensor> rows;
    for (const auto& [name, shape] : parts) rows.push_back(dense(name, shape));
    return QLinear(rows.size() == 1 ? rows[0] : Tensor::cat(rows, 0));
  }
  const Device& device() const override { return device_; }
  DType dtype() const override { return dtype_; }

 private:
  Device device_;
  DType dtype_;
  std::unique_ptr<safetensors::ShardedFile> file_;
};

class GgufWeights : public WeightSource {
 public:
  GgufWeights(const std::string& path, const Device& device, DType dtype,
              std::map<std::string, std::string> names, size_t rope_permuted_head_dim)
      : device_(device),
        dtype_(dtype),
        names_(std::move(names)),
        permuted_head_dim_(rope_permuted_head_dim) {
    check_dtype(dtype);
    file_ = std::make_unique<gguf::File>(gguf::File::open(path));
  }
  bool is_gguf() const override { return true; }
  bool contains(const std::string& name) const override { return file_->contains(gguf_name(name)); }
  Tensor dense_as(const std::string& name, const Shape& shape, DType as) const override {
    std::string g = checked(name, shape);
    return file_->get(g, Device::cpu()).to_device(device_).to_dtype(as);
  }
  QLinear linear(const std::vector<std::pair<std::string, Shape>>& parts) const override {
    std::vector<QTensor> q;
    bool keep = true;
    for (const auto& [name, shape] : parts) {
      q.push_back(file_->get_quantized(checked(name, shape), Device::cpu()));
      if (permuted_head_dim_ > 0 && (name.ends_with("self_attn.q_proj.weight") ||
                                     name.ends_with("self_attn.k_proj.weight"))) {
        q.back() = unpermute_rope_rows(q.back(), shape[0] / permuted_head_dim_, permuted_head_dim_);
      }
      GgmlType t = q.back().type();
      keep = keep && qmatmul_supports(t) && t != GgmlType::F32 && t != GgmlType::F16 &&
             t != GgmlType::BF16;
    }
    if (keep) {
      for (QTensor& p : q) p = p.to_device(device_);
      return QLinear(q);
    }
    std::vector<Tensor> rows;
    for (const QTensor& p : q) rows.push_back(p.dequantize());
    Tensor w = rows.size() == 1 ? rows[0] : Tensor::cat(rows, 0);
    return QLinear(w.to_device(device_).to_dtype(dtype_));
  }
  const Device& device() const override { return device_; }
  DType dtype() const override { return dtype_; }

 private:
  std::string gguf_name(const std::string& hf) const {
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    const std::string prefix = "model.layers.", suffix = ".weight";
    if (hf.rfind(prefix, 0) == 0 && hf.size() > prefix.size() + suffix.size()) {
      size_t dot = hf.find('.', prefix.size());
      if (dot != std::string::npos) {
        std::string index = hf.substr(prefix.size(), dot - prefix.size());
        std::string part = hf.substr(dot + 1, hf.size() - suffix.size() - dot - 1);
        auto it = names_.find(part);
        if (it != names_.end()) return str("blk.", index, ".", it->second, suffix);
      }
    }
    return hf;
  }
  std::string checked(const std::string& hf, const Shape& shape) const {
    std::string g = gguf_name(hf);
    if (!file_->contains(g))
      throw FormatError(str("gguf ", file_->path(), ": no tensor '", g, "'"));
    const Shape& got = file_->info(g).shape;
    if (got != shape) {
      throw FormatError(str("gguf ", file_->path(), ": tensor '", g, "' has shape ", got,
                            ", the metadata gives ", shape));
    }
    return g;
  }

  Device device_;
  DType dtype_;
  std::map<std::string, std::string> names_;
  size_t permuted_head_dim_;
  std::unique_ptr<gguf::File> file_;
};

}  // namespace

std::unique_ptr<WeightSource> folder_weights(const std::string& dir, const Device& device,
                                             DType dtype) {
  return std::make_unique<FolderWeights>(dir, device, dtype);
}

std::unique_ptr<WeightSource> gguf_weights(const std::string& path, const Device& device,
                                           DType dtype,
                                           std::map<std::string, std::string> layer_names,
                                           size_t rope_permuted_head_dim) {
  return std::make_unique<GgufWeights>(path, device, dtype, std::move(layer_names),
                                       rope_permuted_head_dim);
}

void read_projections(const WeightSource& src, const DecoderConfig& c, size_t i, Layer& l) {
  std::string p = str("model.layers.", i, ".");
  size_t d = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  size_t ff = c.intermediate_size;
  l.wqkv = src.linear({{p + "self_attn.q_proj.weight", {q, d}},
                       {p + "self_attn.k_proj.weight", {kv, d}},
                       {p + "self_attn.v_proj.weight", {kv, d}}});
  l.wo = src.linear({{p + "self_attn.o_proj.weight", {d, q}}});
  l.wgate_up =
      src.linear({{p + "mlp.gate_proj.weight", {ff, d}}, {p + "mlp.up_proj.weight", {ff, d}}});
  l.wdown = src.linear({{p + "mlp.down_proj.weight", {d, ff}}});
}

void read_embedding_and_head(const WeightSource& src, DecoderConfig& c, Weights& w) {
  w.embed = src.dense("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  if (c.tie_word_embeddings || !src.contains("lm_head.weight")) {
    c.tie_word_embeddings = true;
    w.lm_head = src.is_gguf()
                    ? src.linear({{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}}})
                    : QLinear(w.embed);
  } else {
    w.lm_head = src.linear({{"lm_head.weight", {c.vocab_size, c.hidden_size}}});
  }
}

// ---- the model ----

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
