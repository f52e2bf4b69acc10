#pragma once
// What Gemma 2 and Gemma 3 share (gemma2.cpp): their configuration beyond the common one, the
// weights of their four-norm layers, and the layer math both state.

#include <memory>
#include <string>
#include <vector>

#include "models/decoder.h"

namespace wick::models::gemma {

/// A Gemma 2 or Gemma 3 text model's settings read by load_gemma.
struct GemmaConfig {
  decoder::DecoderConfig common;
  double query_pre_attn_scalar = 256;  // scores scale by its inverse square root
  double attn_softcap = 0;
  size_t sliding_window = 0;
  std::vector<bool> sliding;         // per layer
  std::vector<decoder::Rope> ropes;  // [0] global layers, [1] local (sliding) layers when given
  bool qk_norm = false;              // Gemma 3
};

/// The folder or GGUF file at `path` with `cfg` read, as a Gemma decoder: embeddings times
/// sqrt(hidden) (rounded to the model's dtype), per layer
///   x += post_attn_norm(wo attention(q, k, v) of attn_norm(x))
///   x += post_ffn_norm(wdown (gelu_tanh(gate) * up) of ffn_norm(x))
/// with every norm x / rms(x) * (1 + w), q/k head norms (Gemma 3) before rope, the scale
/// query_pre_attn_scalar^-1/2, the score soft-cap and the sliding window of the local layers;
/// logits = lm_head final_norm(x), soft-capped when the config says so.
std::unique_ptr<CausalLM> load_gemma(const std::string& path, GemmaConfig cfg, const Device& device,
                                     DType dtype);

/// The activation a Gemma config names (hidden_activation, else hidden_act): FormatError unless
/// it is tanh-approximated GELU.
void check_activation(const json_file::Json& j, const std::string& origin);

/// A number field: `fallback` when absent (transformers' default), 0 (off) when null.
double number_or_off(const json_file::Json& j, const char* key, double fallback,
                     const std::string& origin);

/// The score scale of a GGUF file: <arch>.attention.scale when present, else llama.cpp's rule
/// (1 / sqrt(head_dim), or 1 / sqrt(hidden / heads) for the 27B shapes).
double gguf_query_scalar(const gguf::File& f, const std::string& arch,
                         const decoder::DecoderConfig& c);

}  // namespace wick::models::gemma
