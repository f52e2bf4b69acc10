// CpuStorage::matmul: OpenBLAS gemm/gemv reading the operands through their own strides whenever
// BLAS can (transposes, padded rows, collapsible or broadcast batches), one packed copy when it
// cannot. f16/bf16 are widened to f32, multiplied in f32 and rounded once at the end. On AVX-512
// CPUs the f32 products take wick's own GEMM (cpu/gemm_f32.h) but for the shapes OpenBLAS runs
// faster (see product). OpenBLAS runs single-threaded; large products are split across wick's
// thread pool in parts from the product's size (never the thread count), batches handed out
// whole. WICK_BATCH_INVARIANT=1 takes wick's GEMM (AVX-512 or AVX2) for every f32 shape, else
// invariant_product (f64; CPUs without AVX2), whose calls compute a row the same way for every
// row count.

#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "cpu/blas.h"
#include "cpu/cpu_storage.h"
#include "cpu/gemm_f32.h"
#include "cpu/parallel.h"
#include "dispatch.h"
#include "settings.h"
#include "util.h"

namespace wick::cpu {
namespace {

// ---- BLAS threads ----

// OpenBLAS runs single-threaded, always: large products are split across wick's own pool, each
// part one single-threaded BLAS call. Two thread pools on the same cores would oversubscribe
// them (OpenBLAS's threads spin for a while after each call, as wick's workers do between
// steps), and OpenBLAS's thread count is process-global, so a per-call setting would race. Its
// threads are stopped: openblas_set_num_threads starts them again when init_blas stopped them, and
// a new one spins for some 0.1 s, against the pool's threads.
void init_blas_threads() {
  static const bool done = [] {
    init_blas();
    openblas_set_num_threads(1);
    stop_blas_threads();
    return true;
  }();
  (void)done;
}

// ---- layouts as BLAS sees them ----

constexpr size_t kBlasMax = INT_MAX;

// One (rows x cols) matrix for BLAS: row-major (no transpose) or column-major (transposed), with
// leading dimension ld.
struct MatrixView {
  bool trans;
  size_t ld;
};

// The view BLAS can read for element strides rs (rows) and cs (cols), if any. Dims of size 1
// take any stride; a leading dimension must cover the other dim (no overlapping rows).
std::optional<MatrixView> blas_view(size_t rows, size_t cols, size_t rs, size_t cs) {
  if ((cols <= 1 || cs == 1) && (rows <= 1 || (rs >= cols && rs >= 1))) {
    size_t ld = rows <= 1 ? std::max<size_t>(cols, 1) : rs;
    if (ld <= kBlasMax) return MatrixView{false, ld};
  }
  if ((rows <= 1 || rs == 1) && (cols <= 1 || (cs >= rows && cs >= 1))) {
    size_t ld = cols <= 1 ? std::max<size_t>(rows, 1) : cs;
    if (ld <= kBlasMax) return MatrixView{true, ld};
  }
  return std::nullopt;
}

// The one stride that walks the batch dims (all but the last two) in row-major order, if they
// collapse to one: 0 for a broadcast batch, and any stride when there is at most one batch.
std::optional<size_t> batch_stride(const Layout& layout) {
  const auto& dims = layout.dims();
  const auto& strides = layout.strides();
  std::optional<size_t> stride;
  size_t expect = 0;
  for (size_t i = layout.rank() - 2; i-- > 0;) {
    if (dims[i] == 1) continue;
    if (!stride) {
      stride = strides[i];
    } else if (strides[i] != expect) {
      return std::nullopt;
    }
    expect = strides[i] * dims[i];
  }
  return stride.value_or(0);
}

// Offset of batch i's matrix for batch dims that do not collapse (a permuted batch, or a mix of
// broadcast and real batch dims): no copy is needed, only this arithmetic per batch.
size_t batch_offset(const Layout& layout, size_t i) {
  const auto& dims = layout.dims();
  const auto& strides = layout.strides();
  size_t off = 0;
  for (size_t d = layout.rank() - 2; d-- > 0;) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

// ---- scratch memory ----

// Packed operands and widened f16/bf16 results live in per-thread buffers kept between calls: a
// fresh multi-megabyte allocation per call comes back from the kernel as new pages, about one
// page fault per 4 KiB (some 2,000 for a 1024x1024 f16 product). Up to three buffers of at most
// kScratchKeep bytes stay cached per calling thread; larger ones are freed after the call.
constexpr size_t kScratchKeep = size_t{16} << 20;

struct ScratchSlot {
  std::unique_ptr<std::byte[]> data;
  size_t bytes = 0;
  bool in_use = false;
};

thread_local std::array<ScratchSlot, 3> t_scratch;

template <class C>
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(size_t count) {
    size_t bytes = std::max<size_t>(count, 1) * sizeof(C);
    if (bytes <= kScratchKeep) {
      for (auto& s : t_scratch) {
        if (s.in_use) continue;
        if (s.bytes < bytes) {
          s.data.reset();
          s.data = std::make_unique_for_overwrite<std::byte[]>(bytes);
          s.bytes = bytes;
        }
        s.in_use = true;
        slot_ = &s;
        ptr_ = reinterpret_cast<C*>(s.data.get());
        return;
      }
    }
    owned_ = std::make_unique_for_overwrite<C[]>(std::max<size_t>(count, 1));
    ptr_ = owned_.get();
  }
  Scratch(Scratch&& other) noexcept
      : slot_(std::exchange(other.slot_, nullptr)),
        owned_(std::move(other.owned_)),
        ptr_(std::exchange(other.ptr_, nullptr)) {}
  Scratch& operator=(Scratch&& other) noexcept {
    if (this != &other) {
      release();
      slot_ = std::exchange(other.slot_, nullptr);
      owned_ = std::move(other.owned_);
      ptr_ = std::exchange(other.ptr_, nullptr);
    }
    return *this;
  }
  ~Scratch() { release(); }
  C* get() const { return ptr_; }

 private:
  void release() {
    if (slot_) slot_->in_use = false;
    slot_ = nullptr;
  }
  ScratchSlot* slot_ = nullptr;
  std::unique_ptr<C[]> owned_;
  C* ptr_ = nullptr;
};

// One operand as the BLAS calls see it: batch i's matrix starts at at(i).
template <class C>
struct Operand {
  const C* base = nullptr;
  size_t rs = 0, cs = 0;  // element strides of the matrix dims
  MatrixView view{};
  std::optional<size_t> bstride;   // set when the batch dims collapse
  const Layout* layout = nullptr;  // the batch dims otherwise
  Scratch<C> packed;               // holds base when the operand was copied

