// CPU halves of nn::paged_attention and nn::paged_kv_write.
// A work item is one (query token, kv head), or one (query token, query head) where those are too
// few to share among the workers: the item's query heads walk the token's pages in position order
// (from the first key of its window), scores (soft-capped when asked) in f32 (f64 for f64) from
// 8-lane dot products whose lanes are summed in one fixed order, then softmax and the weighted sum
// of the values. Every token's result comes from its own sequence's keys in that order alone, so it
// is the same bits whichever tokens share the batch and however the items are split across the
// workers. Pools: (pages, h_kv, P, d).

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define WICK_PAGED_AVX2 1
#endif

#include "cpu/cpu_storage.h"
#include "cpu/load8.h"
#include "cpu/parallel.h"
#include "dispatch.h"
#include "fused/paged_attention.h"
#include "tensor_internal.h"
#include "util.h"
#include "wick/error.h"

namespace wick::detail {

namespace {

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T>
T* data_of(const Tensor& t) {
  return cpu::as_cpu(backend_of(t)).as<T>() + t.impl()->layout.start_offset();
}

// q . k over d elements with q already in f32 (f64 for f64): 8 lane sums, added pairwise.
template <class T>
acc_t<T> dot(const acc_t<T>* q, const T* k, size_t d) {
  size_t e = 0;
  acc_t<T> lanes[8] = {};
#if defined(WICK_PAGED_AVX2)
  if constexpr (!std::is_same_v<T, double>) {
    __m256 acc = _mm256_setzero_ps();
    for (; e + 8 <= d; e += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), cpu::load8(k + e), acc);
    _mm256_storeu_ps(lanes, acc);
  }
#endif
  for (; e + 8 <= d; e += 8) {
    for (size_t l = 0; l < 8; ++l) lanes[l] += q[e + l] * static_cast<acc_t<T>>(k[e + l]);
  }
  for (; e < d; ++e) lanes[e % 8] += q[e] * static_cast<acc_t<T>>(k[e]);
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

// out += p * v over d elements.
template <class T>
void axpy(acc_t<T>* out, acc_t<T> p, const T* v, size_t d) {
  size_t e = 0;
#if defined(WICK_PAGED_AVX2)
  if constexpr (!std::is_same_v<T, double>) {
    const __m256 pv = _mm256_set1_ps(p);
    for (; e + 8 <= d; e += 8) {
      _mm256_storeu_ps(out + e, _mm256_fmadd_ps(pv, cpu::load8(v + e), _mm256_loadu_ps(out + e)));
    }
  }
#endif
  for (; e < d; ++e) out[e] = std::fma(p, static_cast<acc_t<T>>(v[e]), out[e]);
}

// dot() of four keys at once, each with the same lanes and sums: a row's dot product is a chain
// of dependent multiply-adds, so four side by side keep the FMA units busy.
template <class T>
void dot4(const acc_t<T>* q, const T* const k[4], size_t d, acc_t<T> out[4]) {
#if defined(WICK_PAGED_AVX2)
  if constexpr (!std::is_same_v<T, double>) {
    if (d % 8 == 0) {
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      for (size_t e = 0; e < d; e += 8) {
        const __m256 qv = _mm256_loadu_ps(q + e);
        for (int i = 0; i < 4; ++i) acc[i] = _mm256_fmadd_ps(qv, cpu::load8(k[i] + e), acc[i]);
      }
      for (int i = 0; i < 4; ++i) {
        float lanes[8];
        _mm256_storeu_ps(lanes, acc[i]);
        out[i] = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                 ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
      }
      return;
    }
  }
#endif
  for (int i = 0; i < 4; ++i) out[i] = dot<T>(q, k[i], d);
}

#if defined(WICK_PAGED_AVX2)
// acc[0, 8 W) += p[i] * row(i)[0, 8 W) for the n keys in order, the sums held in registers.
template <int W, class T, class Row>
void add_rows_chunk(float* acc, const float* p, size_t n, const Row& row, size_t e0) {
  __m256 s[W];
  for (int v = 0; v < W; ++v) s[v] = _mm256_loadu_ps(acc + e0 + 8 * v);
  for (size_t i = 0; i < n; ++i) {
    const T* r = row(i) + e0;
    const __m256 pv = _mm256_set1_ps(p[i]);
    for (int v = 0; v < W; ++v) s[v] = _mm256_fmadd_ps(pv, cpu::load8(r + 8 * v), s[v]);
  }
  for (int v = 0; v < W; ++v) _mm256_storeu_ps(acc + e0 + 8 * v, s[v]);
}
#endif

// acc += sum over the n keys, in order, of p[i] * row(i): axpy() key by key (the same
// multiply-add an element a key, in key order), with the running sums kept in registers, 64
// elements at a time.
template <class T, class Row>
void add_rows(acc_t<T>* acc, const acc_t<T>* p, size_t n, const Row& row, size_t d) {
#if defined(WICK_PAGED_AVX2)
  if constexpr (!std::is_same_v<T, double>) {
    if (d % 8 == 0) {
      size_t e0 = 0;
      for (; e0 + 64 <= d; e0 += 64) add_rows_chunk<8, T>(acc, p, n, row, e0);
      if (e0 + 32 <= d) add_rows_chunk<4, T>(acc, p, n, row, e0), e0 += 32;
      if (e0 + 16 <= d) add_rows_chunk<2, T>(acc, p, n, row, e0), e0 += 16;
      if (e0 + 8 <= d) add_rows_chunk<1, T>(acc, p, n, row, e0);
      return;
    }
  }
#endif
  for (size_t i = 0; i < n; ++i) axpy<T>(acc, p[i], row(i), d);
}

Tensor cpu_paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                           const Tensor& page_table, const Tensor& token_seq,
                           const Tensor& token_pos, double scale, size_t window, double softcap) {
  const size_t tokens = q.dims()[0], h = q.dims()[1], d = q.dims()[2];
  const size_t pages = k_pages.dims()[0], h_kv = k_pages.dims()[1], ps = k_pages.dims()[2];
  const size_t group = h / h_kv;
  const size_t n_seqs = page_table.dims()[0], width = page_table.dims()[1];
  auto out = std::make_unique<cpu::CpuStorage>(tokens * h * d, q.dtype());
  auto locks = read_locks({&q, &k_pages, &v_pages, &page_table, &token_seq, &token_pos});
  const uint32_t* table = data_of<uint32_t>(page_table);
  const uint32_t* seq = data_of<uint32_t>(token_seq);
  const uint32_t* pos = data_of<uint32_t>(token_pos);
  for (size_t t = 0; t < tokens; ++t) {
    if (seq[t] >= n_seqs || pos[t] / ps >= width) {
      throw IndexOutOfRange(str("paged_attention: token ", t, " of sequence ", seq[t],
                                " at position ", pos[t], " is outside the page table (", n_seqs,
                                " sequences of ", width, " pages of ", ps, ")"));
    }
    for (size_t i = 0; i <= pos[t] / ps; ++i) {
      if (table[seq[t] * width + i] >= pages) {
        throw IndexOutOfRange(str("paged_attention: page ", table[seq[t] * width + i],
                                  " of sequence ", seq[t], " is outside the pool of ", pages));
      }
    }
  }
  dispatch_float(q.dtype(), "paged_attention", [&]<class T>() {
    using A = acc_t<T>;
    const T* qp = data_of<T>(q);
    const T* kp = data_of<T>(k_pages);
    const T* vp = data_of<T>(v_pages);
    T* op = out->template as<T>();
    const A sc = static_cast<A>(scale != 0 ? scale : 1.0 / std::sqrt(static_cast<double>(d)));
    const A cap = static_cast<A>(softcap);
    auto first_key = [&](size_t p) { return window > 0 && p + 1 > window ? p + 1 - window : 0; };
    // An item is a (token, k/v head) and its group's query heads, which share the key and value
    // rows; where those are fewer than two a thread (a decode step), a (token, query head) alone.
    // The same arithmetic a head either way. Chunks of about 16k multiply-adds, from the batch's
    // average key count.
    const size_t heads_per_item = tokens * h_kv < 2 * cpu::num_threads() ? 1 : group;
    const size_t per_token = h / heads_per_item;
    size_t keys = 0;
    for (size_t t = 0; t < tokens; ++t) keys += pos[t] + 1 - first_key(pos[t]);
    const size_t per_item = std::max<size_t>(1, keys * heads_per_item * d / tokens);
    const size_t grain = std::max<size_t>(1, 16384 / per_item);
    cpu::parallel_for(tokens * per_token, grain, [&](size_t begin, size_t end) {
      std::vector<A> qf(heads_per_item * d), acc(d), scores;
      for (size_t item = begin; item < end; ++item) {
        const size_t t = item / per_token, head0 = item % per_token * heads_per_item;
        const size_t g = head0 / group;
        // Keys first..pos[t]: n of them, score i for position first + i.
        const size_t first = first_key(pos[t]), n = pos[t] + 1 - first;
        const uint32_t* pt = table + seq[t] * width;
        scores.resize(heads_per_item * n);
        for (size_t r = 0; r < heads_per_item * d; ++r) {
          qf[r] = static_cast<A>(qp[(t * h + head0) * d + r]);
        }
        auto key_row = [&](const T* pool, size_t i) {
          const size_t j = first + i;
          return pool + ((pt[j / ps] * h_kv + g) * ps + j % ps) * d;
        };
        auto score = [&](A dot_product) {
          A x = dot_product * sc;
          return cap > 0 ? cap * std::tanh(x / cap) : x;
        };
        size_t i = 0;
        for (; i + 4 <= n; i += 4) {
          const T* rows[4] = {key_row(kp, i), key_row(kp, i + 1), key_row(kp, i + 2),
                              key_row(kp, i + 3)};
          for (size_t r = 0; r < heads_per_item; ++r) {
            A dots[4];
            dot4<T>(qf.data() + r * d, rows, d, dots);
            for (size_t u = 0; u < 4; ++u) scores[r * n + i + u] = score(dots[u]);
          }
        }
        for (; i < n; ++i) {
          for (size_t r = 0; r < heads_per_item; ++r) {
            scores[r * n + i] = score(dot<T>(qf.data() + r * d, key_row(kp, i), d));
          }
        }
        for (size_t r = 0; r < heads_per_item; ++r) {
          A* s = scores.data() + r * n;
          A mx = -std::numeric_limits<A>::infinity();
          for (size_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
          A sum = 0;
          for (size_t j = 0; j < n; ++j) {
            s[j] = std::exp(s[j] - mx);
            sum += s[j];
          }
          std::fill(acc.begin(), acc.end(), A(0));
          add_rows<T>(
              acc.data(), s, n, [&](size_t i) { return key_row(vp, i); }, d);
          const A inv = A(1) / sum;
          T* o = op + (t * h + head0 + r) * d;
          for (size_t e = 0; e < d; ++e) o[e] = T(acc[e] * inv);
        }
      }
    });
  });
  return from_storage(std::move(out), q.shape());
}

void cpu_paged_kv_write(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k,
                        const Tensor& v, const Tensor& slots) {
  const size_t tokens = k.dims()[0], h_kv = k.dims()[1], d = k.dims()[2];
  const size_t pages = k_pages.dims()[0], ps = k_pages.dims()[2];
  std::vector<uint32_t> slot = slots.to_vec1<uint32_t>();
  for (size_t t = 0; t < tokens; ++t) {
    if (slot[t] / ps >= pages) {
      throw IndexOutOfRange(str("paged_kv_write: slot ", slot[t], " of token ", t,
                                " is outside the pool of ", pages, " pages of ", ps));
    }
  }
  StorageLocks locks({k.impl()->storage.get(), v.impl()->storage.get()},
                     {k_pages.impl()->storage.get(), v_pages.impl()->storage.get()});
  const size_t elem = size_in_bytes(k.dtype());
  dispatch_float(k.dtype(), "paged_kv_write", [&]<class T>() {
    const T* kp = data_of<T>(k);
    const T* vp = data_of<T>(v);
    T* kc = data_of<T>(k_pages);
    T* vc = data_of<T>(v_pages);
    for (size_t t = 0; t < tokens; ++t) {
      const size_t page = slot[t] / ps, row = slot[t] % ps;
      for (size_t g = 0; g < h_kv; ++g) {
        const size_t dst = ((page * h_kv + g) * ps + row) * d;
        std::memcpy(kc + dst, kp + (t * h_kv + g) * d, d * elem);
        std::memcpy(vc + dst, vp + (t * h_kv + g) * d, d * elem);
      }
    }
  });
  k_pages.impl()->storage->bump_version();
  v_pages.impl()->storage->bump_version();
}

}  // namespace

}  // namespace wick::detail

namespace wick::fused {

std::optional<TensorList> PagedAttentionOp::cpu(const TensorList& in) const {
  return TensorList{detail::cpu_paged_attention(in[0], in[1], in[2], in[3], in[4], in[5], scale,
                                                window, softcap)};
}

std::optional<TensorList> PagedKvWriteOp::cpu(const TensorList& in) const {
  detail::cpu_paged_kv_write(in[0], in[1], in[2], in[3], in[4]);
  return TensorList{};
}

}  // namespace wick::fused
