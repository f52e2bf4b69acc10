#include "wick/shape.h"

#include <sstream>

namespace wick {

size_t Shape::elem_count() const {
  size_t n = 1;
  for (size_t d : dims_) n *= d;
  return n;
}

std::vector<size_t> Shape::contiguous_strides() const {
  std::vector<size_t> strides(dims_.size());
  size_t s = 1;
  for (size_t i = dims_.size(); i-- > 0;) {
    strides[i] = s;
    s *= dims_[i];
  }
  return strides;
}

std::string Shape::to_string() const {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
  os << ']';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) {
  return os << shape.to_string();
}

}  // namespace wick