  const C* at(size_t i) const { return base + (bstride ? i * *bstride : batch_offset(*layout, i)); }
  // Every batch reads the same matrix.
  bool shared(size_t b) const { return b == 1 || (bstride && *bstride == 0); }
};

// ---- conversions ----

// dst[i] = C(src[i * step]) for i < n.
template <class T, class C>
void convert_line(const T* src, size_t step, size_t n, C* dst) {
  if (step == 1) {
    if constexpr (std::is_same_v<T, C>) {
      std::memcpy(dst, src, n * sizeof(C));
      return;
    }
#if defined(__F16C__)
    if constexpr (std::is_same_v<T, f16> && std::is_same_v<C, float>) {
      size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
      }
      for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
      return;
    }
#endif
    if constexpr (std::is_same_v<T, bf16> && std::is_same_v<C, float>) {
      // The bits of a bf16 are the top half of the float: a shift the compiler vectorises.
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) {
        uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
        std::memcpy(dst + i, &u, 4);
      }
      return;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, C>) {
      dst[i] = src[i * step];
    } else {
      dst[i] = static_cast<float>(src[i * step]);
    }
  }
}

// Rounds n floats to T (f16/bf16) once.
template <class T>
void round_floats(const float* src, size_t n, T* dst) {
  parallel_for(n, 1 << 15, [&](size_t begin, size_t end) {
    size_t i = begin;
#if defined(__F16C__)
    if constexpr (std::is_same_v<T, f16>) {
      for (; i + 8 <= end; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
      }
    }
#endif
    for (; i < end; ++i) dst[i] = T(src[i]);
  });
}

