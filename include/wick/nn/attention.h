#pragma once
// Scaled dot-product attention as one fused kernel per backend (tiled, online softmax; the
// (s, s_kv) score matrix is never stored).

#include <optional>

#include "wick/tensor.h"

namespace wick::nn {

struct AttentionOptions {
  /// Query i attends to keys j <= i + s_kv - s (aligned to the end, as when decoding with a KV
  /// cache); with s == s_kv that is the usual lower triangle.
  bool causal = false;
  /// Multiplies q k^T; 0 means 1 / sqrt(d).
  double scale = 0;
  /// Added to the scores before the softmax; broadcastable to (b, h, s, s_kv), q's dtype.
  std::optional<Tensor> mask;
  /// Sliding window: > 0 lets query i see only the `window` latest keys of its causal alignment,
  /// j > i + s_kv - s - window (with causal: keys i + s_kv - s - window < j <= i + s_kv - s).
  size_t window = 0;
  /// Score soft-cap: > 0 replaces each score x = q k^T * scale by softcap * tanh(x / softcap)
  /// before the mask is added (Gemma 2).
  double softcap = 0;
};

/// softmax(cap(q k^T * scale) + mask) v (cap: the soft-cap when set; keys outside the window
/// masked) with q (b, h, s, d), k and v (b, h_kv, s_kv, d), h a multiple
/// of h_kv (grouped-query attention: query head i uses k/v head i / (h / h_kv), never copied).
/// Returns (b, h, s, d). f32/f16/bf16 (f64 on the CPU too); f16/bf16 accumulate in f32. A query
/// that sees no key (causal with s > s_kv, or a mask row of -inf) gets zeros. Gradients are
/// recorded (computed through the composed matmul/softmax path).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

}  // namespace wick::nn
