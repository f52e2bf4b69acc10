#pragma once
// Self-attention over sequences packed without padding (an encoder's unpadded batch):
// nn::detail::varlen_attention (front end and fallback: src/nn/varlen_attention.cpp; CPU kernel:
// src/cpu/varlen_attention.cpp). Gradients: autograd through the fallback.

#include "wick/custom_op.h"

namespace wick::fused {

/// Inputs: qkv (t, 3 h), each row a token's query, key and value projections side by side (h =
/// heads x d), the sequences one after another; offsets (n + 1) U32, where sequence i holds rows
/// [offsets[i], offsets[i + 1]). Output (t, h) in qkv's dtype: per sequence and head,
/// softmax(scale q k^T) v over the sequence's own tokens (no mask, no padding), the heads side by
/// side.
class VarlenAttentionOp final : public CustomOp {
 public:
  VarlenAttentionOp(size_t heads, double scale) : heads(heads), scale(scale) {}
  const char* name() const override { return "varlen_attention"; }
  void check(const TensorList& inputs) const override;
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;

  size_t heads;
  double scale;
};

}  // namespace wick::fused
