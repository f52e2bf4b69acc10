// Binary arithmetic, comparisons and where_cond.
//
// Integer semantics (no undefined behaviour anywhere): add, sub and mul wrap around modulo 2^bits
// (two's complement for i64); division truncates toward zero, x / 0 gives 0, and i64 MIN / -1
// gives MIN (the wrapped result). Float maximum/minimum propagate NaN.

// Float compares (maximum, minimum, cmp) only vectorise when GCC may assume they raise no visible
// FP exceptions (clang's default); nothing in wick reads the FP flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <type_traits>

#include "cpu/cpu_storage.h"
#include "cpu/elementwise.h"
#include "dispatch.h"
#include "util.h"

namespace wick::cpu {

namespace {

template <class C>
constexpr bool is_signed_int_v = std::is_integral_v<C>&& std::is_signed_v<C>;

// Arithmetic in the compute type C; signed integers go through unsigned to wrap without UB, u8 is
// promoted to int by the language and truncated back on the store (well defined).
struct AddOp {
  template <class C>
  C operator()(C a, C b) const {
    if constexpr (is_signed_int_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return static_cast<C>(a + b);
    }
  }
};
struct SubOp {
  template <class C>
  C operator()(C a, C b) const {
    if constexpr (is_signed_int_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
    } else {
      return static_cast<C>(a - b);
    }
  }
};
struct MulOp {
  template <class C>
  C operator()(C a, C b) const {
    if constexpr (is_signed_int_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
    } else if constexpr (std::is_same_v<C, uint32_t>) {
      return a * b;  // unsigned: wraps
    } else {
      return static_cast<C>(a * b);  // u8 (promoted to int: no overflow) and floats
    }
  }
};
struct DivOp {
  template <class C>
  C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      if (b == 0) return C(0);
      if constexpr (std::is_signed_v<C>) {
        if (b == C(-1)) return SubOp{}(C(0), a);  // MIN / -1 overflows; wrap like neg
      }
      return static_cast<C>(a / b);
    } else {
      return a / b;
    }
  }
};
struct MaxOp {
  template <class C>
  C operator()(C a, C b) const {
    return (a > b || a != a) ? a : b;  // a != a: NaN in a wins; NaN in b fails a > b
  }
};
struct MinOp {
  template <class C>
  C operator()(C a, C b) const {
    return (a < b || a != a) ? a : b;
  }
};

// out[i] = f(lhs[i], rhs[i]) with results of type R (T for arithmetic, uint8_t for comparisons).
template <class T, class R, class F>
std::unique_ptr<CpuStorage> map_binary(const CpuStorage& lhs, const Layout& ll,
                                       const CpuStorage& rhs, const Layout& rl, F f) {
  using C = compute_t<T>;
  std::unique_ptr<CpuStorage> out = std::make_unique<CpuStorage>(ll.elem_count(), dtype_of<R>());
  if (ll.elem_count() == 0) return out;
  Layout out_layout = Layout::contiguous(ll.shape());
  Walk<3> w = make_walk<3>({Operand{&out_layout, out->data(), sizeof(R)},
                            {&ll, lhs.data(), sizeof(T)},
                            {&rl, rhs.data(), sizeof(T)}});
  for_each_segment(
      w, [&](const std::array<char*, 3>& p, size_t len, const std::array<size_t, 3>& s) {
        R* __restrict d = reinterpret_cast<R*>(p[0]);
        const T* __restrict x = reinterpret_cast<const T*>(p[1]);
        const T* __restrict y = reinterpret_cast<const T*>(p[2]);
        if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
          for (size_t i = 0; i < len; ++i) d[i] = R(f(static_cast<C>(x[i]), static_cast<C>(y[i])));
        } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {  // rhs broadcast along this dim
          const C yv = static_cast<C>(y[0]);
          for (size_t i = 0; i < len; ++i) d[i] = R(f(static_cast<C>(x[i]), yv));
        } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {  // lhs broadcast along this dim
          const C xv = static_cast<C>(x[0]);
          for (size_t i = 0; i < len; ++i) d[i] = R(f(xv, static_cast<C>(y[i])));
        } else {
          for (size_t i = 0; i < len; ++i) {
            d[i * s[0]] = R(f(static_cast<C>(x[i * s[1]]), static_cast<C>(y[i * s[2]])));
          }
        }
      });
  return out;
}

