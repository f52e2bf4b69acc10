// BERT encoder, written from the architecture's equations (Devlin et al. 2019; the post-norm
// layers of Hugging Face's BertModel): embeddings -> layer_norm, then per layer
//   a = layer_norm(x + attention(x) W_o), x = layer_norm(a + gelu_erf(a W_i) W_2).

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "json_file.h"
#include "wick/bert.h"
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

  auto fail = [&](const std::string& what) { throw FormatError(config_json.string() + ": " + what); };
  if (c.hidden_size == 0 || c.num_attention_heads == 0 || c.vocab_size == 0 ||
      c.intermediate_size == 0 || c.max_position_embeddings == 0 || c.type_vocab_size == 0) {
    fail("hidden_size, num_attention_heads, vocab_size, intermediate_size, "
         "max_position_embeddings and type_vocab_size must be positive");
  }
  if (c.hidden_size % c.num_attention_heads != 0) {
    fail("hidden_size " + std::to_string(c.hidden_size) + " is not a multiple of num_attention_heads " +
         std::to_string(c.num_attention_heads));
  }
  if (!(c.layer_norm_eps > 0)) fail("layer_norm_eps must be positive");
  // Hugging Face's "gelu" is the exact (erf) GELU; other activations are other models.
  auto act = json_file::get_string(j, "hidden_act", config_json, "gelu");
  if (act != "gelu") fail("hidden_act \"" + act + "\" is not supported (only \"gelu\", exact)");
  auto pos = json_file::get_string(j, "position_embedding_type", config_json, "absolute");
  if (pos != "absolute") fail("position_embedding_type \"" + pos + "\" is not supported");
  return c;
}

namespace {

// x (..., in) times the transpose of w (out, in), plus b (out): one GEMM over all leading dims.
struct Dense {
  Tensor weight;  // (out, in)
  Tensor bias;    // (out)

  Tensor forward(const Tensor& x) const {
    auto dims = x.dims();
    size_t in = dims.back();
    size_t rows = x.elem_count() / std::max<size_t>(in, 1);
    auto y = x.reshape({rows, in}).matmul(weight.t()).broadcast_add(bias);
    dims.back() = weight.dim(0);
    return y.reshape(Shape(dims));
  }
};

struct Norm {
  Tensor weight, bias;
  double eps;
  Tensor forward(const Tensor& x) const { return x.layer_norm(weight, bias, eps); }
};

Dense dense(const nn::Weights& w, size_t in, size_t out) {
  return {w.get("weight", {out, in}), w.get("bias", {out})};
}

Norm norm(const nn::Weights& w, size_t dim, double eps) {
  // Old TF-converted checkpoints name the LayerNorm parameters gamma and beta.
  if (!w.contains("weight") && w.contains("gamma")) {
    return {w.get("gamma", {dim}), w.get("beta", {dim}), eps};
  }
  return {w.get("weight", {dim}), w.get("bias", {dim}), eps};
}

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
  Tensor word_embeddings;      // (vocab, hidden)
  Tensor position_embeddings;  // (max_positions, hidden)
  Tensor token_type_row;       // (hidden): token type 0
  Norm embeddings_norm;
  std::vector<Layer> layers;
};

Bert Bert::load(const fs::path& model_dir, const Device& device, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    throw UnsupportedDType(std::string("Bert::load: dtype ") + dtype_name(dtype) +
                           " (expected f32, f16 or bf16)");
  }
  if (!fs::is_directory(model_dir)) {
    throw FormatError(model_dir.string() + ": not a model folder (no such directory)");
  }
  auto impl = std::make_shared<Impl>();
  impl->config = BertConfig::from_file(model_dir / "config.json");
  impl->device = device;
  impl->dtype = dtype;
  const auto& c = impl->config;
  const size_t h = c.hidden_size;

  auto all = nn::Weights::from_safetensors(safetensors_files(model_dir), dtype, device);
  // BertModel checkpoints name tensors "embeddings...", BertFor* checkpoints "bert.embeddings...".
  auto root = all.contains("embeddings.word_embeddings.weight") ? all : all.pp("bert");

  auto emb = root.pp("embeddings");
  impl->word_embeddings = emb.pp("word_embeddings").get("weight", {c.vocab_size, h});
  impl->position_embeddings =
      emb.pp("position_embeddings").get("weight", {c.max_position_embeddings, h});
  impl->token_type_row =
      emb.pp("token_type_embeddings").get("weight", {c.type_vocab_size, h}).get(0);
  impl->embeddings_norm = norm(emb.pp("LayerNorm"), h, c.layer_norm_eps);

  auto layers = root.pp("encoder").pp("layer");
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    auto lw = layers.pp(std::to_string(i));
    auto self = lw.pp("attention").pp("self");
    auto q = dense(self.pp("query"), h, h);
    auto k = dense(self.pp("key"), h, h);
    auto v = dense(self.pp("value"), h, h);
    Layer layer{
        Dense{Tensor::cat({q.weight, k.weight, v.weight}, 0), Tensor::cat({q.bias, k.bias, v.bias}, 0)},
        dense(lw.pp("attention").pp("output").pp("dense"), h, h),
        norm(lw.pp("attention").pp("output").pp("LayerNorm"), h, c.layer_norm_eps),
        dense(lw.pp("intermediate").pp("dense"), h, c.intermediate_size),
        dense(lw.pp("output").pp("dense"), c.intermediate_size, h),
        norm(lw.pp("output").pp("LayerNorm"), h, c.layer_norm_eps),
    };
    impl->layers.push_back(std::move(layer));
  }
  device.synchronize();
  return Bert(std::move(impl));
}

const BertConfig& Bert::config() const { return impl_->config; }
Device Bert::device() const { return impl_->device; }
DType Bert::dtype() const { return impl_->dtype; }

Tensor Bert::encode(const Tensor& ids_in, const Tensor& mask_in) const {
  const auto& m = *impl_;
  const auto& c = m.config;
  if (ids_in.rank() != 2 || mask_in.shape() != ids_in.shape()) {
    throw ShapeMismatch("Bert::encode: ids must be (batch, seq) and attention_mask the same, got ids " +
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
  double lowest = m.dtype == DType::F16 ? -65504.0 : -3.0e38;
  auto keep = mask_in.to_device(m.device).to_dtype(DType::F32);
  auto additive = (1.0 - keep).affine(lowest, 0.0).to_dtype(m.dtype).reshape({b, 1, 1, s});
  nn::AttentionOptions options;
  options.mask = additive;

  for (const auto& layer : m.layers) {
    // (b, s, 3h) -> q, k, v as (b, heads, s, d) views.
    auto qkv = layer.qkv.forward(x).reshape({b, s, 3, heads, d});
    auto part = [&](size_t i) { return qkv.narrow(2, i, 1).squeeze(2).transpose(1, 2); };
    auto ctx = nn::scaled_dot_product_attention(part(0), part(1), part(2), options);
    ctx = ctx.transpose(1, 2).reshape({b, s, h});
    auto a = layer.attn_norm.forward(layer.attn_out.forward(ctx) + x);
    auto inner = layer.intermediate.forward(a).gelu_erf();
    x = layer.out_norm.forward(layer.out.forward(inner) + a);
  }
  return x;
}

}  // namespace wick::models
