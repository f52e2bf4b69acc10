// Linear, Embedding, LayerNorm, RmsNorm: thin wrappers over the Tensor ops, with PyTorch's
// initialisation for fresh layers.

#include "wick/nn/layers.h"

#include <cmath>

#include "util.h"

namespace wick::nn {

namespace {

Tensor uniform(double bound, const Shape& shape, DType dtype, const Device& device) {
  return Tensor::rand<double>(-bound, bound, shape, Device::cpu())
      .to_dtype(dtype)
      .to_device(device);
}

Tensor tracked(const Tensor& t) {
  return t.is_tracked() ? t : t.requires_grad();
}

}  // namespace

// ---- Linear ----

Linear::Linear(size_t in, size_t out, bool bias, DType dtype, const Device& device) {
  // kaiming_uniform_(a = sqrt(5)) on (out, in) gives the bound 1 / sqrt(in), as does the bias.
  double bound = in == 0 ? 0.0 : 1.0 / std::sqrt(static_cast<double>(in));
  weight_ = uniform(bound, Shape{out, in}, dtype, device);
  if (bias) bias_ = uniform(bound, Shape{out}, dtype, device);
}

Linear::Linear(Tensor weight, std::optional<Tensor> bias)
    : weight_(std::move(weight)), bias_(std::move(bias)) {
  if (!weight_.defined() || weight_.rank() != 2) {
    throw ShapeMismatch(str("nn::Linear: weight must be (out, in), got ",
                            weight_.defined() ? weight_.shape().to_string() : "an empty handle"));
  }
  if (bias_ && (!bias_->defined() || bias_->shape() != Shape{weight_.dims()[0]})) {
    throw ShapeMismatch(str("nn::Linear: bias must be [", weight_.dims()[0], "], got ",
                            bias_->defined() ? bias_->shape().to_string() : "an empty handle"));
  }
}

Tensor Linear::forward(const Tensor& x) const {
  size_t in = in_features(), out = out_features();
  if (!x.defined() || x.rank() == 0 || x.dims().back() != in) {
    throw ShapeMismatch(str("nn::Linear: input ", x.defined() ? x.shape().to_string() : "(empty)",
                            " does not end in ", in, " (weight ", weight_.shape(), ")"));
  }
  std::vector<size_t> out_dims = x.dims();
  out_dims.back() = out;
  Tensor wt = weight_.t();
  Tensor y;
  if (x.rank() == 2) {
    y = x.matmul(wt);
  } else if (x.rank() == 1 || x.is_contiguous()) {
    // One (rows, in) x (in, out) gemm for all leading dims.
    y = x.reshape(Shape{x.elem_count() / std::max<size_t>(in, 1), in}).matmul(wt);
  } else {
    y = x.broadcast_matmul(wt);
  }
  if (bias_) y = y.broadcast_add(*bias_);
  return y.shape() == Shape(out_dims) ? y : y.reshape(Shape(out_dims));
}

std::vector<Tensor> Linear::parameters() const {
  std::vector<Tensor> p{weight_};
  if (bias_) p.push_back(*bias_);
  return p;
}

Linear Linear::requires_grad() const {
  return Linear(tracked(weight_), bias_ ? std::optional<Tensor>(tracked(*bias_)) : std::nullopt);
}

// ---- Embedding ----

Embedding::Embedding(size_t n, size_t dim, DType dtype, const Device& device)
    : table_(Tensor::randn<double>(0.0, 1.0, Shape{n, dim}, Device::cpu())
                 .to_dtype(dtype)
                 .to_device(device)) {}

Embedding::Embedding(Tensor table) : table_(std::move(table)) {
  if (!table_.defined() || table_.rank() != 2) {
    throw ShapeMismatch(str("nn::Embedding: table must be (n, dim), got ",
                            table_.defined() ? table_.shape().to_string() : "an empty handle"));
  }
}

Tensor Embedding::forward(const Tensor& ids) const {
  return table_.embedding(ids);
}

std::vector<Tensor> Embedding::parameters() const {
  return {table_};
}

Embedding Embedding::requires_grad() const {
  return Embedding(tracked(table_));
}

// ---- LayerNorm ----

LayerNorm::LayerNorm(size_t dim, double eps, bool bias, DType dtype, const Device& device)
    : weight_(Tensor::ones(Shape{dim}, dtype, device)), eps_(eps) {
  if (bias) bias_ = Tensor::zeros(Shape{dim}, dtype, device);
}

LayerNorm::LayerNorm(Tensor weight, std::optional<Tensor> bias, double eps)
    : weight_(std::move(weight)), bias_(std::move(bias)), eps_(eps) {
  if (!weight_.defined() || weight_.rank() != 1) {
    throw ShapeMismatch(str("nn::LayerNorm: weight must be (dim), got ",
                            weight_.defined() ? weight_.shape().to_string() : "an empty handle"));
  }
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return x.layer_norm(weight_, bias_ ? *bias_ : Tensor(), eps_);
}

std::vector<Tensor> LayerNorm::parameters() const {
  std::vector<Tensor> p{weight_};
  if (bias_) p.push_back(*bias_);
  return p;
}

LayerNorm LayerNorm::requires_grad() const {
  return LayerNorm(tracked(weight_), bias_ ? std::optional<Tensor>(tracked(*bias_)) : std::nullopt,
                   eps_);
}

// ---- RmsNorm ----

RmsNorm::RmsNorm(size_t dim, double eps, DType dtype, const Device& device)
    : weight_(Tensor::ones(Shape{dim}, dtype, device)), eps_(eps) {}

RmsNorm::RmsNorm(Tensor weight, double eps) : weight_(std::move(weight)), eps_(eps) {
  if (!weight_.defined() || weight_.rank() != 1) {
    throw ShapeMismatch(str("nn::RmsNorm: weight must be (dim), got ",
                            weight_.defined() ? weight_.shape().to_string() : "an empty handle"));
  }
}

Tensor RmsNorm::forward(const Tensor& x) const {
  return x.rms_norm(weight_, eps_);
}

std::vector<Tensor> RmsNorm::parameters() const {
  return {weight_};
}

RmsNorm RmsNorm::requires_grad() const {
  return RmsNorm(tracked(weight_), eps_);
}

// ---- from Weights ----

Linear linear(const Weights& w, size_t in, size_t out, bool bias) {
  Tensor weight = w.get("weight", Shape{out, in});
  std::optional<Tensor> b;
  if (bias) b = w.get("bias", Shape{out});
  return Linear(std::move(weight), std::move(b));
}

Embedding embedding(const Weights& w, size_t n, size_t dim) {
  return Embedding(w.get("weight", Shape{n, dim}));
}

LayerNorm layer_norm(const Weights& w, size_t dim, double eps) {
  std::optional<Tensor> bias;
  if (w.contains("bias")) bias = w.get("bias", Shape{dim});
  return LayerNorm(w.get("weight", Shape{dim}), std::move(bias), eps);
}

RmsNorm rms_norm(const Weights& w, size_t dim, double eps) {
  return RmsNorm(w.get("weight", Shape{dim}), eps);
}

}  // namespace wick::nn
