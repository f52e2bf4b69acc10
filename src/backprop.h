#pragma once
// The record an op leaves on its output when an input is tracked.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ops.h"
#include "wick/shape.h"
#include "wick/tensor.h"

namespace wick {

enum class OpKind : uint8_t {
  Unary,        // unary
  Binary,       // binary; inputs (lhs, rhs) of equal shape
  Sum,          // dims (keepdim result)
  Max,          // dims = {dim} (keepdim result)
  Min,          // dims = {dim} (keepdim result)
  Softmax,      // over the last dim
  Matmul,       // inputs (lhs, rhs), batch dims equal
  Reshape,      // any view that only changes dims (reshape, squeeze, unsqueeze, flatten)
  Permute,      // dims = the permutation
  Narrow,       // dim, start
  BroadcastAs,  // output shape from the result
  Copy,         // identity (contiguous, copy)
  ToDType,
  ToDevice,
  Cat,          // dim; any number of inputs
  WhereCond,    // inputs (cond, on_true, on_false), all of one shape
  IndexSelect,  // inputs (self, ids), dim
  Gather,       // inputs (self, ids), dim
  IndexAdd,     // inputs (self, ids, src), dim
  ScatterAdd,   // inputs (self, ids, src), dim
  Fused,        // a fused op (norms, rope, attention): fused_grad gives the input gradients
};

/// The gradients of a fused op's inputs from its output `out` and output gradient `grad`;
/// entry i may be left empty when `need[i]` is false. Captures no tensors (the inputs are in
/// BackpropOp::inputs), so releasing a graph stays iterative.
using FusedGrad =
    std::function<std::vector<Tensor>(const Tensor& out, const std::vector<Tensor>& inputs,
                                      const Tensor& grad, const std::vector<bool>& need)>;

struct BackpropOp {
  BackpropOp(OpKind kind, std::vector<Tensor> inputs) : kind(kind), inputs(std::move(inputs)) {}
  BackpropOp(const BackpropOp&) = default;
  BackpropOp(BackpropOp&&) = default;
  BackpropOp& operator=(const BackpropOp&) = default;
  BackpropOp& operator=(BackpropOp&&) = default;
  /// Frees the ops only this one keeps alive with a loop, not recursion, whatever the sharing
  /// (y = y.mul(y) passes y twice): a 1,000,000-op graph is freed on a small stack.
  ~BackpropOp();
  OpKind kind;
  std::vector<Tensor> inputs;
  UnaryOp unary{UnaryKind::Neg};
  BinaryKind binary = BinaryKind::Add;
  std::vector<size_t> dims;
  size_t dim = 0;
  size_t start = 0;
  // Storage versions when recorded (set by record): in-place writes since then make backward
  // throw, since the saved values are gone.
  std::vector<uint64_t> input_versions;
  uint64_t output_version = 0;
  FusedGrad fused_grad;  // OpKind::Fused only
};

/// The op's user-facing name ("mul", "matmul", "narrow"), for messages.
std::string op_name(const BackpropOp& op);

/// Attaches `op` to `out` when recording is on and an input is tracked; returns `out`.
Tensor record(Tensor out, BackpropOp op);

}  // namespace wick
