// Unary element-wise ops. Float dtypes get every op (f16/bf16 computed in float); integer dtypes
// only abs, sqr, relu, affine, clamp (and neg on i64), as ops.h's unary_supports says.

#include "cuda/kernel_utils.cuh"
#include "util.h"

namespace wick::cuda {

namespace {

template <UnaryKind K, class T>
inline constexpr bool supported = is_float_v<T> || K == UnaryKind::Abs || K == UnaryKind::Sqr ||
                                  K == UnaryKind::Relu || K == UnaryKind::Affine ||
                                  K == UnaryKind::Clamp ||
                                  (K == UnaryKind::Neg && std::is_same_v<T, int64_t>);

// Float math in the compute type's precision.
template <class C>
__device__ __forceinline__ C m_exp(C x) {
  if constexpr (std::is_same_v<C, float>)
    return expf(x);
  else
    return exp(x);
}
template <class C>
__device__ __forceinline__ C m_tanh(C x) {
  if constexpr (std::is_same_v<C, float>)
    return tanhf(x);
  else
    return tanh(x);
}

template <UnaryKind K, class T>
struct UnaryFn {
  double p0, p1;

  __device__ __forceinline__ T operator()(T x) const {
    using C = compute_t<T>;
    C v = to_compute(x);
    if constexpr (K == UnaryKind::Affine && !is_float_v<T>) {
      // In double, then back with saturation, as the CPU backend (Candle's `as`).
      return float_to_int<T>(static_cast<double>(v) * p0 + p1);
    } else if constexpr (K == UnaryKind::Clamp && !is_float_v<T>) {
      // The bounds converted to T first (truncated, saturated), as the CPU backend.
      T lo = float_to_int<T>(p0), hi = float_to_int<T>(p1);
      T m = x < lo ? lo : x;
      return hi < m ? hi : m;
    } else {
      return convert<T>(apply(v));
    }
  }

  __device__ __forceinline__ compute_t<T> apply(compute_t<T> v) const {
    using C = compute_t<T>;
    if constexpr (K == UnaryKind::Neg) {
      if constexpr (std::is_integral_v<C>)
        return static_cast<C>(0ull - static_cast<uint64_t>(v));
      else
        return -v;
    } else if constexpr (K == UnaryKind::Abs) {
      if constexpr (std::is_unsigned_v<C>)
        return v;
      else if constexpr (std::is_integral_v<C>)
        return v < 0 ? static_cast<C>(0ull - v) : v;
      else
        return fabs(v);
    } else if constexpr (K == UnaryKind::Sqr) {
      // Integers wrap (i64 through unsigned; u8 is promoted to int and truncated on the store).
      if constexpr (std::is_same_v<C, int64_t>) {
        return static_cast<C>(static_cast<uint64_t>(v) * static_cast<uint64_t>(v));
      } else {
        return static_cast<C>(v * v);
      }
    } else if constexpr (K == UnaryKind::Relu) {
      return v > C(0) ? v : C(0);
    } else if constexpr (K == UnaryKind::Affine) {
      return v * static_cast<C>(p0) + static_cast<C>(p1);
    } else if constexpr (K == UnaryKind::Clamp) {
      // std::min(std::max(v, lo), hi), as the CPU backend (NaN stays NaN).
      C lo = static_cast<C>(p0), hi = static_cast<C>(p1);
      C m = v < lo ? lo : v;
      return hi < m ? hi : m;
    } else if constexpr (K == UnaryKind::Exp) {
      return m_exp(v);
    } else if constexpr (K == UnaryKind::Log) {
      return log(v);
    } else if constexpr (K == UnaryKind::Sqrt) {
      return sqrt(v);
    } else if constexpr (K == UnaryKind::Recip) {
      return C(1) / v;
    } else if constexpr (K == UnaryKind::Tanh) {
      return m_tanh(v);
    } else if constexpr (K == UnaryKind::Sin) {
      return sin(v);
    } else if constexpr (K == UnaryKind::Cos) {
      return cos(v);
    } else if constexpr (K == UnaryKind::Silu) {
      return v / (C(1) + m_exp(-v));
    } else if constexpr (K == UnaryKind::Sigmoid) {
      return C(1) / (C(1) + m_exp(-v));
    } else if constexpr (K == UnaryKind::Gelu) {
      // The tanh approximation, as Candle's gelu.
      const C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
      return C(0.5) * v * (C(1) + m_tanh(k * v * (C(1) + static_cast<C>(0.044715) * v * v)));
    } else if constexpr (K == UnaryKind::GeluErf) {
      return C(0.5) * v * (C(1) + erf(v * static_cast<C>(0.7071067811865476)));
    } else if constexpr (K == UnaryKind::Powf) {
      return pow(v, static_cast<C>(p0));
    } else {
      static_assert(K == UnaryKind::Neg, "unhandled unary op");
      return v;
    }
  }
};

template <UnaryKind K>
void run(const UnaryOp& op, DType dtype, const void* src, const StridedView& view, void* dst,
         size_t count, cudaStream_t s) {
  dispatch_dev(dtype, [&]<class T>() {
    if constexpr (supported<K, T>) {
      launch_map1(static_cast<const T*>(src), view, static_cast<T*>(dst), count,
                  UnaryFn<K, T>{op.p0, op.p1}, s);
    } else {
      throw UnsupportedDType(
          str(unary_name(K), ": unsupported dtype ", dtype_name(dtype), " on cuda"));
    }
  });
}

}  // namespace

void launch_unary(const UnaryOp& op, DType dtype, const void* src, const StridedView& src_view,
                  void* dst, size_t count, cudaStream_t s) {
  if (count == 0) return;
  switch (op.kind) {
#define WICK_UNARY_CASE(K) \
  case UnaryKind::K:       \
    return run<UnaryKind::K>(op, dtype, src, src_view, dst, count, s);
    WICK_UNARY_CASE(Neg)
    WICK_UNARY_CASE(Abs)
    WICK_UNARY_CASE(Exp)
    WICK_UNARY_CASE(Log)
    WICK_UNARY_CASE(Sqrt)
    WICK_UNARY_CASE(Sqr)
    WICK_UNARY_CASE(Recip)
    WICK_UNARY_CASE(Tanh)
    WICK_UNARY_CASE(Sin)
    WICK_UNARY_CASE(Cos)
    WICK_UNARY_CASE(Relu)
    WICK_UNARY_CASE(Silu)
    WICK_UNARY_CASE(Sigmoid)
    WICK_UNARY_CASE(Gelu)
    WICK_UNARY_CASE(GeluErf)
    WICK_UNARY_CASE(Affine)
    WICK_UNARY_CASE(Powf)
    WICK_UNARY_CASE(Clamp)
#undef WICK_UNARY_CASE
  }
  throw Error("unary: invalid op on cuda");
}

}  // namespace wick::cuda
