// Op recording and reverse-mode differentiation. Gradients are written with the public Tensor ops,
// so every backend gets them for free; backward runs with recording off.

#include "backprop.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "backprop_stats.h"
#include "tensor_impl.h"
#include "util.h"
#include "wick/autograd.h"

namespace wick {

namespace {

bool tracked(const Tensor& t) {
  const auto& impl = t.impl();
  return impl && (impl->op || impl->is_variable);
}

size_t storage_bytes(const Tensor& t) {
  const auto& storage = t.impl()->storage;
  return storage ? storage->backend().elem_count() * size_in_bytes(t.dtype()) : 0;
}

thread_local detail::BackwardStats t_last_stats;

// Gradients waiting for their tensor's turn in the reverse topological order.
class Pending {
 public:
  void add(const Tensor& input, Tensor grad) {
    if (grad.shape() != input.shape() || grad.dtype() != input.dtype() ||
        grad.device() != input.device()) {
      throw Error(str("backward: internal error, gradient ", grad.shape(), " ", grad.dtype(), " ",
                      grad.device(), " for a tensor ", input.shape(), " ", input.dtype(), " ",
                      input.device()));
    }
    auto [it, inserted] = grads_.try_emplace(input.id());
    if (inserted) {
      // The first contribution is kept as it is, not added to zeros.
      live_bytes_ += storage_bytes(grad);
      it->second = std::move(grad);
    } else {
      live_bytes_ -= storage_bytes(it->second);
      it->second = it->second.add(grad);
      live_bytes_ += storage_bytes(it->second);
      ++stats_.accumulations;
    }
    note_peak();
  }

  // Takes the finished gradient of `t` out; the caller releases it when done with it.
  std::optional<Tensor> take(const Tensor& t) {
    auto it = grads_.find(t.id());
    if (it == grads_.end()) return std::nullopt;
    Tensor grad = std::move(it->second);
    grads_.erase(it);
    in_process_ = 1;
    return grad;
  }

  void release(const Tensor& grad) {
    live_bytes_ -= storage_bytes(grad);
    in_process_ = 0;
  }

  detail::BackwardStats& stats() { return stats_; }

 private:
  void note_peak() {
    stats_.peak_live_grads = std::max(stats_.peak_live_grads, grads_.size() + in_process_);
    stats_.peak_live_bytes = std::max(stats_.peak_live_bytes, live_bytes_);
  }

