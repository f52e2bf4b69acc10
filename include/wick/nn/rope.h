#pragma once
// Tables and masks that the transformer blocks feed to the fused ops.

#include <utility>

#include "wick/tensor.h"

namespace wick::nn {

/// Rotary tables for Tensor::rope / rope_interleaved: (cos, sin), each (positions, dim / 2), with
/// angle[p][i] = p * theta^(-2i / dim). The angles are formed in f32 as Hugging Face transformers
/// does (so that outputs match it), their cos and sin taken in f64 and rounded to `dtype`.
std::pair<Tensor, Tensor> rope_tables(size_t positions, size_t dim, double theta, DType dtype,
                                      const Device& device);

/// An additive attention mask from a (b, s_kv) keep-mask (1 keeps a key, 0 drops it; any dtype):
/// (b, 1, 1, s_kv) in `dtype`, 0 where kept and the dtype's lowest finite value where dropped
/// (as transformers' BERT), broadcastable to the scores of scaled_dot_product_attention.
Tensor padding_mask(const Tensor& keep, DType dtype);

}  // namespace wick::nn
