#pragma once
// The basic layers: Linear, Embedding, LayerNorm, RmsNorm. Each is built from nn::Weights
// (nn::linear(w, in, out, bias), ...) or fresh with PyTorch's initialisation, and is trainable:
// requires_grad() gives a copy whose tensors are tracked leaves, parameters() lists them.

#include <optional>
#include <vector>

#include "wick/nn/weights.h"
#include "wick/tensor.h"

namespace wick::nn {

/// y = x W^T + b, with W (out, in) as PyTorch stores it. x: (..., in) -> (..., out).
class Linear {
 public:
  /// Fresh: W and b uniform in +-1/sqrt(in) (PyTorch's kaiming-uniform default).
  Linear(size_t in, size_t out, bool bias, DType dtype = DType::F32,
         const Device& device = Device::cpu());
  /// From tensors: weight (out, in), bias (out) or none.
  Linear(Tensor weight, std::optional<Tensor> bias);
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  const std::optional<Tensor>& bias() const { return bias_; }
  size_t in_features() const { return weight_.dims()[1]; }
  size_t out_features() const { return weight_.dims()[0]; }
  std::vector<Tensor> parameters() const;
  Linear requires_grad() const;

 private:
  Tensor weight_;
  std::optional<Tensor> bias_;
};

/// Rows of a (n, dim) table: ids (any shape, u32 or i64) -> ids shape + (dim).
class Embedding {
 public:
  /// Fresh: N(0, 1) as PyTorch.
  Embedding(size_t n, size_t dim, DType dtype = DType::F32, const Device& device = Device::cpu());
  explicit Embedding(Tensor table);
  Tensor forward(const Tensor& ids) const;
  const Tensor& table() const { return table_; }
  std::vector<Tensor> parameters() const;
  Embedding requires_grad() const;

 private:
  Tensor table_;
};

/// Normalises the last dim: (x - mean) / sqrt(var + eps) * weight + bias (one fused kernel).
class LayerNorm {
 public:
  /// Fresh: weight ones, bias zeros (or none).
  LayerNorm(size_t dim, double eps, bool bias = true, DType dtype = DType::F32,
            const Device& device = Device::cpu());
  LayerNorm(Tensor weight, std::optional<Tensor> bias, double eps);
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  const std::optional<Tensor>& bias() const { return bias_; }
  double eps() const { return eps_; }
  std::vector<Tensor> parameters() const;
  LayerNorm requires_grad() const;

 private:
  Tensor weight_;
  std::optional<Tensor> bias_;
  double eps_;
};

/// x / sqrt(mean(x^2) + eps) * weight over the last dim (one fused kernel).
class RmsNorm {
 public:
  /// Fresh: weight ones.
  RmsNorm(size_t dim, double eps, DType dtype = DType::F32, const Device& device = Device::cpu());
  RmsNorm(Tensor weight, double eps);
  Tensor forward(const Tensor& x) const;
  const Tensor& weight() const { return weight_; }
  double eps() const { return eps_; }
  std::vector<Tensor> parameters() const;
  RmsNorm requires_grad() const;

 private:
  Tensor weight_;
  double eps_;
};

/// From Weights: "weight" (out, in) and, when `bias`, "bias" (out).
Linear linear(const Weights& w, size_t in, size_t out, bool bias = true);
/// "weight" (n, dim).
Embedding embedding(const Weights& w, size_t n, size_t dim);
/// "weight" (dim) and "bias" (dim) when present.
LayerNorm layer_norm(const Weights& w, size_t dim, double eps);
/// "weight" (dim).
RmsNorm rms_norm(const Weights& w, size_t dim, double eps);

}  // namespace wick::nn
