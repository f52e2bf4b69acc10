#pragma once
// OpenBLAS set up for the CPU it runs on: the kernels of the best instruction set the processor
// offers, whatever OpenBLAS's own model list says, before the first BLAS call.

#include <string>

namespace wick::cpu {

/// Makes OpenBLAS run the kernels of the best instruction set this CPU offers (once; later calls
/// return at once). A DYNAMIC_ARCH OpenBLAS picks its kernels from a list of CPU models frozen at
/// its release, and falls back to SSE3 (Prescott) kernels on a newer model it does not know; this
/// re-runs its core selection with the core chosen from the CPU's features instead. An
/// OPENBLAS_CORETYPE set by the user is kept. Called before any BLAS call of the CPU backend.
void init_blas();

/// Stops OpenBLAS's worker threads, if its build has them (it starts them again by itself should
/// a multi-threaded call come). A thread it (re)starts busy-waits for work, yielding, for some
/// 0.1 s before it sleeps: CPU time taken from wick's own pool, which runs OpenBLAS
/// single-threaded.
void stop_blas_threads();

/// OpenBLAS's name of the kernels in use ("Cooperlake", "Haswell", ...), after init_blas().
std::string blas_core();

/// The instruction set of an OpenBLAS x86-64 core name: "avx512", "avx2", "avx" or "sse"; ""
/// for a name not known here.
std::string blas_core_isa(const std::string& core);

}  // namespace wick::cpu
