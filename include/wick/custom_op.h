#pragma once
// Ops outside the op table: one class per op, with a composed fallback (the op's meaning, built
// from table ops), optional CPU and CUDA kernels and an optional hand-written gradient, run by
// wick::apply. wick's own fused ops (norms, rope, attention, the decoder ops, the KV-cache
// writes) are CustomOps; user code can define its own the same way.

#include <concepts>
#include <memory>
#include <optional>
#include <vector>

#include "wick/tensor.h"

namespace wick {

/// The inputs or outputs of a CustomOp. An empty handle is an absent optional input.
using TensorList = std::vector<Tensor>;

class CustomOp {
 public:
  virtual ~CustomOp() = default;

  /// The op's name, for error messages and traces.
  virtual const char* name() const = 0;

  /// Validates the inputs (shapes, dtypes; throw the wick::Error family naming the op). apply
  /// has already checked that at least one input is defined and that the defined ones share a
  /// device. Default: nothing more.
  virtual void check(const TensorList& inputs) const;

  /// The op composed of Tensor ops: what it means, what runs where no kernel takes the inputs,
  /// and, unless has_backward(), what autograd records when an input is tracked.
  virtual TensorList fallback(const TensorList& inputs) const = 0;

  /// The CPU kernel, or nullopt when it does not take these inputs (the fallback runs). It may
  /// use any Tensor op (wick's own kernels read storages directly, under their storage locks).
  /// Default: no kernel.
  virtual std::optional<TensorList> cpu(const TensorList& inputs) const;

  /// The CUDA kernel, or nullopt (the fallback runs). Default: no kernel. wick's own ops answer
  /// with registered_cuda_kernel(*this, inputs), so that a build without CUDA has no stubs.
  virtual std::optional<TensorList> cuda(const TensorList& inputs) const;

  /// True when backward() is the op's gradient: apply then runs the kernel under autograd too
  /// and records one node per output. False (the default): with a tracked input, apply runs the
  /// fallback, whose ops autograd records.
  virtual bool has_backward() const;

  /// The gradients of the inputs (entry i may stay empty when need[i] is false; absent inputs
  /// are empty). Called once per output that receives a gradient: outputs[j] and grads[j] are
  /// defined for that output only. Runs with recording off. Default: throws (has_backward()
  /// false never calls it).
  virtual TensorList backward(const TensorList& inputs, const TensorList& outputs,
                              const TensorList& grads, const std::vector<bool>& need) const;

  /// Indices of the inputs the kernels write in place (a KV cache): wick's kernels take their
  /// storage locks exclusively. Default: none.
  virtual std::vector<size_t> written_inputs() const;
};

/// The CUDA kernel of op class `Op`: one slot per class, filled by the CUDA backend's list of
/// kernels (src/cuda/custom_kernels.cpp) when its first device is created; null otherwise.
template <class Op>
struct CudaKernel {
  using Fn = std::optional<TensorList> (*)(const Op& op, const TensorList& inputs);
  static inline Fn fn = nullptr;
};

/// For Op::cuda(): the registered kernel's answer, or nullopt when none is registered.
template <class Op>
std::optional<TensorList> registered_cuda_kernel(const Op& op, const TensorList& inputs) {
  typename CudaKernel<Op>::Fn fn = CudaKernel<Op>::fn;
  if (fn == nullptr) return std::nullopt;
  return fn(op, inputs);
}

namespace detail {
using KeepOp = std::shared_ptr<const CustomOp> (*)(const CustomOp& op);
TensorList apply_custom_op(const CustomOp& op, const TensorList& inputs, KeepOp keep);
}  // namespace detail

/// Runs `op` on `inputs`: the checks, then the kernel of the inputs' device (cpu() or cuda()),
/// or the fallback where there is none, and the gradient recording (a copy of `op` is kept by
/// the recorded nodes when has_backward()). Throws what check() throws, DeviceMismatch for
/// inputs on several devices, and wick::Error when no input is defined. Call it qualified,
/// wick::apply: unqualified, a std::vector argument brings std::apply into the lookup.
template <class Op>
requires std::derived_from<Op, CustomOp> && std::copy_constructible<Op> TensorList
apply(const Op& op, const TensorList& inputs) {
  return detail::apply_custom_op(op, inputs, [](const CustomOp& o) {
    return std::shared_ptr<const CustomOp>(std::make_shared<Op>(static_cast<const Op&>(o)));
  });
}

}  // namespace wick
