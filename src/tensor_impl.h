#pragma once
// What a Tensor handle points to.

#include <atomic>
#include <memory>

#include "backprop.h"
#include "storage.h"
#include "wick/tensor.h"

namespace wick {

struct TensorImpl {
  uint64_t id;
  std::shared_ptr<Storage> storage;
  Layout layout;
  DType dtype;
  Device device;
  std::shared_ptr<BackpropOp> op;  // how this tensor was computed from tracked inputs
  bool is_variable = false;        // a tracked leaf

  static uint64_t next_id() {
    static std::atomic<uint64_t> counter{1};
    return counter.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace wick
