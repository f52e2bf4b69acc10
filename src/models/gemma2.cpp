// Gemma 2 (transformers' Gemma2ForCausalLM; GGUF architecture gemma2) and the decoder Gemma 3
// shares (gemma.h): GeGLU with tanh GELU, (1 + w) RMS norms before and after attention and the
// FFN, embeddings scaled by sqrt(hidden), scores scaled by query_pre_attn_scalar^-1/2 and
// soft-capped, sliding-window attention on alternating layers (layer_types), final logits
// soft-capped.

#include <cmath>
#include <filesystem>

#include "decode_plan.h"
#include "models/families.h"
#include "models/gemma.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"

namespace wick::models {

namespace gemma {

namespace {

using namespace decoder;

class Gemma : public Decoder {
 public:
  Gemma(DecoderConfig c, Weights w, const Device& device, DType dtype)
      : Decoder(std::move(c), std::move(w), device, dtype) {
    // transformers multiplies by sqrt(hidden) as a tensor of the embedding's dtype.
    double s = std::sqrt(static_cast<double>(config_.hidden_size));
    embed_scale_ = Tensor::from_vec(std::vector<double>{s}, {1}, Device::cpu())
                       .to_dtype(dtype)
                       .to_vec_f64()[0];
    ask_for_plan(GatedActivation::GeluTanh, embed_scale_);
  }

 protected:
  Tensor hidden(const Tensor& ids, const Step& at) const override {
    const double eps = config_.rms_norm_eps;
    const size_t ff = config_.intermediate_size;
    Tensor x = w_.embed.embedding(ids).affine(embed_scale_, 0);
    for (size_t li = 0; li < w_.layers.size(); ++li) {
      const Layer& l = w_.layers[li];
      Tensor att = linear(l.wo, attend(head_norm(x, l.attn_norm, eps), li, at), at);
      x = x.add(head_norm(att, l.post_attn_norm, eps));
      Tensor gate_up = linear(l.wgate_up, head_norm(x, l.ffn_norm, eps), at);
      Tensor act = gate_up.narrow(2, 0, ff).gelu().mul(gate_up.narrow(2, ff, ff));
      x = x.add(head_norm(linear(l.wdown, act, at), l.post_ffn_norm, eps));
    }
    return head_norm(x, w_.norm, eps);
  }

 private:
  double embed_scale_ = 1;
};

}  // namespace

void check_activation(const json_file::Json& j, const std::string& origin) {
  std::string act = json_file::get_string(j, "hidden_act", origin, "gelu_pytorch_tanh");
  act = json_file::get_string(j, "hidden_activation", origin, act);
  if (act != "gelu_pytorch_tanh" && act != "gelu_tanh" && act != "gelu_new") {
    throw FormatError(
        str(origin, ": activation \"", act, "\" is not supported (Gemma's is gelu_pytorch_tanh)"));
  }
}

double number_or_off(const json_file::Json& j, const char* key, double fallback,
                     const std::string& origin) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (it->is_null()) return 0;
  if (!it->is_number() || !(it->get<double>() >= 0)) {
    json_file::bad_field(origin, key, "a non-negative number or null", *it);
  }
  return it->get<double>();
}

double gguf_query_scalar(const gguf::File& f, const std::string& arch, const DecoderConfig& c) {
  std::string key = arch + ".attention.scale";
  if (f.contains_key(key)) {
    double scale = f.get_float(key);
    if (!(std::isfinite(scale) && scale > 0)) {
      throw FormatError(str("gguf ", f.path(), ": ", key, " ", scale, " is not positive"));
    }
    return 1 / (scale * scale);
  }
  const bool big = (arch == "gemma2" && c.hidden_size == 4608 && c.num_layers == 46) ||
                   (arch == "gemma3" && c.hidden_size == 5376 && c.num_layers == 62);
  return big ? static_cast<double>(c.hidden_size / c.num_heads) : static_cast<double>(c.head_dim);
}

std::unique_ptr<CausalLM> load_gemma(const std::string& path, GemmaConfig g, const Device& device,
                                     DType dtype) {
  DecoderConfig& c = g.common;
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(path, ec);
  const std::string origin = folder ? path : "gguf " + path;
  if (!(std::isfinite(g.query_pre_attn_scalar) && g.query_pre_attn_scalar > 0) ||
      !(std::isfinite(g.attn_softcap) && g.attn_softcap >= 0)) {
    throw FormatError(str(origin, ": query_pre_attn_scalar ", g.query_pre_attn_scalar,
                          " and attn_logit_softcapping ", g.attn_softcap,
                          " must be positive finite numbers"));
  }
  std::unique_ptr<WeightSource> src;
  if (folder) {
    src = folder_weights(path, device, dtype);
  } else {
    src = gguf_weights(path, device, dtype,
                       {{"input_layernorm", "attn_norm"},
                        {"post_attention_layernorm", "post_attention_norm"},
                        {"pre_feedforward_layernorm", "ffn_norm"},
                        {"post_feedforward_layernorm", "post_ffw_norm"},
                        {"self_attn.q_proj", "attn_q"},
                        {"self_attn.k_proj", "attn_k"},
                        {"self_attn.v_proj", "attn_v"},
                        {"self_attn.o_proj", "attn_output"},
                        {"self_attn.q_norm", "attn_q_norm"},
                        {"self_attn.k_norm", "attn_k_norm"},
                        {"mlp.gate_proj", "ffn_gate"},
                        {"mlp.up_proj", "ffn_up"},
                        {"mlp.down_proj", "ffn_down"}});
  }
  // Gemma's norms multiply by 1 + w in f32, w as the model's dtype holds it (transformers loads
  // the weight in that dtype); llama.cpp's converter stores 1 + w in GGUF files. The weights stay
  // f32 and the norms compute in f32 whatever the model's dtype (head_norm).
  auto norm = [&](const std::string& name, size_t n) {
    if (src->is_gguf()) return src->dense_as(name, {n}, DType::F32);
    return src->dense(name, {n}).to_dtype(DType::F32).affine(1, 1);
  };
  Weights w;
  w.ropes = g.ropes;
  read_embedding_and_head(*src, c, w);
  w.norm = norm("model.norm.weight", c.hidden_size);
  const double scale = 1 / std::sqrt(g.query_pre_attn_scalar);
  for (size_t i = 0; i < c.num_layers; ++i) {
    std::string p = str("model.layers.", i, ".");
    Layer l;
    l.attn_norm = norm(p + "input_layernorm.weight", c.hidden_size);
    l.post_attn_norm = norm(p + "post_attention_layernorm.weight", c.hidden_size);
    l.ffn_norm = norm(p + "pre_feedforward_layernorm.weight", c.hidden_size);
    l.post_ffn_norm = norm(p + "post_feedforward_layernorm.weight", c.hidden_size);
    if (g.qk_norm) {
      l.q_norm = norm(p + "self_attn.q_norm.weight", c.head_dim);
      l.k_norm = norm(p + "self_attn.k_norm.weight", c.head_dim);
    }
    read_projections(*src, c, i, l);
    l.attention.scale = scale;
    l.attention.softcap = g.attn_softcap;
    l.attention.window = g.sliding.at(i) ? g.sliding_window : 0;
    l.attention.rope = g.sliding.at(i) && g.ropes.size() > 1 ? 1 : 0;
    w.layers.push_back(std::move(l));
  }
  return std::make_unique<Gemma>(std::move(c), std::move(w), device, dtype);
}

}  // namespace gemma

