#pragma once
// The dims of a tensor.

#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

namespace wick {

class Shape {
 public:
  Shape() = default;  // rank 0: a scalar
  Shape(std::initializer_list<size_t> dims) : dims_(dims) {}
  Shape(std::vector<size_t> dims) : dims_(std::move(dims)) {}

  size_t rank() const { return dims_.size(); }
  const std::vector<size_t>& dims() const { return dims_; }
  /// Product of the dims (1 for a scalar).
  size_t elem_count() const;
  size_t operator[](size_t i) const { return dims_[i]; }
  bool operator==(const Shape& other) const = default;

  /// Row-major strides, in elements.
  std::vector<size_t> contiguous_strides() const;
  /// "[2, 3]".
  std::string to_string() const;

 private:
  std::vector<size_t> dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& shape);

}  // namespace wick