// Copies the operand's matrices into a dense buffer of C, row-major, or column-major when the
// source is column-major (so both sides of the copy run sequentially). A shared (broadcast)
// operand is copied once.
template <class T, class C>
void pack(Operand<C>& op, const T* data, const Layout& layout, size_t b, size_t rows, size_t cols,
          bool col_major) {
  size_t rs = layout.strides()[layout.rank() - 2];
  size_t cs = layout.strides()[layout.rank() - 1];
  auto bstride = batch_stride(layout);
  bool shared = b == 1 || (bstride && *bstride == 0);
  size_t count = shared ? 1 : b;
  const T* base = data + layout.start_offset();

  Scratch<C> buf(count * rows * cols);
  size_t lines = col_major ? cols : rows;
  size_t len = col_major ? rows : cols;
  size_t line_step = col_major ? cs : rs;
  size_t elem_step = col_major ? rs : cs;
  size_t grain = std::max<size_t>(1, (size_t{1} << 14) / len);
  C* dst = buf.get();
  parallel_for(count * lines, grain, [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) {
      size_t bi = t / lines, line = t % lines;
      const T* src = base + (bstride ? bi * *bstride : batch_offset(layout, bi));
      convert_line<T, C>(src + line * line_step, elem_step, len, dst + t * len);
    }
  });

  op.base = buf.get();
  op.rs = col_major ? 1 : cols;
  op.cs = col_major ? rows : 1;
  op.view = *blas_view(rows, cols, op.rs, op.cs);
  op.bstride = shared ? 0 : rows * cols;
  op.layout = nullptr;
  op.packed = std::move(buf);
}

// The operand for the (batch..., rows, cols) `layout` of `data`: read in place when BLAS can
// (C == T and the strides fit), packed otherwise.
template <class T, class C>
Operand<C> make_operand(const T* data, const Layout& layout, size_t b, size_t rows, size_t cols) {
  Operand<C> op;
  size_t rs = layout.strides()[layout.rank() - 2];
  size_t cs = layout.strides()[layout.rank() - 1];
  auto view = blas_view(rows, cols, rs, cs);
  if constexpr (std::is_same_v<T, C>) {
    if (view) {
      op.base = data + layout.start_offset();
      op.rs = rs;
      op.cs = cs;
      op.view = *view;
      op.bstride = batch_stride(layout);
      op.layout = &layout;
      return op;
    }
  }
  pack<T, C>(op, data, layout, b, rows, cols, view && view->trans);
  return op;
}

// ---- BLAS calls ----

int blas_int(size_t v) {
  return static_cast<int>(v);
}

CBLAS_TRANSPOSE trans_flag(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}

// y = op(A) x with A a row-major (rows x cols) matrix.
template <class C>
void gemv(bool trans, size_t rows, size_t cols, const C* a, size_t lda, const C* x, size_t incx,
          C* y) {
  if constexpr (std::is_same_v<C, float>) {
    cblas_sgemv(CblasRowMajor, trans_flag(trans), blas_int(rows), blas_int(cols), 1.0f, a,
                blas_int(lda), x, blas_int(incx), 0.0f, y, 1);
  } else {
    cblas_dgemv(CblasRowMajor, trans_flag(trans), blas_int(rows), blas_int(cols), 1.0, a,
                blas_int(lda), x, blas_int(incx), 0.0, y, 1);
  }
}

