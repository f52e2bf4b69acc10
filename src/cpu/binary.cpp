// Binary arithmetic, comparisons and where_cond. The ops are WICK_BINARY_OPS and WICK_CMP_OPS
// (ops.h); their math, with its integer semantics, is ops/binary_math.h, shared with CUDA.

// Float compares (maximum, minimum, cmp) only vectorise when GCC may assume they raise no visible
// FP exceptions (clang's default); nothing in wick reads the FP flags.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <type_traits>

#include "cpu/cpu_storage.h"
#include "cpu/elementwise.h"
#include "cpu/isa_begin.h"  // last
#include "cpu/kernels.h"
#include "dispatch.h"
#include "ops/binary_math.h"
#include "util.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

// d[i] = op(x[i * sx], y[i * sy]) for i < n; d is contiguous.
using BinarySegment = void (*)(void* d, const void* x, size_t sx, const void* y, size_t sy,
                               size_t n);

// Arithmetic (R = T) and comparisons (R = uint8_t) on every dtype but f16/bf16.
template <class T, class R, class Op>
void plain_segment(void* d, const void* x, size_t sx, const void* y, size_t sy, size_t n) {
  map_run2(static_cast<R*>(d), static_cast<const T*>(x), sx, static_cast<const T*>(y), sy, n,
           [](T a, T b) { return static_cast<R>(Op{}(a, b)); });
}

// f16/bf16: both operands widened to float a chunk at a time, the float op, results rounded once
// (comparisons store their bytes directly).
template <class H, class R, class Op>
void half_segment(void* dv, const void* xv, size_t sx, const void* yv, size_t sy, size_t n) {
  R* d = static_cast<R*>(dv);
  const H* x = static_cast<const H*>(xv);
  const H* y = static_cast<const H*>(yv);
  float xb[kChunk], yb[kChunk], rb[kChunk];
  for (size_t c = 0; c < n; c += kChunk) {
    size_t len = std::min(kChunk, n - c);
    // A broadcast operand is widened once and stays broadcast.
    widen_run(x + c * sx, sx, sx == 0 ? 1 : len, xb);
    widen_run(y + c * sy, sy, sy == 0 ? 1 : len, yb);
    const size_t ux = sx == 0 ? 0 : 1, uy = sy == 0 ? 0 : 1;
    if constexpr (std::is_same_v<R, H>) {
      plain_segment<float, float, Op>(rb, xb, ux, yb, uy, len);
      narrow_run(rb, len, d + c);
    } else {
      plain_segment<float, R, Op>(d + c, xb, ux, yb, uy, len);
    }
  }
}

template <class T, class R, class Op>
constexpr BinarySegment kernel() {
  if constexpr (is_half_v<T>) {
    return &half_segment<T, R, Op>;
  } else {
    return &plain_segment<T, R, Op>;
  }
}

// The kernels of the table's ops (ops.h), their math from ops/binary_math.h.
template <class T>
BinarySegment binary_kernel(BinaryKind op) {
  switch (op) {
#define WICK_BINARY_KERNEL(K, name) \
  case BinaryKind::K:               \
    return kernel<T, T, ops::BinaryMath<BinaryKind::K>>();
    WICK_BINARY_OPS(WICK_BINARY_KERNEL)
#undef WICK_BINARY_KERNEL
  }
  throw Error(str("binary: invalid op kind ", static_cast<int>(op)));
}

template <class T>
BinarySegment cmp_kernel(CmpKind op) {
  switch (op) {
#define WICK_CMP_KERNEL(K, name) \
  case CmpKind::K:               \
    return kernel<T, uint8_t, ops::CmpMath<CmpKind::K>>();
    WICK_CMP_OPS(WICK_CMP_KERNEL)
#undef WICK_CMP_KERNEL
  }
  throw Error(str("cmp: invalid op kind ", static_cast<int>(op)));
}

