#include "storage.h"

#include <algorithm>

#include "util.h"
#include "wick/error.h"

namespace wick {

StoragePtr Storage::matmul(const Storage& rhs, MatmulDims dims, const Layout& lhs_layout,
                           const Layout& rhs_layout) const {
  if (device() != rhs.device()) {
    throw DeviceMismatch(str("matmul: device mismatch, lhs ", device(), " rhs ", rhs.device()));
  }
  if (dtype() != rhs.dtype()) {
    throw DTypeMismatch(str("matmul: dtype mismatch, lhs ", dtype(), " rhs ", rhs.dtype()));
  }
  return backend_->matmul(rhs.backend(), dims, lhs_layout, rhs_layout);
}

ReadLocks::ReadLocks(std::vector<const Storage*> storages) : locked_(std::move(storages)) {
  // A fixed order (by address) also keeps two threads from deadlocking against a writer.
  std::sort(locked_.begin(), locked_.end());
  locked_.erase(std::unique(locked_.begin(), locked_.end()), locked_.end());
  for (const Storage* s : locked_) s->mutex().lock_shared();
}

ReadLocks::~ReadLocks() {
  for (auto it = locked_.rbegin(); it != locked_.rend(); ++it) (*it)->mutex().unlock_shared();
}

}  // namespace wick
