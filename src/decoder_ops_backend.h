#pragma once
// The backend halves of nn::add_rms_norm and nn::silu_mul (src/nn/decoder_ops.cpp checks the
// arguments and passes row-major operands): src/cpu/decoder_ops.cpp and src/cuda/decoder_ops.cpp
// (stubs in cuda_stub.cpp without CUDA).

#include "wick/nn/decoder_ops.h"

namespace wick::detail {

/// x, delta: row-major (rows, d); weight: row-major (d).
nn::ResidualNorm cpu_add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                  double eps);
nn::ResidualNorm cuda_add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                   double eps);
/// gate_up: row-major (rows, 2n).
Tensor cpu_silu_mul(const Tensor& gate_up);
Tensor cuda_silu_mul(const Tensor& gate_up);

}  // namespace wick::detail
