#pragma once
// Dequantisation of GGML blocks on the CPU (dequant.cpp): fused::DequantizeOp's kernel, also
// used by the qmatmul kernels.

#include <cstddef>
#include <cstdint>

#include "wick/quantized.h"

namespace wick::cpu {
/// Dequantises `n` values (a whole number of blocks) of `type` at `src` into `dst`.
/// `type` is one of the types ggml_can_dequantize() accepts.
void dequantize(GgmlType type, const uint8_t* src, float* dst, size_t n);
}  // namespace wick::cpu