  std::unordered_map<uint64_t, Tensor> grads_;
  size_t live_bytes_ = 0;
  size_t in_process_ = 0;
  detail::BackwardStats stats_;
};

Tensor scalar_zero(const Tensor& like) {
  return Tensor::zeros(Shape{}, like.dtype(), like.device());
}

// 1 where `mask` (u8) is set, 0 elsewhere, in `like`'s dtype.
Tensor as_float(const Tensor& mask, const Tensor& like) {
  return mask.to_dtype(like.dtype());
}

// Sums `grad` over the dims that broadcasting added or stretched, giving `target`'s shape.
Tensor sum_to_shape(const Tensor& grad, const Shape& target) {
  size_t lead = grad.rank() - target.rank();
  std::vector<size_t> dims;
  for (size_t i = 0; i < grad.rank(); ++i) {
    if (i < lead || (target[i - lead] == 1 && grad.dim(i) != 1)) dims.push_back(i);
  }
  Tensor out = dims.empty() ? grad : grad.sum_keepdim(dims);
  return out.shape() == target ? out : out.reshape(target);
}

// dL/dx of every entry of wick/unary_ops.def: its gradient body on x, out, g and p (p0, p1).
Tensor unary_grad(const UnaryOp& p, const Tensor& x, const Tensor& out, const Tensor& g) {
  switch (p.kind) {
#define WICK_UNARY_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, lo, hi, math, grad) \
  case UnaryKind::K: {                                                                       \
    WICK_UNPAREN grad                                                                        \
  }
#include "wick/unary_ops.def"
  }
  throw Error("backward: unknown unary op");
}

// Calls emit(i, grad) for each tracked input i of `node`'s op.
template <class Emit>
void propagate(const Tensor& node, const BackpropOp& op, const Tensor& g, Emit&& emit) {
  const auto& in = op.inputs;
  auto need = [&](size_t i) { return i < in.size() && tracked(in[i]); };
  switch (op.kind) {
    case OpKind::Unary:
      if (need(0)) emit(0, unary_grad(op.unary, in[0], node, g));
      return;
    case OpKind::Binary: {
      const Tensor& l = in[0];
      const Tensor& r = in[1];
      switch (op.binary) {
        case BinaryKind::Add:
          if (need(0)) emit(0, g);
          if (need(1)) emit(1, g);
          return;
        case BinaryKind::Sub:
          if (need(0)) emit(0, g);
          if (need(1)) emit(1, g.neg());
          return;
        case BinaryKind::Mul:
          if (need(0)) emit(0, g.mul(r));
          if (need(1)) emit(1, g.mul(l));
          return;
        case BinaryKind::Div: {
          // d/dr (l / r) = -(l / r) / r = -out / r
          Tensor gl = g.div(r);
          if (need(1)) emit(1, gl.mul(node).neg());
          if (need(0)) emit(0, std::move(gl));
          return;
        }
        case BinaryKind::Maximum:
        case BinaryKind::Minimum: {
          // Where both sides tie, each gets half.
          Tensor ml = as_float(node.eq(l), g);
          Tensor mr = as_float(node.eq(r), g);
          if (need(0)) emit(0, g.mul(ml).div(mr.affine(1, 1)));
          if (need(1)) emit(1, g.mul(mr).div(ml.affine(1, 1)));
          return;
        }
      }
      throw Error("backward: unknown binary op");
    }
    case OpKind::Sum:
      if (need(0)) emit(0, g.broadcast_as(in[0].shape()));
      return;
    case OpKind::Max:
    case OpKind::Min: {
      if (!need(0)) return;
      // The extremes share the gradient equally when several elements tie.
      Tensor mask = as_float(in[0].eq(node), g);
      Tensor share = mask.broadcast_div(mask.sum_keepdim(op.dims));
      emit(0, share.broadcast_mul(g));
      return;
    }
    case OpKind::Softmax: {
      if (!need(0)) return;
      // dx = y * (g - sum(g * y)) over the last dim
      Tensor gy = g.mul(node);
      emit(0, gy.sub(node.broadcast_mul(gy.sum_keepdim({node.rank() - 1}))));
      return;
    }
    case OpKind::Matmul:
      if (need(0)) emit(0, g.matmul(in[1].t()));
      if (need(1)) emit(1, in[0].t().matmul(g));
      return;
    case OpKind::Reshape:
      if (need(0)) emit(0, g.reshape(in[0].shape()));
      return;
    case OpKind::Permute: {
      if (!need(0)) return;
      std::vector<size_t> inverse(op.dims.size());
      for (size_t i = 0; i < op.dims.size(); ++i) inverse[op.dims[i]] = i;
      emit(0, g.permute(inverse));
      return;
    }
    case OpKind::Narrow: {
      if (!need(0)) return;
      const Shape& full = in[0].shape();
      size_t len = node.dim(op.dim);
      size_t after = full[op.dim] - op.start - len;
      if (op.start == 0 && after == 0) {
        emit(0, g);
        return;
      }
      auto zeros = [&](size_t n) {
        std::vector<size_t> dims = full.dims();
        dims[op.dim] = n;
        return Tensor::zeros(Shape(dims), g.dtype(), g.device());
      };
      std::vector<Tensor> parts;
      if (op.start > 0) parts.push_back(zeros(op.start));
      parts.push_back(g);
      if (after > 0) parts.push_back(zeros(after));
      emit(0, Tensor::cat(parts, op.dim));
      return;
    }
    case OpKind::BroadcastAs:
      if (need(0)) emit(0, sum_to_shape(g, in[0].shape()));
      return;
    case OpKind::Copy:
      if (need(0)) emit(0, g);
      return;
    case OpKind::ToDType:
      if (need(0)) emit(0, g.to_dtype(in[0].dtype()));
      return;
    case OpKind::ToDevice:
      if (need(0)) emit(0, g.to_device(in[0].device()));
      return;
    case OpKind::Cat: {
      size_t offset = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        size_t len = in[i].dim(op.dim);
        if (need(i)) emit(i, g.narrow(op.dim, offset, len));
        offset += len;
      }
      return;
    }
    case OpKind::WhereCond: {
      Tensor zero = scalar_zero(g);
      if (need(1)) emit(1, in[0].where_cond(g, zero));
      if (need(2)) emit(2, in[0].where_cond(zero, g));
      return;
    }
    case OpKind::IndexSelect:
      if (need(0)) {
        Tensor zeros = Tensor::zeros(in[0].shape(), g.dtype(), g.device());
        emit(0, zeros.index_add(in[1], g, op.dim));
      }
      return;
    case OpKind::Gather:
      if (need(0)) {
        Tensor zeros = Tensor::zeros(in[0].shape(), g.dtype(), g.device());
        emit(0, zeros.scatter_add(in[1], g, op.dim));
      }
      return;
    case OpKind::IndexAdd:
      if (need(0)) emit(0, g);
      if (need(2)) emit(2, g.index_select(in[1], op.dim));
      return;
    case OpKind::ScatterAdd:
      if (need(0)) emit(0, g);
      if (need(2)) emit(2, g.gather(in[1], op.dim));
      return;
    case OpKind::Fused: {
      std::vector<bool> needs(in.size());
      for (size_t i = 0; i < in.size(); ++i) needs[i] = need(i);
      std::vector<Tensor> grads = op.fused_grad(node, in, g, needs);
      for (size_t i = 0; i < grads.size() && i < in.size(); ++i) {
        if (needs[i] && grads[i].defined()) emit(i, std::move(grads[i]));
      }
      return;
    }
  }
  throw Error("backward: unknown op kind");
}

// Throws when a tensor `op` saved was written in place since it was recorded (as PyTorch does):
// the gradient would be computed from the new values.
void check_versions(const Tensor& node, const BackpropOp& op) {
  auto check = [&](const Tensor& t, uint64_t recorded, const std::string& which) {
    uint64_t now = t.impl()->storage->version();
    if (now == recorded) return;
    throw Error(str("backward: ", which, " of ", op_name(op), " (", t.shape(), " ", t.dtype(),
                    ") was modified in place after ", op_name(op),
                    " was recorded (storage version ", now, ", recorded ", recorded,
                    "); recompute the graph after in-place writes such as assign or an "
                    "optimizer step"));
  };
  for (size_t i = 0; i < op.inputs.size() && i < op.input_versions.size(); ++i) {
    check(op.inputs[i], op.input_versions[i], str("input ", i));
  }
  check(node, op.output_version, "the output");
}

// Tracked tensors reachable from `root`, every tensor after all of its inputs. Iterative, so
// that deep graphs cannot overflow the stack.
std::vector<Tensor> topological_order(const Tensor& root) {
  struct Frame {
    Tensor t;
    size_t next_input;
  };
  std::vector<Tensor> order;
  std::unordered_set<uint64_t> seen{root.id()};
  std::vector<Frame> stack{{root, 0}};
  while (!stack.empty()) {
    Frame& top = stack.back();
    const auto& op = top.t.impl()->op;
    if (op && top.next_input < op->inputs.size()) {
      const Tensor& input = op->inputs[top.next_input++];
      if (tracked(input) && seen.insert(input.id()).second) stack.push_back({input, 0});
      continue;
    }
    order.push_back(std::move(top.t));
    stack.pop_back();
  }
  return order;
}

}  // namespace