// One (m x k) * (k x n) product into the row-major c (leading dimension ldc), single-threaded.
// m == 1 or n == 1 is a gemv, which OpenBLAS runs faster than the same shape through
// its sgemm (unless allow_gemv is false: the batch-invariant path keeps one kernel for all shapes).
template <class C>
void blas_product(size_t m, size_t n, size_t k, const C* a, MatrixView av, const C* b,
                  MatrixView bv, C* c, size_t ldc, bool allow_gemv = true) {
  if (m == 1 && allow_gemv) {
    // c = B^T a: a's elements are ld apart when it is stored column-major.
    size_t inca = av.trans ? av.ld : 1;
    if (bv.trans) {
      gemv<C>(false, n, k, b, bv.ld, a, inca, c);
    } else {
      gemv<C>(true, k, n, b, bv.ld, a, inca, c);
    }
    return;
  }
  if (n == 1 && allow_gemv) {
    // c is a column: ldc apart, which gemv cannot write: only dense columns (ldc == 1) come here.
    size_t incb = bv.trans ? 1 : bv.ld;
    if (av.trans) {
      gemv<C>(true, k, m, a, av.ld, b, incb, c);
    } else {
      gemv<C>(false, m, k, a, av.ld, b, incb, c);
    }
    return;
  }
  if constexpr (std::is_same_v<C, float>) {
    cblas_sgemm(CblasRowMajor, trans_flag(av.trans), trans_flag(bv.trans), blas_int(m), blas_int(n),
                blas_int(k), 1.0f, a, blas_int(av.ld), b, blas_int(bv.ld), 0.0f, c, blas_int(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, trans_flag(av.trans), trans_flag(bv.trans), blas_int(m), blas_int(n),
                blas_int(k), 1.0, a, blas_int(av.ld), b, blas_int(bv.ld), 0.0, c, blas_int(ldc));
  }
}

// Below this many multiply-adds, waking the workers costs more than the product.
constexpr size_t kParallelMinFlops = size_t{1} << 18;
// A large product is split into at most kMaxParts parts of at least kMinSpan rows (or columns);
// one of at most 2 * kMinSpan into two parts of at least kMinHalfSpan, so that two threads share
// it.
constexpr size_t kMaxParts = 32;
constexpr size_t kMinSpan = 256;
constexpr size_t kMinHalfSpan = 128;
// The batch-invariant path: rows of one part, and OpenBLAS's small-matrix kernels (its AVX-512
// builds), which take calls of at most kSmallKernelMax multiply-adds and compute a row
// differently by the call's row count.
constexpr size_t kInvariantRows = 256;
constexpr double kSmallKernelMax = 1e6;
// Above this many padding rows a call is left to plain loops instead.
constexpr size_t kMaxPadRows = 64;
// The batch-invariant path's BLAS calls have a multiple of this many rows: OpenBLAS computes the
// rows past its kernel's last full tile of rows with other kernels and other sums (its Zen dgemm
// and sgemm do, up to thousands of ulps apart), so a row's bits would depend on the row count.
// The kernels' row tiles of the CPUs our CI runs on divide 16 (the BatchInvariance tests).
constexpr size_t kInvariantRowTile = 16;
// Products of fewer columns stay with OpenBLAS outside batch invariance (gemm_f32.h's AVX-512
// tiles are 32 columns wide).
constexpr size_t kGemmF32MinCols = 32;
// Products with a transposed b (x @ W^T, W a linear layer's weight) of fewer rows stay with
// OpenBLAS outside batch invariance: wick's GEMM transposes all of b as it packs it, which a few
// rows do not repay.
constexpr size_t kGemmF32MinRowsTransposedB = 64;

// The rows (or columns) of each part when d of them are split: a multiple of 16 (the BLAS
// kernels' tile) that depends on the product's size only, never on the thread count, so that
// each part's BLAS call (whose kernel OpenBLAS may choose by its shape) is the same whatever
// the pool's size, and so are the bits.
size_t part_span(size_t d) {
  const size_t span = std::max(kMinSpan, ((d + kMaxParts - 1) / kMaxParts + 15) / 16 * 16);
  const size_t half = (d / 2 + 15) / 16 * 16;
  return std::max(kMinHalfSpan, std::min(span, half));
}

// One part of the batch-invariant product: (rows x k) * (k x w) into c (leading dimension ldc),
// computed the same way for a row whatever `rows` is: an sgemm/dgemm call of enough rows to stay
// above the small-matrix kernels, and of a multiple of kInvariantRowTile rows, so that every row
// lands in a full tile of the BLAS kernel (the rows padded with zero rows), never a gemv;
// products too thin for that (w * k small) in plain loops, each element a sum in k order.
template <class C>
void invariant_part(size_t rows, size_t w, size_t k, const C* a, MatrixView av, const C* b,
                    MatrixView bv, C* c, size_t ldc) {
  const size_t min_rows =
      static_cast<size_t>(kSmallKernelMax / (static_cast<double>(w) * static_cast<double>(k))) + 1;
  if (min_rows > kMaxPadRows) {
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < w; ++j) {
        C acc = 0;
        for (size_t t = 0; t < k; ++t) {
          C x = av.trans ? a[t * av.ld + i] : a[i * av.ld + t];
          C y = bv.trans ? b[j * bv.ld + t] : b[t * bv.ld + j];
          acc += x * y;
        }
        c[i * ldc + j] = acc;
      }
    }
    return;
  }
  const size_t call_rows =
      (std::max(rows, min_rows) + kInvariantRowTile - 1) / kInvariantRowTile * kInvariantRowTile;
  if (rows == call_rows) {
    blas_product<C>(rows, w, k, a, av, b, bv, c, ldc, false);
    return;
  }
  // Padded to `call_rows` rows in a's own orientation.
  Scratch<C> pa(call_rows * k), pc(call_rows * w);
  C* pad = pa.get();
  std::fill(pad, pad + call_rows * k, C(0));
  for (size_t i = 0; i < rows; ++i) {
    for (size_t t = 0; t < k; ++t) {
      C v = av.trans ? a[t * av.ld + i] : a[i * av.ld + t];
      (av.trans ? pad[t * call_rows + i] : pad[i * k + t]) = v;
    }
  }
  MatrixView pv{av.trans, av.trans ? call_rows : k};
  blas_product<C>(call_rows, w, k, pad, pv, b, bv, pc.get(), w, false);
  for (size_t i = 0; i < rows; ++i) std::memcpy(c + i * ldc, pc.get() + i * w, w * sizeof(C));
}

