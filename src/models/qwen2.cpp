// Qwen2 (transformers' Qwen2ForCausalLM): Llama's decoder (llama.cpp) with a bias on the q, k and
// v projections, added inside the projection's rounding as transformers' nn.Linear adds it.

#include <filesystem>

#include "models/families.h"
#include "util.h"
#include "wick/error.h"

namespace wick::models {

std::unique_ptr<CausalLM> load_qwen2(const std::string& path, const Device& device, DType dtype) {
  std::string config_path = (std::filesystem::path(path) / "config.json").string();
  LlamaConfig c = LlamaConfig::from_file(config_path);
  if (c.model_type != "qwen2") {
    throw FormatError(str(config_path, ": model_type \"", c.model_type, "\" is not qwen2"));
  }
  c.qkv_bias = true;
  return std::make_unique<Llama>(load_llama_weights(path, c, device, dtype));
}

}  // namespace wick::models
