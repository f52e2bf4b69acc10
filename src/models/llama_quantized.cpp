// Llama::load(..., keep_quantized): a GGUF file's matrices kept as their GGML blocks and
// multiplied by qmatmul (nn/qlinear.h); norms and the embedding lookup dequantised.

#include "models/llama_impl.h"
#include "util.h"
#include "wick/error.h"
#include "wick/gguf.h"

namespace wick::models {

// GGUF stores q and k rows permuted for interleaved rope (see llama_load.cpp): rows
// (heads, head_dim / 2, 2) back to (heads, 2, head_dim / 2). Rows are whole blocks, so the
// permutation moves bytes.
QTensor unpermute_rope_rows(const QTensor& w, size_t heads, size_t head_dim) {
  size_t n = w.shape()[0], row_bytes = ggml_bytes(w.type(), w.shape()[1]);
  if (n != heads * head_dim) {
    throw ShapeMismatch(
        str("Llama: q/k weight of ", n, " rows for ", heads, " heads of ", head_dim));
  }
  Tensor bytes = w.data()
                     .reshape({heads, head_dim / 2, 2, row_bytes})
                     .transpose(1, 2)
                     .contiguous()
                     .reshape({n * row_bytes});
  return QTensor(w.type(), w.shape(), bytes);
}

namespace {

bool keepable(GgmlType t) {
  return qmatmul_supports(t) && t != GgmlType::F32 && t != GgmlType::F16 && t != GgmlType::BF16;
}

}  // namespace

Llama load_gguf_quantized(const std::string& path, const Device& device, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::F16 && dtype != DType::BF16) {
    throw UnsupportedDType(str("Llama: weights must be f32, f16 or bf16, got ", dtype));
  }
  gguf::File f = gguf::File::open(path);
  LlamaConfig c = gguf_config(f);
  auto impl = std::make_shared<Llama::Impl>();
  impl->config = c;
  impl->device = device;
  impl->dtype = dtype;
  auto dense = [&](const std::string& name) {
    return f.get(name, Device::cpu()).to_device(device).to_dtype(dtype);
  };
  // Row-stacked parts: kept quantized when every part's type is, else dequantised and joined.
  auto linear = [&](const std::vector<QTensor>& parts) -> QLinear {
    bool keep = true;
    for (const QTensor& p : parts) keep = keep && keepable(p.type());
    if (keep) {
      std::vector<QTensor> on_device;
      for (const QTensor& p : parts) on_device.push_back(p.to_device(device));
      return QLinear(on_device);
    }
    std::vector<Tensor> rows;
    for (const QTensor& p : parts) rows.push_back(p.dequantize());
    Tensor w = rows.size() == 1 ? rows[0] : Tensor::cat(rows, 0);
    return QLinear(w.to_device(device).to_dtype(dtype));
  };
  auto q = [&](const std::string& name) { return f.get_quantized(name, Device::cpu()); };
  impl->embed = dense("token_embd.weight");
  impl->norm = dense("output_norm.weight");
  impl->lm_head = linear({q(c.tie_word_embeddings ? "token_embd.weight" : "output.weight")});
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string g = str("blk.", i, ".");
    Llama::Impl::Layer l;
    l.ln1 = dense(g + "attn_norm.weight");
    l.ln2 = dense(g + "ffn_norm.weight");
    l.wqkv = linear({unpermute_rope_rows(q(g + "attn_q.weight"), c.num_attention_heads, c.head_dim),
                     unpermute_rope_rows(q(g + "attn_k.weight"), c.num_key_value_heads, c.head_dim),
                     q(g + "attn_v.weight")});
    l.wo = linear({q(g + "attn_output.weight")});
    l.wgate_up = linear({q(g + "ffn_gate.weight"), q(g + "ffn_up.weight")});
    l.wdown = linear({q(g + "ffn_down.weight")});
    impl->layers.push_back(std::move(l));
  }
  return Llama(std::move(impl));
}

}  // namespace wick::models
