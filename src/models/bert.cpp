// BERT encoder, written from the architecture's equations (Devlin et al. 2019; the post-norm
// layers of Hugging Face's BertModel): embeddings -> layer_norm, then per layer
//   a = layer_norm(x + attention(x) W_o), x = layer_norm(a + gelu_erf(a W_i) W_2).

#include "wick/bert.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "json_file.h"
#include "nn/dense.h"
#include "nn/varlen_attention.h"
#include "wick/error.h"
#include "wick/nn.h"

namespace wick::models {

namespace fs = std::filesystem;

BertConfig BertConfig::from_file(const fs::path& config_json) {
  auto j = json_file::read(config_json);
  if (!j.is_object()) throw FormatError(config_json.string() + ": expected a JSON object");
  BertConfig c;
  c.vocab_size = json_file::get_size(j, "vocab_size", config_json);
  c.hidden_size = json_file::get_size(j, "hidden_size", config_json);
  c.num_hidden_layers = json_file::get_size(j, "num_hidden_layers", config_json);
  c.num_attention_heads = json_file::get_size(j, "num_attention_heads", config_json);
  c.intermediate_size = json_file::get_size(j, "intermediate_size", config_json);
  c.max_position_embeddings = json_file::get_size(j, "max_position_embeddings", config_json);
  const size_t two = 2;
  c.type_vocab_size = json_file::get_size(j, "type_vocab_size", config_json, &two);
  c.layer_norm_eps = json_file::get_number(j, "layer_norm_eps", config_json, 1e-12);

  auto fail = [&](const std::string& what) {
    throw FormatError(config_json.string() + ": " + what);
  };
  if (c.hidden_size == 0 || c.num_attention_heads == 0 || c.vocab_size == 0 ||
      c.intermediate_size == 0 || c.max_position_embeddings == 0 || c.type_vocab_size == 0) {
    fail(
        "hidden_size, num_attention_heads, vocab_size, intermediate_size, "
        "max_position_embeddings and type_vocab_size must be positive");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    fail("hidden_size " + std::to_string(c.hidden_size) +
         " is not a multiple of num_attention_heads " + std::to_string(c.num_attention_heads));
  }
  if (!(c.layer_norm_eps > 0) || !std::isfinite(c.layer_norm_eps)) {
    fail("layer_norm_eps " + std::to_string(c.layer_norm_eps) + " must be positive and finite");
  }
  // Products that size the weights must not wrap.
  size_t product = 0;
  if (__builtin_mul_overflow(c.vocab_size, c.hidden_size, &product) ||
      __builtin_mul_overflow(c.intermediate_size, c.hidden_size, &product) ||
      __builtin_mul_overflow(c.max_position_embeddings, c.hidden_size, &product) ||
      __builtin_mul_overflow(c.type_vocab_size, c.hidden_size, &product) ||
      __builtin_mul_overflow(c.hidden_size, size_t{3 * 8}, &product)) {
    fail(
        "sizes overflow (vocab_size, intermediate_size, max_position_embeddings or "
        "type_vocab_size times hidden_size)");
  }
  // Hugging Face's "gelu" is the exact (erf) GELU; other activations are other models.
  auto act = json_file::get_string(j, "hidden_act", config_json, "gelu");
  if (act != "gelu") fail("hidden_act \"" + act + "\" is not supported (only \"gelu\", exact)");
  auto pos = json_file::get_string(j, "position_embedding_type", config_json, "absolute");
  if (pos != "absolute") fail("position_embedding_type \"" + pos + "\" is not supported");
  return c;
}

namespace {

// x (..., in) times the transpose of w (out, in), plus b (out), then the activation when `gelu`,
// then the residual when given: one GEMM over all leading dims.
struct Dense {
  Tensor weight;  // (out, in)
  Tensor bias;    // (out)

  Tensor forward(const Tensor& x, bool gelu = false, const Tensor& residual = {}) const {
    return nn::detail::dense(x, weight, bias, gelu, residual);
  }
};

struct Norm {
  Tensor weight, bias;
  double eps;
  Tensor forward(const Tensor& x) const { return x.layer_norm(weight, bias, eps); }
};

// The weight `name` of shape `dims` in the model's dtype; FormatError naming the folder and the
// tensor for a shape or a dtype the file should not have.
Tensor weight(const nn::Weights& w, const std::string& name, const Shape& dims, DType dtype,
              const fs::path& dir) {
  Tensor t;
  try {
    t = w.get(name, dims);
  } catch (const ShapeMismatch& e) {
    throw FormatError(dir.string() + ": " + e.what());
  }
  if (t.dtype() != dtype) {
    throw FormatError(dir.string() + ": tensor '" + w.path(name) + "' has dtype " +
                      dtype_name(t.dtype()) + ", not a float type");
  }
  return t;
}

struct Loader {
  DType dtype;
  fs::path dir;
  Tensor get(const nn::Weights& w, const std::string& name, const Shape& dims) const {
    return weight(w, name, dims, dtype, dir);
  }
  Dense dense(const nn::Weights& w, size_t in, size_t out) const {
    return {get(w, "weight", {out, in}), get(w, "bias", {out})};
  }
  Norm norm(const nn::Weights& w, size_t dim, double eps) const {
    // Old TF-converted checkpoints name the LayerNorm parameters gamma and beta.
    if (!w.contains("weight") && w.contains("gamma")) {
      return {get(w, "gamma", {dim}), get(w, "beta", {dim}), eps};
    }
    return {get(w, "weight", {dim}), get(w, "bias", {dim}), eps};
  }
};

struct Layer {
  Dense qkv;  // query, key and value stacked: one GEMM instead of three
  Dense attn_out;
  Norm attn_norm;
  Dense intermediate;
  Dense out;
  Norm out_norm;
};

std::vector<std::string> safetensors_files(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  }
  if (ec) throw FormatError(dir.string() + ": cannot list the folder: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    throw FormatError(dir.string() + ": no *.safetensors weights (pytorch_model.bin is not read)");
  }
  return files;
}

}  // namespace

