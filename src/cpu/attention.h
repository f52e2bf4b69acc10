#pragma once
// The operands of one CPU attention call, shared by the f64 and f16/bf16 kernels
// (src/cpu/attention.cpp) and the f32 one compiled per instruction set
// (src/cpu/attention_f32.cpp).

#include <algorithm>
#include <cstddef>
#include <vector>

#include "cpu/cpu_storage.h"

namespace wick::cpu {

/// The attention op's settings (fused::AttentionOp): scale already resolved; causal aligns the
/// last query with the last key; window > 0 keeps the keys j > i + shift - window; softcap > 0
/// maps each scaled score x to softcap tanh(x / softcap) before the mask.
struct AttentionParams {
  double scale;
  bool causal;
  size_t window = 0;
  double softcap = 0;
};

struct View4 {
  size_t dims[4];
  size_t strides[4];
};

inline View4 view4(const Layout& l) {
  View4 v{};
  for (size_t i = 0; i < 4; ++i) {
    v.dims[i] = l.dims()[i];
    v.strides[i] = l.strides()[i];
  }
  return v;
}

/// One attention call: the operands as typed pointers and 4-d views, the sizes, and the split
/// into work items of `tile_rows` rows. The rows of an item are (query head of the group, query)
/// pairs, head-major: the heads that share a k/v head share its tiles too (decoding: the whole
/// group in one item).
template <class T>
struct Problem {
  View4 qv, kv, vv, mv{};
  const T *qp, *kp, *vp, *mp = nullptr;
  bool has_mask;
  size_t nb, nh, s, d, nh_kv, s_kv, group;
  long shift;  // causal: query i sees keys j <= i + shift (the last query sees the last key)
  size_t group_rows, q_tiles, items;

  Problem(const std::vector<KernelOperand>& ops, size_t tile_rows)
      : qv(view4(ops[0].layout)),
        kv(view4(ops[1].layout)),
        vv(view4(ops[2].layout)),
        qp(data(ops[0])),
        kp(data(ops[1])),
        vp(data(ops[2])),
        has_mask(ops.size() > 3 && ops[3].storage != nullptr) {
    if (has_mask) {
      mv = view4(ops[3].layout);
      mp = data(ops[3]);
    }
    nb = qv.dims[0];
    nh = qv.dims[1];
    s = qv.dims[2];
    d = qv.dims[3];
    nh_kv = kv.dims[1];
    s_kv = kv.dims[2];
    group = nh / nh_kv;
    shift = static_cast<long>(s_kv) - static_cast<long>(s);
    group_rows = group * s;
    q_tiles = (group_rows + tile_rows - 1) / tile_rows;
    items = nb * nh_kv * q_tiles;
  }

  static const T* data(const KernelOperand& op) {
    return as_cpu(*op.storage).as<T>() + op.layout.start_offset();
  }

  /// The first key query qi sees: 0, or with a window the oldest key inside it.
  long first_key(const AttentionParams& p, size_t qi) const {
    if (p.window == 0) return 0;
    return std::max(0L, static_cast<long>(qi) + shift - static_cast<long>(p.window) + 1);
  }
};

}  // namespace wick::cpu
