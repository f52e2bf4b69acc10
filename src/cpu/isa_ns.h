#pragma once
// WICK_ISA_NS: the namespace (in wick::cpu) of code compiled once per instruction set. CMake
// defines it for those files; files built once (with the baseline flags) get the AVX2 one.

#ifndef WICK_ISA_NS
#define WICK_ISA_NS avx2
#endif
