#pragma once
// The rotation of rotary position embeddings, written once for the CPU and the CUDA kernels (as
// norm_math.h): a pair (a, b) of a head's row (its two halves, or neighbours when interleaved)
// turned by the angle of cosine c and sine s, each product rounded by `round` (to the model's
// dtype and back, as transformers' q * cos + rotate_half(q) * sin computes in that dtype; the
// identity for f32/f64), then the sum: lo = a c - b s, hi = b c + a s. Two functions, so that a
// kernel stores lo before it computes hi, as it always has.

#if defined(__CUDACC__)
#define WICK_ROPE_HD __host__ __device__ __forceinline__
#else
#define WICK_ROPE_HD inline
#endif

namespace wick::ops {

template <class C, class Round>
WICK_ROPE_HD C rope_lo(C a, C b, C c, C s, Round round) {
  return round(a * c) - round(b * s);
}

template <class C, class Round>
WICK_ROPE_HD C rope_hi(C a, C b, C c, C s, Round round) {
  return round(b * c) + round(a * s);
}

}  // namespace wick::ops

#undef WICK_ROPE_HD
