#include "wick/shape.h"

#include <sstream>

#include "wick/error.h"

namespace wick {

void Shape::check() {
  size_t count = 1, span = 1;  // span: the product with 0 dims counted as 1 (the largest stride)
  for (size_t d : dims_) {
    if (__builtin_mul_overflow(span, d == 0 ? 1 : d, &span)) {
      throw ShapeMismatch("shape: the element count of " + to_string() +
                          " overflows 64 bits (dims too large)");
    }
    count *= d;  // <= span, so cannot wrap
  }
  elem_count_ = count;
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
