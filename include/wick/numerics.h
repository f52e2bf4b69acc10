#pragma once
// The numerical contract (docs/NUMERICS.md): for every op, dtype and device, how far a result may
// lie from the float64 reference computed from the same (already rounded) inputs. The tests and
// tools/wick-conform read their tolerances from here and nowhere else.
//
// Every bound is a sum of terms, each derived from one source of error:
//   output rounding    u_T * |want|               (the result is rounded once to the dtype T)
//   the op's math      c * u_C * |want|           (libm / CUDA math, c from their ulp claims)
//   cancellation       a * u_C * scale            (scale: the input's magnitude, at least 1)
//   a k-long sum       2 * sqrt(k) * u_A * sum|x| (round-to-nearest errors of the partial sums)
//   underflow          half the smallest subnormal of T
// with u_T the unit roundoff (half an ulp) of T, u_C that of the type the arithmetic runs in (f32
// for f16/bf16) and u_A that of the accumulator. Integer ops are exact: their bound is 0.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include "wick/dtype.h"

namespace wick::numerics {

/// bf16, f16, f32, f64 (is_float, usable in constant expressions).
constexpr bool is_float_dtype(DType dtype) {
  return dtype == DType::BF16 || dtype == DType::F16 || dtype == DType::F32 || dtype == DType::F64;
}

/// Unit roundoff (half an ulp, relative) of a float dtype: 2^-8 bf16, 2^-11 f16, 2^-24 f32,
/// 2^-53 f64; 0 for integer dtypes (exact).
constexpr double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 0x1p-8;
    case DType::F16:
      return 0x1p-11;
    case DType::F32:
      return 0x1p-24;
    case DType::F64:
      return 0x1p-53;
    default:
      return 0;
  }
}

/// Unit roundoff of the type the arithmetic runs in: f32 for f16/bf16/f32, f64 for f64.
constexpr double compute_roundoff(DType dtype) {
  if (!is_float_dtype(dtype)) return 0;
  return dtype == DType::F64 ? 0x1p-53 : 0x1p-24;
}

/// Half the smallest subnormal of a float dtype: the absolute error of rounding a tiny value.
constexpr double underflow_floor(DType dtype) {
  switch (dtype) {
    case DType::BF16:
      return 0x1p-134;
    case DType::F16:
      return 0x1p-25;
    case DType::F32:
      return 0x1p-150;
    default:
      return 0;
  }
}

enum class Backend { Cpu, Cuda };

/// One element-wise op: its error in units of u_C, relative to the result (`rel`) and absolute
/// against the input's magnitude (`abs`, for results that cancel: gelu's 1 + tanh, cos near
/// pi/2), on each backend. Derived from the math library's ulp claims (1 ulp = 2 u), with
/// twice the claim as margin.
struct ElementwiseRow {
  std::string_view op;
  double cpu_rel, cuda_rel, abs;
  std::string_view why;
};

