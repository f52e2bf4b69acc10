#pragma once
// The weights of a Llama model as held after loading (q/k/v and gate/up fused for fewer
// matmuls); shared by llama.cpp and the loaders.

#include <vector>

#include "models/qlinear.h"
#include "wick/llama.h"

namespace wick::gguf {
class File;
}

namespace wick::models {

struct Llama::Impl {
  struct Layer {
    Tensor ln1, ln2;   // input_layernorm, post_attention_layernorm
    QLinear wqkv;      // (q_out + 2 kv_out, d): q, k, v rows
    Tensor bqkv;       // qwen2 only
    QLinear wo;        // (d, q_out)
    QLinear wgate_up;  // (2 intermediate, d): gate rows, then up rows
    QLinear wdown;     // (d, intermediate)
  };
  LlamaConfig config;
  Device device = Device::cpu();
  DType dtype = DType::F32;
  Tensor embed, norm;
  QLinear lm_head;
  std::vector<Layer> layers;
};

/// The configuration in a GGUF file's llama.* metadata (llama_load.cpp).
LlamaConfig gguf_config(const gguf::File& f);
/// Llama::load of a GGUF file with its quantized matrices kept quantized (llama_quantized.cpp).
Llama load_gguf_quantized(const std::string& path, const Device& device, DType dtype);

}  // namespace wick::models
