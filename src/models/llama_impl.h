#pragma once
// The weights of a Llama model as held after loading (q/k/v and gate/up fused for fewer
// matmuls, in the standard decoder layout of decode_plan.h); shared by llama.cpp and the loaders.

#include <memory>

#include "decode_plan.h"
#include "wick/llama.h"

namespace wick::gguf {
class File;
}

namespace wick::models {

using nn::QLinear;

struct Llama::Impl : DecoderWeights {
  LlamaConfig config;
  Device device = Device::cpu();
  DType dtype = DType::F32;
  std::unique_ptr<DecodePlan> plan;  // the backend's, or null (set by Llama's constructor)
};

/// The configuration in a GGUF file's llama.* metadata (llama_load.cpp).
LlamaConfig gguf_config(const gguf::File& f);
/// The q or k rows of a llama GGUF file (permuted for interleaved rope by llama.cpp's convert
/// script) back in Hugging Face's order, for one rotate-half rope; any row type
/// (llama_quantized.cpp).
QTensor unpermute_rope_rows(const QTensor& w, size_t heads, size_t head_dim);
/// Llama::load of a GGUF file with its quantized matrices kept quantized (llama_quantized.cpp).
Llama load_gguf_quantized(const std::string& path, const Device& device, DType dtype);

}  // namespace wick::models
