// Scaled dot-product attention on the CPU: f64 and f16/bf16 here, f32 in attention_f32.cpp
// (compiled per instruction set, queries held transposed). One work item per (batch, k/v head, tile
// of 64 rows) over the thread pool, a row being one query of one of the heads that share the k/v
// head, so grouped-query heads share each k/v tile (and a decoding step reads the cache once per
// group). Keys and values stream through in tiles of 64 with an online softmax (running max and sum
// per row), so the (s, s_kv) score matrix is never stored; causal tiles past an item's last visible
// key are skipped. f16/bf16 take a two-pass version that rounds where transformers' eager
// attention does (attention_rounded).

#include "cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_storage.h"
#include "cpu/fused.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/vec_exp.h"
#include "dispatch.h"
#include "fused/attention.h"
#include "fused_op.h"
#include "tensor_internal.h"

namespace wick::cpu {
namespace {

constexpr size_t kQueryTile = 64;
constexpr size_t kKeyTile = 64;

// ---- tile products: scores = Q K^T and O += P V over one key tile ----

// s[r][j] = sum_t q[r][t] kt[t][j] for r < nq, j < kw (kt is K transposed, rows kKeyTile long;
// kw a multiple of 16 up to kKeyTile).
template <class C>
void tile_scores(const C* q, const C* kt, C* s, size_t nq, size_t d, size_t kw) {
  size_t r = 0;
  if constexpr (std::is_same_v<C, float>) {
    // 4 rows x 16 keys of accumulators in registers; each K load serves 4 rows.
    for (; r + 4 <= nq; r += 4) {
      for (size_t j0 = 0; j0 < kw; j0 += 16) {
        v8f acc[4][2] = {};
        for (size_t t = 0; t < d; ++t) {
          v8f k0 = load8(kt + t * kKeyTile + j0), k1 = load8(kt + t * kKeyTile + j0 + 8);
          for (size_t i = 0; i < 4; ++i) {
            float a = q[(r + i) * d + t];
            acc[i][0] += a * k0;
            acc[i][1] += a * k1;
          }
        }
        for (size_t i = 0; i < 4; ++i) {
          store8(s + (r + i) * kKeyTile + j0, acc[i][0]);
          store8(s + (r + i) * kKeyTile + j0 + 8, acc[i][1]);
        }
      }
    }
  }
  for (; r < nq; ++r) {
    C* sr = s + r * kKeyTile;
    for (size_t j = 0; j < kw; ++j) sr[j] = 0;
    for (size_t t = 0; t < d; ++t) {
      C a = q[r * d + t];
      const C* row = kt + t * kKeyTile;
      for (size_t j = 0; j < kw; ++j) sr[j] += a * row[j];
    }
  }
}

// o[r][t] += sum_j p[r][j] v[j][t] for r < nq, j < nk.
template <class C>
void tile_pv(const C* p, const C* v, C* o, size_t nq, size_t nk, size_t d) {
  size_t r = 0;
  if constexpr (std::is_same_v<C, float>) {
    size_t d16 = d / 16 * 16;
    for (; r + 4 <= nq; r += 4) {
      for (size_t t0 = 0; t0 < d16; t0 += 16) {
        v8f acc[4][2];
        for (size_t i = 0; i < 4; ++i) {
          acc[i][0] = load8(o + (r + i) * d + t0);
          acc[i][1] = load8(o + (r + i) * d + t0 + 8);
        }
        for (size_t j = 0; j < nk; ++j) {
          v8f v0 = load8(v + j * d + t0), v1 = load8(v + j * d + t0 + 8);
          for (size_t i = 0; i < 4; ++i) {
            float a = p[(r + i) * kKeyTile + j];
            acc[i][0] += a * v0;
            acc[i][1] += a * v1;
          }
        }
        for (size_t i = 0; i < 4; ++i) {
          store8(o + (r + i) * d + t0, acc[i][0]);
          store8(o + (r + i) * d + t0 + 8, acc[i][1]);
        }
      }
      for (size_t i = 0; i < 4; ++i) {
        for (size_t j = 0; j < nk; ++j) {
          float a = p[(r + i) * kKeyTile + j];
          for (size_t t = d16; t < d; ++t) o[(r + i) * d + t] += a * v[j * d + t];
        }
      }
    }
  }
  for (; r < nq; ++r) {
    C* orow = o + r * d;
    for (size_t j = 0; j < nk; ++j) {
      C a = p[r * kKeyTile + j];
      if (a == C(0)) continue;
      const C* vr = v + j * d;
      for (size_t t = 0; t < d; ++t) orow[t] += a * vr[t];
    }
  }
}

template <class T>
void attention_typed(const AttentionParams& p, const std::vector<KernelOperand>& ops, T* out) {
  using C = compute_t<T>;
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  const Problem<T> pb(ops, kQueryTile);
  C scale = static_cast<C>(p.scale);

  parallel_for(pb.items, 1, [&](size_t i0, size_t i1) {
    std::vector<C> kt(pb.d * kKeyTile), vt(kKeyTile * pb.d), q(kQueryTile * pb.d),
        o(kQueryTile * pb.d), sc(kQueryTile * kKeyTile);
    C m[kQueryTile], l[kQueryTile];
    size_t row_head[kQueryTile], row_query[kQueryTile];
    long row_first[kQueryTile];
    for (size_t item = i0; item < i1; ++item) {
      size_t qt = item % pb.q_tiles, bk = item / pb.q_tiles;
      size_t bi = bk / pb.nh_kv, hk = bk % pb.nh_kv;
      size_t r0 = qt * kQueryTile, nq = std::min(kQueryTile, pb.group_rows - r0);
      long last_visible = -1, first_seen = std::numeric_limits<long>::max();
      for (size_t r = 0; r < nq; ++r) {
        size_t hi = hk * pb.group + (r0 + r) / pb.s, qi = (r0 + r) % pb.s;
        row_head[r] = hi;
        row_query[r] = qi;
        row_first[r] = pb.first_key(p, qi);
        first_seen = std::min(first_seen, row_first[r]);
        const T* qr = pb.qp + bi * pb.qv.strides[0] + hi * pb.qv.strides[1] + qi * pb.qv.strides[2];
        for (size_t t = 0; t < pb.d; ++t) q[r * pb.d + t] = static_cast<C>(qr[t]) * scale;
        m[r] = kNegInf;
        l[r] = 0;
        last_visible = std::max(last_visible, p.causal ? static_cast<long>(qi) + pb.shift
                                                       : static_cast<long>(pb.s_kv) - 1);
      }
      std::fill_n(o.begin(), nq * pb.d, C(0));
      size_t key_end = static_cast<size_t>(std::clamp(last_visible + 1, 0L, long(pb.s_kv)));
      // Tiles before every row's window are skipped.
      size_t key_begin = std::min(static_cast<size_t>(first_seen), key_end) / kKeyTile * kKeyTile;
      const T* kbase = pb.kp + bi * pb.kv.strides[0] + hk * pb.kv.strides[1];
      const T* vbase = pb.vp + bi * pb.vv.strides[0] + hk * pb.vv.strides[1];
      for (size_t k0 = key_begin; k0 < key_end; k0 += kKeyTile) {
        size_t nk = std::min(kKeyTile, key_end - k0);
        // Short tiles (short sequences) compute scores for nk keys rounded up to 16, not 64.
        size_t kw = std::min(kKeyTile, (nk + 15) / 16 * 16);
        // K transposed (pb.d, tile) so that scores are axpys along the tile; zeros past the end.
        for (size_t j = 0; j < kw; ++j) {
          if (j < nk) {
            const T* kr = kbase + (k0 + j) * pb.kv.strides[2];
            const T* vr = vbase + (k0 + j) * pb.vv.strides[2];
            for (size_t t = 0; t < pb.d; ++t) {
              kt[t * kKeyTile + j] = static_cast<C>(kr[t]);
              vt[j * pb.d + t] = static_cast<C>(vr[t]);
            }
          } else {
            for (size_t t = 0; t < pb.d; ++t) kt[t * kKeyTile + j] = 0;
          }
        }
        tile_scores(q.data(), kt.data(), sc.data(), nq, pb.d, kw);
        // The online softmax of each row over this tile; p overwrites the scores.
        for (size_t r = 0; r < nq; ++r) {
          C* sr = sc.data() + r * kKeyTile;
          long qi = static_cast<long>(row_query[r]);
          size_t hi = row_head[r];
          long limit = p.causal ? qi + pb.shift : static_cast<long>(pb.s_kv) - 1;
          size_t visible = static_cast<size_t>(
              std::clamp(limit - static_cast<long>(k0) + 1, 0L, static_cast<long>(nk)));
          if (p.softcap > 0) {
            const C cap = static_cast<C>(p.softcap);
            for (size_t j = 0; j < visible; ++j) sr[j] = cap * std::tanh(sr[j] / cap);
          }
          if (pb.has_mask) {
            const T* mrow = pb.mp + bi * pb.mv.strides[0] + hi * pb.mv.strides[1] +
                            static_cast<size_t>(qi) * pb.mv.strides[2] + k0 * pb.mv.strides[3];
            const size_t ms = pb.mv.strides[3];
            if (ms == 1) {  // a row of keys read in a vectorised loop
              for (size_t j = 0; j < visible; ++j) sr[j] += static_cast<C>(mrow[j]);
            } else {
              for (size_t j = 0; j < visible; ++j) sr[j] += static_cast<C>(mrow[j * ms]);
            }
          }
          for (size_t j = visible; j < kw; ++j) sr[j] = kNegInf;
          // Keys before the row's window.
          size_t before = static_cast<size_t>(
              std::clamp(row_first[r] - static_cast<long>(k0), 0L, static_cast<long>(visible)));
          for (size_t j = 0; j < before; ++j) sr[j] = kNegInf;
          // Eight running maxima and sums so that the loops vectorise.
          C mx8[8] = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
          for (size_t j = 0; j < kw; j += 8) {
            for (size_t e = 0; e < 8; ++e) mx8[e] = sr[j + e] > mx8[e] ? sr[j + e] : mx8[e];
          }
          C mx = kNegInf;
          for (C v : mx8) mx = std::max(mx, v);
          C m_new = std::max(m[r], mx);
          C* orow = o.data() + r * pb.d;
          if (m_new == kNegInf) {  // every key so far is masked out
            for (size_t j = 0; j < kw; ++j) sr[j] = 0;
            continue;
          }
          C corr = m[r] == kNegInf ? C(0) : exp_le0(m[r] - m_new);
          for (size_t j = 0; j < kw; ++j) sr[j] = exp_le0(sr[j] - m_new);
          C sum8[8] = {};
          for (size_t j = 0; j < kw; j += 8) {
            for (size_t e = 0; e < 8; ++e) sum8[e] += sr[j + e];
          }
          C sum = ((sum8[0] + sum8[1]) + (sum8[2] + sum8[3])) +
                  ((sum8[4] + sum8[5]) + (sum8[6] + sum8[7]));
          l[r] = l[r] * corr + sum;
          m[r] = m_new;
          if (corr != C(1)) {
            for (size_t t = 0; t < pb.d; ++t) orow[t] *= corr;
          }
        }
        tile_pv(sc.data(), vt.data(), o.data(), nq, nk, pb.d);
      }
      // A query that sees no key (causal with pb.s > pb.s_kv, or an all -inf mask row) gets zeros.
      for (size_t r = 0; r < nq; ++r) {
        T* orow = out + ((bi * pb.nh + row_head[r]) * pb.s + row_query[r]) * pb.d;
        C inv = l[r] > C(0) ? C(1) / l[r] : C(0);
        for (size_t t = 0; t < pb.d; ++t) orow[t] = T(o[r * pb.d + t] * inv);
      }
    }
  });
}

// f16/bf16 attention rounded where transformers' eager attention rounds in the model's dtype:
// scores = round(round(Q K^T) * scale), + mask rounded, softmax in f32 over the whole row, the
// probabilities rounded, P V accumulated in f32 and rounded once. The softmax needs each row's
// final max and sum before any probability is rounded, so the scores of the item's rows are
// kept whole (nq x visible keys floats) instead of streamed: two passes over the keys.
template <class T>
void attention_rounded(const AttentionParams& p, const std::vector<KernelOperand>& ops, T* out) {
  using C = float;
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  const Problem<T> pb(ops, kQueryTile);
  C scale = static_cast<C>(p.scale);

  parallel_for(pb.items, 1, [&](size_t i0, size_t i1) {
    std::vector<C> kt(pb.d * kKeyTile), vt(kKeyTile * pb.d), q(kQueryTile * pb.d),
        o(kQueryTile * pb.d), sc(kQueryTile * kKeyTile), rows;
    size_t row_head[kQueryTile], row_query[kQueryTile];
    long row_limit[kQueryTile], row_first[kQueryTile];
    for (size_t item = i0; item < i1; ++item) {
      size_t qt = item % pb.q_tiles, bk = item / pb.q_tiles;
      size_t bi = bk / pb.nh_kv, hk = bk % pb.nh_kv;
      size_t r0 = qt * kQueryTile, nq = std::min(kQueryTile, pb.group_rows - r0);
      long last_visible = -1, first_seen = std::numeric_limits<long>::max();
      for (size_t r = 0; r < nq; ++r) {
        size_t hi = hk * pb.group + (r0 + r) / pb.s, qi = (r0 + r) % pb.s;
        row_head[r] = hi;
        row_query[r] = qi;
        row_first[r] = pb.first_key(p, qi);
        first_seen = std::min(first_seen, row_first[r]);
        row_limit[r] = p.causal ? static_cast<long>(qi) + pb.shift : static_cast<long>(pb.s_kv) - 1;
        const T* qr = pb.qp + bi * pb.qv.strides[0] + hi * pb.qv.strides[1] + qi * pb.qv.strides[2];
        for (size_t t = 0; t < pb.d; ++t) q[r * pb.d + t] = static_cast<C>(qr[t]);
        last_visible = std::max(last_visible, row_limit[r]);
      }
      size_t key_end = static_cast<size_t>(std::clamp(last_visible + 1, 0L, long(pb.s_kv)));
      rows.assign(nq * key_end, kNegInf);
      const T* kbase = pb.kp + bi * pb.kv.strides[0] + hk * pb.kv.strides[1];
      const T* vbase = pb.vp + bi * pb.vv.strides[0] + hk * pb.vv.strides[1];
      size_t key_begin = std::min(static_cast<size_t>(first_seen), key_end) / kKeyTile * kKeyTile;
      // Pass 1: the rounded scores of every visible key (the soft-cap rounded at each of
      // transformers' steps: / cap, tanh, * cap).
      const C cap = static_cast<C>(p.softcap);
      for (size_t k0 = key_begin; k0 < key_end; k0 += kKeyTile) {
        size_t nk = std::min(kKeyTile, key_end - k0);
        for (size_t j = 0; j < kKeyTile; ++j) {
          if (j < nk) {
            const T* kr = kbase + (k0 + j) * pb.kv.strides[2];
            for (size_t t = 0; t < pb.d; ++t) kt[t * kKeyTile + j] = static_cast<C>(kr[t]);
          } else {
            for (size_t t = 0; t < pb.d; ++t) kt[t * kKeyTile + j] = 0;
          }
        }
        tile_scores(q.data(), kt.data(), sc.data(), nq, pb.d, kKeyTile);
        for (size_t r = 0; r < nq; ++r) {
          long visible =
              std::clamp(row_limit[r] - static_cast<long>(k0) + 1, 0L, static_cast<long>(nk));
          C* dst = rows.data() + r * key_end + k0;
          long before = std::clamp(row_first[r] - static_cast<long>(k0), 0L, visible);
          for (long j = before; j < visible; ++j) {
            C v = round_as<T>(round_as<T>(sc[r * kKeyTile + j]) * scale);
            if (p.softcap > 0) v = round_as<T>(round_as<T>(std::tanh(round_as<T>(v / cap))) * cap);
            if (pb.has_mask) {
              v = round_as<T>(
                  v + static_cast<C>(
                          pb.mp[bi * pb.mv.strides[0] + row_head[r] * pb.mv.strides[1] +
                                row_query[r] * pb.mv.strides[2] + (k0 + j) * pb.mv.strides[3]]));
            }
            dst[j] = v;
          }
        }
      }
      // The softmax of each row in f32, the probabilities rounded.
      for (size_t r = 0; r < nq; ++r) {
        C* row = rows.data() + r * key_end;
        C mx = kNegInf;
        for (size_t j = 0; j < key_end; ++j) mx = std::max(mx, row[j]);
        if (mx == kNegInf) {  // no visible key: zeros
          std::fill(row, row + key_end, C(0));
          continue;
        }
        C sum = 0;
        for (size_t j = 0; j < key_end; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        for (size_t j = 0; j < key_end; ++j) row[j] = round_as<T>(row[j] / sum);
      }
      // Pass 2: O = P V, accumulated in f32.
      std::fill(o.begin(), o.end(), C(0));
      for (size_t k0 = key_begin; k0 < key_end; k0 += kKeyTile) {
        size_t nk = std::min(kKeyTile, key_end - k0);
        for (size_t j = 0; j < nk; ++j) {
          const T* vr = vbase + (k0 + j) * pb.vv.strides[2];
          for (size_t t = 0; t < pb.d; ++t) vt[j * pb.d + t] = static_cast<C>(vr[t]);
        }
        for (size_t r = 0; r < nq; ++r) {
          for (size_t j = 0; j < kKeyTile; ++j) {
            sc[r * kKeyTile + j] = j < nk ? rows[r * key_end + k0 + j] : C(0);
          }
        }
        tile_pv(sc.data(), vt.data(), o.data(), nq, nk, pb.d);
      }
      for (size_t r = 0; r < nq; ++r) {
        T* orow = out + ((bi * pb.nh + row_head[r]) * pb.s + row_query[r]) * pb.d;
        for (size_t t = 0; t < pb.d; ++t) orow[t] = T(o[r * pb.d + t]);
      }
    }
  });
}

StoragePtr attention(const AttentionParams& params, const std::vector<KernelOperand>& operands) {
  const Layout& ql = operands[0].layout;
  DType dtype = operands[0].storage->dtype();
  auto out = std::make_unique<CpuStorage>(ql.elem_count(), dtype);
  if (ql.elem_count() == 0) return out;
  dispatch_float(dtype, "scaled_dot_product_attention", [&]<class T>() {
    if constexpr (std::is_same_v<T, float>) {
      kernels().attention_f32(params, operands, out->as<T>());
    } else if constexpr (std::is_same_v<T, compute_t<T>>) {
      attention_typed<T>(params, operands, out->as<T>());
    } else {
      attention_rounded<T>(params, operands, out->as<T>());
    }
  });
  return out;
}

}  // namespace

}  // namespace wick::cpu

namespace wick::fused {

std::optional<TensorList> AttentionOp::cpu(const TensorList& in) const {
  auto locks = detail::lock_inputs(*this, in);
  std::vector<KernelOperand> operands;
  operands.reserve(in.size());
  for (const Tensor& t : in) operands.push_back(detail::kernel_operand(t));
  return TensorList{detail::from_storage(cpu::attention({scale, causal, window, softcap}, operands),
                                         in[0].shape())};
}

}  // namespace wick::fused
