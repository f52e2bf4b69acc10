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
#include "cpu/paged_attention.h"
#include "cpu/parallel.h"
#include "cpu/vec_exp.h"
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

// Asks for the cache lines of `bytes` bytes from p: a sequence's rows are contiguous only within
// a page, where the hardware prefetchers are slow to start, so the kernel asks for the rows a few
// keys ahead itself.
inline void prefetch_bytes(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b);
}

// Keys ahead whose rows are asked for.
constexpr size_t kPrefetchKeys = 16;

// dot() of eight keys at once, each with the same lanes and sums: a row's dot product is a chain
// of dependent multiply-adds, so eight side by side keep the FMA units busy, and their lanes are
// summed in one transposed reduction, pair by pair as dot() adds them.
template <class T>
void dot8(const acc_t<T>* q, const T* const k[8], size_t d, acc_t<T> out[8]) {
#if defined(WICK_PAGED_AVX2)
  if constexpr (!std::is_same_v<T, double>) {
    if (d % 8 == 0) {
      __m256 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (size_t e = 0; e < d; e += 8) {
        const __m256 qv = _mm256_loadu_ps(q + e);
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, cpu::load8(k[i] + e), acc[i]);
      }
      // Per key, lanes l0..l7: a = (l0 + l4, l1 + l5, l2 + l6, l3 + l7) for keys 2j and 2j + 1
      // side by side, reordered to (a0, a2, a1, a3); then (a0 + a2, a1 + a3); then their sum.
      __m256 a[4];
      for (int j = 0; j < 4; ++j) {
        const __m256 lo = _mm256_permute2f128_ps(acc[2 * j], acc[2 * j + 1], 0x20);
        const __m256 hi = _mm256_permute2f128_ps(acc[2 * j], acc[2 * j + 1], 0x31);
        a[j] = _mm256_permute_ps(_mm256_add_ps(lo, hi), 0xD8);
      }
      // Keys (0, 2, 4, 6 | 1, 3, 5, 7) after the two pairwise adds.
      const __m256 sums = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
      _mm256_storeu_ps(out,
                       _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      return;
    }
  }
#endif
  for (int i = 0; i < 8; ++i) out[i] = dot<T>(q, k[i], d);
}

// The softmax of n scores in place, unnormalised: s[j] = exp(s[j] - max); returns their sum,
// taken in 8 lanes added pairwise as dot() adds them.
template <class A>
A softmax_unnormalised(A* s, size_t n) {
  A lanes[8];
  std::fill(lanes, lanes + 8, -std::numeric_limits<A>::infinity());
  size_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (size_t l = 0; l < 8; ++l) lanes[l] = std::max(lanes[l], s[j + l]);
  }
  A mx = -std::numeric_limits<A>::infinity();
  for (size_t l = 0; l < 8; ++l) mx = std::max(mx, lanes[l]);
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  for (size_t i = 0; i < n; ++i) s[i] = cpu::exp_le0<A>(s[i] - mx);
  std::fill(lanes, lanes + 8, A(0));
  for (j = 0; j + 8 <= n; j += 8) {
    for (size_t l = 0; l < 8; ++l) lanes[l] += s[j + l];
  }
  for (; j < n; ++j) lanes[j % 8] += s[j];
  return ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
         ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
}

