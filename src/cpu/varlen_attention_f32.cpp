// The f32 kernel of fused::VarlenAttentionOp, compiled once per instruction set
// (src/CMakeLists.txt; src/cpu/isa.cpp picks the build): one work item per (sequence, head), each
// over the sequence's own tokens only, so a sequence's result does not depend on the others in the
// batch, on their lengths or on the thread count. An item copies its keys transposed (d rows of the
// sequence's length, padded to two vectors; blocks of a vector's lanes square transposed in
// registers, as a vector load of scalar stores just made would wait for them to retire), reads
// its values in place, and takes the queries kQueries at a time: scores for two vectors of keys at
// once (each key vector loaded once for all queries), the softmax in f32 with the vectorised exp,
// and p v summed over the keys in order, two vectors of columns of the kQueries queries at a time.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/vec_exp.h"

// clang-format off
#include "cpu/isa_begin.h"  // last: the code below is compiled for this file's instruction set
#include "cpu/lane_transpose.h"
// clang-format on

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

// Queries per pass over the keys: their accumulators take 16 of AVX-512's 32 vector registers,
// 8 of AVX2's 16.
#if defined(WICK_ISA_AVX512)
constexpr size_t kLanes = 16;
constexpr size_t kQueries = 8;
#else
constexpr size_t kLanes = 8;
constexpr size_t kQueries = 4;
#endif
using vf = float __attribute__((vector_size(kLanes * sizeof(float))));