// The batch-invariant product: rows in parts of kInvariantRows, columns in parts of
// part_span(n), each part an invariant_part, so that a row's bits do not depend on m.
template <class C>
void invariant_product(size_t m, size_t n, size_t k, const C* a, MatrixView av, const C* b,
                       MatrixView bv, C* c) {
  const size_t span = part_span(n);
  const size_t col_parts = (n + span - 1) / span;
  const size_t row_parts = (m + kInvariantRows - 1) / kInvariantRows;
  const size_t items = row_parts * col_parts;
  const size_t grain = m * n * k < kParallelMinFlops ? items : 1;
  parallel_for(items, grain, [&](size_t begin, size_t end) {
    for (size_t item = begin; item < end; ++item) {
      const size_t r0 = item / col_parts * kInvariantRows, rows = std::min(kInvariantRows, m - r0);
      const size_t j0 = item % col_parts * span, w = std::min(span, n - j0);
      const C* a_part = a + (av.trans ? r0 : r0 * av.ld);
      const C* b_part = b + (bv.trans ? j0 * bv.ld : j0);
      invariant_part<C>(rows, w, k, a_part, av, b_part, bv, c + r0 * n + j0, n);
    }
  });
}

// One (m x k) * (k x n) product into the dense row-major c: large ones split along the longer
// of m and n into parts of part_span (each part packs its share of that operand and all of the
// other), shared by the pool's threads.
template <class C>
void product(size_t m, size_t n, size_t k, const C* a, MatrixView av, const C* b, MatrixView bv,
             C* c) {
  const bool invariant = settings::batch_invariant();
  if constexpr (std::is_same_v<C, float>) {
    // wick's own GEMM: every shape under batch invariance (its rows never depend on m); else,
    // where it is the default path (AVX-512), all but the matrix-vector products (OpenBLAS's gemv
    // is faster), those of fewer than kGemmF32MinCols columns (most of its 32-column tiles would
    // be padding), those of few rows against a transposed b (kGemmF32MinRowsTransposedB) and those
    // OpenBLAS's small-matrix kernels take (no packing: faster below kSmallKernelMax).
    const GemmF32& gemm = gemm_f32();
    const bool small =
        static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) < kSmallKernelMax;
    const bool few_rows = bv.trans && m < kGemmF32MinRowsTransposedB;
    if (gemm.run != nullptr &&
        ((gemm.default_path && m > 1 && n >= kGemmF32MinCols && !small && !few_rows) ||
         invariant)) {
      gemm.run(m, n, k, {a, av.ld, av.trans}, {b, bv.ld, bv.trans}, c, n);
      return;
    }
  }
  if (invariant) {
    invariant_product<C>(m, n, k, a, av, b, bv, c);
    return;
  }
  const size_t d = std::max(m, n);
  if (m * n * k < kParallelMinFlops || d < 2) {
    blas_product<C>(m, n, k, a, av, b, bv, c, n);
    return;
  }
  const size_t span = part_span(d);
  const size_t parts = (d + span - 1) / span;
  const bool by_rows = m >= n;
  parallel_for(parts, 1, [&](size_t begin, size_t end) {
    for (size_t p = begin; p < end; ++p) {
      size_t lo = p * span, hi = std::min(d, lo + span);
      if (by_rows) {
        // Rows lo..hi of a: a row-major a starts ld * lo further on, a column-major one lo.
        const C* a_part = a + (av.trans ? lo : lo * av.ld);
        blas_product<C>(hi - lo, n, k, a_part, av, b, bv, c + lo * n, n);
      } else {
        // Columns lo..hi of b and c.
        const C* b_part = b + (bv.trans ? lo * bv.ld : lo);
        blas_product<C>(m, hi - lo, k, a, av, b_part, bv, c + lo, n);
      }
    }
  });
}

