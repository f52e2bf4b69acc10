#pragma once
// Dtype dispatch, written once for both backends: dispatch(dtype, [&]<class T>() { ... }) calls
// the lambda with the element type of `dtype`. The element types come from a type map: HostTypes
// here (wick::f16, wick::bf16), DeviceTypes in cuda/kernel_utils.cuh (__half, __nv_bfloat16) for
// the kernels: dispatch<DeviceTypes>(dtype, f).

#include <cstdint>
#include <string>
#include <type_traits>

#include "wick/dtype.h"
#include "wick/error.h"
#include "wick/half.h"

namespace wick {

/// The element type of each dtype on the host.
struct HostTypes {
  using u8 = uint8_t;
  using u32 = uint32_t;
  using i64 = int64_t;
  using bf16 = wick::bf16;
  using f16 = wick::f16;
  using f32 = float;
  using f64 = double;
};

/// f.template operator()<T>() with T the element type of `dtype` in the type map `Types`. With
/// kFloatsOnly, integer dtypes throw UnsupportedDType naming `op` (and are never instantiated).
template <class Types, bool kFloatsOnly, class F>
decltype(auto) dispatch_in(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::BF16:
      return f.template operator()<typename Types::bf16>();
    case DType::F16:
      return f.template operator()<typename Types::f16>();
    case DType::F32:
      return f.template operator()<typename Types::f32>();
    case DType::F64:
      return f.template operator()<typename Types::f64>();
    case DType::U8:
      if constexpr (kFloatsOnly)
        break;
      else
        return f.template operator()<typename Types::u8>();
    case DType::U32:
      if constexpr (kFloatsOnly)
        break;
      else
        return f.template operator()<typename Types::u32>();
    case DType::I64:
      if constexpr (kFloatsOnly)
        break;
      else
        return f.template operator()<typename Types::i64>();
  }
  if (kFloatsOnly && (dtype == DType::U8 || dtype == DType::U32 || dtype == DType::I64)) {
    throw UnsupportedDType(std::string(op) + ": unsupported dtype " + dtype_name(dtype) +
                           " (float dtypes only)");
  }
  throw Error(std::string(op) + ": invalid dtype");
}

/// Every dtype; the element types of `Types` (the host's unless named).
template <class Types = HostTypes, class F>
decltype(auto) dispatch(DType dtype, F&& f) {
  return dispatch_in<Types, false>(dtype, "dispatch", f);
}

/// Float dtypes only; integer dtypes throw UnsupportedDType naming `op`.
template <class Types = HostTypes, class F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  return dispatch_in<Types, true>(dtype, op, f);
}

/// The type arithmetic runs in: the type itself for C++'s arithmetic types, float for the half
/// types of either backend (wick::f16 and wick::bf16, CUDA's __half and __nv_bfloat16).
template <class T>
using compute_t = std::conditional_t<std::is_arithmetic_v<T>, T, float>;

}  // namespace wick
