#pragma once
// The CPU's bf16 GEMM (src/cpu/gemm_amx.cpp): f32 activations rounded to bf16 times bf16 weights,
// f32 sums, on AMX-BF16 tiles where the CPU has them and the OS grants them, else with
// AVX512-BF16's dot products where the CPU has those.

#include <cstddef>

#include "wick/half.h"

namespace wick::cpu {

/// The bf16 GEMM kernels this process runs: "amx-bf16" when the CPU has AMX-TILE and AMX-BF16,
/// the OS saves the tile state and grants it to the process (Linux ARCH_REQ_XCOMP_PERM) and
/// WICK_CPU_ISA asks for no less than AVX-512; else "avx512-bf16" when the CPU has AVX512-BF16
/// (VDPBF16PS) and the same AVX-512; "" otherwise (no kernel: callers compose the product from f32
/// ops). Decided once, at the first call.
const char* bf16_gemm_kernel();

/// c (m x n, row stride ldc) = act(round_bf16(a) w^T + bias) + residual: a (m x k, row stride
/// lda) f32, w (n x k, row stride ldw) bf16, bias (n) f32 or null, act the exact GELU when `gelu`,
/// else the identity, residual (m x n, row stride ldr) f32 or null. Products exact, sums in f32
/// in a fixed k order: a row's result does not depend on m, on the other rows or on the thread
/// count. Requires bf16_gemm_kernel() to be non-empty.
void gemm_bf16(size_t m, size_t n, size_t k, const float* a, size_t lda, const bf16* w, size_t ldw,
               const float* bias, bool gelu, const float* residual, size_t ldr, float* c,
               size_t ldc);

}  // namespace wick::cpu