struct Bert::Impl {
  BertConfig config;
  Device device = Device::cpu();
  DType dtype = DType::F32;
  DType matmul_dtype = DType::F32;
  Tensor word_embeddings;      // (vocab, hidden)
  Tensor position_embeddings;  // (max_positions, hidden)
  Tensor token_type_row;       // (hidden): token type 0
  Norm embeddings_norm;
  std::vector<Layer> layers;
};

Bert Bert::load(const fs::path& model_dir, const Device& device, DType dtype) {
  return load(model_dir, device, dtype, dtype);
}

Bert Bert::load(const fs::path& model_dir, const Device& device, DType dtype, DType matmul_dtype) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    throw UnsupportedDType(std::string("Bert::load: dtype ") + dtype_name(dtype) +
                           " (expected f32, f16 or bf16)");
  }
  if (matmul_dtype != dtype && !(dtype == DType::F32 && matmul_dtype == DType::BF16)) {
    throw UnsupportedDType(std::string("Bert::load: matmul dtype ") + dtype_name(matmul_dtype) +
                           " with dtype " + dtype_name(dtype) +
                           " (expected the dtype itself, or bf16 with f32)");
  }
  json_file::require_model_folder(model_dir);
  auto impl = std::make_shared<Impl>();
  impl->config = BertConfig::from_file(model_dir / "config.json");
  impl->device = device;
  impl->dtype = dtype;
  impl->matmul_dtype = matmul_dtype;
  const auto& c = impl->config;
  const size_t h = c.hidden_size;

  auto all = nn::Weights::from_safetensors(safetensors_files(model_dir), dtype, device);
  // BertModel checkpoints name tensors "embeddings...", BertFor* checkpoints "bert.embeddings...".
  auto root = all.contains("embeddings.word_embeddings.weight") ? all : all.pp("bert");

  const Loader ld{dtype, model_dir};
  auto emb = root.pp("embeddings");
  impl->word_embeddings = ld.get(emb.pp("word_embeddings"), "weight", {c.vocab_size, h});
  impl->position_embeddings =
      ld.get(emb.pp("position_embeddings"), "weight", {c.max_position_embeddings, h});
  impl->token_type_row =
      ld.get(emb.pp("token_type_embeddings"), "weight", {c.type_vocab_size, h}).get(0);
  impl->embeddings_norm = ld.norm(emb.pp("LayerNorm"), h, c.layer_norm_eps);

  auto layers = root.pp("encoder").pp("layer");
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    auto lw = layers.pp(std::to_string(i));
    auto self = lw.pp("attention").pp("self");
    auto q = ld.dense(self.pp("query"), h, h);
    auto k = ld.dense(self.pp("key"), h, h);
    auto v = ld.dense(self.pp("value"), h, h);
    Layer layer{
        Dense{Tensor::cat({q.weight, k.weight, v.weight}, 0),
              Tensor::cat({q.bias, k.bias, v.bias}, 0)},
        ld.dense(lw.pp("attention").pp("output").pp("dense"), h, h),
        ld.norm(lw.pp("attention").pp("output").pp("LayerNorm"), h, c.layer_norm_eps),
        ld.dense(lw.pp("intermediate").pp("dense"), h, c.intermediate_size),
        ld.dense(lw.pp("output").pp("dense"), c.intermediate_size, h),
        ld.norm(lw.pp("output").pp("LayerNorm"), h, c.layer_norm_eps),
    };
    if (matmul_dtype != dtype) {
      for (Dense* d : {&layer.qkv, &layer.attn_out, &layer.intermediate, &layer.out}) {
        d->weight = d->weight.to_dtype(matmul_dtype);
      }
    }
    impl->layers.push_back(std::move(layer));
  }
  device.synchronize();
  return Bert(std::move(impl));
}

const BertConfig& Bert::config() const {
  return impl_->config;
}
Device Bert::device() const {
  return impl_->device;
}
DType Bert::dtype() const {
  return impl_->dtype;
}
DType Bert::matmul_dtype() const {
  return impl_->matmul_dtype;
}

