// The CPU kernel of fused::VarlenAttentionOp (f32): one work item per (sequence, head), each
// over the sequence's own tokens only, so a sequence's result does not depend on the others in
// the batch, on their lengths or on the thread count. An item copies its keys transposed (d rows
// of the sequence's length, padded to 16) and its values (s rows of d), then takes the queries
// four at a time: scores for 16 keys at once (each key vector loaded once for the four queries),
// the softmax in f32 with the vectorised exp, and p v summed over the keys in order, 16 columns
// of the four queries at a time.

#include "fused/varlen_attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "cpu/cpu_storage.h"
#include "cpu/fused.h"
#include "cpu/parallel.h"
#include "cpu/vec_exp.h"
#include "fused_op.h"
#include "tensor_internal.h"

namespace wick::fused {

namespace {

constexpr size_t kQueries = 4;  // queries per pass over the keys
constexpr size_t kKeys = 16;    // keys per block of scores (two v8f)

bool dense_rows(const Tensor& t) {
  const auto& l = t.impl()->layout;
  return l.is_contiguous();
}

// One (sequence, head): s tokens from row `first`, the head's d columns at `col` of q (k, v
// follow at + h, + 2 h) in rows of `stride` floats; out rows of `h` floats.
struct Item {
  const float* qkv;
  size_t stride, h, d, first, s, col;
  float scale;
  float* out;
};

void run_item(const Item& it, float* kt, float* v, float* scores, float* acc) {
  const size_t d = it.d, s = it.s, sp = (s + kKeys - 1) / kKeys * kKeys;
  for (size_t j = 0; j < s; ++j) {
    const float* row = it.qkv + (it.first + j) * it.stride + it.col;
    for (size_t c = 0; c < d; ++c) {
      kt[c * sp + j] = row[it.h + c];
      v[j * d + c] = row[2 * it.h + c];
    }
  }
  for (size_t c = 0; c < d; ++c) std::fill(kt + c * sp + s, kt + (c + 1) * sp, 0.0f);

  for (size_t i0 = 0; i0 < s; i0 += kQueries) {
    const size_t nq = std::min(kQueries, s - i0);
    const float* q[kQueries];
    for (size_t r = 0; r < kQueries; ++r) {
      q[r] = it.qkv + (it.first + i0 + std::min(r, nq - 1)) * it.stride + it.col;
    }
    for (size_t j0 = 0; j0 < sp; j0 += kKeys) {
      cpu::v8f a[kQueries][2] = {};
      for (size_t c = 0; c < d; ++c) {
        const cpu::v8f k0 = cpu::load8(kt + c * sp + j0), k1 = cpu::load8(kt + c * sp + j0 + 8);
        for (size_t r = 0; r < kQueries; ++r) {
          const float x = q[r][c];
          a[r][0] += x * k0;
          a[r][1] += x * k1;
        }
      }
      for (size_t r = 0; r < kQueries; ++r) {
        cpu::store8(scores + r * sp + j0, a[r][0] * it.scale);
        cpu::store8(scores + r * sp + j0 + 8, a[r][1] * it.scale);
      }
    }
    // Softmax of each row over its s keys: max and sum in eight lanes (then across them), exp
    // in a loop of its own so that it vectorises; 1 / sum folded into the probabilities.
    for (size_t r = 0; r < kQueries; ++r) {
      float* p = scores + r * sp;
      const size_t s8 = s / 8 * 8;
      float m = p[0];
      if (s8 > 0) {
        cpu::v8f mv = cpu::load8(p);
        for (size_t j = 8; j < s8; j += 8) {
          cpu::v8f x = cpu::load8(p + j);
          mv = mv > x ? mv : x;
        }
        for (int l = 0; l < 8; ++l) m = std::max(m, mv[l]);
      }
      for (size_t j = s8; j < s; ++j) m = std::max(m, p[j]);
      for (size_t j = 0; j < s; ++j) p[j] = cpu::exp_nonpositive(p[j] - m);
      cpu::v8f sv = {};
      for (size_t j = 0; j < s8; j += 8) sv += cpu::load8(p + j);
      float sum = cpu::hsum8(sv);
      for (size_t j = s8; j < s; ++j) sum += p[j];
      const float inv = 1.0f / sum;
      for (size_t j = 0; j < s; ++j) p[j] *= inv;
    }
    // out = p v: 16 columns at a time for the four queries (each value vector loaded once).
    const float* p[kQueries];
    for (size_t r = 0; r < kQueries; ++r) p[r] = scores + r * sp;
    size_t c0 = 0;
    for (; c0 + 16 <= d; c0 += 16) {
      cpu::v8f a[kQueries][2] = {};
      for (size_t j = 0; j < s; ++j) {
        const cpu::v8f v0 = cpu::load8(v + j * d + c0), v1 = cpu::load8(v + j * d + c0 + 8);
        for (size_t r = 0; r < kQueries; ++r) {
          a[r][0] += p[r][j] * v0;
          a[r][1] += p[r][j] * v1;
        }
      }
      for (size_t r = 0; r < nq; ++r) {
        float* o = it.out + (it.first + i0 + r) * it.h + it.col + c0;
        cpu::store8(o, a[r][0]);
        cpu::store8(o + 8, a[r][1]);
      }
    }
    for (size_t r = 0; r < nq && c0 < d; ++r) {
      std::fill(acc, acc + (d - c0), 0.0f);
      for (size_t j = 0; j < s; ++j) {
        const float pj = p[r][j];
        const float* vr = v + j * d + c0;
        for (size_t c = 0; c < d - c0; ++c) acc[c] += pj * vr[c];
      }
      float* o = it.out + (it.first + i0 + r) * it.h + it.col + c0;
      std::copy(acc, acc + (d - c0), o);
    }
  }
}

}  // namespace

std::optional<TensorList> VarlenAttentionOp::cpu(const TensorList& in) const {
  const Tensor &qkv = in[0], &off = in[1];
  if (qkv.dtype() != DType::F32 || !dense_rows(qkv) || !dense_rows(off)) return std::nullopt;
  auto locks = detail::lock_inputs(*this, in);
  const size_t t = qkv.dim(0), h = qkv.dim(1) / 3, d = h / heads;
  const float* base =
      cpu::as_cpu(detail::backend_of(qkv)).as<float>() + qkv.impl()->layout.start_offset();
  const uint32_t* o =
      cpu::as_cpu(detail::backend_of(off)).as<uint32_t>() + off.impl()->layout.start_offset();
  const size_t n = off.dim(0) - 1;
  size_t longest = 0;
  for (size_t i = 0; i < n; ++i) longest = std::max<size_t>(longest, o[i + 1] - o[i]);
  const size_t sp = (longest + kKeys - 1) / kKeys * kKeys;
  auto out = std::make_unique<cpu::CpuStorage>(t * h, DType::F32);
  float* op = out->as<float>();
  const float scale_f = static_cast<float>(scale);
  cpu::parallel_for(n * heads, 1, [&](size_t begin, size_t end) {
    std::vector<float> kt(d * sp), v(longest * d), scores(kQueries * sp), acc(d);
    for (size_t item = begin; item < end; ++item) {
      const size_t i = item / heads, head = item % heads;
      run_item(Item{base, 3 * h, h, d, o[i], o[i + 1] - o[i], head * d, scale_f, op}, kt.data(),
               v.data(), scores.data(), acc.data());
    }
  });
  return TensorList{detail::from_storage(std::move(out), Shape{t, h})};
}

}  // namespace wick::fused
