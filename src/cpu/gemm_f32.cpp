// wick's f32 GEMM for AVX-512 CPUs (cpu/gemm_f32.h), BLIS-style. For each block of kNc columns
// and kKc k values, b is packed once into micro-panels of kNr columns (kc rows of 32 floats, one
// micro-panel fits L1), the packing shared out across the thread pool; then each work item (a
// chunk of at most kMc rows of a, and a range of the block's micro-panels) packs its rows into
// micro-panels of kMr rows (the block stays in L2) and runs the register-blocked micro-kernel over
// them: kMr x 32 accumulators in 2 * kMr zmm registers, one embedded-broadcast FMA per a value and
// half-row of b. The first k block starts its accumulators at 0, later ones at c's current value,
// so an output element is one chain of FMAs in k order whatever the blocking: edges are padded
// with zeros in the packed operands and written under masks, never computed another way.
//
// The AVX2 build of this file has no kernel (matmul keeps OpenBLAS there).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "cpu/gemm_f32.h"
#include "cpu/isa_begin.h"  // last: the code below is compiled for this file's instruction set
#include "cpu/parallel.h"

namespace wick::cpu {
inline namespace WICK_ISA_NS {

#if defined(WICK_ISA_AVX512)

namespace {

constexpr size_t kMr = 14;    // rows of a micro-tile
constexpr size_t kNr = 32;    // columns of a micro-tile: two zmm
constexpr size_t kKc = 256;   // k block: a packed b micro-panel is kKc * 128 bytes (L1)
constexpr size_t kMc = 168;   // rows of a work item at most (12 micro-panels, its block in L2)
constexpr size_t kNc = 1024;  // columns of a block of b packed at once
// Below this many multiply-adds the product runs on the calling thread alone.
constexpr size_t kParallelMinFlops = size_t{1} << 18;

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

__mmask16 lanes(size_t count) {
  return count >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << count) - 1);
}

// Transposes 16 rows of 16 floats in place: r[i][j] becomes r[j][i].
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
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

// Packs b's columns j0..j0+cols (cols <= 32) and k values p0..p0+kc into dst: kc rows of 32
// floats, columns past `cols` zero.
void pack_b(const GemmF32Operand& b, size_t p0, size_t kc, size_t j0, size_t cols, float* dst) {
  if (!b.trans) {
    const __mmask16 m0 = lanes(cols), m1 = lanes(cols > 16 ? cols - 16 : 0);
    const float* src = b.data + p0 * b.ld + j0;
    for (size_t p = 0; p < kc; ++p, src += b.ld, dst += kNr) {
      _mm512_store_ps(dst, _mm512_maskz_loadu_ps(m0, src));
      _mm512_store_ps(dst + 16, _mm512_maskz_loadu_ps(m1, src + 16));
    }
    return;
  }
  // Column j of b is row j of the stored matrix: 16 x 16 blocks transposed on the way.
  for (size_t half = 0; half < 2; ++half) {
    const size_t valid = cols > 16 * half ? std::min<size_t>(16, cols - 16 * half) : 0;
    const float* src = b.data + (j0 + 16 * half) * b.ld + p0;
    for (size_t pb = 0; pb < kc; pb += 16) {
      const size_t len = std::min<size_t>(16, kc - pb);
      const __mmask16 m = lanes(len);
      __m512 r[16];
      for (size_t j = 0; j < 16; ++j) {
        r[j] = j < valid ? _mm512_maskz_loadu_ps(m, src + j * b.ld + pb) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (size_t q = 0; q < len; ++q) _mm512_store_ps(dst + (pb + q) * kNr + 16 * half, r[q]);
    }
  }
}

// Packs a's rows i0..i0+rows (rows <= kMr) and k values p0..p0+kc into dst: kc groups of kMr
// floats, rows past `rows` zero.
void pack_a(const GemmF32Operand& a, size_t i0, size_t rows, size_t p0, size_t kc, float* dst) {
  constexpr __mmask16 kTile = (1u << kMr) - 1;
  if (a.trans) {
    const __mmask16 m = lanes(rows);
    const float* src = a.data + p0 * a.ld + i0;
    for (size_t p = 0; p < kc; ++p, src += a.ld, dst += kMr) {
      _mm512_mask_storeu_ps(dst, kTile, _mm512_maskz_loadu_ps(m, src));
    }
    return;
  }
  const float* src = a.data + i0 * a.ld + p0;
  for (size_t pb = 0; pb < kc; pb += 16) {
    const size_t len = std::min<size_t>(16, kc - pb);
    const __mmask16 m = lanes(len);
    __m512 r[16];
    for (size_t i = 0; i < 16; ++i) {
      r[i] = i < rows ? _mm512_maskz_loadu_ps(m, src + i * a.ld + pb) : _mm512_setzero_ps();
    }
    transpose16(r);
    for (size_t q = 0; q < len; ++q) _mm512_mask_storeu_ps(dst + (pb + q) * kMr, kTile, r[q]);
  }
}

// c (rows x cols of a kMr x 32 tile, leading dimension ldc) = its packed a micro-panel times its
// packed b micro-panel over kc, added to c's current values when `accumulate`, each element's
// products added in k order.
void micro_kernel(size_t kc, const float* a, const float* b, float* c, size_t ldc, size_t rows,
                  size_t cols, bool accumulate) {
  const __mmask16 m0 = lanes(cols), m1 = lanes(cols > 16 ? cols - 16 : 0);
  __m512 acc[kMr][2];
#pragma GCC unroll 16
  for (size_t i = 0; i < kMr; ++i) {
    if (accumulate && i < rows) {
      acc[i][0] = _mm512_maskz_loadu_ps(m0, c + i * ldc);
      acc[i][1] = _mm512_maskz_loadu_ps(m1, c + i * ldc + 16);
    } else {
      acc[i][0] = _mm512_setzero_ps();
      acc[i][1] = _mm512_setzero_ps();
    }
  }
  for (size_t p = 0; p < kc; ++p, a += kMr, b += kNr) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 16
    for (size_t i = 0; i < kMr; ++i) {
      const __m512 x = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 16
  for (size_t i = 0; i < kMr; ++i) {
    if (i < rows) {
      _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);
      _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);
    }
  }
}

// One block of the product: b's columns jc..jc+nc and k values pc..pc+kc.
struct Block {
  size_t m, jc, nc, pc, kc;
  const GemmF32Operand* a;
  const float* packed_b;  // nc rounded up to micro-panels, kc rows each
  float* c;
  size_t ldc;
  // Work items: row chunks of row_chunk micro-panels times column chunks of col_chunk panels.
  size_t row_chunk, col_items, col_chunk;
};

// Work item `item` of the block: packs its rows of a, then multiplies them with its micro-panels
// of b.
void run_item(const Block& blk, size_t item) {
  const size_t panels = (blk.nc + kNr - 1) / kNr;
  const size_t r0 = item / blk.col_items * blk.row_chunk * kMr;
  const size_t r1 = std::min(blk.m, r0 + blk.row_chunk * kMr);
  const size_t q0 = item % blk.col_items * blk.col_chunk;
  const size_t q1 = std::min(panels, q0 + blk.col_chunk);
  if (r0 >= r1 || q0 >= q1) return;
  const size_t tiles = (r1 - r0 + kMr - 1) / kMr;
  float* packed_a = t_packed_a.get(tiles * kMr * blk.kc);
  for (size_t t = 0; t < tiles; ++t) {
    const size_t i0 = r0 + t * kMr;
    pack_a(*blk.a, i0, std::min(kMr, r1 - i0), blk.pc, blk.kc, packed_a + t * kMr * blk.kc);
  }
  const bool accumulate = blk.pc > 0;
  for (size_t q = q0; q < q1; ++q) {
    const float* pb = blk.packed_b + q * kNr * blk.kc;
    const size_t j0 = q * kNr, cols = std::min(kNr, blk.nc - j0);
    for (size_t t = 0; t < tiles; ++t) {
      const size_t i0 = r0 + t * kMr;
      micro_kernel(blk.kc, packed_a + t * kMr * blk.kc, pb, blk.c + i0 * blk.ldc + blk.jc + j0,
                   blk.ldc, std::min(kMr, r1 - i0), cols, accumulate);
    }
  }
}

void gemm(size_t m, size_t n, size_t k, const GemmF32Operand& a, const GemmF32Operand& b, float* c,
          size_t ldc) {
  const bool parallel = m * n * k >= kParallelMinFlops;
  const size_t threads = parallel ? num_threads() : 1;
  const size_t row_tiles = (m + kMr - 1) / kMr;
  float* packed_b = t_packed_b.get(kKc * std::min(n + kNr - 1, kNc) / kNr * kNr);
  for (size_t jc = 0; jc < n; jc += kNc) {
    const size_t nc = std::min(kNc, n - jc);
    const size_t panels = (nc + kNr - 1) / kNr;
    // Rows in chunks of at most kMc, as many as needed to give every thread some; when the rows
    // cannot, the block's micro-panels are split too.
    Block blk{m, jc, nc, 0, 0, &a, packed_b, c, ldc, 0, 1, panels};
    const size_t row_items_wanted = std::max<size_t>(threads, (row_tiles * kMr + kMc - 1) / kMc);
    blk.row_chunk = std::max<size_t>(1, (row_tiles + row_items_wanted - 1) / row_items_wanted);
    const size_t row_items = (row_tiles + blk.row_chunk - 1) / blk.row_chunk;
    if (row_items < threads) {
      blk.col_items = std::min(panels, (threads + row_items - 1) / row_items);
      blk.col_chunk = (panels + blk.col_items - 1) / blk.col_items;
      blk.col_items = (panels + blk.col_chunk - 1) / blk.col_chunk;
    }
    const size_t items = row_items * blk.col_items;
    for (size_t pc = 0; pc < k; pc += kKc) {
      blk.pc = pc;
      blk.kc = std::min(kKc, k - pc);
      auto pack = [&](size_t begin, size_t end) {
        for (size_t q = begin; q < end; ++q) {
          pack_b(b, pc, blk.kc, jc + q * kNr, std::min(kNr, nc - q * kNr),
                 packed_b + q * kNr * blk.kc);
        }
      };
      auto work = [&](size_t begin, size_t end) {
        for (size_t item = begin; item < end; ++item) run_item(blk, item);
      };
      if (threads > 1) {
        parallel_for(panels, 1, pack);
        parallel_for(items, 1, work);
      } else {
        pack(0, panels);
        work(0, items);
      }
    }
  }
}

}  // namespace

#endif

}  // namespace WICK_ISA_NS

#if defined(WICK_ISA_AVX512)
const GemmF32 kAvx512GemmF32{"wick avx512 14x32", &gemm};
#else
const GemmF32 kAvx2GemmF32{"", nullptr};
#endif

}  // namespace wick::cpu
