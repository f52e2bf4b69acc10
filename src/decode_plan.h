#pragma once
// The decode plan: how a backend runs the one-token decode step of a standard decoder (pre-norm RMS
// norms, fused q/k/v with optional bias, optional per-head q/k RMS norms before rope, rotate-half
// rope over whole heads or their first dims (partial rotary) with a table per layer, grouped-query
// attention over a KvCache with an optional sliding window, scale and score soft-cap, optional RMS
// norms of the attention's and the FFN's outputs before their residual adds, a SiLU- or GELU-gated
// FFN, a scaled embedding, tied or separate output head, optional logit soft-cap): Llama, Qwen2,
// Qwen3, Mistral, Phi-3 (Phi-4-mini's partial rotary too), Gemma 2 and 3. A model hands its weights
// over once (BackendDevice::decode_plan); the backend may answer with a plan that fuses, prefetches
// and launches as it sees fit, or with none, and the model then composes the step from its own ops.
// Models never see what a plan does; plans never see a model's class.

#include <cstddef>
#include <vector>

#include "nn/qlinear.h"
#include "wick/causal_lm.h"
#include "wick/kv_cache.h"
#include "wick/paged_kv_cache.h"
#include "wick/tensor.h"

namespace wick {

/// The FFN's gate: act(gate) * up.
enum class GatedActivation { SiLU, GeluTanh };

/// The weights of a standard decoder as they are held after loading. Every RMS norm weight is of
/// the model's dtype, or f32 for f16/bf16 models (Gemma's 1 + w: the norm in f32, rounded once,
/// as Tensor::rms_norm takes it).
struct DecoderWeights {
  struct Layer {
    Tensor ln1, ln2;        // attention and FFN input RMS norms
    nn::QLinear wqkv;       // (q_out + 2 kv_out, d): q, k, v rows
    Tensor bqkv;            // their bias, or undefined
    nn::QLinear wo;         // (d, q_out)
    nn::QLinear wgate_up;   // (2 intermediate, d): gate rows, then up rows
    nn::QLinear wdown;      // (d, intermediate)
    Tensor q_norm, k_norm;  // (head_dim): RMS norms of each q and k head before rope, or undefined
    // RMS norms of the attention's output projection and of the FFN's down projection before
    // each is added to the residual stream (Gemma), or undefined.
    Tensor post_attn_norm, post_ffn_norm;
    // (positions, rotary_dims / 2) rope tables of this layer, covering every position a cache
    // holds (Gemma 3's local layers), or undefined: the cache's.
    Tensor cos, sin;
    size_t window = 0;   // > 0: the position p attends keys (p - window, p] only
    double scale = 0;    // of the scores; 0: 1 / sqrt(head_dim)
    double softcap = 0;  // > 0: scores softcap tanh(score / softcap)
  };
  size_t heads = 0, kv_heads = 0, head_dim = 0;
  // The dims of each q and k head that rope turns, the first ones: head_dim, or fewer (partial
  // rotary; the rest pass through). The rope tables are rotary_dims / 2 wide.
  size_t rotary_dims = 0;
  double eps = 0;          // of every RMS norm
  double embed_scale = 1;  // the embedding times this (affine), Gemma's sqrt(hidden)
  GatedActivation activation = GatedActivation::SiLU;
  double final_softcap = 0;  // > 0: logits softcap tanh(logit / softcap)
  Tensor embed, norm;
  nn::QLinear lm_head;
  std::vector<Layer> layers;
};

class DecodePlan {
 public:
  virtual ~DecodePlan() = default;
  /// CausalLM::decode_step for the weights the plan was made for (arguments already checked).
  /// Returns an undefined tensor, doing nothing, for a step it does not take (a batch of
  /// several sequences; a sliding window shorter than key_window); the model composes that step
  /// itself.
  virtual Tensor step(const Tensor& token, const Tensor& position, models::KvCache& cache,
                      Tensor* logits, size_t key_window) const = 0;
  /// CausalLM::forward_last of one token of one sequence, `token` (1, 1) U32 (arguments already
  /// checked): its logits (1, vocab), its keys and values written at the cache's length (the
  /// model then advances the length). Returns an undefined tensor, doing nothing, where the plan
  /// does not take it; the model composes the forward itself.
  virtual Tensor forward_one(const Tensor& /*token*/, models::KvCache& /*cache*/) const {
    return Tensor();
  }
  /// CausalLM::forward_paged_tensors for the weights the plan was made for (arguments already
  /// checked; the cache's rope tables are the model's): the logits (n, vocab) of each sequence's
  /// last token. Returns an undefined tensor, doing nothing, for a batch it does not take; the
  /// model composes that step itself.
  virtual Tensor paged_step(const models::PagedBatchTensors& /*batch*/,
                            models::PagedKvCache& /*cache*/) const {
    return Tensor();
  }
};

}  // namespace wick
