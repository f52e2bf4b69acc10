// Strided copies and dtype conversions on the CPU: copies move bits through an unsigned type of
// the element's size (any dtype), conversions go segment by segment (runs of the innermost dim)
// through one function per (to, from) pair, so that a strided source costs no per-element dispatch.

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "cpu/cpu_storage.h"
#include "cpu/elementwise.h"
#include "cpu/isa_begin.h"  // last
#include "cpu/kernels.h"
#include "dispatch.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_half_v<To>) {
    if constexpr (is_half_v<From> || std::is_same_v<From, float>) {
      return To(static_cast<float>(v));
    } else {
      return To(round_to_odd_float(static_cast<double>(v)));
    }
  } else if constexpr (std::is_floating_point_v<To>) {
    if constexpr (is_half_v<From>) {
      return static_cast<To>(static_cast<float>(v));
    } else {
      return static_cast<To>(v);
    }
  } else if constexpr (std::is_integral_v<From>) {
    return static_cast<To>(v);  // modular, as Candle's `as`
  } else {
    return float_to_int<To>(static_cast<double>(static_cast<compute_t<From>>(v)));
  }
}

// An unsigned integer type of the element's size: copies move bits, whatever the dtype.
template <size_t Bytes>
using bits_t = std::conditional_t<
    Bytes == 1, uint8_t,
    std::conditional_t<Bytes == 2, uint16_t, std::conditional_t<Bytes == 4, uint32_t, uint64_t>>>;

template <class U>
void copy_typed(const void* src, const Layout& src_layout, void* dst, const Layout& dst_layout) {
  Walk<2> w = make_walk<2>({Operand{&dst_layout, dst, sizeof(U)}, {&src_layout, src, sizeof(U)}});
  for_each_segment(w,
                   [&](const std::array<char*, 2>& p, size_t len, const std::array<size_t, 2>& s) {
                     U* __restrict d = reinterpret_cast<U*>(p[0]);
                     const U* __restrict x = reinterpret_cast<const U*>(p[1]);
                     if (s[0] == 1 && s[1] == 1) {
                       std::memcpy(d, x, len * sizeof(U));
                     } else {
                       for (size_t i = 0; i < len; ++i) d[i * s[0]] = x[i * s[1]];
                     }
                   });
}

}  // namespace

void copy_bytes(const void* src, const Layout& src_layout, void* dst, const Layout& dst_layout,
                size_t elem) {
  if (src_layout.elem_count() == 0) return;
  if (src_layout.is_contiguous() && dst_layout.is_contiguous()) {
    size_t n = src_layout.elem_count() * elem;
    const char* s = static_cast<const char*>(src) + src_layout.start_offset() * elem;
    char* d = static_cast<char*>(dst) + dst_layout.start_offset() * elem;
    parallel_for(n, size_t(1) << 20, [&](size_t b, size_t e) { std::memcpy(d + b, s + b, e - b); });
    return;
  }
  switch (elem) {
    case 1:
      return copy_typed<uint8_t>(src, src_layout, dst, dst_layout);
    case 2:
      return copy_typed<uint16_t>(src, src_layout, dst, dst_layout);
    case 4:
      return copy_typed<uint32_t>(src, src_layout, dst, dst_layout);
    default:
      return copy_typed<uint64_t>(src, src_layout, dst, dst_layout);
  }
}

namespace {

// d[i] = convert<To>(x[i * sx]) for i < n; d is contiguous.
using ConvertSegment = void (*)(void* d, const void* x, size_t sx, size_t n);

template <class To, class From>
void convert_segment(void* d, const void* x, size_t sx, size_t n) {
  map_run(static_cast<To*>(d), static_cast<const From*>(x), sx, n,
          [](From v) { return convert<To>(v); });
}

}  // namespace

StoragePtr to_dtype(const CpuStorage& in, const Layout& layout, DType dtype) {
  auto out = std::make_unique<CpuStorage>(layout.elem_count(), dtype);
  if (layout.elem_count() == 0) return out;
  Layout out_layout = Layout::contiguous(layout.shape());
  if (dtype == in.dtype()) {
    copy_bytes(in.data(), layout, out->data(), out_layout, size_in_bytes(dtype));
    return out;
  }
  ConvertSegment kernel = dispatch(in.dtype(), [&]<class From>() {
    return dispatch(dtype,
                    [&]<class To>() -> ConvertSegment { return &convert_segment<To, From>; });
  });
  Walk<2> w = make_walk<2>({Operand{&out_layout, out->data(), size_in_bytes(dtype)},
                            {&layout, in.data(), size_in_bytes(in.dtype())}});
  // The output is contiguous: its segments have stride 1 (or hold one element).
  for_each_segment(w, [&](const std::array<char*, 2>& p, size_t len,
                          const std::array<size_t, 2>& s) { kernel(p[0], p[1], s[1], len); });
  return out;
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
