// GradStore, NoGradGuard and the per-thread recording switch.

#include "wick/autograd.h"

#include "util.h"

namespace wick {

namespace {
// Per thread: a guard on one thread must not stop recording on another.
thread_local bool t_grad_enabled = true;
}  // namespace

bool grad_enabled() {
  return t_grad_enabled;
}

NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) {
  t_grad_enabled = false;
}

NoGradGuard::~NoGradGuard() {
  t_grad_enabled = previous_;
}

std::optional<Tensor> GradStore::get(const Tensor& t) const {
  auto it = grads_.find(t.id());
  if (it == grads_.end()) return std::nullopt;
  return it->second;
}

void GradStore::insert(const Tensor& t, Tensor grad) {
  if (!grad.defined()) throw Error("GradStore::insert: the gradient is an empty tensor");
  if (grad.shape() != t.shape()) {
    throw ShapeMismatch(str("GradStore::insert: gradient shape ", grad.shape(),
                            " differs from the tensor's ", t.shape()));
  }
  if (grad.dtype() != t.dtype()) {
    throw DTypeMismatch(str("GradStore::insert: gradient dtype ", grad.dtype(),
                            " differs from the tensor's ", t.dtype()));
  }
  if (grad.device() != t.device()) {
    throw DeviceMismatch(str("GradStore::insert: gradient device ", grad.device(),
                             " differs from the tensor's ", t.device()));
  }
  grads_.insert_or_assign(t.id(), std::move(grad));
}

std::optional<Tensor> GradStore::remove(const Tensor& t) {
  auto it = grads_.find(t.id());
  if (it == grads_.end()) return std::nullopt;
  Tensor grad = std::move(it->second);
  grads_.erase(it);
  return grad;
}

}  // namespace wick
