#include "ops.h"

namespace wick {

const char* unary_name(UnaryKind kind) {
  switch (kind) {
#define WICK_UNARY_NAME(K, name, dtypes) \
  case UnaryKind::K:                     \
    return name;
    WICK_UNARY_OPS(WICK_UNARY_NAME)
#undef WICK_UNARY_NAME
  }
  return "?";
}

const char* binary_name(BinaryKind kind) {
  switch (kind) {
    case BinaryKind::Add:
      return "add";
    case BinaryKind::Sub:
      return "sub";
    case BinaryKind::Mul:
      return "mul";
    case BinaryKind::Div:
      return "div";
    case BinaryKind::Maximum:
      return "maximum";
    case BinaryKind::Minimum:
      return "minimum";
  }
  return "?";
}

const char* cmp_name(CmpKind kind) {
  switch (kind) {
    case CmpKind::Eq:
      return "eq";
    case CmpKind::Ne:
      return "ne";
    case CmpKind::Lt:
      return "lt";
    case CmpKind::Le:
      return "le";
    case CmpKind::Gt:
      return "gt";
    case CmpKind::Ge:
      return "ge";
  }
  return "?";
}

const char* reduce_name(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Sum:
      return "sum";
    case ReduceKind::Max:
      return "max";
    case ReduceKind::Min:
      return "min";
    case ReduceKind::ArgMax:
      return "argmax";
    case ReduceKind::ArgMin:
      return "argmin";
  }
  return "?";
}

}  // namespace wick
