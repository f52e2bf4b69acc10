// wick's f32 GEMM (cpu/gemm_f32.h), BLIS-style, for AVX-512 and for AVX2 with FMA: one algorithm,
// its vector operations and tile sizes given per instruction set by `Simd` below. For each block
// of kNc columns and kKc k values, b is packed once into micro-panels of kNr columns (kc rows of
// two vectors), the packing shared out across the thread pool; then each work item (a run of
// about kMc rows of a, and a range of the block's micro-panels) packs its rows into micro-panels
// of kMr rows and runs the register-blocked micro-kernel on every pair of its a and b
// micro-panels, in the order that keeps one of them in L1 while the others stream past it from
// L2 (kBPanelsInner): kMr x kNr accumulators in 2 * kMr vector registers, one broadcast of an a
// value and two FMAs per row and k value. A product of one row tile, or of a small b shared by
// several threads, reads a row-major b in place instead of packing it; the last row tile of a
// product runs a micro-kernel of its own row count. The first k block starts its accumulators at
// 0, later ones at c's current value, so an output element is one chain of FMAs in k order
// whatever the blocking: column edges are padded with zeros in the packed operands and written
// under masks, never computed another way.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif
#include <sched.h>

#include "cpu/gemm_f32.h"
#include "cpu/isa_begin.h"  // last: the code below is compiled for this file's instruction set
#include "cpu/parallel.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

#if defined(WICK_ISA_AVX512) || (defined(__AVX2__) && defined(__FMA__))

