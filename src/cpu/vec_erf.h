#pragma once
// erf for float, written branch-free so that the CPU loops calling it vectorise (libm's erff
// does not, and was 12% of a BERT forward through the exact GELU). Both halves are computed and
// one is selected, so a vector of 8 or 16 lanes pays for both: ~20 FMAs and one exp.
//
//   |x| < 1.25: erf(x) = x P(x^2), P a degree-7 minimax fit of erf(x)/x (relative error 1e-9);
//   |x| >= 1.25: erf(x) = sign(x) (1 - e^Q(|x|)), Q a degree-6 fit of log(erfc) in |x| - 2.625
//                on [1.25, 4] (absolute error of erfc 3e-10); past 4, erfc < 2e-8 rounds away
//                against 1.
//
// Error against the exact erf: within 2 ulp (the exp's 2 ulp weighted by erfc <= 0.16, Horner's
// roundings, the final subtraction), inside numerics.h's "erf" row; tests/test_vec_erf.cpp
// sweeps it against double erf. NaN gives NaN, +-inf gives +-1, the sign of zero is kept.

#include <cmath>

#include "ops/unary_math.h"

namespace wick::cpu {

inline float vec_erff(float x) {
  const float a = std::fabs(x);
  // Small |a|: a c0 + a (z P(z)) with z = a^2, c0 = 2 / sqrt(pi) split in two so that its
  // float rounding goes into the small correction term; the leading term is rounded once.
  const float z = a * a;
  float p = -7.740968613e-06f;
  p = std::fma(p, z, 1.048905760e-04f);
  p = std::fma(p, z, -8.360946085e-04f);
  p = std::fma(p, z, 5.211428273e-03f);
  p = std::fma(p, z, -2.686167322e-02f);
  p = std::fma(p, z, 1.128371656e-01f);
  p = std::fma(p, z, -3.761263490e-01f);
  p = std::fma(p, z, -5.863538344e-08f);  // 2 / sqrt(pi) - c0_hi
  const float small = std::fma(a, 1.128379226e+00f, a * p);
  // Large |a|: 1 - erfc with erfc = e^Q. NaN fails `4 < a` and flows through to the result.
  const float t = (4.0f < a ? 4.0f : a) - 2.625f;
  float q = 1.595284994e-04f;
  q = std::fma(q, t, -1.479791681e-04f);
  q = std::fma(q, t, 2.151187276e-03f);
  q = std::fma(q, t, -9.733328596e-03f);
  q = std::fma(q, t, -9.477661848e-01f);
  q = std::fma(q, t, -5.589156628e+00f);
  q = std::fma(q, t, -8.490671158e+00f);
  const float large = 1.0f - ops::math::vec_expf(q);
  return std::copysign(a < 1.25f ? small : large, x);
}

/// The exact GELU, 0.5 x (1 + erf(x / sqrt 2)), as ops::UnaryMath<GeluErf> computes it, with
/// vec_erff.
inline float vec_gelu_erff(float x) {
  return 0.5f * x * (1.0f + vec_erff(x * 0.70710678118654752f));
}

}  // namespace wick::cpu