template <class T>
StoragePtr binary_typed(BinaryKind op, const CpuStorage& lhs, const Layout& ll,
                        const CpuStorage& rhs, const Layout& rl) {
  switch (op) {
    case BinaryKind::Add:
      return map_binary<T, T>(lhs, ll, rhs, rl, AddOp{});
    case BinaryKind::Sub:
      return map_binary<T, T>(lhs, ll, rhs, rl, SubOp{});
    case BinaryKind::Mul:
      return map_binary<T, T>(lhs, ll, rhs, rl, MulOp{});
    case BinaryKind::Div:
      return map_binary<T, T>(lhs, ll, rhs, rl, DivOp{});
    case BinaryKind::Maximum:
      return map_binary<T, T>(lhs, ll, rhs, rl, MaxOp{});
    case BinaryKind::Minimum:
      return map_binary<T, T>(lhs, ll, rhs, rl, MinOp{});
  }
  throw Error(str("binary: invalid op kind ", static_cast<int>(op)));
}

template <class T>
StoragePtr cmp_typed(CmpKind op, const CpuStorage& lhs, const Layout& ll, const CpuStorage& rhs,
                     const Layout& rl) {
  using C = compute_t<T>;
  switch (op) {
    case CmpKind::Eq:
      return map_binary<T, uint8_t>(lhs, ll, rhs, rl, [](C a, C b) { return uint8_t(a == b); });
    case CmpKind::Ne:
      return map_binary<T, uint8_t>(lhs, ll, rhs, rl, [](C a, C b) { return uint8_t(a != b); });
    case CmpKind::Lt:
      return map_binary<T, uint8_t>(lhs, ll, rhs, rl, [](C a, C b) { return uint8_t(a < b); });
    case CmpKind::Le:
      return map_binary<T, uint8_t>(lhs, ll, rhs, rl, [](C a, C b) { return uint8_t(a <= b); });
    case CmpKind::Gt:
      return map_binary<T, uint8_t>(lhs, ll, rhs, rl, [](C a, C b) { return uint8_t(a > b); });
    case CmpKind::Ge:
      return map_binary<T, uint8_t>(lhs, ll, rhs, rl, [](C a, C b) { return uint8_t(a >= b); });
  }
  throw Error(str("cmp: invalid op kind ", static_cast<int>(op)));
}

}  // namespace

StoragePtr CpuStorage::binary(BinaryKind op, const Layout& layout, const BackendStorage& rhs,
                              const Layout& rhs_layout) const {
  return dispatch(dtype_, [&]<class T>() {
    return binary_typed<T>(op, *this, layout, as_cpu(rhs), rhs_layout);
  });
}

StoragePtr CpuStorage::cmp(CmpKind op, const Layout& layout, const BackendStorage& rhs,
                           const Layout& rhs_layout) const {
  return dispatch(
      dtype_, [&]<class T>() { return cmp_typed<T>(op, *this, layout, as_cpu(rhs), rhs_layout); });
}

StoragePtr CpuStorage::where_cond(const Layout& layout, const BackendStorage& on_true,
                                  const Layout& true_layout, const BackendStorage& on_false,
                                  const Layout& false_layout) const {
  const CpuStorage& ts = as_cpu(on_true);
  const CpuStorage& fs = as_cpu(on_false);
  return dispatch(ts.dtype(), [&]<class T>() -> StoragePtr {
    std::unique_ptr<CpuStorage> out =
        std::make_unique<CpuStorage>(layout.elem_count(), dtype_of<T>());
    if (layout.elem_count() == 0) return out;
    Layout out_layout = Layout::contiguous(layout.shape());
    Walk<4> w = make_walk<4>({Operand{&out_layout, out->data(), sizeof(T)},
                              {&layout, data(), 1},
                              {&true_layout, ts.data(), sizeof(T)},
                              {&false_layout, fs.data(), sizeof(T)}});
    for_each_segment(
        w, [&](const std::array<char*, 4>& p, size_t len, const std::array<size_t, 4>& s) {
          T* __restrict d = reinterpret_cast<T*>(p[0]);
          const uint8_t* __restrict c = reinterpret_cast<const uint8_t*>(p[1]);
          const T* __restrict x = reinterpret_cast<const T*>(p[2]);
          const T* __restrict y = reinterpret_cast<const T*>(p[3]);
          if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
            for (size_t i = 0; i < len; ++i) d[i] = c[i] ? x[i] : y[i];
          } else {
            for (size_t i = 0; i < len; ++i) d[i * s[0]] = c[i * s[1]] ? x[i * s[2]] : y[i * s[3]];
          }
        });
    return out;
  });
}

}  // namespace wick::cpu
