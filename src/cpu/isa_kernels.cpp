// The kernel table of one instruction set (this file is compiled once per set).

#include "cpu/isa_begin.h"
#include "cpu/kernels.h"

namespace wick::cpu {

#if defined(WICK_ISA_AVX512)
const Kernels kAvx512Kernels
#else
const Kernels kAvx2Kernels
#endif
    {&copy_bytes,    &to_dtype,
     &unary,         &binary,
     &cmp,           &where_cond,
     &reduce,        &softmax_last_dim,
     &attention_f32, &varlen_attention_f32};

}  // namespace wick::cpu
