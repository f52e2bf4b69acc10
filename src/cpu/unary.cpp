// Float compares (relu, clamp, the range checks in vec_expf) only vectorise when GCC may assume
// they raise no visible FP exceptions (clang's default); nothing in wick reads the FP flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <cmath>
#include <type_traits>

#include "cpu/cpu_storage.h"
#include "cpu/elementwise.h"
#include "cpu/isa_begin.h"  // last
#include "cpu/kernels.h"
#include "dispatch.h"
#include "util.h"

namespace wick::cpu::inline WICK_ISA_NS {

namespace {

// d[i] = op(x[i * sx]) for i < n; d is contiguous.
using UnarySegment = void (*)(void* d, const void* x, size_t sx, size_t n, const UnaryOp& op);

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

// Float ops on f32 and f64 (f16 and bf16 go through float chunks, below).
template <class C, UnaryKind K>
void float_segment(void* dv, const void* xv, size_t sx, size_t n, const UnaryOp& op) {
  const C p0 = static_cast<C>(op.p0), p1 = static_cast<C>(op.p1);
  auto f = [=](C x) -> C {
    if constexpr (K == UnaryKind::Neg) {
      return -x;
    } else if constexpr (K == UnaryKind::Abs) {
      return std::abs(x);
    } else if constexpr (K == UnaryKind::Exp) {
      return exp_c(x);
    } else if constexpr (K == UnaryKind::Log) {
      return std::log(x);
    } else if constexpr (K == UnaryKind::Sqrt) {
      return std::sqrt(x);
    } else if constexpr (K == UnaryKind::Sqr) {
      return x * x;
    } else if constexpr (K == UnaryKind::Recip) {
      return C(1) / x;
    } else if constexpr (K == UnaryKind::Tanh) {
      return std::tanh(x);
    } else if constexpr (K == UnaryKind::Sin) {
      return std::sin(x);
    } else if constexpr (K == UnaryKind::Cos) {
      return std::cos(x);
    } else if constexpr (K == UnaryKind::Relu) {
      return x > C(0) ? x : C(0);
    } else if constexpr (K == UnaryKind::Silu) {
      return x * sigmoid(x);
    } else if constexpr (K == UnaryKind::Sigmoid) {
      return sigmoid(x);
    } else if constexpr (K == UnaryKind::Gelu) {
      // Candle's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
      const C k = static_cast<C>(0.7978845608028654);  // sqrt(2 / pi)
      return C(0.5) * x * (C(1) + std::tanh(k * x * (C(1) + static_cast<C>(0.044715) * x * x)));
    } else if constexpr (K == UnaryKind::GeluErf) {
      return C(0.5) * x * (C(1) + std::erf(x * static_cast<C>(0.7071067811865476)));
    } else if constexpr (K == UnaryKind::Affine) {
      return x * p0 + p1;
    } else if constexpr (K == UnaryKind::Powf) {
      return std::pow(x, p0);
    } else {
      static_assert(K == UnaryKind::Clamp);
      return std::min(std::max(x, p0), p1);
    }
  };
  map_run(static_cast<C*>(dv), static_cast<const C*>(xv), sx, n, f);
}

// f16/bf16: widened to float a chunk at a time, the float op, rounded once on the store.
template <class H, UnaryKind K>
void half_segment(void* dv, const void* xv, size_t sx, size_t n, const UnaryOp& op) {
  H* d = static_cast<H*>(dv);
  const H* x = static_cast<const H*>(xv);
  float in[kChunk], out[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    size_t len = std::min(kChunk, n - c);
    widen_run(x + c * sx, sx, len, in);
    float_segment<float, K>(out, in, 1, len, op);
    narrow_run(out, len, d + c);
  }
}

template <class T, UnaryKind K>
constexpr UnarySegment float_kernel() {
  if constexpr (is_half_v<T>) {
    return &half_segment<T, K>;
  } else {
    return &float_segment<T, K>;
  }
}

template <class T>
UnarySegment float_kernel(UnaryKind kind) {
  switch (kind) {
    case UnaryKind::Neg:
      return float_kernel<T, UnaryKind::Neg>();
    case UnaryKind::Abs:
      return float_kernel<T, UnaryKind::Abs>();
    case UnaryKind::Exp:
      return float_kernel<T, UnaryKind::Exp>();
    case UnaryKind::Log:
      return float_kernel<T, UnaryKind::Log>();
    case UnaryKind::Sqrt:
      return float_kernel<T, UnaryKind::Sqrt>();
    case UnaryKind::Sqr:
      return float_kernel<T, UnaryKind::Sqr>();
    case UnaryKind::Recip:
      return float_kernel<T, UnaryKind::Recip>();
    case UnaryKind::Tanh:
      return float_kernel<T, UnaryKind::Tanh>();
    case UnaryKind::Sin:
      return float_kernel<T, UnaryKind::Sin>();
    case UnaryKind::Cos:
      return float_kernel<T, UnaryKind::Cos>();
    case UnaryKind::Relu:
      return float_kernel<T, UnaryKind::Relu>();
    case UnaryKind::Silu:
      return float_kernel<T, UnaryKind::Silu>();
    case UnaryKind::Sigmoid:
      return float_kernel<T, UnaryKind::Sigmoid>();
    case UnaryKind::Gelu:
      return float_kernel<T, UnaryKind::Gelu>();
    case UnaryKind::GeluErf:
      return float_kernel<T, UnaryKind::GeluErf>();
    case UnaryKind::Affine:
      return float_kernel<T, UnaryKind::Affine>();
    case UnaryKind::Powf:
      return float_kernel<T, UnaryKind::Powf>();
    case UnaryKind::Clamp:
      return float_kernel<T, UnaryKind::Clamp>();
  }
  throw Error(str("unary: invalid op kind ", static_cast<int>(kind)));
}

// Integer ops: abs, neg (signed), sqr and relu wrap like Candle's; affine runs in double and
// saturates back, clamp converts its bounds to T first (truncated, saturated), as Candle does.
template <class T, UnaryKind K>
void int_segment(void* dv, const void* xv, size_t sx, size_t n, const UnaryOp& op) {
  const double mul = op.p0, add = op.p1;
  const T lo = float_to_int<T>(op.p0), hi = float_to_int<T>(op.p1);
  auto f = [=](T x) -> T {
    if constexpr (K == UnaryKind::Abs) {
      if constexpr (std::is_signed_v<T>) {
        return x < 0 ? wrap_neg(x) : x;
      } else {
        return x;
      }
    } else if constexpr (K == UnaryKind::Neg) {
      return wrap_neg(x);
    } else if constexpr (K == UnaryKind::Sqr) {
      if constexpr (std::is_same_v<T, uint8_t>) {
        return static_cast<T>(x * x);  // int: no overflow
      } else {
        return wrap_mul(x, x);
      }
    } else if constexpr (K == UnaryKind::Relu) {
      return x > 0 ? x : T(0);
    } else if constexpr (K == UnaryKind::Affine) {
      return float_to_int<T>(static_cast<double>(x) * mul + add);
    } else {
      static_assert(K == UnaryKind::Clamp);
      return std::min(std::max(x, lo), hi);
    }
  };
  map_run(static_cast<T*>(dv), static_cast<const T*>(xv), sx, n, f);
}

template <class T>
UnarySegment int_kernel(UnaryKind kind) {
  constexpr bool is_signed = std::is_signed_v<T>;
  switch (kind) {
    case UnaryKind::Abs:
      return &int_segment<T, UnaryKind::Abs>;
    case UnaryKind::Neg:
      if constexpr (is_signed) return &int_segment<T, UnaryKind::Neg>;
      break;
    case UnaryKind::Sqr:
      return &int_segment<T, UnaryKind::Sqr>;
    case UnaryKind::Relu:
      return &int_segment<T, UnaryKind::Relu>;
    case UnaryKind::Affine:
      return &int_segment<T, UnaryKind::Affine>;
    case UnaryKind::Clamp:
      return &int_segment<T, UnaryKind::Clamp>;
    default:
      break;
  }
  throw UnsupportedDType(str(unary_name(kind), ": unsupported dtype ", dtype_of<T>()));
}

}  // namespace

StoragePtr unary(const CpuStorage& in, const UnaryOp& op, const Layout& layout) {
  UnarySegment kernel = dispatch(in.dtype(), [&]<class T>() {
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      return float_kernel<T>(op.kind);
    } else {
      return int_kernel<T>(op.kind);
    }
  });
  const size_t elem = size_in_bytes(in.dtype());
  auto out = std::make_unique<CpuStorage>(layout.elem_count(), in.dtype());
  if (layout.elem_count() == 0) return out;
  Layout out_layout = Layout::contiguous(layout.shape());
  Walk<2> w = make_walk<2>({Operand{&out_layout, out->data(), elem}, {&layout, in.data(), elem}});
  // The output is contiguous: its segments have stride 1 (or hold one element).
  for_each_segment(w, [&](const std::array<char*, 2>& p, size_t len,
                          const std::array<size_t, 2>& s) { kernel(p[0], p[1], s[1], len, op); });
  return out;
}

}  // namespace wick::cpu::inline WICK_ISA_NS
