// wick::apply: the one call path of the ops outside the op table (include/wick/custom_op.h).

#include "wick/custom_op.h"

#include <algorithm>
#include <array>
#include <span>

#include "backprop.h"
#include "fused_op.h"
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

// Operand lists of the usual op sizes without a heap allocation.
template <class T>
class SmallList {
 public:
  explicit SmallList(size_t capacity) {
    if (capacity > kInline) heap_.reserve(capacity);
  }
  void push_back(T v) {
    if (heap_.capacity() > 0) {
      heap_.push_back(v);
    } else {
      inline_[size_++] = v;
    }
  }
  const T* data() const { return heap_.capacity() > 0 ? heap_.data() : inline_.data(); }
  size_t size() const { return heap_.capacity() > 0 ? heap_.size() : size_; }
  bool contains(T v) const { return std::find(data(), data() + size(), v) != data() + size(); }

 private:
  static constexpr size_t kInline = 8;
  std::array<T, kInline> inline_{};
  size_t size_ = 0;
  std::vector<T> heap_;
};

}  // namespace

StorageLocks lock_inputs(const CustomOp& op, const TensorList& inputs) {
  const std::vector<size_t> written = op.written_inputs();
  SmallList<const Storage*> reads(inputs.size()), writes(inputs.size());
  for (size_t i : written) {
    if (i < inputs.size() && inputs[i].defined()) writes.push_back(inputs[i].impl()->storage.get());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    const Storage* s = inputs[i].impl()->storage.get();
    // A storage both read and written is locked once, exclusively.
    if (!writes.contains(s)) reads.push_back(s);
  }
  return StorageLocks(std::span<const Storage* const>(reads.data(), reads.size()),
                      std::span<const Storage* const>(writes.data(), writes.size()));
}

TensorList apply_custom_op(const CustomOp& op, const TensorList& inputs, KeepOp keep) {
  const Tensor* first = nullptr;
  SmallList<const Tensor*> present(inputs.size());
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

  std::optional<TensorList> kernel_out =
      first->device().is_cuda() ? op.cuda(inputs) : op.cpu(inputs);
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
