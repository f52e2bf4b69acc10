// Unary element-wise ops: every op of wick/unary_ops.def on the dtypes it lists, its math
// from ops/unary_math.h (the functor the CPU loops call too); f16/bf16 compute in float.

#include "cuda/kernel_utils.cuh"
#include "ops/unary_math.h"
#include "util.h"

namespace wick::cuda {

namespace {

// One element: widened to the compute type, the op's math, converted back (rounded once).
template <UnaryKind K, class T>
struct UnaryFn {
  ops::UnaryParams p;
  __device__ __forceinline__ T operator()(T x) const {
    return convert<T>(ops::UnaryMath<K>{}(to_compute(x), p));
  }
};

template <UnaryKind K>
void run(const UnaryOp& op, DType dtype, const void* src, const StridedView& view, void* dst,
         size_t count, cudaStream_t s) {
  dispatch(dtype, [&]<class H>() {
    // Only the dtypes the table lists are instantiated, to keep nvcc builds short.
    if constexpr (unary_supports(K, dtype_of<H>())) {
      using T = device_t<H>;
      launch_map1(static_cast<const T*>(src), view, static_cast<T*>(dst), count,
                  UnaryFn<K, T>{{op.p0, op.p1}}, s);
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
#define WICK_UNARY_OP(K, ...) \
  case UnaryKind::K:          \
    return run<UnaryKind::K>(op, dtype, src, src_view, dst, count, s);
#include "wick/unary_ops.def"
  }
  throw Error("unary: invalid op on cuda");
}

}  // namespace wick::cuda
