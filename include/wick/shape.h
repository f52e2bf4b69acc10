#pragma once
// The dims of a tensor.

#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace wick {

/// Dims are checked on construction: the product of the dims (counting a 0 dim as 1, so that
/// strides fit too) must fit in size_t, otherwise ShapeMismatch naming the dims is thrown. A value,
/// safe to copy and read from any thread.
class Shape {
 public:
  Shape() = default;  // rank 0: a scalar
  Shape(std::initializer_list<size_t> dims) : dims_(dims) { check(); }
  Shape(std::vector<size_t> dims) : dims_(std::move(dims)) { check(); }

  size_t rank() const { return dims_.size(); }
  const std::vector<size_t>& dims() const { return dims_; }
  /// Product of the dims (1 for a scalar); never wraps (checked on construction).
  size_t elem_count() const { return elem_count_; }
  size_t operator[](size_t i) const { return dims_[i]; }
  bool operator==(const Shape& other) const { return dims_ == other.dims_; }

  /// Row-major strides, in elements.
  std::vector<size_t> contiguous_strides() const;
  /// "[2, 3]".
  std::string to_string() const;

 private:
  void check();

  std::vector<size_t> dims_;
  size_t elem_count_ = 1;
};

std::ostream& operator<<(std::ostream& os, const Shape& shape);

}  // namespace wick
