#pragma once
// Small private helpers for building error messages.

#include <sstream>
#include <string>
#include <vector>

#include "wick/shape.h"

namespace wick {

/// Concatenates anything printable: str("add: lhs ", shape, " rhs ", other).
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

inline std::string vec_str(const std::vector<size_t>& v) {
  return Shape(v).to_string();
}

}  // namespace wick