BackpropOp::~BackpropOp() {
  // Input handles are dropped one at a time from a work list. Before the last handle of a tensor
  // goes, its op is moved out and the op's inputs join the list, so freeing that tensor and op
  // recurses one level only. A handle that is not the last (y.mul(y) holds y twice) is dropped
  // without freeing anything.
  std::vector<Tensor> work = std::move(inputs);
  while (!work.empty()) {
    Tensor t = std::move(work.back());
    work.pop_back();
    const auto& impl = t.impl();
    if (!impl || impl.use_count() != 1 || !impl->op) continue;
    std::shared_ptr<BackpropOp> op = std::move(impl->op);
    if (op.use_count() == 1) {
      for (Tensor& input : op->inputs) work.push_back(std::move(input));
      op->inputs.clear();
    }
  }
}

std::string op_name(const BackpropOp& op) {
  switch (op.kind) {
    case OpKind::Unary:
      return unary_name(op.unary.kind);
    case OpKind::Binary:
      return binary_name(op.binary);
    case OpKind::Sum:
      return "sum";
    case OpKind::Max:
      return "max";
    case OpKind::Min:
      return "min";
    case OpKind::Softmax:
      return "softmax";
    case OpKind::Fused:
      return "fused op";
    case OpKind::Matmul:
      return "matmul";
    case OpKind::Reshape:
      return "reshape";
    case OpKind::Permute:
      return "permute";
    case OpKind::Narrow:
      return "narrow";
    case OpKind::BroadcastAs:
      return "broadcast_as";
    case OpKind::Copy:
      return "copy";
    case OpKind::ToDType:
      return "to_dtype";
    case OpKind::ToDevice:
      return "to_device";
    case OpKind::Cat:
      return "cat";
    case OpKind::WhereCond:
      return "where_cond";
    case OpKind::IndexSelect:
      return "index_select";
    case OpKind::Gather:
      return "gather";
    case OpKind::IndexAdd:
      return "index_add";
    case OpKind::ScatterAdd:
      return "scatter_add";
  }
  return "unknown op";
}

