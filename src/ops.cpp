#include "ops.h"

namespace wick {

const char* unary_name(UnaryKind kind) {
  switch (kind) {
#define WICK_UNARY_OP(K, name, ...) \
  case UnaryKind::K:                \
    return #name;
#include "wick/unary_ops.def"
  }
  return "?";
}

const char* binary_name(BinaryKind kind) {
  switch (kind) {
#define WICK_BINARY_NAME(K, name) \
  case BinaryKind::K:             \
    return name;
    WICK_BINARY_OPS(WICK_BINARY_NAME)
#undef WICK_BINARY_NAME
  }
  return "?";
}

const char* broadcast_binary_name(BinaryKind kind) {
  switch (kind) {
#define WICK_BROADCAST_BINARY_NAME(K, name) \
  case BinaryKind::K:                       \
    return "broadcast_" name;
    WICK_BINARY_OPS(WICK_BROADCAST_BINARY_NAME)
#undef WICK_BROADCAST_BINARY_NAME
  }
  return "?";
}

const char* cmp_name(CmpKind kind) {
  switch (kind) {
#define WICK_CMP_NAME(K, name) \
  case CmpKind::K:             \
    return name;
    WICK_CMP_OPS(WICK_CMP_NAME)
#undef WICK_CMP_NAME
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
