#pragma once
// Self-attention of sequences packed without padding (fused::VarlenAttentionOp).

#include <cstddef>

#include "wick/tensor.h"

namespace wick::nn::detail {

/// Per sequence and head, softmax(scale q k^T) v over the sequence's own tokens: qkv (t, 3 h) the
/// packed tokens' query, key and value projections, offsets (n + 1) U32 the sequences' first rows
/// and t last. Result (t, h) in qkv's dtype. ShapeMismatch naming "varlen_attention" when h is
/// not a multiple of `heads`, the offsets do not rise from 0 to t, or a sequence is empty.
Tensor varlen_attention(const Tensor& qkv, const Tensor& offsets, size_t heads, double scale);

}  // namespace wick::nn::detail
