// SGD with momentum and AdamW. Updates are computed with Tensor ops under a NoGradGuard and
// written into the parameters in place (assign), so the caller's handles see the new values.

#include "wick/optim.h"

#include <cmath>

#include "tensor_impl.h"
#include "util.h"

namespace wick::optim {

namespace {

void check_params(const char* op, const std::vector<Tensor>& params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!p.defined()) throw Error(str(op, ": parameter ", i, " is an empty tensor handle"));
    if (!is_float(p.dtype())) {
      throw UnsupportedDType(str(op, ": parameter ", i, " ", p.shape(), " has dtype ", p.dtype(),
                                 " (float dtypes only)"));
    }
    // An untracked tensor never gets a gradient, and the result of an op is not what the caller
    // holds as the parameter: either would leave the optimizer stepping nothing.
    const TensorImpl& impl = *p.impl();
    if (!impl.is_variable) {
      throw Error(str(op, ": parameter ", i, " ", p.shape(), " is not a tracked leaf (",
                      impl.op ? "it is the result of an op" : "it does not track gradients",
                      "); pass the tensor returned by requires_grad()"));
    }
  }
}

void check_hyper(const char* op, const char* name, double value, double lo, bool lo_open) {
  if (!std::isfinite(value) || value < lo || (lo_open && value == lo)) {
    throw Error(str(op, ": ", name, " must be ", lo_open ? "> " : ">= ", lo, ", got ", value));
  }
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, double lr, double momentum)
    : params_(std::move(params)), velocity_(params_.size()), lr_(lr), momentum_(momentum) {
  check_params("SGD", params_);
  check_hyper("SGD", "lr", lr, 0, false);
  check_hyper("SGD", "momentum", momentum, 0, false);
}

void SGD::set_lr(double lr) {
  check_hyper("SGD::set_lr", "lr", lr, 0, false);
  lr_ = lr;
}

void SGD::step(const GradStore& grads) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    std::optional<Tensor> g = grads.get(params_[i]);
    if (!g) continue;
    Tensor direction = *g;
    if (momentum_ != 0) {
      // v = momentum * v + g (PyTorch's form); the first step starts from v = g.
      Tensor& v = velocity_[i];
      v = v.defined() ? v.affine(momentum_, 0).add(*g) : *g;
      direction = v;
    }
    params_[i].assign(params_[i].sub(direction.affine(lr_, 0)));
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : params_(std::move(params)), m_(params_.size()), v_(params_.size()), options_(options) {
  check_params("AdamW", params_);
  check_hyper("AdamW", "lr", options.lr, 0, false);
  check_hyper("AdamW", "eps", options.eps, 0, false);
  check_hyper("AdamW", "weight_decay", options.weight_decay, 0, false);
  check_hyper("AdamW", "beta1", options.beta1, 0, false);
  check_hyper("AdamW", "beta2", options.beta2, 0, false);
  if (options.beta1 >= 1 || options.beta2 >= 1) {
    throw Error(
        str("AdamW: beta1 and beta2 must be < 1, got ", options.beta1, " and ", options.beta2));
  }
}

void AdamW::set_lr(double lr) {
  check_hyper("AdamW::set_lr", "lr", lr, 0, false);
  options_.lr = lr;
}

void AdamW::step(const GradStore& grads) {
  NoGradGuard no_grad;
  ++step_count_;
  const auto& o = options_;
  double t = static_cast<double>(step_count_);
  double m_scale = 1.0 / (1.0 - std::pow(o.beta1, t));  // bias corrections
  double v_scale = 1.0 / (1.0 - std::pow(o.beta2, t));
  for (size_t i = 0; i < params_.size(); ++i) {
    std::optional<Tensor> g = grads.get(params_[i]);
    if (!g) continue;
    Tensor& m = m_[i];
    Tensor& v = v_[i];
    Tensor g_m = g->affine(1 - o.beta1, 0);
    Tensor g_v = g->sqr().affine(1 - o.beta2, 0);
    m = m.defined() ? m.affine(o.beta1, 0).add(g_m) : g_m;
    v = v.defined() ? v.affine(o.beta2, 0).add(g_v) : g_v;
    Tensor update = m.affine(m_scale, 0).div(v.affine(v_scale, 0).sqrt().affine(1, o.eps));
    Tensor& p = params_[i];
    // Decoupled weight decay: p * (1 - lr * wd), then the Adam step.
    p.assign(p.affine(1 - o.lr * o.weight_decay, 0).sub(update.affine(o.lr, 0)));
  }
}

}  // namespace wick::optim
