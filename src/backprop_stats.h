#pragma once
// Internal counters of the autograd machinery, for tests and benchmarks. Only public headers are
// included so that tests/ and bench/ can include this file by relative path.

#include <cstddef>

#include "wick/tensor.h"

namespace wick::detail {

/// What the most recent Tensor::backward() on this thread held while it ran.
struct BackwardStats {
  size_t nodes = 0;            // tensors in the topological order
  size_t peak_live_grads = 0;  // most gradients held at once (pending + the one in process)
  size_t peak_live_bytes = 0;  // their storage bytes at that point (shared storage counted twice)
  size_t accumulations = 0;    // additions of a second contribution into a gradient
  size_t leaf_grads = 0;       // gradients handed back in the GradStore
};

BackwardStats last_backward_stats();

/// What the graph behind `t` keeps alive.
struct GraphStats {
  size_t ops = 0;         // recorded ops reachable from t
  size_t tensors = 0;     // distinct tensors reachable (tracked or saved as op inputs)
  size_t bytes = 0;       // bytes of the distinct storages of those tensors
  size_t grad_bytes = 0;  // what keeping a gradient for every tracked tensor would take
};

GraphStats graph_stats(const Tensor& t);

}  // namespace wick::detail
