#pragma once
// Transposes of square blocks of float vectors in registers, for the files compiled once per
// instruction set: include it after cpu/isa_begin.h, so that it is compiled for that set (its
// templates live in wick::cpu::WICK_ISA_NS, as the including file's code does). The including
// file includes the standard headers below before isa_begin.h, so that they keep the baseline
// instruction set (isa_begin.h says why) and these #includes do nothing.

#include <cstddef>
#include <cstdint>
#include <utility>

namespace wick::cpu {
inline namespace WICK_ISA_NS {

/// One transpose round at distance H over vectors of float lanes (GCC's vector extension, any
/// width): lane i of the first result takes lane i of a, or lane i - H of b where i has bit H;
/// the second takes lane i + H of a, or lane i of b. Indices as a pack for clang's
/// __builtin_shufflevector (GCC 12 has it too, older GCC only __builtin_shuffle).
template <size_t H, class V, size_t... I>
inline void shuffle_round(V& a, V& b, std::index_sequence<I...>) {
  constexpr size_t kLanes = sizeof(V) / sizeof(float);
#if defined(__clang__)
  V first = __builtin_shufflevector(a, b, ((I & H) ? I - H + kLanes : I)...);
  V second = __builtin_shufflevector(a, b, ((I & H) ? I + kLanes : I + H)...);
#else
  typedef int32_t Index __attribute__((vector_size(sizeof(V))));
  V first = __builtin_shuffle(a, b, Index{static_cast<int32_t>((I & H) ? I - H + kLanes : I)...});
  V second = __builtin_shuffle(a, b, Index{static_cast<int32_t>((I & H) ? I + kLanes : I + H)...});
#endif
  a = first;
  b = second;
}

/// x[i][j] -> x[j][i] for a block of as many vectors as each has lanes: log2(lanes) rounds of
/// two-vector shuffles.
template <class V, size_t H = sizeof(V) / sizeof(float) / 2>
inline void transpose(V* x) {
  constexpr size_t kLanes = sizeof(V) / sizeof(float);
  for (size_t i = 0; i < kLanes; ++i) {
    if (i & H) continue;
    shuffle_round<H>(x[i], x[i + H], std::make_index_sequence<kLanes>());
  }
  if constexpr (H > 1) transpose<V, H / 2>(x);
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
