// The weight sources of the composed decoder families (decoder.h): a Hugging Face folder
// (safetensors) or a GGUF file, and the projections and embedding every family reads alike.

#include <filesystem>

#include "models/decoder.h"
#include "models/llama_impl.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"
#include "wick/quantized.h"
#include "wick/safetensors.h"

namespace wick::models::decoder {

namespace {

namespace fs = std::filesystem;

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

}  // namespace wick::models::decoder
