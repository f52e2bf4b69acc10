#include "ops.h"

namespace wick {

const char* unary_name(UnaryKind kind) {
  switch (kind) {
    case UnaryKind::Neg:
      return "neg";
    case UnaryKind::Abs:
      return "abs";
    case UnaryKind::Exp:
      return "exp";
    case UnaryKind::Log:
      return "log";
    case UnaryKind::Sqrt:
      return "sqrt";
    case UnaryKind::Sqr:
      return "sqr";
    case UnaryKind::Recip:
      return "recip";
    case UnaryKind::Tanh:
      return "tanh";
    case UnaryKind::Sin:
      return "sin";
    case UnaryKind::Cos:
      return "cos";
    case UnaryKind::Relu:
      return "relu";
    case UnaryKind::Silu:
      return "silu";
    case UnaryKind::Sigmoid:
      return "sigmoid";
    case UnaryKind::Gelu:
      return "gelu";
    case UnaryKind::GeluErf:
      return "gelu_erf";
    case UnaryKind::Affine:
      return "affine";
    case UnaryKind::Powf:
      return "powf";
    case UnaryKind::Clamp:
      return "clamp";
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

bool unary_supports(UnaryKind kind, DType dtype) {
  if (is_float(dtype)) return true;
  switch (kind) {
    case UnaryKind::Abs:
    case UnaryKind::Sqr:
    case UnaryKind::Relu:
    case UnaryKind::Affine:
    case UnaryKind::Clamp:
      return true;
    case UnaryKind::Neg:
      return dtype == DType::I64;
    default:
      return false;
  }
}

}  // namespace wick
