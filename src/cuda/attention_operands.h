#pragma once
// What the attention kernels that take whole query blocks read of AttentionArgs (attention.cu,
// attention_wgmma.cu).

#include <cstdint>

#include "cuda/fused_kernels.h"

namespace wick::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;

// The operands of the kernels that take whole query blocks, elements of type E (the 16-bit
// words of f16/bf16 for the mma and rounded kernels, T for the split kernel), strides in
// elements.
template <class E>
struct Operands {
  const E* q;
  const E* k;
  const E* v;
  const E* mask;
  E* out;
  int64_t qs[3], ks[3], vs[3], ms[4];
  int h, group, s, s_kv;
  bool causal;
};
using HalfOperands = Operands<uint16_t>;

template <class E>
inline Operands<E> operands(const AttentionArgs& a) {
  Operands<E> p{};
  p.q = static_cast<const E*>(a.q);
  p.k = static_cast<const E*>(a.k);
  p.v = static_cast<const E*>(a.v);
  p.mask = static_cast<const E*>(a.mask);
  p.out = static_cast<E*>(a.out);
  for (int i = 0; i < 3; ++i) {
    p.qs[i] = a.q_strides[i];
    p.ks[i] = a.k_strides[i];
    p.vs[i] = a.v_strides[i];
  }
  for (int i = 0; i < 4; ++i) p.ms[i] = a.mask_strides[i];
  p.h = a.h;
  p.group = a.h / a.h_kv;
  p.s = a.s;
  p.s_kv = a.s_kv;
  p.causal = a.causal;
  return p;
}

}  // namespace wick::cuda
