#include "wick/dtype.h"

namespace wick {

size_t size_in_bytes(DType dtype) {
  switch (dtype) {
    case DType::U8:
      return 1;
    case DType::U32:
      return 4;
    case DType::I64:
      return 8;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::F32:
      return 4;
    case DType::F64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::U8:
      return "u8";
    case DType::U32:
      return "u32";
    case DType::I64:
      return "i64";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "f16";
    case DType::F32:
      return "f32";
    case DType::F64:
      return "f64";
  }
  return "?";
}

bool is_float(DType dtype) {
  return dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32 || dtype == DType::F64;
}

std::ostream& operator<<(std::ostream& os, DType dtype) {
  return os << dtype_name(dtype);
}

}  // namespace wick
