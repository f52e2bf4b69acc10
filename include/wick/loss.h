#pragma once
// Loss functions for training. Each is composed of Tensor ops, so autograd records it: backward()
// of the loss gives the gradients of the tracked tensors it was computed from. Tensor's
// log_softmax(dim) (wick/tensor.h) is the numerically stable log of softmax they build on.

#include "wick/tensor.h"

namespace wick::loss {

/// Cross-entropy of the class scores `logits` (..., c), a float dtype with the classes on the
/// last dim, against class ids `targets` (U32 or I64) of logits' shape without its last dim:
/// the mean over the rows of -log_softmax(logits)[row, target[row]] (PyTorch's cross_entropy
/// with reduction "mean", for classes on the last dim). A rank-0 tensor of logits' dtype; NaN
/// for no rows. Throws ShapeMismatch when the shapes do not fit, UnsupportedDType for integer
/// logits or targets of another dtype, IndexOutOfRange for a target >= c.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);

/// Negative log-likelihood of log-probabilities `log_probs` (..., c) (as log_softmax gives them):
/// the mean over the rows of -log_probs[row, target[row]]; shapes, dtypes and errors as for
/// cross_entropy.
Tensor nll(const Tensor& log_probs, const Tensor& targets);

/// Mean squared error: the mean of (a - b)^2 over all elements, a rank-0 tensor (NaN for no
/// elements). a and b: the same shape (ShapeMismatch), float dtype (UnsupportedDType), device.
Tensor mse(const Tensor& a, const Tensor& b);

}  // namespace wick::loss
