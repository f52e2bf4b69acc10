#pragma once
// The loaders of the causal LM families, one per model file, as load_causal_lm's table calls
// them: a model folder (config.json + safetensors) or, where the family has one, a GGUF file.

#include <memory>
#include <string>

#include "wick/causal_lm.h"
#include "wick/llama.h"

namespace wick::models {

/// llama.cpp: Llama 2/3, SmolLM and Mistral folders and llama GGUF files (kept quantized).
std::unique_ptr<CausalLM> load_llama_family(const std::string& path, const Device& device,
                                            DType dtype);
/// qwen2.cpp: Qwen2 folders.
std::unique_ptr<CausalLM> load_qwen2(const std::string& path, const Device& device, DType dtype);
/// qwen3.cpp: Qwen3 folders and qwen3 GGUF files.
std::unique_ptr<CausalLM> load_qwen3(const std::string& path, const Device& device, DType dtype);

/// mistral.cpp: Mistral folders (sliding-window attention; without a window, Llama's loader).
std::unique_ptr<CausalLM> load_mistral(const std::string& path, const Device& device, DType dtype);
/// mistral.cpp: config.json model_type llama and GGUF architecture llama: Llama's loader, except
/// a GGUF file whose llama.attention.sliding_window is below its context (a Mistral: its window).
std::unique_ptr<CausalLM> load_llama_architecture(const std::string& path, const Device& device,
                                                  DType dtype);
/// phi3.cpp: Phi-3 folders and phi3 GGUF files.
std::unique_ptr<CausalLM> load_phi3(const std::string& path, const Device& device, DType dtype);

/// gemma2.cpp: Gemma 2 folders and gemma2 GGUF files.
std::unique_ptr<CausalLM> load_gemma2(const std::string& path, const Device& device, DType dtype);
/// gemma3.cpp: Gemma 3 text folders (gemma3_text) and gemma3 GGUF files.
std::unique_ptr<CausalLM> load_gemma3(const std::string& path, const Device& device, DType dtype);

/// Throws FormatError (naming `origin`) when the config's bos or eos token ids are outside its
/// vocabulary: every family's config check (causal_lm.cpp).
void check_special_tokens(const CausalLMConfig& c, const std::string& origin);

/// A Llama-family model from a folder's safetensors under `config` (llama_load.cpp).
Llama load_llama_weights(const std::string& dir, const LlamaConfig& config, const Device& device,
                         DType dtype);

}  // namespace wick::models
