#include "wick/layout.h"

#include "checked.h"
#include "wick/error.h"

namespace wick {

Layout::Layout(Shape shape, std::vector<size_t> strides, size_t start_offset)
    : shape_(std::move(shape)), strides_(std::move(strides)), start_offset_(start_offset) {
  if (strides_.size() != shape_.rank()) throw Error("Layout: strides and shape differ in rank");
  // The largest offset must be computable: kernels index with it.
  if (shape_.elem_count() > 0) {
    size_t last = start_offset_;
    for (size_t i = 0; i < rank(); ++i) {
      last = checked_add(last, checked_mul(dims()[i] - 1, strides_[i], "layout"), "layout");
    }
    checked_add(last, 1, "layout");
  }
}

Layout Layout::contiguous(Shape shape, size_t start_offset) {
  auto strides = shape.contiguous_strides();
  return Layout(std::move(shape), std::move(strides), start_offset);
}

bool Layout::is_contiguous() const {
  size_t expected = 1;
  for (size_t i = rank(); i-- > 0;) {
    if (dims()[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= dims()[i];
  }
  return true;
}

bool Layout::is_fortran_contiguous() const {
  size_t expected = 1;
  for (size_t i = 0; i < rank(); ++i) {
    if (dims()[i] == 1) continue;
    if (strides_[i] != expected) return false;
    expected *= dims()[i];
  }
  return true;
}

size_t Layout::max_offset_exclusive() const {
  if (elem_count() == 0) return start_offset_;
  size_t last = start_offset_;
  for (size_t i = 0; i < rank(); ++i) last += (dims()[i] - 1) * strides_[i];
  return last + 1;
}

}  // namespace wick
