// f32 scaled dot-product attention on the CPU, compiled once per instruction set
// (src/CMakeLists.txt; src/cpu/isa.cpp picks the build). One work item per (batch, k/v head,
// tile of 64 rows), claimed from a counter by the pool's threads, a row being one query of one of
// the heads that share the k/v head (grouped-query heads share each k/v tile). Keys and values
// stream through in tiles of 64 with an online softmax, so the (s, s_kv) scores are never stored.
// Q, the scores and the output are held transposed (one vector lane per row): both tile products
// broadcast one element of k or v, read in place, against vectors of rows, and the online softmax
// is vertical vector arithmetic; K and V are never copied. Decode items (at most one vector of
// rows) keep rows x keys instead, each score a dot product of two rows (few_rows_item).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "cpu/attention.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "settings.h"

#if defined(WICK_ISA_AVX512)
#include <immintrin.h>
#endif

// clang-format off
#include "cpu/isa_begin.h"  // last: the code below is compiled for this file's instruction set
#include "cpu/lane_transpose.h"
// clang-format on

namespace wick::cpu {
inline namespace WICK_ISA_NS {

namespace {

// Register blocks: the scores kernel keeps kScoreKeys keys x kScoreRowVecs row vectors of
// accumulators, the P V kernel kPvCols output columns x kPvRowVecs row vectors (AVX-512: 16 of
// its 32 registers; AVX2: 12 of 16, the FMAs reading the row vectors from memory). Row vectors
// left over (an item whose rows end mid-block) take blocks of one row vector and kNarrowKeys keys
// or kNarrowCols columns; few_rows_item takes blocks of kFewRows rows.
#if defined(WICK_ISA_AVX512)
constexpr size_t kLanes = 16;
typedef float vf __attribute__((vector_size(64), __may_alias__));
typedef int32_t vi __attribute__((vector_size(64), __may_alias__));
constexpr size_t kScoreKeys = 4, kScoreRowVecs = 4;
constexpr size_t kPvCols = 4, kPvRowVecs = 4;
constexpr size_t kNarrowKeys = 8, kNarrowCols = 8;
constexpr size_t kFewRows = 4;
#else
constexpr size_t kLanes = 8;
typedef float vf __attribute__((vector_size(32), __may_alias__));
typedef int32_t vi __attribute__((vector_size(32), __may_alias__));
constexpr size_t kScoreKeys = 3, kScoreRowVecs = 4;
constexpr size_t kPvCols = 3, kPvRowVecs = 4;
constexpr size_t kNarrowKeys = 8, kNarrowCols = 8;
constexpr size_t kFewRows = 2;
#endif

constexpr size_t kItemRows = 64;  // query rows of a work item
constexpr size_t kRowVecs = kItemRows / kLanes;
constexpr size_t kKeyTile = 64;
constexpr size_t kKeyVecs = kKeyTile / kLanes;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;

inline vf splat(float x) {
  return vf{} + x;
}

// a > b ? a : b per lane (b where either is NaN).
inline vf vmax(vf a, vf b) {
#if defined(WICK_ISA_AVX512)
  // (The masked form with every lane set: GCC 12's unmasked one trips -Wmaybe-uninitialized.)
  return _mm512_mask_max_ps(a, 0xFFFF, a, b);
#else
  return a > b ? a : b;
#endif
}

// 2^x for x <= 0 per lane. The scores are in log2 units (the queries are scaled by log2(e)),
// which saves exp's multiplication by 1/ln2 and its two-step reduction. Exactly 0 for x <= -150
// and -inf (and for NaN, which only a masked key yields).
#if defined(WICK_ISA_AVX512)
// 2^(k/16) * 2^r with k = round(16 x) and |r| <= 1/32: 2^(k/16) is 2^floor(k/16) (scalef) times
// a 16-entry table indexed by k mod 16 (one permute), and 2^r a degree-3 Taylor polynomial
// (relative error ~1e-8). (The intrinsics' masked forms with every lane set: GCC 12's unmasked
// ones trip -Wmaybe-uninitialized.)
inline vf vexp2_le0(vf x) {
  const vf table = {1.0f,        1.04427373f, 1.09050775f, 1.13878858f, 1.18920708f, 1.24185777f,
                    1.29683959f, 1.35425556f, 1.41421354f, 1.47682619f, 1.54221082f, 1.61049032f,
                    1.68179286f, 1.75625217f, 1.8340081f,  1.91520655f};
  x = vmax(x, splat(-150.0f));
  vf t = x + 786432.0f;  // 1.5 * 2^19, whose last place is 1/16: t's low mantissa bits hold k
  vf n = t - 786432.0f;  // k / 16
  vf r = x - n;
  vf frac = _mm512_mask_permutexvar_ps(table, 0xFFFF, __builtin_bit_cast(__m512i, t), table);
  vf p = splat(5.5504108664821580e-02f);
  p = p * r + 2.4022650695910071e-01f;
  p = p * r + 6.9314718055994531e-01f;
  p = p * r + 1.0f;
  p *= frac;
  return _mm512_mask_scalef_ps(p, 0xFFFF, p, n);  // p * 2^floor(n), rounded to 0 below 2^-149
}
#else
// 2^n * p(r) with n = round(x), r = x - n in [-1/2, 1/2] and p the degree-7 Taylor polynomial
// of 2^r (relative error ~1e-8); 2^n built from its biased exponent.
inline vf vexp2_le0(vf x) {
  x = x > splat(-127.0f) ? x : splat(-127.0f);  // -inf and NaN too: 2^-127 below is +0
  vf t = x + 12582912.0f;                       // 1.5 * 2^23: the low bits of t hold round(x)
  vf n = t - 12582912.0f;
  vf r = x - n;
  vf p = splat(1.5252733804059841e-05f);
  p = p * r + 1.5403530393381609e-04f;
  p = p * r + 1.3333558146428443e-03f;
  p = p * r + 9.6181291076284772e-03f;
  p = p * r + 5.5504108664821580e-02f;
  p = p * r + 2.4022650695910071e-01f;
  p = p * r + 6.9314718055994531e-01f;
  p = p * r + 1.0f;
  // 2^n from its biased exponent n + 127 (n = -127 gives the bits of +0).
  vi bits = (__builtin_bit_cast(vi, t) - 0x4B400000 + 127) << 23;
  return p * __builtin_bit_cast(vf, bits);
}
#endif

inline vf load_unaligned(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

inline void store_unaligned(float* p, vf v) {
  __builtin_memcpy(p, &v, sizeof(v));
}

// st[j][rv0 + b] = sum_t k[j][t] qt[t][rv0 + b] for j < J, b < RB: J keys (rows `ks` floats
// apart) against RB vectors of rows; mx[rv0 + b] takes the maximum of the new scores too.
template <size_t J, size_t RB>
__attribute__((always_inline)) inline void score_block(const float* k, size_t ks, const vf* qt,
                                                       size_t d, size_t rv0, vf* st, vf* mx) {
  vf acc[J][RB] = {};
  for (size_t t = 0; t < d; ++t) {
    vf q[RB];
    for (size_t b = 0; b < RB; ++b) q[b] = qt[t * kRowVecs + rv0 + b];
    for (size_t j = 0; j < J; ++j) {
      float kj = k[j * ks + t];
      for (size_t b = 0; b < RB; ++b) acc[j][b] += kj * q[b];
    }
  }
  for (size_t j = 0; j < J; ++j) {
    for (size_t b = 0; b < RB; ++b) {
      st[j * kRowVecs + rv0 + b] = acc[j][b];
      mx[rv0 + b] = vmax(mx[rv0 + b], acc[j][b]);
    }
  }
}

// ot[t0 + c][rv0 + b] = ot[..] * corr[rv0 + b] + sum_j v[j][t0 + c] pt[j][rv0 + b] for c < C,
// b < RB, j < nk: the running output rescaled to the new maxima, plus this tile's P V.
template <size_t C, size_t RB>
__attribute__((always_inline)) inline void pv_block(const float* v, size_t vs, const vf* pt,
                                                    size_t nk, size_t t0, size_t rv0,
                                                    const vf* corr, vf* ot) {
  vf acc[C][RB];
  for (size_t c = 0; c < C; ++c) {
    for (size_t b = 0; b < RB; ++b) {
      acc[c][b] = ot[(t0 + c) * kRowVecs + rv0 + b] * corr[rv0 + b];
    }
  }
  for (size_t j = 0; j < nk; ++j) {
    vf pj[RB];
    for (size_t b = 0; b < RB; ++b) pj[b] = pt[j * kRowVecs + rv0 + b];
    for (size_t c = 0; c < C; ++c) {
      float x = v[j * vs + t0 + c];
      for (size_t b = 0; b < RB; ++b) acc[c][b] += x * pj[b];
    }
  }
  for (size_t c = 0; c < C; ++c) {
    for (size_t b = 0; b < RB; ++b) ot[(t0 + c) * kRowVecs + rv0 + b] = acc[c][b];
  }
}

// S^T over nk keys for row vectors [rv0, rv0 + RB), each row's maximum score into mx. (Not
// inlined, here and in pv_rows: in the caller the loops' registers are lost to its constants.)
template <size_t J, size_t RB>
__attribute__((noinline)) void scores_rows(const float* k, size_t ks, size_t nk, const vf* qt,
                                           size_t d, size_t rv0, vf* st, vf* mx) {
  size_t j = 0;
  for (; j + J <= nk; j += J) score_block<J, RB>(k + j * ks, ks, qt, d, rv0, st + j * kRowVecs, mx);
  for (; j < nk; ++j) score_block<1, RB>(k + j * ks, ks, qt, d, rv0, st + j * kRowVecs, mx);
}

// O^T = O^T * corr + V^T P^T for row vectors [rv0, rv0 + RB).
template <size_t C, size_t RB>
__attribute__((noinline)) void pv_rows(const float* v, size_t vs, const vf* pt, size_t nk, size_t d,
                                       size_t rv0, const vf* corr, vf* ot) {
  size_t t0 = 0;
  for (; t0 + C <= d; t0 += C) pv_block<C, RB>(v, vs, pt, nk, t0, rv0, corr, ot);
  for (; t0 < d; ++t0) pv_block<1, RB>(v, vs, pt, nk, t0, rv0, corr, ot);
}

// A float buffer of n vectors aligned to the vector size.
class VecBuffer {
 public:
  explicit VecBuffer(size_t n) : storage_((n + 1) * kLanes) {
    auto addr = reinterpret_cast<uintptr_t>(storage_.data());
    constexpr uintptr_t kAlign = sizeof(vf);
    data_ = reinterpret_cast<vf*>((addr + kAlign - 1) / kAlign * kAlign);
  }
  vf* data() { return data_; }

 private:
  std::vector<float> storage_;
  vf* data_;
};

struct ItemBuffers {
  VecBuffer qt, ot, st;  // Q^T and O^T (d, kItemRows), S^T then P^T (kKeyTile, kItemRows)
  // Items of at most kLanes rows (few_rows_item): Q and O (row, d rounded up to vectors).
  VecBuffer q, o;
  explicit ItemBuffers(size_t d)
      : qt(d * kRowVecs),
        ot(d * kRowVecs),
        st(kKeyTile * kRowVecs),
        q(kLanes * vecs(d)),
        o(kLanes * vecs(d)) {}
  static size_t vecs(size_t n) { return (n + kLanes - 1) / kLanes; }
};

// ---- items of at most kLanes rows (decoding): rows x keys, dot products of rows ----
//
// One row per lane would leave most lanes idle, so these items keep the usual layout: scores of
// a row along the keys of a tile, outputs along d. A score is a dot product of a query row and a
// key row, both read in place: kLanes keys' products accumulate lane-wise, and one reduction of
// those kLanes vectors yields their kLanes scores as one vector.

// Lane j of the result: the sum of the lanes of x[j], for the kLanes vectors x (overwritten).
// Each round adds pairs of lanes H apart, packing two vectors' sums into one (shuffle_round).
template <size_t H = kLanes / 2>
inline vf sum_lanes(vf* x) {
  for (size_t i = 0; i < H; ++i) {
    shuffle_round<H>(x[i], x[i + H], std::make_index_sequence<kLanes>());
    x[i] += x[i + H];
  }
  if constexpr (H > 1) {
    return sum_lanes<H / 2>(x);
  } else {
    return x[0];
  }
}

// Scores of one row q (d floats, the first d_vecs whole vectors of it taken here) against the
// nk <= kLanes keys at k (rows ks floats apart); lanes past nk repeat the last key.
__attribute__((always_inline)) inline vf few_scores_group(const float* q, const float* k, size_t ks,
                                                          size_t nk, size_t d_vecs) {
  const float* row[kLanes];
  for (size_t j = 0; j < kLanes; ++j) row[j] = k + std::min(j, nk - 1) * ks;
  vf acc[kLanes] = {};
  for (size_t v = 0; v < d_vecs; ++v) {
    const vf qv = load_unaligned(q + v * kLanes);
    for (size_t j = 0; j < kLanes; ++j) acc[j] += qv * load_unaligned(row[j] + v * kLanes);
  }
  return sum_lanes(acc);
}

// Asks for the d floats of each of the rows [first, end) of a cache (rows `stride` floats apart).
// A decode step's caches come from memory (the weights streamed through the caches since the
// last step), and each tile's first pass stalled on them: each tile's passes ask for the same
// rows of the next tile, so that memory keeps busy while this one computes (docs/perf/cpu.md).
inline void prefetch_rows(const float* rows, size_t stride, size_t first, size_t end, size_t d) {
  for (size_t j = first; j < end; ++j) {
    const char* row = reinterpret_cast<const char*>(rows + j * stride);
    for (size_t b = 0; b < d * sizeof(float); b += 64) __builtin_prefetch(row + b);
  }
}

// sc[r][j] = q[r] . k[j] for rows r < nq (q rows dq floats apart) and the tile's nk keys (rows ks
// floats apart); lanes past nk hold values of no meaning (the caller masks them). The rows'
// passes ask for the next tile's first next_nk keys (prefetch_rows), a share of each group each.
__attribute__((noinline)) void few_scores(const float* q, size_t dq, const float* k, size_t ks,
                                          size_t nk, size_t d, size_t nq, vf* sc, size_t next_nk) {
  const size_t d_vecs = d / kLanes;
  for (size_t r = 0; r < nq; ++r) {
    const float* qr = q + r * dq;
    for (size_t kv = 0; kv * kLanes < nk; ++kv) {
      const float* kg = k + kv * kLanes * ks;
      const size_t n = std::min(kLanes, nk - kv * kLanes);
      // This group's rows of the next tile, shared out over the rows' passes.
      const size_t g0 = kv * kLanes + r * kLanes / nq, g1 = kv * kLanes + (r + 1) * kLanes / nq;
      prefetch_rows(k + kKeyTile * ks, ks, std::min(next_nk, g0), std::min(next_nk, g1), d);
      vf s = few_scores_group(qr, kg, ks, n, d_vecs);
      // Columns past the last whole vector.
      for (size_t t = d_vecs * kLanes; t < d; ++t) {
        for (size_t j = 0; j < n; ++j) s[j] += qr[t] * kg[j * ks + t];
      }
      sc[r * kKeyVecs + kv] = s;
    }
  }
}

// o[i][tv0 + c] = o[..] * corr[i] + sum_j p[i][j] v[j][(tv0 + c) vector] for i < R, c < C
// (o rows dv vectors apart, p rows kKeyTile floats apart); asks for the same vectors of the next
// tile's first next_nk keys as it goes (prefetch_rows says why).
template <size_t R, size_t C>
__attribute__((always_inline)) inline void few_pv_block(const float* v, size_t vs, const float* p,
                                                        size_t nk, size_t tv0, const float* corr,
                                                        vf* o, size_t dv, size_t next_nk) {
  vf acc[R][C];
  for (size_t i = 0; i < R; ++i) {
    for (size_t c = 0; c < C; ++c) acc[i][c] = o[i * dv + tv0 + c] * corr[i];
  }
  for (size_t j = 0; j < nk; ++j) {
    if (j < next_nk) {
      const char* next = reinterpret_cast<const char*>(v + (j + kKeyTile) * vs + tv0 * kLanes);
      for (size_t b = 0; b < C * sizeof(vf); b += 64) __builtin_prefetch(next + b);
    }
    vf vj[C];
    for (size_t c = 0; c < C; ++c) vj[c] = load_unaligned(v + j * vs + (tv0 + c) * kLanes);
    for (size_t i = 0; i < R; ++i) {
      float a = p[i * kKeyTile + j];
      for (size_t c = 0; c < C; ++c) acc[i][c] += a * vj[c];
    }
  }
  for (size_t i = 0; i < R; ++i) {
    for (size_t c = 0; c < C; ++c) o[i * dv + tv0 + c] = acc[i][c];
  }
}

template <size_t R>
inline void few_pv_rows(const float* v, size_t vs, const float* p, size_t nk, size_t d,
                        const float* corr, vf* o, size_t dv, size_t next_nk) {
  const size_t d_vecs = d / kLanes;
  size_t tv = 0;
  for (; tv + 4 <= d_vecs; tv += 4) few_pv_block<R, 4>(v, vs, p, nk, tv, corr, o, dv, next_nk);
  for (; tv < d_vecs; ++tv) few_pv_block<R, 1>(v, vs, p, nk, tv, corr, o, dv, next_nk);
  // Columns past the last whole vector (V's rows end there).
  for (size_t i = 0; i < R; ++i) {
    float* oi = reinterpret_cast<float*>(o + i * dv);
    for (size_t t = d_vecs * kLanes; t < d; ++t) {
      float sum = oi[t] * corr[i];
      for (size_t j = 0; j < nk; ++j) sum += p[i * kKeyTile + j] * v[j * vs + t];
      oi[t] = sum;
    }
  }
}

__attribute__((noinline)) void few_pv(const float* v, size_t vs, const vf* sc, size_t nk, size_t d,
                                      size_t nq, const float* corr, vf* o, size_t dv,
                                      size_t next_nk) {
  const float* p = reinterpret_cast<const float*>(sc);
  size_t r = 0;
  // Only the first block asks for the next tile's values.
  for (; r + kFewRows <= nq; r += kFewRows, next_nk = 0) {
    few_pv_rows<kFewRows>(v, vs, p + r * kKeyTile, nk, d, corr + r, o + r * dv, dv, next_nk);
  }
  // The rows left in one block, so that V is read once for them too.
  if constexpr (kFewRows > 3) {
    if (nq - r == 3) {
      few_pv_rows<3>(v, vs, p + r * kKeyTile, nk, d, corr + r, o + r * dv, dv, next_nk);
      return;
    }
  }
  if constexpr (kFewRows > 2) {
    if (nq - r == 2) {
      few_pv_rows<2>(v, vs, p + r * kKeyTile, nk, d, corr + r, o + r * dv, dv, next_nk);
      return;
    }
  }
  for (; r < nq; ++r, next_nk = 0) {
    few_pv_rows<1>(v, vs, p + r * kKeyTile, nk, d, corr + r, o + r * dv, dv, next_nk);
  }
}

inline float hmax(vf x) {
  float m = x[0];
  for (size_t i = 1; i < kLanes; ++i) m = std::max(m, x[i]);
  return m;
}

inline float hsum(vf x) {
  float s = 0;
  for (size_t i = 0; i < kLanes; ++i) s += x[i];
  return s;
}

// cap tanh(x / cap) of a score in log2 units, with cap the soft-cap in those units.
inline float soft_cap(float x, float cap) {
  return cap * std::tanh(x / cap);
}

// An item of nq <= kLanes rows; row_* as in run_item.
void few_rows_item(const Problem<float>& pb, float scale, float cap, size_t bi, size_t hk,
                   size_t nq, const size_t* row_head, const size_t* row_query,
                   const float* const* q_row, const int32_t* limit, const int32_t* first,
                   ItemBuffers& buf, float* out) {
  const size_t d = pb.d, dv = ItemBuffers::vecs(d), dq = dv * kLanes;
  float* q = reinterpret_cast<float*>(buf.q.data());
  vf* o = buf.o.data();
  vf* sc = buf.st.data();
  float m[kLanes], l[kLanes], corr[kLanes];
  long max_limit = -1, min_first = std::numeric_limits<long>::max();
  for (size_t r = 0; r < nq; ++r) {
    for (size_t t = 0; t < d; ++t) q[r * dq + t] = q_row[r][t] * scale;
    for (size_t i = 0; i < dv; ++i) o[r * dv + i] = vf{};
    m[r] = kNegInf;
    l[r] = 0;
    max_limit = std::max(max_limit, static_cast<long>(limit[r]));
    min_first = std::min(min_first, static_cast<long>(first[r]));
  }
  const size_t key_end = static_cast<size_t>(max_limit + 1);
  const size_t key_begin = std::min(static_cast<size_t>(min_first), key_end) / kKeyTile * kKeyTile;
  const size_t ks = pb.kv.strides[2], vs = pb.vv.strides[2];
  const float* kbase = pb.kp + bi * pb.kv.strides[0] + hk * pb.kv.strides[1];
  const float* vbase = pb.vp + bi * pb.vv.strides[0] + hk * pb.vv.strides[1];
  for (size_t k0 = key_begin; k0 < key_end; k0 += kKeyTile) {
    const size_t nk = std::min(kKeyTile, key_end - k0);
    const size_t next_nk = std::min(kKeyTile, key_end - std::min(key_end, k0 + kKeyTile));
    few_scores(q, dq, kbase + k0 * ks, ks, nk, d, nq, sc, next_nk);
    for (size_t r = 0; r < nq; ++r) {
      vf* srow = sc + r * kKeyVecs;
      float* sf = reinterpret_cast<float*>(srow);
      if (cap > 0) {
        for (size_t j = 0; j < nk; ++j) sf[j] = soft_cap(sf[j], cap);
      }
      if (pb.has_mask) {
        const size_t ms = pb.mv.strides[3];
        const float* mrow = pb.mp + bi * pb.mv.strides[0] + row_head[r] * pb.mv.strides[1] +
                            row_query[r] * pb.mv.strides[2] + k0 * ms;
        for (size_t j = 0; j < nk; ++j) sf[j] += mrow[j * ms] * kLog2e;
      }
      // Keys past the row's last visible one (causal) and past the tile's end get -inf.
      long visible = std::clamp(static_cast<long>(limit[r]) - static_cast<long>(k0) + 1, 0L,
                                static_cast<long>(nk));
      for (size_t j = static_cast<size_t>(visible); j < kKeyTile; ++j) sf[j] = kNegInf;
      // Keys before the row's window get -inf too.
      long before = std::clamp(static_cast<long>(first[r]) - static_cast<long>(k0), 0L, visible);
      for (long j = 0; j < before; ++j) sf[j] = kNegInf;
      vf mxv = srow[0];
      for (size_t kv = 1; kv < kKeyVecs; ++kv) mxv = vmax(mxv, srow[kv]);
      const float m_new = std::max(m[r], hmax(mxv));
      const float m_use = m_new == kNegInf ? 0.0f : m_new;  // as in run_item
      corr[r] = vexp2_le0(splat(m[r] - m_use))[0];
      vf sum{};
      for (size_t kv = 0; kv < kKeyVecs; ++kv) {
        vf p = vexp2_le0(srow[kv] - m_use);
        srow[kv] = p;
        sum += p;
      }
      l[r] = l[r] * corr[r] + hsum(sum);
      m[r] = m_new;
    }
    few_pv(vbase + k0 * vs, vs, sc, nk, d, nq, corr, o, dv, next_nk);
  }
  for (size_t r = 0; r < nq; ++r) {
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    const float* orow = reinterpret_cast<const float*>(o + r * dv);
    float* dst = out + ((bi * pb.nh + row_head[r]) * pb.s + row_query[r]) * d;
    for (size_t t = 0; t < d; ++t) dst[t] = orow[t] * inv;
  }
}

// One work item: rows [r0, r0 + nq) of the group of k/v head hk of batch bi.
void run_item(const Problem<float>& pb, const AttentionParams& params, float scale, float cap,
              size_t bi, size_t hk, size_t r0, size_t nq, ItemBuffers& buf, float* out) {
  const bool causal = params.causal;
  const size_t d = pb.d;
  vf* qt = buf.qt.data();
  vf* ot = buf.ot.data();
  vf* st = buf.st.data();
  size_t row_head[kItemRows], row_query[kItemRows];
  const float* q_row[kItemRows];
  // The last key each row sees; rows past nq (padding) see every key and read zeros.
  // The first key each row sees (its window's oldest; 0 without a window or for padding rows).
  alignas(sizeof(vf)) int32_t limit[kItemRows];
  alignas(sizeof(vf)) int32_t first[kItemRows];
  long min_limit = std::numeric_limits<long>::max(), max_limit = -1;
  long min_first = std::numeric_limits<long>::max(), max_first = 0;
  for (size_t r = 0; r < kItemRows; ++r) {
    if (r >= nq) {
      limit[r] = std::numeric_limits<int32_t>::max();
      first[r] = 0;
      continue;
    }
    size_t hi = hk * pb.group + (r0 + r) / pb.s, qi = (r0 + r) % pb.s;
    row_head[r] = hi;
    row_query[r] = qi;
    q_row[r] = pb.qp + bi * pb.qv.strides[0] + hi * pb.qv.strides[1] + qi * pb.qv.strides[2];
    long lim = causal ? static_cast<long>(qi) + pb.shift : static_cast<long>(pb.s_kv) - 1;
    lim = std::clamp(lim, -1L, static_cast<long>(pb.s_kv) - 1);
    limit[r] = static_cast<int32_t>(lim);
    min_limit = std::min(min_limit, lim);
    max_limit = std::max(max_limit, lim);
    long f = std::min(pb.first_key(params, qi), static_cast<long>(pb.s_kv));
    first[r] = static_cast<int32_t>(f);
    min_first = std::min(min_first, f);
    max_first = std::max(max_first, f);
  }
  // WICK_BATCH_INVARIANT=1: every item takes the tiled path below, so that a query's bits do not
  // depend on how many rows share its item (decode against prefill).
  if (nq <= kLanes && !settings::batch_invariant()) {
    few_rows_item(pb, scale, cap, bi, hk, nq, row_head, row_query, q_row, limit, first, buf, out);
    return;
  }
  // Only the nv row vectors that hold rows are computed (the rest pad the last tile of rows).
  const size_t nv = (nq + kLanes - 1) / kLanes;
  // Q^T, scaled: blocks of kLanes rows x kLanes columns transposed in registers.
  const size_t d_blocks = d / kLanes * kLanes;
  for (size_t rv = 0; rv < nv; ++rv) {
    for (size_t t0 = 0; t0 < d_blocks; t0 += kLanes) {
      vf x[kLanes];
      for (size_t i = 0; i < kLanes; ++i) {
        size_t r = rv * kLanes + i;
        x[i] = r < nq ? load_unaligned(q_row[r] + t0) * scale : vf{};
      }
      transpose(x);
      for (size_t i = 0; i < kLanes; ++i) qt[(t0 + i) * kRowVecs + rv] = x[i];
    }
    for (size_t t = d_blocks; t < d; ++t) {
      for (size_t i = 0; i < kLanes; ++i) {
        size_t r = rv * kLanes + i;
        qt[t * kRowVecs + rv][i] = r < nq ? q_row[r][t] * scale : 0.0f;
      }
    }
  }
  vf m[kRowVecs], l[kRowVecs], corr[kRowVecs];
  vi lim[kRowVecs], fst[kRowVecs];
  for (size_t rv = 0; rv < nv; ++rv) {
    m[rv] = splat(kNegInf);
    l[rv] = vf{};
    lim[rv] = *reinterpret_cast<const vi*>(limit + rv * kLanes);
    fst[rv] = *reinterpret_cast<const vi*>(first + rv * kLanes);
  }
  for (size_t t = 0; t < d; ++t) {
    for (size_t rv = 0; rv < nv; ++rv) ot[t * kRowVecs + rv] = vf{};
  }

  const size_t key_end = static_cast<size_t>(max_limit + 1);
  const size_t key_begin = std::min(static_cast<size_t>(min_first), key_end) / kKeyTile * kKeyTile;
  const size_t ks = pb.kv.strides[2], vs = pb.vv.strides[2];
  const float* kbase = pb.kp + bi * pb.kv.strides[0] + hk * pb.kv.strides[1];
  const float* vbase = pb.vp + bi * pb.vv.strides[0] + hk * pb.vv.strides[1];
  for (size_t k0 = key_begin; k0 < key_end; k0 += kKeyTile) {
    const size_t nk = std::min(kKeyTile, key_end - k0);
    const float* k = kbase + k0 * ks;
    const float* v = vbase + k0 * vs;

    // S^T = K Q^T over this tile's keys, and each row's maximum score.
    vf mx[kRowVecs];
    for (size_t rv = 0; rv < nv; ++rv) mx[rv] = splat(kNegInf);
    size_t rv0 = 0;
    for (; rv0 + kScoreRowVecs <= nv; rv0 += kScoreRowVecs) {
      scores_rows<kScoreKeys, kScoreRowVecs>(k, ks, nk, qt, d, rv0, st, mx);
    }
    for (; rv0 < nv; ++rv0) scores_rows<kNarrowKeys, 1>(k, ks, nk, qt, d, rv0, st, mx);
    if (cap > 0) {
      for (size_t j = 0; j < nk; ++j) {
        for (size_t rv = 0; rv < nv; ++rv) {
          for (size_t i = 0; i < kLanes; ++i) {
            st[j * kRowVecs + rv][i] = soft_cap(st[j * kRowVecs + rv][i], cap);
          }
        }
      }
    }
    // The additive mask, and -inf past each row's last visible key (causal); the maxima are then
    // taken again over what is left (masked raw scores must not set them).
    const bool masked = static_cast<long>(k0 + nk) - 1 > min_limit;
    const bool windowed = static_cast<long>(k0) < max_first;  // keys before some row's window
    if (pb.has_mask) {
      const size_t ms = pb.mv.strides[3];
      for (size_t r = 0; r < nq; ++r) {
        const float* mrow = pb.mp + bi * pb.mv.strides[0] + row_head[r] * pb.mv.strides[1] +
                            row_query[r] * pb.mv.strides[2] + k0 * ms;
        for (size_t j = 0; j < nk; ++j) {
          st[j * kRowVecs + r / kLanes][r % kLanes] += mrow[j * ms] * kLog2e;
        }
      }
    }
    if (masked) {
      for (size_t j = 0; j < nk; ++j) {
        const vi key = vi{} + static_cast<int32_t>(k0 + j);
        for (size_t rv = 0; rv < nv; ++rv) {
          st[j * kRowVecs + rv] = key > lim[rv] ? splat(kNegInf) : st[j * kRowVecs + rv];
        }
      }
    }
    if (windowed) {
      for (size_t j = 0; j < nk; ++j) {
        const vi key = vi{} + static_cast<int32_t>(k0 + j);
        for (size_t rv = 0; rv < nv; ++rv) {
          st[j * kRowVecs + rv] = key < fst[rv] ? splat(kNegInf) : st[j * kRowVecs + rv];
        }
      }
    }
    if (masked || windowed || pb.has_mask || cap > 0) {
      for (size_t rv = 0; rv < nv; ++rv) {
        mx[rv] = st[rv];
        for (size_t j = 1; j < nk; ++j) mx[rv] = vmax(mx[rv], st[j * kRowVecs + rv]);
      }
    }
    // Online softmax: new running maxima, the old sums and outputs rescaled, P^T over S^T.
    for (size_t rv = 0; rv < nv; ++rv) {
      const vf m_new = vmax(m[rv], mx[rv]);
      // A row with no visible key so far keeps m = -inf; 0 stands in so that no lane computes
      // -inf - -inf (its probabilities are exp(-inf) = 0).
      const vf m_use = m_new == splat(kNegInf) ? vf{} : m_new;
      corr[rv] = vexp2_le0(m[rv] - m_use);
      vf sum{};
      for (size_t j = 0; j < nk; ++j) {
        vf pj = vexp2_le0(st[j * kRowVecs + rv] - m_use);
        st[j * kRowVecs + rv] = pj;
        sum += pj;
      }
      l[rv] = l[rv] * corr[rv] + sum;
      m[rv] = m_new;
    }
    // O^T = O^T * corr + V^T P^T.
    rv0 = 0;
    for (; rv0 + kPvRowVecs <= nv; rv0 += kPvRowVecs) {
      pv_rows<kPvCols, kPvRowVecs>(v, vs, st, nk, d, rv0, corr, ot);
    }
    for (; rv0 < nv; ++rv0) pv_rows<kNarrowCols, 1>(v, vs, st, nk, d, rv0, corr, ot);
  }

  // A row that saw no key (causal with s > s_kv, or an all -inf mask row) gets zeros.
  alignas(sizeof(vf)) float inv[kItemRows];
  for (size_t rv = 0; rv < nv; ++rv) {
    *reinterpret_cast<vf*>(inv + rv * kLanes) = l[rv] > vf{} ? 1.0f / l[rv] : vf{};
  }
  for (size_t rv = 0; rv < nv; ++rv) {
    float* o_row[kLanes];
    for (size_t i = 0; i < kLanes; ++i) {
      size_t r = rv * kLanes + i;
      o_row[i] = r < nq ? out + ((bi * pb.nh + row_head[r]) * pb.s + row_query[r]) * d : nullptr;
    }
    for (size_t t0 = 0; t0 < d_blocks; t0 += kLanes) {
      vf x[kLanes];
      for (size_t i = 0; i < kLanes; ++i) x[i] = ot[(t0 + i) * kRowVecs + rv];
      transpose(x);
      for (size_t i = 0; i < kLanes; ++i) {
        if (o_row[i] != nullptr) store_unaligned(o_row[i] + t0, x[i] * inv[rv * kLanes + i]);
      }
    }
    for (size_t t = d_blocks; t < d; ++t) {
      for (size_t i = 0; i < kLanes; ++i) {
        if (o_row[i] != nullptr) o_row[i][t] = ot[t * kRowVecs + rv][i] * inv[rv * kLanes + i];
      }
    }
  }
}

// The calling thread's buffers for head size d (kept between calls: a decode step makes one
// attention call per layer).
ItemBuffers& item_buffers(size_t d) {
  thread_local std::unique_ptr<ItemBuffers> buf;
  thread_local size_t buf_d = 0;
  if (!buf || buf_d != d) {
    buf = std::make_unique<ItemBuffers>(d);
    buf_d = d;
  }
  return *buf;
}

}  // namespace

void attention_f32(const AttentionParams& params, const std::vector<KernelOperand>& operands,
                   float* out) {
  // Decoding (each k/v head's rows fit one few-rows item): an item reads its k/v head's whole
  // cache, so a group's rows stay together unless the groups cannot be shared out evenly: with
  // fewer groups than threads each group is cut into as many pieces as it takes for every thread
  // to get one; with more, the groups % threads left over after whole rounds are cut the same way
  // (SmolLM2's 3 groups on 2 threads: 3 + 2 rows against 3 + 1, not 6 against 3). Whole groups
  // are claimed first, then the pieces, largest first. A row's result does not depend on the rows
  // it shares an item with.
  const size_t threads = num_threads();
  const auto& q_dims = operands[0].layout.dims();
  const size_t groups = q_dims[0] * operands[1].layout.dims()[1];
  const size_t group_rows = q_dims[1] / operands[1].layout.dims()[1] * q_dims[2];
  const bool decode = groups > 0 && threads > 1 && group_rows > 1 && group_rows <= kLanes &&
                      !settings::batch_invariant();
  const size_t whole = decode && groups >= threads ? groups - groups % threads : 0;
  const size_t cut = decode ? groups - whole : 0;  // the groups cut into pieces
  const size_t asked = cut > 0 ? std::min(group_rows, (threads + cut - 1) / cut) : 1;
  const size_t piece_rows = (group_rows + asked - 1) / asked;
  const size_t pieces = (group_rows + piece_rows - 1) / piece_rows;  // none of them empty
  const Problem<float> pb(operands, kItemRows);
  // Scores in log2 units: exp(x - m) = 2^(x log2(e) - m log2(e)).
  const float scale = static_cast<float>(params.scale * kLog2e);
  const float cap = static_cast<float>(params.softcap * kLog2e);
  const size_t heads = pb.nb * pb.nh_kv;
  const size_t items = decode ? whole + cut * pieces : pb.items;
  std::atomic<size_t> next{0};
  parallel_for(std::min(threads, items), 1, [&](size_t, size_t) {
    ItemBuffers& buf = item_buffers(pb.d);
    for (;;) {
      const size_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= items) break;
      size_t bk, r0, nq;
      if (!decode) {
        // The last query tiles first: causal, they see the most keys, so the threads end together.
        bk = i % heads;
        r0 = (pb.q_tiles - 1 - i / heads) * kItemRows;
        nq = std::min(kItemRows, pb.group_rows - r0);
      } else if (i < whole) {
        bk = i, r0 = 0, nq = group_rows;
      } else {
        bk = whole + (i - whole) % cut;
        r0 = (i - whole) / cut * piece_rows;
        nq = std::min(piece_rows, group_rows - r0);
      }
      run_item(pb, params, scale, cap, bk / pb.nh_kv, bk % pb.nh_kv, r0, nq, buf, out);
    }
  });
}

}  // namespace WICK_ISA_NS
}  // namespace wick::cpu
