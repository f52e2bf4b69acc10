#pragma once
// WICK_ISA_NS: the namespace (in wick::cpu) of code compiled once per instruction set. CMake
// defines it for those files; files built once (with the baseline flags) get the AVX2 one.
//
// WICK_ISA_TARGET marks the templates of headers included before cpu/isa_begin.h that call a
// kernel's lambda in their loops (map_unit, map_unit2): they must be compiled for the file's
// instruction set too, since GCC never inlines an AVX-512 function into a baseline one (the loop
// would then call the lambda once per element).

#ifndef WICK_ISA_NS
#define WICK_ISA_NS avx2
#endif

#define WICK_AVX512_TARGET_LIST "avx512f,avx512bw,avx512dq,avx512vl"

#if defined(WICK_ISA_AVX512)
#define WICK_ISA_TARGET __attribute__((target(WICK_AVX512_TARGET_LIST)))
#else
#define WICK_ISA_TARGET
#endif
