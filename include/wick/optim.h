#pragma once
// Optimizers over tracked leaves.

#include <vector>

#include "wick/autograd.h"
#include "wick/tensor.h"

namespace wick::optim {

/// Stochastic gradient descent with optional momentum. Not thread-safe: step() updates the
/// parameters and the optimizer's state; call it from one thread at a time.
class SGD {
 public:
  SGD(std::vector<Tensor> params, double lr, double momentum = 0);
  /// Updates every parameter that has a gradient in `grads`, in place.
  void step(const GradStore& grads);
  double lr() const { return lr_; }
  /// Throws wick::Error unless lr is finite and >= 0.
  void set_lr(double lr);

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> velocity_;
  double lr_;
  double momentum_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

/// Adam with decoupled weight decay. Not thread-safe: step() updates the parameters and the
/// moment estimates; call it from one thread at a time.
class AdamW {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  void step(const GradStore& grads);
  double lr() const { return options_.lr; }
  /// Throws wick::Error unless lr is finite and >= 0.
  void set_lr(double lr);

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> m_;
  std::vector<Tensor> v_;
  AdamWOptions options_;
  size_t step_count_ = 0;
};

}  // namespace wick::optim
