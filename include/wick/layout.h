#pragma once
// How a tensor's elements sit in its storage: shape, strides (in elements) and start offset.

#include <cstddef>
#include <vector>

#include "wick/shape.h"

namespace wick {

/// Shape, strides and start offset of a view: a value, safe to copy and read from any thread.
class Layout {
 public:
  Layout() = default;
  Layout(Shape shape, std::vector<size_t> strides, size_t start_offset);
  /// Row-major layout of `shape` starting at `start_offset`.
  static Layout contiguous(Shape shape, size_t start_offset = 0);

  const Shape& shape() const { return shape_; }
  const std::vector<size_t>& dims() const { return shape_.dims(); }
  const std::vector<size_t>& strides() const { return strides_; }
  size_t start_offset() const { return start_offset_; }
  size_t rank() const { return shape_.rank(); }
  size_t elem_count() const { return shape_.elem_count(); }

  /// Row-major with no gaps (dims of size 1 may have any stride).
  bool is_contiguous() const;
  /// Column-major with no gaps.
  bool is_fortran_contiguous() const;
  /// One past the largest storage offset the layout touches (start_offset for empty layouts).
  size_t max_offset_exclusive() const;

 private:
  Shape shape_;
  std::vector<size_t> strides_;
  size_t start_offset_ = 0;
};

}  // namespace wick