Tensor record(Tensor out, BackpropOp op) {
  if (!grad_enabled()) return out;
  if (std::none_of(op.inputs.begin(), op.inputs.end(), tracked)) return out;
  const auto& impl = out.impl();
  // An op that hands back one of its inputs (contiguous() of a row-major tensor) adds nothing.
  for (const Tensor& input : op.inputs) {
    if (input.impl() == impl) return out;
  }
  if (impl->op || impl->is_variable) {
    throw Error(str("record: internal error, the result of a ", static_cast<int>(op.kind),
                    " op is already tracked"));
  }
  op.input_versions.reserve(op.inputs.size());
  for (const Tensor& input : op.inputs)
    op.input_versions.push_back(input.impl()->storage->version());
  op.output_version = impl->storage->version();
  impl->op = std::make_shared<BackpropOp>(std::move(op));
  return out;
}

GradStore Tensor::backward() const {
  if (!impl_) throw Error("backward: empty tensor");
  if (elem_count() != 1) {
    throw ShapeMismatch(str("backward: the loss must have one element, got shape ", shape(),
                            " (reduce it first, e.g. with sum_all() or mean_all())"));
  }
  if (!tracked(*this)) {
    throw Error(str("backward: the loss ", shape(), " ", dtype(),
                    " is not tracked (no input called requires_grad(), or it was computed under "
                    "a NoGradGuard or from detach())"));
  }
  NoGradGuard no_grad;
  std::vector<Tensor> order = topological_order(*this);
  Pending pending;
  pending.stats().nodes = order.size();
  pending.add(*this, Tensor::ones(shape(), dtype(), device()));

  // Handles the graph itself holds on each tensor: its entry in `order` and one per use as an op
  // input. A tensor with more handles is held by the caller, who may ask for its gradient; the
  // gradients of all other intermediates are released as soon as they are consumed.
  std::unordered_map<const TensorImpl*, long> graph_handles;
  graph_handles.reserve(order.size() * 2);  // no rehash of a million-entry table mid-way
  for (const Tensor& t : order) {
    ++graph_handles[t.impl().get()];
    if (const auto& op = t.impl()->op) {
      for (const Tensor& input : op->inputs) ++graph_handles[input.impl().get()];
    }
  }

  GradStore grads;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Tensor& node = *it;
    std::optional<Tensor> grad = pending.take(node);
    if (!grad) continue;  // no path from the loss carries a gradient here
    const TensorImpl& impl = *node.impl();
    if (impl.op) {
      check_versions(node, *impl.op);
      propagate(node, *impl.op, *grad,
                [&](size_t i, Tensor g) { pending.add(impl.op->inputs[i], std::move(g)); });
    }
    pending.release(*grad);
    if (impl.is_variable) {
      grads.insert(node, std::move(*grad));
      ++pending.stats().leaf_grads;
    } else if (node.impl().use_count() > graph_handles[node.impl().get()]) {
      grads.insert(node, std::move(*grad));
    }
  }
  t_last_stats = pending.stats();
  return grads;
}

namespace detail {

BackwardStats last_backward_stats() {
  return t_last_stats;
}

GraphStats graph_stats(const Tensor& t) {
  GraphStats stats;
  if (!t.defined()) return stats;
  std::unordered_set<const TensorImpl*> seen{t.impl().get()};
  std::unordered_set<const Storage*> storages;
  std::vector<const TensorImpl*> stack{t.impl().get()};
  while (!stack.empty()) {
    const TensorImpl* impl = stack.back();
    stack.pop_back();
    ++stats.tensors;
    if (impl->op || impl->is_variable) {
      stats.grad_bytes += impl->layout.shape().elem_count() * size_in_bytes(impl->dtype);
    }
    if (impl->storage && storages.insert(impl->storage.get()).second) {
      stats.bytes += impl->storage->backend().elem_count() * size_in_bytes(impl->dtype);
    }
    if (!impl->op) continue;
    ++stats.ops;
    for (const Tensor& input : impl->op->inputs) {
      if (seen.insert(input.impl().get()).second) stack.push_back(input.impl().get());
    }
  }
  return stats;
}

}  // namespace detail
}  // namespace wick