#if defined(WICK_PAGED_AVX2)
// acc[0, 8 W) += p[i] * row(i)[0, 8 W) for the n keys in order, the sums held in registers.
template <int W, class T, class Row>
void add_rows_chunk(float* acc, const float* p, size_t n, const Row& row, size_t e0) {
  __m256 s[W];
  for (int v = 0; v < W; ++v) s[v] = _mm256_loadu_ps(acc + e0 + 8 * v);
  for (size_t i = 0; i < n; ++i) {
    const T* r = row(i) + e0;
    if (i + kPrefetchKeys < n) prefetch_bytes(row(i + kPrefetchKeys) + e0, 8 * W * sizeof(T));
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

// Pointers and sizes of one paged attention call (see the file comment); T the element type.
template <class T>
struct PagedRows {
  const T* q;      // (tokens, h, d)
  const T *k, *v;  // the pools (pages, h_kv, ps, d)
  size_t tokens, h, d;
  size_t pages, h_kv, ps;
  const uint32_t* table;  // (n_seqs, width)
  size_t n_seqs, width;
  const uint32_t *seq, *pos;  // (tokens)
  double scale;               // 0: 1 / sqrt(d)
  double softcap;             // 0: none
  size_t window;              // 0: none
};

// The call's pointers and sizes from its operands (q's rows already typed: tokens x h x d).
template <class T>
PagedRows<T> rows_of(const T* q, size_t tokens, size_t h, size_t d, const Tensor& k_pages,
                     const Tensor& v_pages, const Tensor& page_table, const Tensor& token_seq,
                     const Tensor& token_pos, double scale, double softcap, size_t window) {
  return {q,
          data_of<T>(k_pages),
          data_of<T>(v_pages),
          tokens,
          h,
          d,
          k_pages.dims()[0],
          k_pages.dims()[1],
          k_pages.dims()[2],
          data_of<uint32_t>(page_table),
          page_table.dims()[0],
          page_table.dims()[1],
          data_of<uint32_t>(token_seq),
          data_of<uint32_t>(token_pos),
          scale,
          softcap,
          window};
}

// Each token's indices checked against the page table and the pool.
template <class T>
void check_pages(const PagedRows<T>& a) {
  const uint32_t *seq = a.seq, *pos = a.pos, *table = a.table;
  const size_t n_seqs = a.n_seqs, width = a.width, ps = a.ps, pages = a.pages;
  for (size_t t = 0; t < a.tokens; ++t) {
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
}

template <class T>
void attend_pages(const PagedRows<T>& a, T* op) {
  using A = acc_t<T>;
  check_pages(a);
  const size_t tokens = a.tokens, h = a.h, d = a.d, h_kv = a.h_kv, ps = a.ps, width = a.width;
  const size_t group = h / h_kv, window = a.window;
  const uint32_t *table = a.table, *seq = a.seq, *pos = a.pos;
  const T *qp = a.q, *kp = a.k, *vp = a.v;
  const A sc = static_cast<A>(a.scale != 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(d)));
  const A cap = static_cast<A>(a.softcap);
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
      for (; i + 8 <= n; i += 8) {
        const T* rows[8];
        for (size_t u = 0; u < 8; ++u) {
          rows[u] = key_row(kp, i + u);
          if (i + u + kPrefetchKeys < n)
            prefetch_bytes(key_row(kp, i + u + kPrefetchKeys), d * sizeof(T));
        }
        for (size_t r = 0; r < heads_per_item; ++r) {
          A dots[8];
          dot8<T>(qf.data() + r * d, rows, d, dots);
          for (size_t u = 0; u < 8; ++u) scores[r * n + i + u] = score(dots[u]);
        }
      }
      for (; i < n; ++i) {
        for (size_t r = 0; r < heads_per_item; ++r) {
          scores[r * n + i] = score(dot<T>(qf.data() + r * d, key_row(kp, i), d));
        }
      }
      for (size_t r = 0; r < heads_per_item; ++r) {
        A* s = scores.data() + r * n;
        const A sum = softmax_unnormalised(s, n);
        std::fill(acc.begin(), acc.end(), A(0));
        add_rows<T>(
            acc.data(), s, n, [&](size_t i) { return key_row(vp, i); }, d);
        const A inv = A(1) / sum;
        T* o = op + (t * h + head0 + r) * d;
        for (size_t e = 0; e < d; ++e) o[e] = T(acc[e] * inv);
      }
    }
  });
}

Tensor cpu_paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                           const Tensor& page_table, const Tensor& token_seq,
                           const Tensor& token_pos, double scale, size_t window, double softcap) {
  auto out = std::make_unique<cpu::CpuStorage>(q.elem_count(), q.dtype());
  auto locks = read_locks({&q, &k_pages, &v_pages, &page_table, &token_seq, &token_pos});
  dispatch_float(q.dtype(), "paged_attention", [&]<class T>() {
    const PagedRows<T> rows =
        rows_of(data_of<T>(q), q.dims()[0], q.dims()[1], q.dims()[2], k_pages, v_pages, page_table,
                token_seq, token_pos, scale, softcap, window);
    attend_pages<T>(rows, out->template as<T>());
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

namespace wick::cpu {

void paged_attention_f32(const float* q, size_t tokens, size_t h, const Tensor& k_pages,
                         const Tensor& v_pages, const Tensor& page_table, const Tensor& token_seq,
                         const Tensor& token_pos, size_t window, double scale, double softcap,
                         float* out) {
  for (const Tensor* t : {&k_pages, &v_pages}) {
    if (t->dtype() != DType::F32 || t->rank() != 4 || !t->is_contiguous() ||
        !t->device().is_cpu()) {
      throw Error(
          str("paged_attention_f32: the pools must be contiguous f32 (pages, h_kv, page "
              "size, d) on the CPU, got ",
              dtype_name(t->dtype()), " ", t->shape()));
    }
  }
  for (const Tensor* t : {&page_table, &token_seq, &token_pos}) {
    if (t->dtype() != DType::U32 || !t->is_contiguous() || !t->device().is_cpu()) {
      throw Error(str("paged_attention_f32: the indices must be contiguous u32 on the CPU, got ",
                      dtype_name(t->dtype()), " ", t->shape()));
    }
  }
  const detail::PagedRows<float> rows =
      detail::rows_of(q, tokens, h, k_pages.dims()[3], k_pages, v_pages, page_table, token_seq,
                      token_pos, scale, softcap, window);
  detail::attend_pages<float>(rows, out);
}

}  // namespace wick::cpu