Tensor Bert::encode(const Tensor& ids_in, const Tensor& mask_in) const {
  const auto& m = *impl_;
  const auto& c = m.config;
  if (ids_in.rank() != 2 || mask_in.shape() != ids_in.shape()) {
    throw ShapeMismatch(
        "Bert::encode: ids must be (batch, seq) and attention_mask the same, got ids " +
        ids_in.shape().to_string() + " mask " + mask_in.shape().to_string());
  }
  if (ids_in.dtype() != DType::U32 && ids_in.dtype() != DType::I64) {
    throw UnsupportedDType(std::string("Bert::encode: ids must be u32 or i64, got ") +
                           dtype_name(ids_in.dtype()));
  }
  const size_t b = ids_in.dim(0), s = ids_in.dim(1), h = c.hidden_size;
  const size_t heads = c.num_attention_heads, d = h / heads;
  if (s > c.max_position_embeddings) {
    throw ShapeMismatch("Bert::encode: " + std::to_string(s) + " tokens, more than the model's " +
                        std::to_string(c.max_position_embeddings) + " positions");
  }
  auto ids = ids_in.to_device(m.device);

  // Embeddings: word + position + token type 0, then layer norm.
  auto x = m.word_embeddings.embedding(ids)
               .broadcast_add(m.position_embeddings.narrow(0, 0, s))
               .broadcast_add(m.token_type_row);
  x = m.embeddings_norm.forward(x);

  // Padded keys get the dtype's lowest value added to their scores (as transformers does).
  nn::AttentionOptions options;
  options.mask = nn::padding_mask(mask_in.to_device(m.device), m.dtype);

  for (const auto& layer : m.layers) {
    // (b, s, 3h) -> q, k, v as (b, heads, s, d) views.
    auto qkv = layer.qkv.forward(x).reshape({b, s, 3, heads, d});
    auto part = [&](size_t i) { return qkv.narrow(2, i, 1).squeeze(2).transpose(1, 2); };
    auto ctx = nn::scaled_dot_product_attention(part(0), part(1), part(2), options);
    ctx = ctx.transpose(1, 2).reshape({b, s, h});
    auto a = layer.attn_norm.forward(layer.attn_out.forward(ctx, false, x));
    auto inner = layer.intermediate.forward(a, /*gelu=*/true);
    x = layer.out_norm.forward(layer.out.forward(inner, false, a));
  }
  return x;
}

Tensor Bert::encode_packed(const Tensor& ids_in, const std::vector<size_t>& lengths) const {
  const auto& m = *impl_;
  const auto& c = m.config;
  if (ids_in.rank() != 1) {
    throw ShapeMismatch("Bert::encode_packed: ids must be (tokens), got " +
                        ids_in.shape().to_string());
  }
  if (ids_in.dtype() != DType::U32 && ids_in.dtype() != DType::I64) {
    throw UnsupportedDType(std::string("Bert::encode_packed: ids must be u32 or i64, got ") +
                           dtype_name(ids_in.dtype()));
  }
  const size_t t = ids_in.dim(0), h = c.hidden_size, heads = c.num_attention_heads;
  std::vector<uint32_t> positions, offsets{0};
  positions.reserve(t);
  for (size_t len : lengths) {
    if (len == 0 || len > c.max_position_embeddings || positions.size() + len > t) {
      throw ShapeMismatch("Bert::encode_packed: sequence lengths must be 1.." +
                          std::to_string(c.max_position_embeddings) + " and sum to the " +
                          std::to_string(t) + " ids, got a length " + std::to_string(len));
    }
    for (size_t p = 0; p < len; ++p) positions.push_back(static_cast<uint32_t>(p));
    offsets.push_back(static_cast<uint32_t>(positions.size()));
  }
  if (positions.size() != t) {
    throw ShapeMismatch("Bert::encode_packed: the lengths sum to " +
                        std::to_string(positions.size()) + ", not the " + std::to_string(t) +
                        " ids");
  }
  auto ids = ids_in.to_device(m.device);
  auto pos = Tensor::from_vec(positions, {t}, Device::cpu()).to_device(m.device);
  auto off = Tensor::from_vec(offsets, {offsets.size()}, Device::cpu()).to_device(m.device);

  // Embeddings: word + position (each token's place in its own sequence) + token type 0.
  auto x = m.word_embeddings.embedding(ids)
               .add(m.position_embeddings.embedding(pos))
               .broadcast_add(m.token_type_row);
  x = m.embeddings_norm.forward(x);

  const double scale = 1.0 / std::sqrt(static_cast<double>(h / heads));
  for (const auto& layer : m.layers) {
    auto ctx = nn::detail::varlen_attention(layer.qkv.forward(x), off, heads, scale);
    auto a = layer.attn_norm.forward(layer.attn_out.forward(ctx, false, x));
    auto inner = layer.intermediate.forward(a, /*gelu=*/true);
    x = layer.out_norm.forward(layer.out.forward(inner, false, a));
  }
  return x;
}

}  // namespace wick::models
