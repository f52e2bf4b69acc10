#pragma once
// Dtype dispatch, written once: dispatch(dtype, [&]<class T>() { ... }).

#include "wick/dtype.h"
#include "wick/error.h"
#include "wick/half.h"

namespace wick {

template <class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::U8:
      return f.template operator()<uint8_t>();
    case DType::U32:
      return f.template operator()<uint32_t>();
    case DType::I64:
      return f.template operator()<int64_t>();
    case DType::BF16:
      return f.template operator()<bf16>();
    case DType::F16:
      return f.template operator()<f16>();
    case DType::F32:
      return f.template operator()<float>();
    case DType::F64:
      return f.template operator()<double>();
  }
  throw Error("dispatch: invalid dtype");
}

/// Like dispatch, but only for float dtypes; integer dtypes throw UnsupportedDType naming `op`.
template <class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::BF16:
      return f.template operator()<bf16>();
    case DType::F16:
      return f.template operator()<f16>();
    case DType::F32:
      return f.template operator()<float>();
    case DType::F64:
      return f.template operator()<double>();
    default:
      throw UnsupportedDType(std::string(op) + ": unsupported dtype " + dtype_name(dtype) +
                             " (float dtypes only)");
  }
}

/// dispatch through a type map: f.template operator()<Map<T>::type>() for the host type T of
/// `dtype`. The CUDA backend's map (kernel_utils.cuh) gives __half and __nv_bfloat16 for f16 and
/// bf16, so both backends share this one switch.
template <template <class> class Map, class F>
decltype(auto) dispatch_as(DType dtype, F&& f) {
  return dispatch(dtype, [&]<class T>() -> decltype(auto) {
    return f.template operator()<typename Map<T>::type>();
  });
}

/// dispatch_float through a type map.
template <template <class> class Map, class F>
decltype(auto) dispatch_float_as(DType dtype, const char* op, F&& f) {
  return dispatch_float(dtype, op, [&]<class T>() -> decltype(auto) {
    return f.template operator()<typename Map<T>::type>();
  });
}

/// The type arithmetic runs in: float for f16/bf16, the type itself otherwise.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<f16> {
  using type = float;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

}  // namespace wick
