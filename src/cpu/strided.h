#pragma once
// Walking a strided layout in row-major order on the CPU.

#include <cstddef>
#include <vector>

#include "cpu/isa_ns.h"
#include "wick/layout.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

/// Yields the storage offsets of a layout's elements in row-major order. Contiguous layouts
/// should take a fast path instead; this is the general one.
class StridedIndex {
 public:
  explicit StridedIndex(const Layout& layout, size_t first_element = 0)
      : dims_(layout.dims()),
        strides_(layout.strides()),
        index_(dims_.size(), 0),
        offset_(layout.start_offset()) {
    // Start at element `first_element` (for splitting work between threads).
    size_t rem = first_element;
    for (size_t i = dims_.size(); i-- > 0;) {
      if (dims_[i] == 0) continue;
      index_[i] = rem % dims_[i];
      rem /= dims_[i];
      offset_ += index_[i] * strides_[i];
    }
  }
  size_t offset() const { return offset_; }
  void next() {
    for (size_t i = dims_.size(); i-- > 0;) {
      if (++index_[i] < dims_[i]) {
        offset_ += strides_[i];
        return;
      }
      offset_ -= (dims_[i] - 1) * strides_[i];
      index_[i] = 0;
    }
  }

 private:
  std::vector<size_t> dims_;
  std::vector<size_t> strides_;
  std::vector<size_t> index_;
  size_t offset_;
};

/// Calls fn(i, offset) for the elements [begin, end) of `layout` in row-major order.
template <class F>
void for_each_offset(const Layout& layout, size_t begin, size_t end, F&& fn) {
  if (begin >= end) return;
  if (layout.is_contiguous()) {
    size_t base = layout.start_offset();
    for (size_t i = begin; i < end; ++i) fn(i, base + i);
    return;
  }
  StridedIndex it(layout, begin);
  for (size_t i = begin; i < end; ++i, it.next()) fn(i, it.offset());
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