// Below this many multiply-adds per batch, splitting each product across the pool costs more
// than handing whole batches to the workers.
constexpr size_t kSmallBatchFlops = size_t{1} << 24;

// All b products into out (b * m * n, row-major).
template <class C>
void run(size_t b, size_t m, size_t n, size_t k, const Operand<C>& lhs, const Operand<C>& rhs,
         C* out) {
  if (b > 1 && rhs.shared(b) && lhs.bstride) {
    // One rhs for every batch and lhs rows evenly spaced across batches: a single
    // (b*m x k) * (k x n) product, whose result is exactly the (b, m, n) output.
    size_t bs = *lhs.bstride;
    std::optional<size_t> rs;
    if (m == 1) {
      rs = bs;
    } else if (bs == m * lhs.rs) {
      rs = lhs.rs;
    }
    if (rs && b * m <= kBlasMax) {
      if (auto view = blas_view(b * m, k, *rs, lhs.cs)) {
        product<C>(b * m, n, k, lhs.base, *view, rhs.base, rhs.view, out);
        return;
      }
    }
  }
  size_t mn = m * n;
  auto one = [&](size_t i) {
    product<C>(m, n, k, lhs.at(i), lhs.view, rhs.at(i), rhs.view, out + i * mn);
  };
  if (b == 1) {
    one(0);
    return;
  }
  if (lhs.shared(b) && rhs.shared(b)) {
    // Every batch is the same product: compute it once.
    one(0);
    for (size_t i = 1; i < b; ++i) std::memcpy(out + i * mn, out, mn * sizeof(C));
    return;
  }
  size_t workers = num_threads();
  size_t per_batch = m * n * k;
  bool batch_parallel = workers > 1 && b * per_batch >= kParallelMinFlops &&
                        (per_batch <= kSmallBatchFlops || b % workers == 0);
  if (!batch_parallel) {
    for (size_t i = 0; i < b; ++i) one(i);
    return;
  }
  // Each participant claims batches one at a time, so a worker that wakes late costs only the
  // batches it did not get to, not half of them. (product() inside a worker runs inline.)
  std::atomic<size_t> next{0};
  parallel_for(std::min(workers, b), 1, [&](size_t, size_t) {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < b;) one(i);
  });
}

// Products with few lhs rows against an f16/bf16 matrix stored with k contiguous (a linear
// layer's (out, in) weight, transposed): the weight is widened a line at a time inside the dot
// products instead of into a whole f32 copy per call, which for a decode step (m = 1) cost more
// than the product itself. Rows of the output are split across the workers.
constexpr size_t kNarrowRows = 8;

template <class T>
bool narrow_product_fits(MatmulDims d, const Layout& rhs_layout) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    return false;
  } else {
    if (d.m * d.b > kNarrowRows || d.k == 0 || settings::batch_invariant()) return false;
    size_t r = rhs_layout.rank();
    auto bstride = batch_stride(rhs_layout);
    bool shared = d.b == 1 || (bstride && *bstride == 0);
    return shared && rhs_layout.strides()[r - 2] == 1;
  }
}

template <class T>
float widen(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    uint32_t u = static_cast<uint32_t>(std::bit_cast<uint16_t>(v)) << 16;
    return std::bit_cast<float>(u);
  } else {
    return static_cast<float>(v);
  }
}

