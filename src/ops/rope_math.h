#pragma once
// The rotation of rotary position embeddings, written once for the CPU and the CUDA kernels (as
// norm_math.h): a pair (a, b) of a head's row (its two halves, or neighbours when interleaved)
// turned by the angle of cosine c and sine s, each product rounded by `round` (to the model's
// dtype and back, as transformers' q * cos + rotate_half(q) * sin computes in that dtype; the
// identity for f32/f64), then the sum: lo = a c - b s, hi = b c + a s. Two functions, so that a
// kernel stores lo before it computes hi, as it always has.
//
// Partial rotary (Phi-4-mini): only the first 2 * rot_half of a head's `half` * 2 dims rotate,
// each (i, i + rot_half) as a pair; the others pass through. rope_pair names the two elements of
// a head that pair i < half covers, so that a kernel walks the whole head in pairs either way.

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

/// The elements of a head of 2 * half dims that pair i < half covers, with the first
/// 2 * rot_half dims rotating: (i, i + rot_half) for i < rot_half (rotate them), else two of the
/// dims that pass through. rot_half == half: (i, i + half), whole-head rope.
struct RopePair {
  long long lo, hi;
  bool rotates;
};

WICK_ROPE_HD RopePair rope_pair(long long i, long long half, long long rot_half) {
  if (i < rot_half) return {i, i + rot_half, true};
  const long long j = 2 * rot_half + (i - rot_half);
  return {j, j + (half - rot_half), false};
}

}  // namespace wick::ops

#undef WICK_ROPE_HD
