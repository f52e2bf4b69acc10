#pragma once
// The op families a backend implements. Front-end validation uses the *_supports helpers so that
// backends can trust their inputs.

#include <cstdint>

#include "wick/dtype.h"

namespace wick {

/// Every element-wise unary op: one entry of wick/unary_ops.def each (name, dtypes, tolerance,
/// doc, math, gradient).
enum class UnaryKind : uint8_t {
#define WICK_UNARY_OP(K, ...) K,
#include "wick/unary_ops.def"
};

/// The parenthesised statements of a table entry (its math, its gradient), without the
/// parentheses: WICK_UNPAREN math.
#define WICK_UNPAREN(...) __VA_ARGS__

/// Which dtypes a unary op takes.
enum class UnaryDTypes : uint8_t { Floats, FloatsI64, Any };

/// Whether `dtypes` includes `dtype` (usable in constant expressions, for kernel instantiation).
constexpr bool unary_dtypes_include(UnaryDTypes dtypes, DType dtype) {
  bool fl =
      dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32 || dtype == DType::F64;
  switch (dtypes) {
    case UnaryDTypes::Floats:
      return fl;
    case UnaryDTypes::FloatsI64:
      return fl || dtype == DType::I64;
    case UnaryDTypes::Any:
      return true;
  }
  return false;
}

/// The dtypes of `kind`, from wick/unary_ops.def.
constexpr UnaryDTypes unary_dtypes(UnaryKind kind) {
  switch (kind) {
#define WICK_UNARY_OP(K, name, dtypes, ...) \
  case UnaryKind::K:                        \
    return UnaryDTypes::dtypes;
#include "wick/unary_ops.def"
  }
  return UnaryDTypes::Floats;
}

struct UnaryOp {
  UnaryKind kind;
  double p0 = 0;
  double p1 = 0;
};

/// The binary element-wise ops (every dtype) and comparisons (every dtype, result u8):
/// X(Kind, "name"). Their math is in ops/binary_math.h.
#define WICK_BINARY_OPS(X) \
  X(Add, "add")            \
  X(Sub, "sub")            \
  X(Mul, "mul")            \
  X(Div, "div")            \
  X(Maximum, "maximum")    \
  X(Minimum, "minimum")
#define WICK_CMP_OPS(X) X(Eq, "eq") X(Ne, "ne") X(Lt, "lt") X(Le, "le") X(Gt, "gt") X(Ge, "ge")

#define WICK_OP_KIND(K, name) K,
enum class BinaryKind : uint8_t { WICK_BINARY_OPS(WICK_OP_KIND) };
enum class CmpKind : uint8_t { WICK_CMP_OPS(WICK_OP_KIND) };
#undef WICK_OP_KIND
enum class ReduceKind : uint8_t { Sum, Max, Min, ArgMax, ArgMin };

const char* unary_name(UnaryKind kind);
const char* binary_name(BinaryKind kind);
/// "broadcast_" + binary_name(kind), a literal (no string is built on the op path).
const char* broadcast_binary_name(BinaryKind kind);
const char* cmp_name(CmpKind kind);
const char* reduce_name(ReduceKind kind);

/// Whether `kind` takes `dtype` (wick/unary_ops.def says).
constexpr bool unary_supports(UnaryKind kind, DType dtype) {
  return unary_dtypes_include(unary_dtypes(kind), dtype);
}

}  // namespace wick