inline constexpr ElementwiseRow kElementwise[] = {
    {"add", 2, 2, 0, "one rounding"}, {"sub", 2, 2, 0, "one rounding"},
    {"mul", 2, 2, 0, "one rounding"}, {"div", 2, 2, 0, "one rounding (IEEE division on CUDA)"},
    {"maximum", 0, 0, 0, "exact"},    {"minimum", 0, 0, 0, "exact"},
// The unary ops: their rows of wick/unary_ops.def.
#define WICK_UNARY_OP(K, name, dtypes, doc, rel_cpu, rel_cuda, abs, why, ...) \
  {#name, rel_cpu, rel_cuda, abs, why},
#include "wick/unary_ops.def"
};

/// The row of `op`, or nullptr when `op` is not element-wise.
constexpr const ElementwiseRow* elementwise_row(std::string_view op) {
  for (const auto& row : kElementwise) {
    if (row.op == op) return &row;
  }
  return nullptr;
}

/// Bound on |got - want| for one element of an element-wise op. `scale` is the magnitude of the
/// input, at least 1. Throws std::invalid_argument for an op the table does not list: a bound is
/// never guessed.
inline double elementwise_bound(std::string_view op, DType dtype, Backend backend, double want,
                                double scale = 1) {
  const ElementwiseRow* row = elementwise_row(op);
  if (!row) {
    throw std::invalid_argument("wick::numerics::elementwise_bound: no row for op \"" +
                                std::string(op) + "\"");
  }
  if (!is_float_dtype(dtype)) return 0;
  double rel = backend == Backend::Cpu ? row->cpu_rel : row->cuda_rel;
  if (rel == 0 && row->abs == 0) return 0;  // exact: the value is representable, no rounding
  double uc = compute_roundoff(dtype), ut = unit_roundoff(dtype);
  double a = std::abs(want);
  return ut * a + (1 + ut) * uc * (rel * a + row->abs * std::max(1.0, scale)) +
         underflow_floor(dtype);
}

/// Bound for one output of a k-long sum (sum, index_add, scatter_add) whose terms have absolute
/// values summing to `abs_sum`. Accumulation is in f32 (f64 for f64), rounded once to T.
inline double sum_bound(DType dtype, size_t k, double want, double abs_sum) {
  if (!is_float_dtype(dtype)) return 0;
  double n = static_cast<double>(k);
  return unit_roundoff(dtype) * std::abs(want) +
         2 * std::sqrt(n) * compute_roundoff(dtype) * abs_sum + underflow_floor(dtype);
}

/// One output of index_add / scatter_add: the destination plus up to k - 1 added terms, each add
/// rounded to T (the CPU adds in T in place; CUDA in order by pieces, f16/bf16 in f32).
inline double index_add_bound(DType dtype, size_t k, double want, double abs_sum) {
  if (!is_float_dtype(dtype)) return 0;
  double n = static_cast<double>(k);
  return unit_roundoff(dtype) * std::abs(want) + 2 * std::sqrt(n) * unit_roundoff(dtype) * abs_sum +
         underflow_floor(dtype);
}

/// mean = sum * (1/k): the sum's bound divided by k, and a second rounding to T.
inline double mean_bound(DType dtype, size_t k, double want, double abs_sum) {
  if (!is_float_dtype(dtype)) return 0;
  double n = static_cast<double>(k == 0 ? 1 : k);
  return sum_bound(dtype, k, want * n, abs_sum) / n + 2 * unit_roundoff(dtype) * std::abs(want);
}

/// One output of a matmul: k products (each rounded once, or its inputs rounded to TF32's 10-bit
/// mantissa when `tf32`) and a k-long f32 (f64) accumulation; `abs_sum` = sum_j |a_ij * b_jn|.
inline double matmul_bound(DType dtype, size_t k, double want, double abs_sum, bool tf32 = false) {
  if (!is_float_dtype(dtype)) return 0;
  double product = tf32 && dtype == DType::F32 ? 2 * 0x1p-11 : 2 * compute_roundoff(dtype);
  return sum_bound(dtype, k, want, abs_sum) + product * abs_sum;
}

/// One output of qmatmul (x times quantized weights w, against the dequantised w in f64):
/// `abs_sum` = sum_j |w_j x_j|; `quant_abs` = sum_j |w_j| * h_j where h_j is half the step of the
/// 8- or 16-bit block holding x_j (max |x| over its 32 values / 254, or / 65024), the most that
/// rounding x_j to its block can move the result (0 where x is not quantized: K-quants on the CPU,
/// f32 x on CUDA). The rest is an f32 accumulation over k products (block sums are exact integers,
/// scaled by two f32 roundings), with the inputs' own f32 rounding in the scale of x.
inline double qmatmul_bound(DType dtype, size_t k, double want, double abs_sum, double quant_abs) {
  double u = 0x1p-24;
  double s = abs_sum + quant_abs;
  return unit_roundoff(dtype) * std::abs(want) + 2 * std::sqrt(static_cast<double>(k)) * u * s +
         6 * u * s + quant_abs * (1 + 512 * u);
}

/// One output of softmax over a k-long row whose values span `spread` (max - min): exp of
/// x - max (its argument rounded: spread * u_C, and 2 ulp), a k-long positive sum and a division.
/// The vectorised f32 exp may flush a result below f32's smallest normal (2^-126) to zero; the
/// row's sum is at least 1, so an output moves by at most that much (f16/bf16/f32).
inline double softmax_bound(DType dtype, size_t k, double want, double spread) {
  if (!is_float_dtype(dtype)) return 0;
  double uc = compute_roundoff(dtype);
  double rel = uc * (std::abs(spread) + 8 + 2 * std::sqrt(static_cast<double>(k)) + 2);
  double flush = dtype == DType::F64 ? 0 : 0x1p-126;
  return unit_roundoff(dtype) * std::abs(want) + rel * std::abs(want) +
         std::max(underflow_floor(dtype), flush);
}

/// One output y = z w (+ b) of layer_norm or rms_norm over a k-long row: z = (x - mean) * rstd
/// (rms_norm: x * rstd) with `z` = |z| and `w` = |w| at that element, and `m` = mean|x| / sigma of
/// the row (sigma: the standard deviation, or the root mean square for rms_norm). The statistics
/// are k-long f32 sums (2 sqrt(k) u_C each, the variance's relative to mean(x^2), hence m^2),
/// rsqrt 2 u_C and a few products; `t_roundings` more roundings of z w to T in between (1 for
/// f16/bf16 rms_norm, which rounds x * rstd as LlamaRMSNorm does), then the output's.
inline double norm_bound(DType dtype, size_t k, double want, double z, double w, double m,
                         int t_roundings = 0) {
  if (!is_float_dtype(dtype)) return 0;
  double uc = compute_roundoff(dtype), ut = unit_roundoff(dtype);
  double a = std::abs(want), zw = std::abs(z) * std::abs(w);
  double dz = uc * (2 * std::sqrt(static_cast<double>(k)) + 8) * (std::abs(z) + m) * (1 + m);
  return ut * a + t_roundings * ut * zw + std::abs(w) * dz + 3 * uc * (zw + a) +
         underflow_floor(dtype);
}

/// The error of one attention score s_j = scale q k_j + mask_j: a d-long f32 dot whose products'
/// magnitudes, times |scale|, sum to `qk_abs`, and for f16/bf16 with `half_rounding` (the CPU,
/// as transformers) the roundings to T of the dot, of its scaling and of the mask's sum.
inline double attention_score_error(DType dtype, size_t d, double qk_abs, double s_abs,
                                    bool half_rounding = true) {
  if (!is_float_dtype(dtype)) return 0;
  bool rounds = half_rounding && (dtype == DType::F16 || dtype == DType::BF16);
  double uc = compute_roundoff(dtype), ut = unit_roundoff(dtype);
  return (2 * std::sqrt(static_cast<double>(d)) + 2) * uc * qk_abs +
         (rounds ? ut * (2 * qk_abs + std::abs(s_abs)) : 0);
}

/// One output of attention softmax(scale q k^T + mask) v over n keys: `pv` = sum_j p_j |v_j|
/// (p: the reference probabilities), `pev` = sum_j p_j e_j |v_j| with e_j the score's
/// attention_score_error, `spread` = the row's score range. An error e_j in a score moves p_j by
/// at most e_j + sum_l p_l e_l relative, hence 2 pev; then softmax's own bound, the
/// probabilities' rounding to T (f16/bf16 with `half_rounding`), an n-long f32 sum and the
/// output's rounding.
inline double attention_bound(DType dtype, size_t n, double want, double pv, double pev,
                              double spread, bool half_rounding = true) {
  if (!is_float_dtype(dtype)) return 0;
  double uc = compute_roundoff(dtype), ut = unit_roundoff(dtype);
  bool rounds = half_rounding && (dtype == DType::F16 || dtype == DType::BF16);
  double sn = std::sqrt(static_cast<double>(n));
  double ep = uc * (std::abs(spread) + 12 + 2 * sn) + (rounds ? ut : 0);
  return ut * std::abs(want) + (2 * sn + 2) * uc * pv + 2 * pev + ep * pv + underflow_floor(dtype);
}

/// One output of log_softmax over a k-long row whose values span `spread` (max - min), computed
/// as (x - max) - log(sum(exp(x - max))) in f32 (f64 for f64): x - max rounded (spread u_C, once
/// in the output and once in each exp's argument), the exps (2 ulp) and the k-long positive sum
/// as a relative error of the sum, which the log turns into an absolute one, the log's own
/// rounding (log k at most) and the final subtraction (|want|), then one rounding to T.
inline double log_softmax_bound(DType dtype, size_t k, double want, double spread) {
  if (!is_float_dtype(dtype)) return 0;
  double uc = compute_roundoff(dtype), n = static_cast<double>(k == 0 ? 1 : k);
  double terms = 2 * std::abs(spread) + 8 + 2 * std::sqrt(n) + 2 * std::log(n) + 2 * std::abs(want);
  return unit_roundoff(dtype) * std::abs(want) + (1 + unit_roundoff(dtype)) * uc * terms +
         underflow_floor(dtype);
}

/// A conversion to `dtype` from a value exact in f64: one rounding (0 for integer targets, which
/// truncate exactly as documented).
inline double convert_bound(DType dtype, double want) {
  return unit_roundoff(dtype) * std::abs(want) + underflow_floor(dtype);
}

}  // namespace wick::numerics
