// The CPU kernel of fused::RopeWriteOp for a decode step's cache (nn::detail::
// rope_write_at_position): one pass over qkv's rows that adds the bias, rotates the q and k
// heads by their position's table rows, writes the keys and values into the caches and q into
// its own tensor, with the arithmetic of the composed ops (broadcast_add, Tensor::rope). Paged
// caches, head norms and other dtypes than f32 take the composed fallback.

#include "fused/kv_write.h"

#include <cstdint>
#include <memory>

#include "cpu/cpu_storage.h"
#include "fused_op.h"
#include "ops/rope_math.h"
#include "tensor_internal.h"
#include "util.h"
#include "wick/error.h"

namespace wick::fused {

namespace {

template <class T>
T* data_of(const Tensor& t) {
  return cpu::as_cpu(detail::backend_of(t)).as<T>() + t.layout().start_offset();
}

}  // namespace

std::optional<TensorList> RopeWriteOp::cpu(const TensorList& in) const {
  const Tensor &qkv = in[0], &bias = in[1], &cos = in[2], &sin = in[3];
  const Tensor &k_cache = in[4], &v_cache = in[5], &position = in[6];
  if (in[7].defined() || in[8].defined() || in[9].defined() || qkv.dtype() != DType::F32) {
    return std::nullopt;
  }
  auto locks = detail::lock_inputs(*this, in);
  // The front end checked the shapes, dtypes and row-major caches; qkv, bias and the tables are
  // contiguous.
  const size_t b = qkv.dims()[0], s = qkv.dims()[1], d = k_cache.dims()[3];
  const size_t rot_half = cos.dims()[1];  // the tables' width: the rotated dims / 2
  const size_t max_len = k_cache.dims()[2], heads = h + 2 * h_kv;
  const size_t p = data_of<const uint32_t>(position)[0];
  if (p + s > cos.dims()[0]) {
    throw IndexOutOfRange(
        str("rope write: position ", p, " + ", s, " rows past the tables' ", cos.dims()[0]));
  }
  if (p + s > max_len) {
    throw IndexOutOfRange(
        str("kv write: position ", p, " + ", s, " rows past the cache's ", max_len));
  }
  const float* x = data_of<const float>(qkv);
  const float* bp = bias.defined() ? data_of<const float>(bias) : nullptr;
  const float* cp = data_of<const float>(cos);
  const float* sp = data_of<const float>(sin);
  float* kc = data_of<float>(k_cache);
  float* vc = data_of<float>(v_cache);
  auto out = cpu::device().alloc(b * h * s * d, DType::F32);
  float* q = cpu::as_cpu(*out).as<float>();
  auto same = [](float v) { return v; };
  std::unique_ptr<float[]> biased(bp != nullptr ? new float[heads * d] : nullptr);
  for (size_t bi = 0; bi < b; ++bi) {
    for (size_t si = 0; si < s; ++si) {
      const float* row = x + (bi * s + si) * heads * d;
      if (bp != nullptr) {
        for (size_t c = 0; c < heads * d; ++c) biased[c] = row[c] + bp[c];
        row = biased.get();
      }
      const float* c = cp + (p + si) * rot_half;
      const float* sn = sp + (p + si) * rot_half;
      // Head `hd` of the row rotated into dst (its first 2 rot_half dims; the rest copied).
      auto rotate = [&](size_t hd, float* dst) {
        const float* src = row + hd * d;
        for (size_t i = 0; i < rot_half; ++i) {
          dst[i] = ops::rope_lo(src[i], src[i + rot_half], c[i], sn[i], same);
          dst[i + rot_half] = ops::rope_hi(src[i], src[i + rot_half], c[i], sn[i], same);
        }
        for (size_t i = 2 * rot_half; i < d; ++i) dst[i] = src[i];
      };
      for (size_t hd = 0; hd < h; ++hd) rotate(hd, q + ((bi * h + hd) * s + si) * d);
      for (size_t hd = 0; hd < h_kv; ++hd) {
        const size_t at = ((bi * h_kv + hd) * max_len + p + si) * d;
        rotate(h + hd, kc + at);
        const float* v = row + (h + h_kv + hd) * d;
        for (size_t t = 0; t < d; ++t) vc[at + t] = v[t];
      }
    }
  }
  return TensorList{detail::from_storage(std::move(out), Shape{b, h, s, d})};
}

}  // namespace wick::fused