namespace {

#if defined(WICK_ISA_AVX512)

// Vectors of 16 floats; micro-tiles of 14 x 32: 28 accumulators of the 32 zmm registers.
struct Simd {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr size_t kWidth = 16;
  static Mask lanes(size_t count) {
    return count >= 16 ? Mask(0xffff) : static_cast<Mask>((1u << count) - 1);
  }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec broadcast(float x) { return _mm512_set1_ps(x); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec load_aligned(const float* p) { return _mm512_load_ps(p); }
  // The lanes under m from p, zeros elsewhere; the others are not read.
  static Vec load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void store_aligned(float* p, Vec v) { _mm512_store_ps(p, v); }
  // The lanes under m to p; the others are not written.
  static void store(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }
  // The lanes under m to p; the others may be written too (with v's lanes), where the caller
  // owns the whole vector's span and writes the rest later.
  static void store_over(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }

  // Transposes 16 rows of 16 floats in place: r[i][j] becomes r[j][i].
  static void transpose(Vec r[16]) {
    Vec t[16];
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
      const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
      const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
      r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    // r[4g + j] now holds, in 128-bit lane l, element j + 4l of rows 4g..4g+3.
    for (int j = 0; j < 4; ++j) {
      t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
      t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
      t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
      t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
      r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
      r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
      r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd);
    }
  }
};
constexpr const char* kName = "wick avx512 14x32";
constexpr size_t kMr = 14;    // rows of a micro-tile
constexpr size_t kKc = 256;   // k block: an a micro-panel is 14 KiB (L1)
constexpr size_t kMc = 168;   // rows of a work item at most (12 micro-panels)
constexpr size_t kNc = 1024;  // columns of a block of b packed at once: 1 MiB (L2)
// An a micro-panel stays in L1 while the block's b micro-panels stream past it from L2 (b's 32
// floats a k value feed 28 FMAs).
constexpr bool kBPanelsInner = true;

#else

// Vectors of 8 floats; micro-tiles of 6 x 16: 12 accumulators of the 16 ymm registers, beside
// b's two vectors and the broadcast a value.
struct Simd {
  using Vec = __m256;
  using Mask = __m256i;  // a lane is on where its sign bit is set
  static constexpr size_t kWidth = 8;
  static Mask lanes(size_t count) {
    const int on = static_cast<int>(std::min<size_t>(count, 8));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(on), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec broadcast(float x) { return _mm256_set1_ps(x); }
  // a * b + c, written into c's register: with 15 of the 16 registers live in the micro-kernel,
  // GCC otherwise writes some products into the broadcast's register and moves them back, or
  // keeps an accumulator on the stack.
  static Vec fma(Vec a, Vec b, Vec c) {
    __asm__("vfmadd231ps %[b], %[a], %[c]" : [c] "+x"(c) : [a] "x"(a), [b] "x"(b));
    return c;
  }
  static Vec load_aligned(const float* p) { return _mm256_load_ps(p); }
  // The lanes under m from p, zeros elsewhere; the others are not read.
  static Vec load(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void store_aligned(float* p, Vec v) { _mm256_store_ps(p, v); }
  // The lanes under m to p; the others are not written.
  static void store(float* p, Mask m, Vec v) { _mm256_maskstore_ps(p, m, v); }
  // The lanes under m to p; the others may be written too (with v's lanes), where the caller
  // owns the whole vector's span and writes the rest later: a plain store, which AVX2 CPUs run
  // much faster than a masked one.
  static void store_over(float* p, Mask /*m*/, Vec v) { _mm256_storeu_ps(p, v); }

  // Transposes 8 rows of 8 floats in place: r[i][j] becomes r[j][i].
  static void transpose(Vec r[8]) {
    Vec t[8], s[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    // t[2g] holds rows 2g, 2g + 1 interleaved at elements 0, 1, 4, 5; t[2g + 1] at 2, 3, 6, 7.
    for (int i = 0; i < 8; i += 4) {
      s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
      s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
      s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    // s[4h + j] holds elements j and j + 4 of rows 4h..4h+3, in its two 128-bit halves.
    for (int j = 0; j < 4; ++j) {
      r[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
      r[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
    }
  }
};
constexpr const char* kName = "wick avx2 6x16";
constexpr size_t kMr = 6;     // rows of a micro-tile
constexpr size_t kKc = 256;   // k block: an a micro-panel is 6 KiB (L1)
constexpr size_t kMc = 96;    // rows of a work item at most (16 micro-panels)
constexpr size_t kNc = 1024;  // columns of a block of b packed at once: 1 MiB (L2, L3)
// A b micro-panel (16 KiB) stays in L1 while the work item's a micro-panels stream past it from
// L2: their 6 floats a k value cost less of the L2's bandwidth than b's 16 (which feed only 12
// FMAs).
constexpr bool kBPanelsInner = false;

#endif

using Vec = Simd::Vec;
using Mask = Simd::Mask;
constexpr size_t kWidth = Simd::kWidth;
constexpr size_t kNr = 2 * kWidth;  // columns of a micro-tile: two vectors
static_assert(kMr <= kWidth, "a column of an a micro-panel is packed as one vector");
// Cache lines of a row of a micro-tile of c.
constexpr size_t kLinesPerTileRow = kNr * sizeof(float) / 64;
// Below this many multiply-adds the product runs on the calling thread alone.
constexpr size_t kParallelMinFlops = size_t{1} << 18;
// A row-major b of at most this many elements is read in place by every row tile when several
// threads share the product: packing it first would make every work item wait for all the packs,
// which costs more than the packed layout saves on a b this small (it stays in L2).
constexpr size_t kDirectBMaxElements = size_t{1} << 17;

// A growable 64-byte-aligned float buffer kept by its thread between calls.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data_); }
  float* get(size_t count) {
    if (count > size_) {
      std::free(data_);
      data_ = nullptr;
      size_ = 0;
      const size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (data_ == nullptr) throw std::bad_alloc();
      size_ = count;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

thread_local Buffer t_packed_a;  // each thread's micro-panels of a
thread_local Buffer t_packed_b;  // the calling thread's block of b, shared with the workers

// r[q] = the q-th floats of `lines` lines (ld apart, from src), lane i from line i: a kWidth x
// kWidth block read line by line and transposed; lanes past `lines` and r past `len` are zero.
inline void load_transposed(const float* src, size_t ld, size_t lines, size_t len, Vec r[kWidth]) {
  const Mask m = Simd::lanes(len);
  for (size_t i = 0; i < kWidth; ++i) {
    r[i] = i < lines ? Simd::load(m, src + i * ld) : Simd::zero();
  }
  Simd::transpose(r);
}

// Packs b's columns j0..j0+cols (cols <= kNr) and k values p0..p0+kc into dst: kc rows of kNr
// floats, columns past `cols` zero.
void pack_b(const GemmF32Operand& b, size_t p0, size_t kc, size_t j0, size_t cols, float* dst) {
  if (!b.trans) {
    const Mask m0 = Simd::lanes(cols), m1 = Simd::lanes(cols > kWidth ? cols - kWidth : 0);
    const float* src = b.data + p0 * b.ld + j0;
    for (size_t p = 0; p < kc; ++p, src += b.ld, dst += kNr) {
      Simd::store_aligned(dst, Simd::load(m0, src));
      Simd::store_aligned(dst + kWidth, Simd::load(m1, src + kWidth));
    }
    return;
  }
  // Column j of b is row j of the stored matrix: kWidth x kWidth blocks transposed on the way.
  for (size_t half = 0; half < 2; ++half) {
    const size_t valid = cols > kWidth * half ? std::min(kWidth, cols - kWidth * half) : 0;
    const float* src = b.data + (j0 + kWidth * half) * b.ld + p0;
    for (size_t pb = 0; pb < kc; pb += kWidth) {
      const size_t len = std::min(kWidth, kc - pb);
      Vec r[kWidth];
      load_transposed(src + pb, b.ld, valid, len, r);
      for (size_t q = 0; q < len; ++q) {
        Simd::store_aligned(dst + (pb + q) * kNr + kWidth * half, r[q]);
      }
    }
  }
}

// Packs a's rows i0..i0+rows (rows <= kMr) and k values p0..p0+kc into dst: kc groups of `rows`
// floats (the micro-panel of a tile of that many rows). The groups are written in order, each
// as a vector that may spill zeros into the next one's place (store_over): dst has kWidth floats
// of room past the panel.
void pack_a(const GemmF32Operand& a, size_t i0, size_t rows, size_t p0, size_t kc, float* dst) {
  const Mask tile = Simd::lanes(rows);
  if (a.trans) {
    const float* src = a.data + p0 * a.ld + i0;
    for (size_t p = 0; p < kc; ++p, src += a.ld, dst += rows) {
      Simd::store_over(dst, tile, Simd::load(tile, src));
    }
    return;
  }
  const float* src = a.data + i0 * a.ld + p0;
  for (size_t pb = 0; pb < kc; pb += kWidth) {
    const size_t len = std::min(kWidth, kc - pb);
    Vec r[kWidth];
    load_transposed(src + pb, a.ld, rows, len, r);
    for (size_t q = 0; q < len; ++q) Simd::store_over(dst + (pb + q) * rows, tile, r[q]);
  }
}

// One k value of micro_kernel: acc[i] += a[i] * (the kNr floats at b).
template <size_t R, bool Packed>
inline void fma_step(const float* a, const float* b, Mask m0, Mask m1, Vec (&acc)[R][2]) {
  Vec b0, b1;
  if constexpr (Packed) {
    b0 = Simd::load_aligned(b);
    b1 = Simd::load_aligned(b + kWidth);
  } else {
    b0 = Simd::load(m0, b);
    b1 = Simd::load(m1, b + kWidth);
  }
#pragma GCC unroll 16
  for (size_t i = 0; i < R; ++i) {
    const Vec x = Simd::broadcast(a[i]);
    acc[i][0] = Simd::fma(x, b0, acc[i][0]);
    acc[i][1] = Simd::fma(x, b1, acc[i][1]);
  }
}

// c (an R x cols tile, cols <= kNr, leading dimension ldc) = its packed a micro-panel (R rows)
// times its b micro-panel (kc rows of kNr floats, ldb apart: packed, or b's own rows when
// !Packed) over kc, added to c's current values when `accumulate`, each element's products added
// in k order. R = kMr but in a product's last row tile. The `next_rows` rows of the next tile of c
// (at next_c, none when null) are prefetched along the way, a line every 8 k values: a tile's
// first instructions read (or write) its rows of c, lines far apart that a large c keeps out of
// the caches.
template <size_t R, bool Packed>
void micro_kernel(size_t kc, const float* a, const float* b, size_t ldb, float* c, size_t ldc,
                  size_t cols, bool accumulate, const float* next_c, size_t next_rows) {
  const Mask m0 = Simd::lanes(cols), m1 = Simd::lanes(cols > kWidth ? cols - kWidth : 0);
  Vec acc[R][2];
#pragma GCC unroll 16
  for (size_t i = 0; i < R; ++i) {
    if (accumulate) {
      acc[i][0] = Simd::load(m0, c + i * ldc);
      acc[i][1] = Simd::load(m1, c + i * ldc + kWidth);
    } else {
      acc[i][0] = Simd::zero();
      acc[i][1] = Simd::zero();
    }
  }
  const size_t lines = next_c == nullptr ? 0 : kLinesPerTileRow * next_rows;
  size_t p = 0;
  for (size_t line = 0; p + 8 <= kc; p += 8, ++line) {
    if (line < lines) {
      const float* at =
          next_c + line / kLinesPerTileRow * ldc + line % kLinesPerTileRow * (64 / sizeof(float));
      _mm_prefetch(reinterpret_cast<const char*>(at), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (size_t u = 0; u < 8; ++u, a += R, b += ldb) fma_step<R, Packed>(a, b, m0, m1, acc);
  }
  for (; p < kc; ++p, a += R, b += ldb) fma_step<R, Packed>(a, b, m0, m1, acc);
#pragma GCC unroll 16
  for (size_t i = 0; i < R; ++i) {
    Simd::store(c + i * ldc, m0, acc[i][0]);
    Simd::store(c + i * ldc + kWidth, m1, acc[i][1]);
  }
}

using MicroKernel = void (*)(size_t kc, const float* a, const float* b, size_t ldb, float* c,
                             size_t ldc, size_t cols, bool accumulate, const float* next_c,
                             size_t next_rows);
template <bool P, size_t... R>
constexpr std::array<MicroKernel, kMr + 1> micro_kernels(std::index_sequence<R...>) {
  return {nullptr, &micro_kernel<R + 1, P>...};
}
// By b's packing and the tile's rows (1..kMr).
template <bool P>
constexpr std::array<MicroKernel, kMr + 1> kMicroKernels =
    micro_kernels<P>(std::make_index_sequence<kMr>());

// The whole product as one job of the thread pool: a list of tasks, for each block of kNc columns
// and kKc k values in turn (s = its index) first the packing of its b micro-panels (pack tasks),
// then its work items (row runs of a times ranges of micro-panels). The pool's threads claim
// tasks in list order with one fetch_add each, and a task waits only for tasks before it, all
// claimed already by running threads: a work item for the packing of its block, and for the same
// item of the block before when that block's k values precede its own (it adds to that c tile);
// a pack task for the work items of block s - 2, whose buffer it refills (two are used in turn).
// A thread that finishes early thus starts on the next block without a barrier, and a job run by
// one thread alone (the pool busy, or a nested call) runs the tasks in order.
class Job {
 public:
  Job(size_t m, size_t n, size_t k, const GemmF32Operand& a, const GemmF32Operand& b, float* c,
      size_t ldc, size_t threads)
      : m_(m), k_(k), a_(a), b_(b), c_(c), ldc_(ldc) {
    row_tiles_ = (m + kMr - 1) / kMr;
    // One row tile uses each b micro-panel once: b's own rows are read in place of a copy. So
    // are a small b's when threads share the product (kDirectBMaxElements).
    direct_b_ = !b.trans && (row_tiles_ == 1 || (threads > 1 && k * n <= kDirectBMaxElements));
    j_blocks_ = (n + kNc - 1) / kNc;
    k_blocks_ = (k + kKc - 1) / kKc;
    // Rows in runs of at most kMc, their count a multiple of the thread count (each thread gets
    // as many rows); when there are fewer row tiles than threads, the micro-panels are split too.
    const size_t runs = (row_tiles_ * kMr + kMc - 1) / kMc;
    row_items_ = std::min(row_tiles_, (runs + threads - 1) / threads * threads);
    for (size_t jb = 0; jb < 2 && jb < j_blocks_; ++jb) {
      // Block columns: every j block has kNc but the last.
      const size_t nc = jb == 0 && j_blocks_ > 1 ? kNc : n - (j_blocks_ - 1) * kNc;
      Shape& sh = shape_[jb];
      sh.nc = nc;
      sh.panels = (nc + kNr - 1) / kNr;
      sh.col_items = 1;
      if (row_items_ < threads) {
        sh.col_items = std::min(sh.panels, (threads + row_items_ - 1) / row_items_);
      }
      sh.items = row_items_ * sh.col_items;
      sh.packs = direct_b_ ? 0 : std::min(sh.panels, threads > 1 ? 2 * threads : 1);
    }
    const size_t blocks = j_blocks_ * k_blocks_;
    const size_t max_panels = (std::min(n, kNc) + kNr - 1) / kNr;
    if (!direct_b_) {
      buffer_[0] = t_packed_b.get(2 * max_panels * kNr * kKc);
      buffer_[1] = buffer_[0] + max_panels * kNr * kKc;
    }
    counters_ = std::make_unique<std::atomic<size_t>[]>(2 * blocks + max_items());
    for (size_t i = 0; i < 2 * blocks + max_items(); ++i) counters_[i].store(0);
    max_tiles_ = 0;
    for (size_t i = 0; i < row_items_; ++i) {
      max_tiles_ = std::max(max_tiles_, (row_bound(i + 1) - row_bound(i) + kMr - 1) / kMr);
    }
    tasks_ = 0;
    for (size_t jb = 0; jb < j_blocks_; ++jb) {
      tasks_ += k_blocks_ * (shape(jb).packs + shape(jb).items);
    }
  }

  // One of the pool's threads: claims and runs tasks until none is left.
  void participate() {
    // The thread's buffer for a's micro-panels is sized before it claims a task: a task never
    // throws, so no other thread can wait for one that will not finish.
    float* packed_a = t_packed_a.get(max_tiles_ * kMr * kKc + kWidth);
    size_t s = 0, first = 0;  // the block of the last task claimed, and its first task's index
    for (;;) {
      const size_t t = next_.fetch_add(1, std::memory_order_relaxed);
      if (t >= tasks_) return;
      while (t >= first + tasks_of(s)) first += tasks_of(s++);
      const size_t i = t - first;
      const Shape& sh = shape(s / k_blocks_);
      if (i < sh.packs) {
        pack(s, i);
      } else {
        work(s, i - sh.packs, packed_a);
      }
    }
  }

 private:
  struct Shape {
    size_t nc, panels, col_items, items, packs;
  };

  const Shape& shape(size_t jb) const { return shape_[jb + 1 < j_blocks_ ? 0 : 1 % j_blocks_]; }
  size_t tasks_of(size_t s) const {
    const Shape& sh = shape(s / k_blocks_);
    return sh.packs + sh.items;
  }
  size_t max_items() const {
    return std::max(shape_[0].items, j_blocks_ > 1 ? shape_[1].items : 0);
  }
  std::atomic<size_t>& packed(size_t s) { return counters_[2 * s]; }
  std::atomic<size_t>& computed(size_t s) { return counters_[2 * s + 1]; }
  // The blocks done so far (the index of the last one + 1) of each work item.
  std::atomic<size_t>& progress(size_t item) { return counters_[2 * j_blocks_ * k_blocks_ + item]; }

  // The first row of row item i: the multiple of kMr nearest to an even split of the rows (the
  // last tile of the product, which may have fewer rows, runs its own smaller micro-kernel).
  size_t row_bound(size_t i) const {
    if (i >= row_items_) return m_;
    return std::min(m_, (i * m_ / row_items_ + kMr / 2) / kMr * kMr);
  }

  template <class Ready>
  static void wait_for(Ready ready) {
    for (unsigned i = 1; !ready(); ++i) {
      _mm_pause();
      if (i % 64 == 0) sched_yield();
    }
  }

  // Pack task i of block s: its share of the block's micro-panels of b.
  void pack(size_t s, size_t i) {
    const size_t jb = s / k_blocks_, pc = s % k_blocks_ * kKc, jc = jb * kNc;
    const Shape& sh = shape(jb);
    if (s >= 2) {
      const size_t items = shape((s - 2) / k_blocks_).items;
      wait_for([&] { return computed(s - 2).load(std::memory_order_acquire) == items; });
    }
    const size_t kc = std::min(kKc, k_ - pc);
    float* dst = buffer_[s % 2];
    for (size_t q = i * sh.panels / sh.packs; q < (i + 1) * sh.panels / sh.packs; ++q) {
      pack_b(b_, pc, kc, jc + q * kNr, std::min(kNr, sh.nc - q * kNr), dst + q * kNr * kc);
    }
    packed(s).fetch_add(1, std::memory_order_release);
  }

  // Work item `item` of block s: packs its rows of a into packed_a, then multiplies them with its
  // micro-panels of b into c.
  void work(size_t s, size_t item, float* packed_a) {
    const size_t jb = s / k_blocks_, pc = s % k_blocks_ * kKc, jc = jb * kNc;
    const Shape& sh = shape(jb);
    const size_t kc = std::min(kKc, k_ - pc);
    const size_t ri = item / sh.col_items, ci = item % sh.col_items;
    const size_t r0 = row_bound(ri), r1 = row_bound(ri + 1);
    const size_t q0 = ci * sh.panels / sh.col_items, q1 = (ci + 1) * sh.panels / sh.col_items;
    const size_t tiles = (r1 - r0 + kMr - 1) / kMr;
    for (size_t t = 0; t < tiles; ++t) {
      const size_t i0 = r0 + t * kMr;
      pack_a(a_, i0, std::min(kMr, r1 - i0), pc, kc, packed_a + t * kMr * kc);
    }
    wait_for([&] { return packed(s).load(std::memory_order_acquire) == sh.packs; });
    if (pc > 0) wait_for([&] { return progress(item).load(std::memory_order_acquire) >= s; });
    // The tiles (t, q) in the order of kBPanelsInner; the first rows of the next tile's c are
    // prefetched as each runs.
    const size_t panels = q1 - q0, count = tiles * panels;
    auto tile_of = [&](size_t i) {
      return kBPanelsInner ? std::pair{i / panels, q0 + i % panels}
                           : std::pair{i % tiles, q0 + i / tiles};
    };
    for (size_t i = 0; i < count; ++i) {
      const auto [t, q] = tile_of(i);
      const size_t i0 = r0 + t * kMr, rows = std::min(kMr, r1 - i0);
      const size_t j0 = q * kNr, cols = std::min(kNr, sh.nc - j0);
      float* ct = c_ + i0 * ldc_ + jc + j0;
      const float* next_c = nullptr;
      size_t next_rows = 0;
      if (i + 1 < count) {
        const auto [nt, nq] = tile_of(i + 1);
        next_c = c_ + (r0 + nt * kMr) * ldc_ + jc + nq * kNr;
        next_rows = std::min(kMr, r1 - r0 - nt * kMr);
      }
      if (direct_b_) {
        kMicroKernels<false>[rows](kc, packed_a + t * kMr * kc, b_.data + pc * b_.ld + jc + j0,
                                   b_.ld, ct, ldc_, cols, pc > 0, next_c, next_rows);
      } else {
        kMicroKernels<true>[rows](kc, packed_a + t * kMr * kc, buffer_[s % 2] + q * kNr * kc, kNr,
                                  ct, ldc_, cols, pc > 0, next_c, next_rows);
      }
    }
    // progress only grows: an item of the next j block may finish before this one.
    size_t done = progress(item).load(std::memory_order_relaxed);
    while (done < s + 1 &&
           !progress(item).compare_exchange_weak(done, s + 1, std::memory_order_release)) {
    }
    computed(s).fetch_add(1, std::memory_order_release);
  }

  const size_t m_, k_;
  const GemmF32Operand a_, b_;
  float* const c_;
  const size_t ldc_;
  size_t row_tiles_, row_items_, max_tiles_, j_blocks_, k_blocks_, tasks_;
  bool direct_b_;     // b row-major, and one row tile or a small b: its rows read, unpacked
  Shape shape_[2]{};  // the j blocks of kNc columns, and the last one
  float* buffer_[2]{};
  std::unique_ptr<std::atomic<size_t>[]> counters_;
  alignas(64) std::atomic<size_t> next_{0};
};

void gemm(size_t m, size_t n, size_t k, const GemmF32Operand& a, const GemmF32Operand& b, float* c,
          size_t ldc) {
  const size_t threads = m * n * k >= kParallelMinFlops ? num_threads() : 1;
  Job job(m, n, k, a, b, c, ldc, threads);
  if (threads == 1) {
    job.participate();
    return;
  }
  parallel_for(threads, 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) job.participate();
  });
}

}  // namespace

#endif

}  // namespace WICK_ISA_NS

#if defined(WICK_ISA_AVX512)
const GemmF32 kAvx512GemmF32{kName, &gemm, true};
#elif defined(__AVX2__) && defined(__FMA__)
const GemmF32 kAvx2GemmF32{kName, &gemm, false};
#else
const GemmF32 kAvx2GemmF32{"", nullptr, false};
#endif

}  // namespace wick::cpu
