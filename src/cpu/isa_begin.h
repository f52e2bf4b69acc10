// Included last by the files compiled once per instruction set (src/CMakeLists.txt lists them):
// the code after this line is compiled for that set. Only that code, which lives in namespace
// wick::cpu::WICK_ISA_NS, gets AVX-512: the standard library and every header above keep the
// baseline, so no inline function or template emitted here (a weak symbol the linker may share
// with the AVX2 build of the same file) can carry an AVX-512 instruction onto an AVX2-only CPU.
// scripts/check-isa.sh verifies this on the built library.

#include "cpu/isa_ns.h"

#if defined(WICK_ISA_AVX512)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")  // = WICK_AVX512_TARGET_LIST
#else
#error "The AVX-512 kernels are compiled with GCC's #pragma GCC target: build with g++"
#endif
#endif