vf loadv(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}
void storev(float* p, vf v) {
  __builtin_memcpy(p, &v, sizeof(v));
}
float hsum(vf v) {
  float s = 0;
  for (size_t l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

constexpr size_t kKeys = 2 * kLanes;  // keys per block of scores (two vectors)

// One (sequence, head): s tokens from row `first`, the head's d columns at `col` of q (k, v
// follow at + h, + 2 h) in rows of `stride` floats; out rows of `h` floats.
struct Item {
  const float* qkv;
  size_t stride, h, d, first, s, col;
  float scale;
  float* out;
};

void run_item(const Item& it, float* kt, float* scores, float* acc) {
  const size_t d = it.d, s = it.s, sp = (s + kKeys - 1) / kKeys * kKeys;
  auto key = [&](size_t j) { return it.qkv + (it.first + j) * it.stride + it.col + it.h; };
  auto value = [&](size_t j) { return key(j) + it.h; };
  const size_t d_blocks = d / kLanes * kLanes;
  for (size_t j0 = 0; j0 < sp; j0 += kLanes) {
    for (size_t c0 = 0; c0 < d_blocks; c0 += kLanes) {
      vf x[kLanes];
      for (size_t i = 0; i < kLanes; ++i) x[i] = j0 + i < s ? loadv(key(j0 + i) + c0) : vf{};
      transpose(x);
      for (size_t i = 0; i < kLanes; ++i) storev(kt + (c0 + i) * sp + j0, x[i]);
    }
    for (size_t c = d_blocks; c < d; ++c) {
      for (size_t i = 0; i < kLanes; ++i) kt[c * sp + j0 + i] = j0 + i < s ? key(j0 + i)[c] : 0.0f;
    }
  }

  for (size_t i0 = 0; i0 < s; i0 += kQueries) {
    const size_t nq = std::min(kQueries, s - i0);
    const float* q[kQueries];
    for (size_t r = 0; r < kQueries; ++r) {
      q[r] = it.qkv + (it.first + i0 + std::min(r, nq - 1)) * it.stride + it.col;
    }
    for (size_t j0 = 0; j0 < sp; j0 += kKeys) {
      vf a[kQueries][2] = {};
      for (size_t c = 0; c < d; ++c) {
        const vf k0 = loadv(kt + c * sp + j0), k1 = loadv(kt + c * sp + j0 + kLanes);
        for (size_t r = 0; r < kQueries; ++r) {
          const float x = q[r][c];
          a[r][0] += x * k0;
          a[r][1] += x * k1;
        }
      }
      for (size_t r = 0; r < kQueries; ++r) {
        storev(scores + r * sp + j0, a[r][0] * it.scale);
        storev(scores + r * sp + j0 + kLanes, a[r][1] * it.scale);
      }
    }
    // Softmax of each row over its s keys: max and sum in eight lanes (then across them), exp
    // in a loop of its own so that it vectorises; 1 / sum folded into the probabilities.
    for (size_t r = 0; r < kQueries; ++r) {
      float* p = scores + r * sp;
      const size_t s8 = s / kLanes * kLanes;
      float m = p[0];
      if (s8 > 0) {
        vf mv = loadv(p);
        for (size_t j = kLanes; j < s8; j += kLanes) {
          vf x = loadv(p + j);
          mv = mv > x ? mv : x;
        }
        for (size_t l = 0; l < kLanes; ++l) m = std::max(m, mv[l]);
      }
      for (size_t j = s8; j < s; ++j) m = std::max(m, p[j]);
      for (size_t j = 0; j < s; ++j) p[j] = exp_nonpositive(p[j] - m);
      vf sv = {};
      for (size_t j = 0; j < s8; j += kLanes) sv += loadv(p + j);
      float sum = hsum(sv);
      for (size_t j = s8; j < s; ++j) sum += p[j];
      const float inv = 1.0f / sum;
      for (size_t j = 0; j < s; ++j) p[j] *= inv;
    }
    // out = p v: two vectors of columns at a time for the kQueries queries (each value vector
    // loaded once).
    const float* p[kQueries];
    for (size_t r = 0; r < kQueries; ++r) p[r] = scores + r * sp;
    size_t c0 = 0;
    for (; c0 + 2 * kLanes <= d; c0 += 2 * kLanes) {
      vf a[kQueries][2] = {};
      for (size_t j = 0; j < s; ++j) {
        const vf v0 = loadv(value(j) + c0), v1 = loadv(value(j) + c0 + kLanes);
        for (size_t r = 0; r < kQueries; ++r) {
          a[r][0] += p[r][j] * v0;
          a[r][1] += p[r][j] * v1;
        }
      }
      for (size_t r = 0; r < nq; ++r) {
        float* o = it.out + (it.first + i0 + r) * it.h + it.col + c0;
        storev(o, a[r][0]);
        storev(o + kLanes, a[r][1]);
      }
    }
    for (size_t r = 0; r < nq && c0 < d; ++r) {
      std::fill(acc, acc + (d - c0), 0.0f);
      for (size_t j = 0; j < s; ++j) {
        const float pj = p[r][j];
        const float* vr = value(j) + c0;
        for (size_t c = 0; c < d - c0; ++c) acc[c] += pj * vr[c];
      }
      float* o = it.out + (it.first + i0 + r) * it.h + it.col + c0;
      std::copy(acc, acc + (d - c0), o);
    }
  }
}

}  // namespace

void varlen_attention_f32(const float* qkv, const uint32_t* offsets, size_t n, size_t heads,
                          size_t d, float scale, float* out) {
  const size_t h = heads * d;
  size_t longest = 0;
  for (size_t i = 0; i < n; ++i) longest = std::max<size_t>(longest, offsets[i + 1] - offsets[i]);
  const size_t sp = (longest + kKeys - 1) / kKeys * kKeys;
  parallel_for(n * heads, 1, [&](size_t begin, size_t end) {
    std::vector<float> kt(d * sp), scores(kQueries * sp), acc(d);
    for (size_t item = begin; item < end; ++item) {
      const size_t i = item / heads, head = item % heads;
      run_item(
          Item{qkv, 3 * h, h, d, offsets[i], offsets[i + 1] - offsets[i], head * d, scale, out},
          kt.data(), scores.data(), acc.data());
    }
  });
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
