#pragma once
// The CPU backend's instruction set and thread count.

#include <cstddef>
#include <string>

namespace wick {

/// The instruction set the CPU kernels run with, chosen once at first use: "avx512" on a CPU with
/// AVX-512 (F, BW, DQ, VL), else "avx2"; the environment variable WICK_CPU_ISA (avx2 or avx512)
/// forces one. Throws Error when WICK_CPU_ISA is something else or asks for AVX-512 on a CPU
/// without it (every CPU op then throws the same error).
std::string cpu_isa();

/// Sets the CPU backend's worker threads (its thread pool and OpenBLAS) to `n` in place of
/// WICK_NUM_THREADS or the hardware count. Takes effect only before the first CPU op: later, a
/// count other than the one running throws Error, as does `n` outside [1, 1024].
void set_cpu_threads(size_t n);

}  // namespace wick
