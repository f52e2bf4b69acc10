// Unary element-wise ops: every op of wick/unary_ops.def on the dtypes it lists.
//
// Float compares (relu, clamp, the range checks in the float exp) only vectorise when GCC may
// assume they raise no visible FP exceptions (clang's default); nothing in wick reads the FP flags.
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
#include "ops/unary_math.h"
#include "util.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

// d[i] = op(x[i * sx]) for i < n; d is contiguous.
using UnarySegment = void (*)(void* d, const void* x, size_t sx, size_t n, const UnaryOp& op);

// One op of wick/unary_ops.def on a run: its math is ops::UnaryMath<K> (ops/unary_math.h), the
// same functor the CUDA kernels call, in the compute type (T itself for f32, f64 and integers).
template <class T, UnaryKind K>
void plain_segment(void* dv, const void* xv, size_t sx, size_t n, const UnaryOp& op) {
  const ops::UnaryParams p{op.p0, op.p1};
  map_run(static_cast<T*>(dv), static_cast<const T*>(xv), sx, n,
          [=](T x) -> T { return ops::UnaryMath<K>{}(x, p); });
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
    plain_segment<float, K>(out, in, 1, len, op);
    narrow_run(out, len, d + c);
  }
}

// The kernel of `kind` on T; only the dtypes the table lists are instantiated.
template <class T>
UnarySegment unary_kernel(UnaryKind kind) {
  switch (kind) {
#define WICK_UNARY_OP(K, ...)                                    \
  case UnaryKind::K:                                             \
    if constexpr (unary_supports(UnaryKind::K, dtype_of<T>())) { \
      if constexpr (is_half_v<T>) {                              \
        return &half_segment<T, UnaryKind::K>;                   \
      } else {                                                   \
        return &plain_segment<T, UnaryKind::K>;                  \
      }                                                          \
    }                                                            \
    break;
#include "wick/unary_ops.def"
  }
  throw UnsupportedDType(str(unary_name(kind), ": unsupported dtype ", dtype_of<T>()));
}

}  // namespace

StoragePtr unary(const CpuStorage& in, const UnaryOp& op, const Layout& layout) {
  UnarySegment kernel = dispatch(in.dtype(), [&]<class T>() { return unary_kernel<T>(op.kind); });
  const size_t elem = size_in_bytes(in.dtype());
  auto out = std::make_unique<CpuStorage>(layout.elem_count(), in.dtype());
  const size_t n = layout.elem_count();
  if (n == 0) return out;
  if (n < kElementwiseGrain && layout.is_contiguous()) {
    // Small and dense: one segment on this thread, no walk to build.
    kernel(out->data(), static_cast<const char*>(in.data()) + layout.start_offset() * elem, 1, n,
           op);
    return out;
  }
  Layout out_layout = Layout::contiguous(layout.shape());
  Walk<2> w = make_walk<2>({Operand{&out_layout, out->data(), elem}, {&layout, in.data(), elem}});
  // The output is contiguous: its segments have stride 1 (or hold one element).
  for_each_segment(w, [&](const std::array<char*, 2>& p, size_t len,
                          const std::array<size_t, 2>& s) { kernel(p[0], p[1], s[1], len, op); });
  return out;
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
