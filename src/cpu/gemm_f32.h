#pragma once
// wick's own f32 GEMM (gemm_f32.cpp, compiled once per instruction set like the other CPU
// kernels): a packed, register-blocked product for AVX-512 CPUs and for AVX2 CPUs with FMA.
//
// Every output element is one f32 sum of its k products taken in k order (a chain of fused
// multiply-adds from 0), whatever m, n, the blocking, the row's place in its tile, the split across
// threads or their count: a row computed alone has the same bits as inside any larger product.

#include <cstddef>

namespace wick::cpu {

/// One operand of gemm_f32 as a (rows x cols) matrix: element (r, c) at data[r * ld + c], or at
/// data[c * ld + r] when trans (column-major storage, a transposed view).
struct GemmF32Operand {
  const float* data;
  size_t ld;
  bool trans;
};

/// An f32 GEMM: run computes c = a (m x k) times b (k x n) into the row-major c (leading dimension
/// ldc), any m, n, k >= 1, on the CPU backend's thread pool.
struct GemmF32 {
  const char* name;  // "wick avx512 14x32", "wick avx2 6x16"; "" where this build has no kernel
  void (*run)(size_t m, size_t n, size_t k, const GemmF32Operand& a, const GemmF32Operand& b,
              float* c, size_t ldc);
  // Whether matmul's f32 products take it outside batch invariance too: the AVX-512 kernel, which
  // runs ahead of OpenBLAS's; the AVX2 one runs behind OpenBLAS's Zen kernels (by 5-20% on a
  // Zen 3, docs/perf/cpu.md) and serves batch invariance only, where OpenBLAS cannot.
  bool default_path;
};

/// The two builds of gemm_f32.cpp (the AVX2 one has no kernel, name "" and run null, only where
/// the compiler targets no AVX2 and FMA).
extern const GemmF32 kAvx2GemmF32;
extern const GemmF32 kAvx512GemmF32;

/// The f32 GEMM of the CPU kernels' instruction set (wick::cpu_isa()): avx512's on an AVX-512 CPU,
/// avx2's on the others, under WICK_CPU_ISA=avx2 and in a build without AVX-512 kernels.
const GemmF32& gemm_f32();

}  // namespace wick::cpu