// out = kernel(lhs, rhs) over the layouts' shape, out contiguous of dtype out_dtype.
StoragePtr run_binary(BinarySegment kernel, DType out_dtype, const CpuStorage& lhs,
                      const Layout& ll, const CpuStorage& rhs, const Layout& rl) {
  auto out = std::make_unique<CpuStorage>(ll.elem_count(), out_dtype);
  const size_t n = ll.elem_count();
  if (n == 0) return out;
  const size_t elem = size_in_bytes(lhs.dtype());
  if (n < kElementwiseGrain && ll.is_contiguous() && rl.is_contiguous()) {
    // Small and dense: one segment on this thread, no walk to build.
    kernel(out->data(), static_cast<const char*>(lhs.data()) + ll.start_offset() * elem, 1,
           static_cast<const char*>(rhs.data()) + rl.start_offset() * elem, 1, n);
    return out;
  }
  Layout out_layout = Layout::contiguous(ll.shape());
  Walk<3> w = make_walk<3>({Operand{&out_layout, out->data(), size_in_bytes(out_dtype)},
                            {&ll, lhs.data(), elem},
                            {&rl, rhs.data(), elem}});
  // The output is contiguous: its segments have stride 1 (or hold one element).
  for_each_segment(w,
                   [&](const std::array<char*, 3>& p, size_t len, const std::array<size_t, 3>& s) {
                     kernel(p[0], p[1], s[1], p[2], s[2], len);
                   });
  return out;
}

}  // namespace

StoragePtr binary(const CpuStorage& lhs, BinaryKind op, const Layout& lhs_layout,
                  const CpuStorage& rhs, const Layout& rhs_layout) {
  BinarySegment k = dispatch(lhs.dtype(), [&]<class T>() { return binary_kernel<T>(op); });
  return run_binary(k, lhs.dtype(), lhs, lhs_layout, rhs, rhs_layout);
}

StoragePtr cmp(const CpuStorage& lhs, CmpKind op, const Layout& lhs_layout, const CpuStorage& rhs,
               const Layout& rhs_layout) {
  BinarySegment k = dispatch(lhs.dtype(), [&]<class T>() { return cmp_kernel<T>(op); });
  return run_binary(k, DType::U8, lhs, lhs_layout, rhs, rhs_layout);
}

namespace {

// where_cond moves bits: one instantiation per element size.
template <class U>
StoragePtr where_bits(const CpuStorage& cond, const Layout& layout, const CpuStorage& ts,
                      const Layout& true_layout, const CpuStorage& fs, const Layout& false_layout) {
  auto out = std::make_unique<CpuStorage>(layout.elem_count(), ts.dtype());
  if (layout.elem_count() == 0) return out;
  Layout out_layout = Layout::contiguous(layout.shape());
  Walk<4> w = make_walk<4>({Operand{&out_layout, out->data(), sizeof(U)},
                            {&layout, cond.data(), 1},
                            {&true_layout, ts.data(), sizeof(U)},
                            {&false_layout, fs.data(), sizeof(U)}});
  for_each_segment(w,
                   [&](const std::array<char*, 4>& p, size_t len, const std::array<size_t, 4>& s) {
                     U* __restrict d = reinterpret_cast<U*>(p[0]);
                     const uint8_t* __restrict c = reinterpret_cast<const uint8_t*>(p[1]);
                     const U* __restrict x = reinterpret_cast<const U*>(p[2]);
                     const U* __restrict y = reinterpret_cast<const U*>(p[3]);
                     if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
                       for (size_t i = 0; i < len; ++i) d[i] = c[i] ? x[i] : y[i];
                     } else {
                       for (size_t i = 0; i < len; ++i)
                         d[i * s[0]] = c[i * s[1]] ? x[i * s[2]] : y[i * s[3]];
                     }
                   });
  return out;
}

}  // namespace

StoragePtr where_cond(const CpuStorage& cond, const Layout& layout, const CpuStorage& ts,
                      const Layout& true_layout, const CpuStorage& fs, const Layout& false_layout) {
  switch (size_in_bytes(ts.dtype())) {
    case 1:
      return where_bits<uint8_t>(cond, layout, ts, true_layout, fs, false_layout);
    case 2:
      return where_bits<uint16_t>(cond, layout, ts, true_layout, fs, false_layout);
    case 4:
      return where_bits<uint32_t>(cond, layout, ts, true_layout, fs, false_layout);
    default:
      return where_bits<uint64_t>(cond, layout, ts, true_layout, fs, false_layout);
  }
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
