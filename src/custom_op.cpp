// wick::apply: the one call path of the ops outside the op table (include/wick/custom_op.h).

#include "wick/custom_op.h"

#include <algorithm>

#include "backprop.h"
#include "tensor_internal.h"
#include "wick/autograd.h"

namespace wick {

void CustomOp::check(const TensorList&) const {}

std::optional<TensorList> CustomOp::cpu(const TensorList&) const {
  return std::nullopt;
}

std::optional<TensorList> CustomOp::cuda(const TensorList&) const {
  return std::nullopt;
}

bool CustomOp::has_backward() const {
  return false;
}

TensorList CustomOp::backward(const TensorList&, const TensorList&, const TensorList&,
                              const std::vector<bool>&) const {
  throw Error(str(name(), ": backward called on an op without its own gradient"));
}

std::vector<size_t> CustomOp::written_inputs() const {
  return {};
}

namespace detail {

namespace {

// The kernel of the inputs' device under the inputs' storage locks (shared, or exclusive for the
// inputs the op writes).
std::optional<TensorList> run_kernel(const CustomOp& op, const TensorList& inputs,
                                     const Device& device) {
  std::vector<size_t> written = op.written_inputs();
  std::vector<const Storage*> reads, writes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    const Storage* s = inputs[i].impl()->storage.get();
    bool w = std::find(written.begin(), written.end(), i) != written.end();
    (w ? writes : reads).push_back(s);
  }
  // A storage both read and written is locked once, exclusively.
  std::erase_if(reads, [&](const Storage* s) {
    return std::find(writes.begin(), writes.end(), s) != writes.end();
  });
  StorageLocks locks(reads, writes);
  return device.is_cuda() ? op.cuda(inputs) : op.cpu(inputs);
}

}  // namespace

TensorList apply_custom_op(const CustomOp& op, const TensorList& inputs, KeepOp keep) {
  const Tensor* first = nullptr;
  std::vector<const Tensor*> present;
  present.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (first == nullptr) first = &t;
    if (t.device() != first->device()) {
      throw DeviceMismatch(str(op.name(), ": inputs on ", first->device(), " and ", t.device()));
    }
    present.push_back(&t);
  }
  if (first == nullptr) throw Error(str(op.name(), ": no input given"));
  op.check(inputs);
  const bool record_grad = should_record(Inputs(present.data(), present.size()));
  if (record_grad && !op.has_backward()) return op.fallback(inputs);

  std::optional<TensorList> kernel_out = run_kernel(op, inputs, first->device());
  TensorList outputs;
  if (kernel_out) {
    outputs = std::move(*kernel_out);
  } else if (record_grad) {
    NoGradGuard no_grad;  // the op's own node is recorded below
    outputs = op.fallback(inputs);
  } else {
    outputs = op.fallback(inputs);
  }
  if (!record_grad) return outputs;

  // One node per output, over every input slot: absent inputs are recorded as untracked
  // placeholders (so that indices stay aligned) and handed back to backward() as empty handles.
  std::shared_ptr<const CustomOp> kept = keep(op);
  std::vector<bool> absent(inputs.size());
  std::vector<Tensor> recorded;
  recorded.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    absent[i] = !inputs[i].defined();
    recorded.push_back(absent[i] ? Tensor::zeros(Shape{}, first->dtype(), first->device())
                                 : inputs[i]);
  }
  const size_t n_out = outputs.size();
  for (size_t j = 0; j < n_out; ++j) {
    if (!outputs[j].defined()) continue;
    BackpropOp rec{OpKind::Fused, recorded};
    rec.fused_grad = [kept, absent, j, n_out](const Tensor& out, const std::vector<Tensor>& in,
                                              const Tensor& grad, const std::vector<bool>& need) {
      TensorList args(in.size()), outs(n_out), grads(n_out);
      for (size_t i = 0; i < in.size(); ++i) {
        if (!absent[i]) args[i] = in[i];
      }
      outs[j] = out;
      grads[j] = grad;
      std::vector<bool> needed = need;
      for (size_t i = 0; i < needed.size() && i < absent.size(); ++i)
        needed[i] = need[i] && !absent[i];
      return kept->backward(args, outs, grads, needed);
    };
    outputs[j] = record(std::move(outputs[j]), std::move(rec));
  }
  return outputs;
}

}  // namespace detail

}  // namespace wick
