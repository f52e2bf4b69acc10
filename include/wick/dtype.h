#pragma once
// Element types.

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <type_traits>

#include "wick/half.h"

namespace wick {

enum class DType : uint8_t { U8, U32, I64, BF16, F16, F32, F64 };

/// Bytes of one element.
size_t size_in_bytes(DType dtype);
/// "u8", "u32", "i64", "bf16", "f16", "f32", "f64".
const char* dtype_name(DType dtype);
/// True for bf16, f16, f32, f64.
bool is_float(DType dtype);

std::ostream& operator<<(std::ostream& os, DType dtype);

/// The DType of a C++ element type; only the seven element types compile.
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, uint8_t>)
    return DType::U8;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return DType::U32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::I64;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::BF16;
  else if constexpr (std::is_same_v<T, f16>)
    return DType::F16;
  else if constexpr (std::is_same_v<T, float>)
    return DType::F32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::F64;
  else
    static_assert(sizeof(T) == 0, "wick: not an element type");
}

}  // namespace wick
