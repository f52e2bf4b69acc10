#pragma once
// The CPU backend: its kernels' and its GEMM's instruction sets, its thread count.

#include <cstddef>
#include <string>

namespace wick {

/// The instruction set the CPU kernels run with, chosen once at first use: "avx512" on a CPU with
/// AVX-512 (F, BW, DQ, VL), else "avx2"; the environment variable WICK_CPU_ISA (avx2 or avx512)
/// forces one. Throws Error when WICK_CPU_ISA is something else or asks for AVX-512 on a CPU
/// without it (every CPU op then throws the same error).
std::string cpu_isa();

/// Sets the CPU backend's worker threads (its thread pool and OpenBLAS) to `n` in place of
/// WICK_NUM_THREADS or the CPUs the process may run on (its affinity and cgroup CPU quota). Takes
/// effect only before the first CPU op: later, a count other than the one running throws Error, as
/// does `n` outside [1, 1024].
void set_cpu_threads(size_t n);

/// The CPU backend's worker threads: set_cpu_threads' count, else WICK_NUM_THREADS, else the CPUs
/// the process may run on (the hardware threads, fewer under a CPU affinity such as taskset's or a
/// cgroup CPU quota such as docker --cpus', rounded up). Does not start the thread pool. Throws
/// Error when WICK_NUM_THREADS is invalid.
size_t cpu_threads();

/// Batch invariance (docs/NUMERICS.md, "Determinism") for the whole process, in place of
/// WICK_BATCH_INVARIANT: on, f32/f64/f16/bf16 matmuls (CPU and CUDA), CUDA's quantized matmuls
/// and the CPU's f32 attention give a row the same bits whatever the other rows of its batch
/// (slower for products of a few rows on the CPU, and for every product on CUDA, which then takes
/// wick's own GEMM); off, each shape takes its fastest kernel, the serving engine's dense
/// projections included. Ops started after the call follow it. `wick-serve --deterministic`
/// sets it on.
void set_batch_invariant(bool on);
/// Whether batch invariance is on: set_batch_invariant's last call, else WICK_BATCH_INVARIANT.
bool batch_invariant();

/// The GEMMs behind the CPU's f32 and f64 matmuls and the kernels they run: on a CPU whose kernels
/// run AVX-512 (cpu_isa()), wick's own f32 GEMM and OpenBLAS for f64, e.g. "f32 wick avx512 14x32,
/// f64 OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Cooperlake MAX_THREADS=64 [avx512]"; else OpenBLAS
/// for both, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64 [avx2]".
/// OpenBLAS is set up, at wick's first matmul (or this call), to run the kernels of the best
/// instruction set the CPU offers (unless OPENBLAS_CORETYPE is set), even where its own list of CPU
/// models does not know the processor. WICK_TRACE=1 prints this line on stderr then. Throws
/// cpu_isa()'s Error when WICK_CPU_ISA is invalid.
std::string cpu_gemm();

/// The instruction set of the GEMM kernels of cpu_gemm(): "avx512", "avx2", "avx" or "sse" ("" for
/// a BLAS core not known to wick).
std::string cpu_gemm_isa();

/// The kernels of the CPU's bf16 products (Bert::load with matmul dtype BF16, the CPU
/// SentenceEmbedder's bf16): "amx-bf16" when the CPU has AMX-TILE and AMX-BF16, Linux grants the
/// process the tile state and the CPU kernels run AVX-512 (WICK_CPU_ISA=avx2 turns it off); else
/// "avx512-bf16" when the CPU has AVX512-BF16 (VDPBF16PS) and the kernels run AVX-512; ""
/// otherwise, where these products are composed from f32 ops (bf16-rounded inputs, sgemm).
std::string cpu_bf16_gemm();

/// The kernels of the CPU's quantized matmuls (GGUF weights kept quantized, wick::QMatmul):
/// "avx512-vnni" (VPDPBUSD) when the CPU kernels run AVX-512 and the CPU has AVX512-VNNI, else
/// "avx2". Throws cpu_isa()'s Error when WICK_CPU_ISA is invalid.
std::string cpu_qmatmul_isa();

}  // namespace wick
