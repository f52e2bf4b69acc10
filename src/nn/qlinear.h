#pragma once
// The weight of a linear layer, (out, in): a plain tensor, or GGML-quantized row blocks kept
// quantized (qmatmul). Layers fused by rows (q/k/v, gate/up) whose parts have different types
// stay separate parts; their outputs are concatenated.

#include <vector>

#include "wick/quantized.h"
#include "wick/tensor.h"

namespace wick::nn {

class QLinear {
 public:
  QLinear() = default;
  QLinear(Tensor w) : dense_(std::move(w)) {}  // NOLINT: a plain weight converts implicitly
  /// Parts stacked by rows (all with the same `in`); neighbours of one type are merged.
  explicit QLinear(const std::vector<QTensor>& parts);

  bool defined() const { return dense_.defined() || !parts_.empty(); }
  bool quantized() const { return !parts_.empty(); }
  const Tensor& dense() const { return dense_; }
  const std::vector<QTensor>& parts() const { return parts_; }
  /// Bytes held by the weight.
  size_t bytes() const;

  /// x (..., in) times the weight transposed, plus `bias` when defined: (..., out) in x's dtype.
  /// Quantized weights take f32 activations on the CPU (others are converted there and back).
  Tensor forward(const Tensor& x, const Tensor& bias = Tensor()) const;

 private:
  Tensor dense_;
  std::vector<QTensor> parts_;
};

}  // namespace wick::nn
