#pragma once
// Gradients: GradStore (the result of Tensor::backward) and NoGradGuard.

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "wick/tensor.h"

namespace wick {

/// Gradients keyed by tensor id. Not thread-safe: one thread at a time (backward fills one).
class GradStore {
 public:
  /// The gradient of `t` (same shape and dtype), if `t` took part in the graph. Kept for every
  /// tracked leaf and every intermediate the caller still held during backward; the gradients
  /// of intermediates nobody can name any more are freed as soon as they are consumed.
  std::optional<Tensor> get(const Tensor& t) const;
  void insert(const Tensor& t, Tensor grad);
  std::optional<Tensor> remove(const Tensor& t);
  size_t size() const { return grads_.size(); }

 private:
  std::unordered_map<uint64_t, Tensor> grads_;
};

/// While one is alive on this thread, ops record nothing (the switch is per thread: other
/// threads keep recording).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// False inside a NoGradGuard.
bool grad_enabled();

}  // namespace wick
