// Binary arithmetic, comparisons and where_cond, with the CPU backend's semantics: integers wrap,
// x / 0 gives 0 for integers, i64 MIN / -1 gives MIN, float maximum/minimum propagate NaN.

#include "cuda/kernel_utils.cuh"
#include "util.h"

namespace wick::cuda {

namespace {

template <BinaryKind K, class T>
struct BinaryFn {
  __device__ __forceinline__ T operator()(T x, T y) const {
    using C = compute_t<T>;
    C a = to_compute(x), b = to_compute(y);
    C r;
    if constexpr (std::is_same_v<C, int64_t> &&
                  (K == BinaryKind::Add || K == BinaryKind::Sub || K == BinaryKind::Mul)) {
      // Signed overflow through unsigned: defined wrap-around.
      auto ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
      if constexpr (K == BinaryKind::Add)
        r = static_cast<C>(ua + ub);
      else if constexpr (K == BinaryKind::Sub)
        r = static_cast<C>(ua - ub);
      else
        r = static_cast<C>(ua * ub);
    } else if constexpr (K == BinaryKind::Add) {
      r = static_cast<C>(a + b);
    } else if constexpr (K == BinaryKind::Sub) {
      r = static_cast<C>(a - b);
    } else if constexpr (K == BinaryKind::Mul) {
      r = static_cast<C>(a * b);
    } else if constexpr (K == BinaryKind::Div) {
      if constexpr (std::is_integral_v<C>) {
        if (b == 0) {
          r = 0;
        } else if constexpr (std::is_signed_v<C>) {
          r = b == C(-1) ? static_cast<C>(0ull - static_cast<uint64_t>(a)) : a / b;
        } else {
          r = static_cast<C>(a / b);
        }
      } else {
        r = a / b;
      }
    } else if constexpr (K == BinaryKind::Maximum) {
      r = (a > b || a != a) ? a : b;
    } else {
      static_assert(K == BinaryKind::Minimum);
      r = (a < b || a != a) ? a : b;
    }
    return convert<T>(r);
  }
};

template <class T>
struct CmpFn {
  CmpKind op;
  __device__ __forceinline__ uint8_t operator()(T x, T y) const {
    auto a = to_compute(x), b = to_compute(y);
    switch (op) {
      case CmpKind::Eq:
        return a == b;
      case CmpKind::Ne:
        return a != b;
      case CmpKind::Lt:
        return a < b;
      case CmpKind::Le:
        return a <= b;
      case CmpKind::Gt:
        return a > b;
      case CmpKind::Ge:
        return a >= b;
    }
    return 0;
  }
};

template <class U>
struct WhereFn {
  __device__ __forceinline__ U operator()(uint8_t c, U t, U f) const { return c ? t : f; }
};

template <BinaryKind K>
void run(DType dtype, const void* lhs, const StridedView& lv, const void* rhs,
         const StridedView& rv, void* dst, size_t count, cudaStream_t s) {
  dispatch_dev(dtype, [&]<class T>() {
    launch_map2(static_cast<const T*>(lhs), lv, static_cast<const T*>(rhs), rv,
                static_cast<T*>(dst), count, BinaryFn<K, T>{}, s);
  });
}

}  // namespace

void launch_binary(BinaryKind op, DType dtype, const void* lhs, const StridedView& lhs_view,
                   const void* rhs, const StridedView& rhs_view, void* dst, size_t count,
                   cudaStream_t s) {
  if (count == 0) return;
  switch (op) {
    case BinaryKind::Add:
      return run<BinaryKind::Add>(dtype, lhs, lhs_view, rhs, rhs_view, dst, count, s);
    case BinaryKind::Sub:
      return run<BinaryKind::Sub>(dtype, lhs, lhs_view, rhs, rhs_view, dst, count, s);
    case BinaryKind::Mul:
      return run<BinaryKind::Mul>(dtype, lhs, lhs_view, rhs, rhs_view, dst, count, s);
    case BinaryKind::Div:
      return run<BinaryKind::Div>(dtype, lhs, lhs_view, rhs, rhs_view, dst, count, s);
    case BinaryKind::Maximum:
      return run<BinaryKind::Maximum>(dtype, lhs, lhs_view, rhs, rhs_view, dst, count, s);
    case BinaryKind::Minimum:
      return run<BinaryKind::Minimum>(dtype, lhs, lhs_view, rhs, rhs_view, dst, count, s);
  }
  throw Error("binary: invalid op on cuda");
}

void launch_cmp(CmpKind op, DType dtype, const void* lhs, const StridedView& lhs_view,
                const void* rhs, const StridedView& rhs_view, void* dst, size_t count,
                cudaStream_t s) {
  if (count == 0) return;
  dispatch_dev(dtype, [&]<class T>() {
    launch_map2(static_cast<const T*>(lhs), lhs_view, static_cast<const T*>(rhs), rhs_view,
                static_cast<uint8_t*>(dst), count, CmpFn<T>{op}, s);
  });
}

void launch_where(const void* cond, const StridedView& cond_view, DType dtype, const void* on_true,
                  const StridedView& true_view, const void* on_false, const StridedView& false_view,
                  void* dst, size_t count, cudaStream_t s) {
  if (count == 0) return;
  // Only bits move: one kernel per element size.
  dispatch_size(size_in_bytes(dtype), [&]<class U>() {
    launch_map3(static_cast<const uint8_t*>(cond), cond_view, static_cast<const U*>(on_true),
                true_view, static_cast<const U*>(on_false), false_view, static_cast<U*>(dst), count,
                WhereFn<U>{}, s);
  });
}

}  // namespace wick::cuda
