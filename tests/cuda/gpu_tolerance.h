#pragma once
// The GPU tests' relative tolerance per dtype for composite results (decoder layers, fused kernels
// against compositions of other kernels). The CPU tests hold every result to the bounds of
// wick/numerics.h instead.

#include "wick/dtype.h"

namespace wick::testing {

inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 2e-2;
    case DType::F16:
      return 4e-3;
    case DType::F32:
      return 1e-5;
    case DType::F64:
      return 1e-12;
    default:
      return 0;
  }
}

}  // namespace wick::testing
