#pragma once
// The op families a backend implements. Front-end validation uses the *_supports helpers so that
// backends can trust their inputs.

#include <cstdint>

#include "wick/dtype.h"

namespace wick {

enum class UnaryKind : uint8_t {
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Sqr,
  Recip,
  Tanh,
  Sin,
  Cos,
  Relu,
  Silu,
  Sigmoid,
  Gelu,
  GeluErf,
  Affine,  // x * p0 + p1
  Powf,    // x ^ p0
  Clamp,   // min(max(x, p0), p1)
};

struct UnaryOp {
  UnaryKind kind;
  double p0 = 0;
  double p1 = 0;
};

enum class BinaryKind : uint8_t { Add, Sub, Mul, Div, Maximum, Minimum };
enum class CmpKind : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
enum class ReduceKind : uint8_t { Sum, Max, Min, ArgMax, ArgMin };

const char* unary_name(UnaryKind kind);
const char* binary_name(BinaryKind kind);
const char* cmp_name(CmpKind kind);
const char* reduce_name(ReduceKind kind);

/// Abs, Sqr, Relu, Affine, Clamp: every dtype; Neg: floats and i64; the rest: floats only.
bool unary_supports(UnaryKind kind, DType dtype);

}  // namespace wick
