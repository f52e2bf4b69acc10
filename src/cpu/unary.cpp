// Float compares (relu, clamp, the range checks in vec_expf) only vectorise when GCC may assume
// they raise no visible FP exceptions (clang's default); nothing in wick reads the FP flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <cmath>
#include <type_traits>

#include "cpu/cpu_storage.h"
#include "cpu/elementwise.h"
#include "dispatch.h"
#include "util.h"

namespace wick::cpu {

namespace {

// out[i] = f(in[i]) over `layout`; f works on compute_t<T> (float for f16/bf16, which are rounded
// once on the store).
template <class T, class F>
StoragePtr map_unary(const CpuStorage& in, const Layout& layout, F f) {
  using C = compute_t<T>;
  std::unique_ptr<CpuStorage> out =
      std::make_unique<CpuStorage>(layout.elem_count(), dtype_of<T>());
  if (layout.elem_count() == 0) return out;
  Layout out_layout = Layout::contiguous(layout.shape());
  Walk<2> w =
      make_walk<2>({Operand{&out_layout, out->data(), sizeof(T)}, {&layout, in.data(), sizeof(T)}});
  for_each_segment(w,
                   [&](const std::array<char*, 2>& p, size_t len, const std::array<size_t, 2>& s) {
                     T* __restrict d = reinterpret_cast<T*>(p[0]);
                     const T* __restrict x = reinterpret_cast<const T*>(p[1]);
                     if (s[0] == 1 && s[1] == 1) {
                       for (size_t i = 0; i < len; ++i) d[i] = T(f(static_cast<C>(x[i])));
                     } else {
                       for (size_t i = 0; i < len; ++i)
                         d[i * s[0]] = T(f(static_cast<C>(x[i * s[1]])));
                     }
                   });
  return out;
}

// exp through the vectorisable float version where the arithmetic is in float.
template <class C>
C exp_c(C x) {
  if constexpr (std::is_same_v<C, float>) {
    return vec_expf(x);
  } else {
    return std::exp(x);
  }
}

// 1 / (1 + e^-x) without overflowing e^-x for very negative x (which would lose the tiny, even
// subnormal, results): with e = e^-|x| in (0, 1], x >= 0 gives 1 / (1 + e), x < 0 gives e / (1 +
// e).
template <class C>
C sigmoid(C x) {
  C e = exp_c(-std::abs(x));
  C r = C(1) / (C(1) + e);
  return x >= C(0) ? r : e * r;
}

// Two's-complement wrap-around for signed integers, without undefined overflow.
template <class C>
C wrap_neg(C x) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(U(0) - static_cast<U>(x));
}
template <class C>
C wrap_mul(C a, C b) {
  using U = std::make_unsigned_t<C>;
  return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

template <class T>
StoragePtr unary_float(const CpuStorage& in, const UnaryOp& op, const Layout& l) {
  using C = compute_t<T>;
  const C p0 = static_cast<C>(op.p0), p1 = static_cast<C>(op.p1);
  switch (op.kind) {
    case UnaryKind::Neg:
      return map_unary<T>(in, l, [](C x) { return -x; });
    case UnaryKind::Abs:
      return map_unary<T>(in, l, [](C x) { return std::abs(x); });
    case UnaryKind::Exp:
      return map_unary<T>(in, l, [](C x) { return exp_c(x); });
    case UnaryKind::Log:
      return map_unary<T>(in, l, [](C x) { return std::log(x); });
    case UnaryKind::Sqrt:
      return map_unary<T>(in, l, [](C x) { return std::sqrt(x); });
    case UnaryKind::Sqr:
      return map_unary<T>(in, l, [](C x) { return x * x; });
    case UnaryKind::Recip:
      return map_unary<T>(in, l, [](C x) { return C(1) / x; });
    case UnaryKind::Tanh:
      return map_unary<T>(in, l, [](C x) { return std::tanh(x); });
    case UnaryKind::Sin:
      return map_unary<T>(in, l, [](C x) { return std::sin(x); });
    case UnaryKind::Cos:
      return map_unary<T>(in, l, [](C x) { return std::cos(x); });
    case UnaryKind::Relu:
      return map_unary<T>(in, l, [](C x) { return x > C(0) ? x : C(0); });
    case UnaryKind::Silu:
      return map_unary<T>(in, l, [](C x) { return x * sigmoid(x); });
    case UnaryKind::Sigmoid:
      return map_unary<T>(in, l, [](C x) { return sigmoid(x); });
    case UnaryKind::Gelu:
      // Candle's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
      return map_unary<T>(in, l, [](C x) {
        const C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
        return C(0.5) * x * (C(1) + std::tanh(k * x * (C(1) + static_cast<C>(0.044715) * x * x)));
      });
    case UnaryKind::GeluErf:
      return map_unary<T>(in, l, [](C x) {
        return C(0.5) * x * (C(1) + std::erf(x * static_cast<C>(0.7071067811865476)));
      });
    case UnaryKind::Affine:
      return map_unary<T>(in, l, [=](C x) { return x * p0 + p1; });
    case UnaryKind::Powf:
      return map_unary<T>(in, l, [=](C x) { return std::pow(x, p0); });
    case UnaryKind::Clamp:
      return map_unary<T>(in, l, [=](C x) { return std::min(std::max(x, p0), p1); });
  }
  throw Error(str("unary: invalid op kind ", static_cast<int>(op.kind)));
}

template <class T>
StoragePtr unary_int(const CpuStorage& in, const UnaryOp& op, const Layout& l) {
  constexpr bool is_signed = std::is_signed_v<T>;
  switch (op.kind) {
    case UnaryKind::Abs:
      if constexpr (is_signed) {
        return map_unary<T>(in, l, [](T x) { return x < 0 ? wrap_neg(x) : x; });
      } else {
        return map_unary<T>(in, l, [](T x) { return x; });
      }
    case UnaryKind::Neg:
      if constexpr (is_signed) return map_unary<T>(in, l, [](T x) { return wrap_neg(x); });
      break;
    case UnaryKind::Sqr:
      if constexpr (std::is_same_v<T, uint8_t>) {
        return map_unary<T>(in, l, [](T x) { return static_cast<T>(x * x); });  // int: no overflow
      } else {
        return map_unary<T>(in, l, [](T x) { return wrap_mul(x, x); });
      }
    case UnaryKind::Relu:
      if constexpr (is_signed) {
        return map_unary<T>(in, l, [](T x) { return x > 0 ? x : T(0); });
      } else {
        return map_unary<T>(in, l, [](T x) { return x; });
      }
    case UnaryKind::Affine: {
      // In double, then back with saturation, as Candle's `(v as f64 * mul + add) as T`.
      const double mul = op.p0, add = op.p1;
      return map_unary<T>(in, l,
                          [=](T x) { return float_to_int<T>(static_cast<double>(x) * mul + add); });
    }
    case UnaryKind::Clamp: {
      // The bounds converted to T first (truncated, saturated), as Candle's clamp does.
      const T lo = float_to_int<T>(op.p0), hi = float_to_int<T>(op.p1);
      return map_unary<T>(in, l, [=](T x) { return std::min(std::max(x, lo), hi); });
    }
    default:
      break;
  }
  throw UnsupportedDType(str(unary_name(op.kind), ": unsupported dtype ", dtype_of<T>()));
}

}  // namespace

StoragePtr CpuStorage::unary(const UnaryOp& op, const Layout& layout) const {
  return dispatch(dtype_, [&]<class T>() -> StoragePtr {
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      return unary_float<T>(*this, op, layout);
    } else {
      return unary_int<T>(*this, op, layout);
    }
  });
}

}  // namespace wick::cpu