// out (rows x n) = a (rows x k, dense f32) times the k-contiguous columns of w (column j at
// w + j * ld).
template <class T>
void narrow_product(size_t rows, size_t n, size_t k, const float* a, const T* w, size_t ld,
                    T* out) {
  constexpr size_t kLanes = 16;
  parallel_for(n, 64, [&](size_t begin, size_t end) {
    std::array<float, kLanes> line{};
    for (size_t j = begin; j < end; ++j) {
      const T* col = w + j * ld;
      std::array<std::array<float, kLanes>, kNarrowRows> acc{};
      size_t kk = 0;
      for (; kk + kLanes <= k; kk += kLanes) {
        for (size_t l = 0; l < kLanes; ++l) line[l] = widen(col[kk + l]);
        for (size_t i = 0; i < rows; ++i) {
          const float* ai = a + i * k + kk;
          for (size_t l = 0; l < kLanes; ++l) acc[i][l] += ai[l] * line[l];
        }
      }
      for (size_t i = 0; i < rows; ++i) {
        float sum = 0;
        for (size_t l = 0; l < kLanes; ++l) sum += acc[i][l];
        for (size_t t = kk; t < k; ++t) sum += a[i * k + t] * widen(col[t]);
        out[i * n + j] = T(sum);
      }
    }
  });
}

template <class T>
StoragePtr matmul_typed(const CpuStorage& lhs, const CpuStorage& rhs, MatmulDims d,
                        const Layout& lhs_layout, const Layout& rhs_layout) {
  auto out = std::make_unique<CpuStorage>(d.b * d.m * d.n, dtype_of<T>());
  if (d.b * d.m * d.n == 0) return out;
  T* dst = out->template as<T>();
  if (d.k == 0) {
    std::fill(dst, dst + d.b * d.m * d.n, T(0.0f));
    return out;
  }
  if (std::max({d.m, d.n, d.k}) > kBlasMax) {
    throw BackendError(str("matmul: dims too large for BLAS, (b, m, n, k) = (", d.b, ", ", d.m,
                           ", ", d.n, ", ", d.k, ")"));
  }
  init_blas_threads();
  using C = compute_t<T>;
  if constexpr (!std::is_same_v<T, C>) {
    if (narrow_product_fits<T>(d, rhs_layout)) {
      // All b * m lhs rows, widened once into a dense f32 block.
      Scratch<float> a(d.b * d.m * d.k);
      auto op = make_operand<T, C>(lhs.as<T>(), lhs_layout, d.b, d.m, d.k);
      for (size_t bi = 0; bi < d.b; ++bi) {
        for (size_t i = 0; i < d.m; ++i) {
          const float* src = op.at(bi) + i * op.rs;
          float* dst = a.get() + (bi * d.m + i) * d.k;
          for (size_t t = 0; t < d.k; ++t) dst[t] = src[t * op.cs];
        }
        if (op.shared(d.b)) {
          for (size_t bj = 1; bj < d.b; ++bj) {
            std::memcpy(a.get() + bj * d.m * d.k, a.get(), d.m * d.k * sizeof(float));
          }
          break;
        }
      }
      size_t r = rhs_layout.rank();
      const T* w = rhs.as<T>() + rhs_layout.start_offset();
      narrow_product<T>(d.b * d.m, d.n, d.k, a.get(), w, rhs_layout.strides()[r - 1], dst);
      return out;
    }
  }
  auto a = make_operand<T, C>(lhs.as<T>(), lhs_layout, d.b, d.m, d.k);
  auto b = make_operand<T, C>(rhs.as<T>(), rhs_layout, d.b, d.k, d.n);
  if constexpr (std::is_same_v<T, C>) {
    run<C>(d.b, d.m, d.n, d.k, a, b, dst);
  } else {
    Scratch<float> wide(d.b * d.m * d.n);
    run<C>(d.b, d.m, d.n, d.k, a, b, wide.get());
    round_floats<T>(wide.get(), d.b * d.m * d.n, dst);
  }
  return out;
}

}  // namespace

StoragePtr CpuStorage::matmul(const BackendStorage& rhs, MatmulDims dims, const Layout& lhs_layout,
                              const Layout& rhs_layout) const {
  return dispatch_float(dtype_, "matmul", [&]<class T>() -> StoragePtr {
    return matmul_typed<T>(*this, as_cpu(rhs), dims, lhs_layout, rhs_layout);
  });
}

}  // namespace wick::cpu
