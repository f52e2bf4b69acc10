// Binary arithmetic, comparisons and where_cond: every op of WICK_BINARY_OPS and WICK_CMP_OPS
// (ops.h), their math from ops/binary_math.h (the functors the CPU loops call too).

#include "cuda/kernel_utils.cuh"
#include "ops/binary_math.h"
#include "util.h"

namespace wick::cuda {

namespace {

// One element: both operands widened to the compute type, the op's math from the table,
// converted back (rounded once).
template <BinaryKind K, class T>
struct BinaryFn {
  __device__ __forceinline__ T operator()(T x, T y) const {
    return convert<T>(ops::BinaryMath<K>{}(to_compute(x), to_compute(y)));
  }
};

template <CmpKind K, class T>
struct CmpFn {
  __device__ __forceinline__ uint8_t operator()(T x, T y) const {
    return ops::CmpMath<K>{}(to_compute(x), to_compute(y)) ? 1 : 0;
  }
};

template <class U>
struct WhereFn {
  __device__ __forceinline__ U operator()(uint8_t c, U t, U f) const { return c ? t : f; }
};

template <BinaryKind K>
void run(DType dtype, const void* lhs, const StridedView& lv, const void* rhs,
         const StridedView& rv, void* dst, size_t count, cudaStream_t s) {
  dispatch<DeviceTypes>(dtype, [&]<class T>() {
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
#define WICK_BINARY_CASE(K, name) \
  case BinaryKind::K:             \
    return run<BinaryKind::K>(dtype, lhs, lhs_view, rhs, rhs_view, dst, count, s);
    WICK_BINARY_OPS(WICK_BINARY_CASE)
#undef WICK_BINARY_CASE
  }
  throw Error("binary: invalid op on cuda");
}

void launch_cmp(CmpKind op, DType dtype, const void* lhs, const StridedView& lhs_view,
                const void* rhs, const StridedView& rhs_view, void* dst, size_t count,
                cudaStream_t s) {
  if (count == 0) return;
  switch (op) {
#define WICK_CMP_CASE(K, name)                                                                \
  case CmpKind::K:                                                                            \
    return dispatch<DeviceTypes>(dtype, [&]<class T>() {                                      \
      launch_map2(static_cast<const T*>(lhs), lhs_view, static_cast<const T*>(rhs), rhs_view, \
                  static_cast<uint8_t*>(dst), count, CmpFn<CmpKind::K, T>{}, s);              \
    });
    WICK_CMP_OPS(WICK_CMP_CASE)
#undef WICK_CMP_CASE
  }
  throw Error("cmp: invalid op on cuda");
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
