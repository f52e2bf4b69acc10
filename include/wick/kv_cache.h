#pragma once
// The preallocated key/value cache of a causal language model (wick/causal_lm.h): keys and
// values of every layer, preallocated to max_len positions and written in place, with the rope
// tables of those positions.

#include <cstddef>
#include <vector>

#include "wick/tensor.h"

namespace wick::models {

/// Keys and values of every layer for one batch of sequences. Made by CausalLM::make_cache;
/// forward() appends and advances length(). Not for concurrent use by several threads.
class KvCache {
 public:
  KvCache() = default;
  /// Zero-filled keys and values of `layers` layers, each (batch, kv_heads, max_len, head_dim) in
  /// `dtype` on `device`; `cos` and `sin` (max_len, r / 2) the rope tables of the positions, for
  /// the first r dims of a head that rotate (r = head_dim but for partial rotary, r even).
  /// Throws Error when batch or max_len is 0, ShapeMismatch when the tables do not fit.
  static KvCache allocate(size_t layers, size_t batch, size_t kv_heads, size_t max_len,
                          size_t head_dim, DType dtype, const Device& device, Tensor cos,
                          Tensor sin);

  size_t batch() const { return batch_; }
  size_t max_len() const { return max_len_; }
  /// Positions filled so far (the next token's position).
  size_t length() const { return length_; }
  size_t layers() const { return k_.size(); }
  /// (batch, kv_heads, max_len, head_dim) of layer `i`; rows [0, length()) are valid.
  const Tensor& k(size_t layer) const { return k_.at(layer); }
  const Tensor& v(size_t layer) const { return v_.at(layer); }
  /// Bytes held by keys and values (all layers, whole max_len).
  size_t bytes() const;
  /// Forgets the contents (length 0); the memory stays.
  void reset() { length_ = 0; }
  /// Sets the length after work that wrote positions itself (the CUDA-graph decode step).
  /// IndexOutOfRange past max_len.
  void set_length(size_t length);
  /// Rope tables (max_len, head_dim / 2) for this cache's positions, in the model's dtype.
  const Tensor& cos() const { return cos_; }
  const Tensor& sin() const { return sin_; }
  /// 0 .. max_len - 1 (U32): the graph-captured decode step masks the keys after its position.
  const Tensor& positions() const { return positions_; }
  /// {-inf, 0} in the model's dtype: the values of that mask.
  const Tensor& mask_fill() const { return mask_fill_; }

 private:
  size_t batch_ = 0, max_len_ = 0, length_ = 0;
  std::vector<Tensor> k_, v_;
  Tensor cos_, sin_;
  Tensor positions_;
  Tensor mask_fill_;
};

}  // namespace wick::models