std::unique_ptr<CausalLM> load_gemma2(const std::string& path, const Device& device, DType dtype) {
  using namespace decoder;
  gemma::GemmaConfig g;
  DecoderConfig& c = g.common;
  Rope rope;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const std::string origin = (std::filesystem::path(path) / "config.json").string();
    json_file::Json j = json_file::read(origin);
    c = DecoderConfig::from_json(j, origin);
    if (c.architecture != "gemma2") {
      throw FormatError(str(origin, ": model_type \"", c.architecture, "\" is not gemma2"));
    }
    gemma::check_activation(j, origin);
    if (json_file::get_bool(j, "attention_bias", origin, false)) {
      throw FormatError(str(origin, ": attention_bias is not supported for gemma2"));
    }
    c.validate(origin);
    rope = parse_config_rope(j, 10000.0, c.max_position, origin);
    g.query_pre_attn_scalar = json_file::get_number(j, "query_pre_attn_scalar", origin, 256);
    // transformers' defaults where the key is absent; null switches the feature off.
    g.attn_softcap = gemma::number_or_off(j, "attn_logit_softcapping", 50.0, origin);
    c.final_softcap = gemma::number_or_off(j, "final_logit_softcapping", 30.0, origin);
    g.sliding_window = static_cast<size_t>(gemma::number_or_off(j, "sliding_window", 4096, origin));
    auto types = sliding_layers(j, c.num_layers, origin);
    if (!types) {
      types = std::vector<bool>(c.num_layers);
      for (size_t i = 0; i < c.num_layers; ++i) (*types)[i] = i % 2 == 0;
    }
    g.sliding = *types;
    rope.validate(c.head_dim, origin);
  } else {
    gguf::File f = gguf::File::open(path);
    c = DecoderConfig::from_gguf(f, "gemma2");
    c.validate("gguf " + path);
    if (f.contains_key("gemma2.rope.freq_base")) rope.theta = f.get_float("gemma2.rope.freq_base");
    if (f.contains_key("gemma2.attn_logit_softcapping")) {
      g.attn_softcap = f.get_float("gemma2.attn_logit_softcapping");
    }
    if (f.contains_key("gemma2.attention.sliding_window")) {
      g.sliding_window = f.get_uint("gemma2.attention.sliding_window");
    }
    g.query_pre_attn_scalar = gemma::gguf_query_scalar(f, "gemma2", c);
    // llama.cpp: the even layers are the local ones.
    g.sliding.resize(c.num_layers);
    for (size_t i = 0; i < c.num_layers; ++i) g.sliding[i] = i % 2 == 0;
    rope.validate(c.head_dim, "gguf " + path);
  }
  g.ropes = {rope};
  return gemma::load_gemma(path, std::move(g), device, dtype);
}

}  // namespace wick::models
