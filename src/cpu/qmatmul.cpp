// qmatmul on the CPU: the repacking of GGML blocks into 16-row tiles, the quantization of the
// activations (8-bit as ggml's quantize_row_q8_0: d = max|x| / 127, q = round(x / d); or 16-bit
// as two base-255 digits), the choice of
// the tile kernels' instruction set, and the f32 path (each weight row dequantised once into a
// cache-resident buffer and dotted with every f32 activation row: WICK_QMATMUL_ACTIVATIONS=f32).

#include "cpu/qmatmul.h"

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cpu/cpu_storage.h"
#include "cpu/dequant.h"
#include "cpu/parallel.h"
#include "fused/quantized.h"
#include "fused_op.h"
#include "ops/ggml_blocks.h"
#include "settings.h"
#include "tensor_internal.h"
#include "util.h"
#include "wick/cpu.h"
#include "wick/error.h"

namespace wick::cpu {

namespace {

[[maybe_unused]] bool cpu_has_avx512_vnni() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// Value j (0..31) of a Q4_0 / Q4_1 block's nibbles.
inline uint8_t nibble(const uint8_t* qs, int j) {
  return j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
}

// Row r's 32 values (their low 4 bits) into 4 chunks of 64 bytes of nibbles (Q4_0's order).
template <typename Value>
void pack_nibbles(uint8_t* dst, size_t r, Value value) {
  for (int c = 0; c < 4; ++c) {
    for (int j = 0; j < 4; ++j) {
      uint8_t lo = value(8 * c + j) & 0x0f, hi = value(8 * c + 4 + j) & 0x0f;
      dst[64 * c + 4 * r + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Row r's 32 values' fifth bits (bit 4) into 64 bytes: bit i of byte 4r + j for value 4i + j.
template <typename Value>
void pack_fifth_bits(uint8_t* dst, size_t r, Value value) {
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) {
      dst[4 * r + j] |= static_cast<uint8_t>(((value(4 * i + j) >> 4) & 1) << i);
    }
  }
}

// Row r's 32 2-bit values into 2 chunks of 64 bytes: bits 2i, 2i + 1 of byte 4r + j of chunk h
// for value 16h + 4i + j.
template <typename Value>
void pack_crumbs(uint8_t* dst, size_t r, Value value) {
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        dst[64 * h + 4 * r + j] |= static_cast<uint8_t>((value(16 * h + 4 * i + j) & 3) << (2 * i));
      }
    }
  }
}

void pack_tile(GgmlType type, const uint8_t* src, size_t n, size_t k, size_t t, uint8_t* dst) {
  const size_t nb = k / 32, row_bytes = ggml_bytes(type, k), src_block = ggml_type_size(type);
  const size_t tb = q_tile_block_bytes(type);
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* p = dst + b * tb;
    std::memset(p, 0, tb);
    for (size_t r = 0; r < kQTileRows; ++r) {
      size_t row = t * kQTileRows + r;
      if (row >= n) {
        if (type == GgmlType::Q8_0) {
          for (int g = 0; g < 8; ++g) std::memset(p + 32 + 64 * g + 4 * r, 128, 4);
        }
        continue;
      }
      const uint8_t* blk = src + row * row_bytes + b * src_block;
      std::memcpy(p + 2 * r, blk, 2);  // d
      if (type == GgmlType::Q8_0) {
        const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
        for (int j = 0; j < 32; ++j) {
          p[32 + 64 * (j / 4) + 4 * r + j % 4] = static_cast<uint8_t>(qs[j] + 128);
        }
        continue;
      }
      if (type == GgmlType::Q5_0) {
        const uint32_t qh = ops::q5_0_high_bits(blk);
        auto value = [&](int j) { return static_cast<uint8_t>(ops::q5_0_int(blk, qh, j) + 16); };
        pack_nibbles(p + 32, r, value);
        pack_fifth_bits(p + 288, r, value);
        continue;
      }
      if (type == GgmlType::Q5_1) {
        std::memcpy(p + 32 + 2 * r, blk + 2, 2);  // m
        const uint32_t qh = ops::q5_1_high_bits(blk);
        auto value = [&](int j) { return static_cast<uint8_t>(ops::q5_1_int(blk, qh, j)); };
        pack_nibbles(p + 64, r, value);
        pack_fifth_bits(p + 320, r, value);
        continue;
      }
      size_t q_off = 32;
      const uint8_t* qs = blk + 2;
      if (type == GgmlType::Q4_1) {
        std::memcpy(p + 32 + 2 * r, blk + 2, 2);  // m
        q_off = 64;
        qs = blk + 4;
      }
      for (int c = 0; c < 4; ++c) {
        for (int j = 0; j < 4; ++j) {
          uint8_t lo = nibble(qs, 8 * c + j), hi = nibble(qs, 8 * c + 4 + j);
          p[q_off + 64 * c + 4 * r + j] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
    }
  }
}

// Value l (0..31) of sub-block j of a Q4_K super-block (0..15): sub-blocks 2i and 2i + 1 share
// the 32 bytes at 32 i, low and high nibbles.
inline uint8_t q4k_value(const uint8_t* qs, int j, int l) {
  uint8_t v = qs[32 * (j / 2) + l];
  return j % 2 == 0 ? v & 0x0f : v >> 4;
}

// Value v (0..255) of a Q6_K super-block (0..63, offset 32 not applied).
inline uint8_t q6k_value(const uint8_t* blk, int v) {
  const uint8_t* ql = blk + 64 * (v / 128);
  const uint8_t* qh = blk + 128 + 32 * (v / 128);
  int quarter = (v % 128) / 32, l = v % 32;
  uint8_t low = quarter % 2 == 0 ? ql[l] : ql[l + 32];
  low = quarter < 2 ? low & 0x0f : low >> 4;
  return static_cast<uint8_t>(low | (((qh[l] >> (2 * quarter)) & 3) << 4));
}

// Row r's super-block `blk` into the tile-super-block at p (layouts in cpu/qmatmul.h).
void pack_q4_k(const uint8_t* blk, size_t r, uint8_t* p, bool five) {
  std::memcpy(p + 2 * r, blk, 2);           // d
  std::memcpy(p + 32 + 2 * r, blk + 2, 2);  // dmin
  for (int j = 0; j < 8; ++j) {
    uint8_t* b = p + kQ4KTileHeader + j * (five ? kQ5KTileBlock : kQ4KTileBlock);
    ops::q4_k_scale_min(static_cast<unsigned>(j), blk + 4, b[r], b[16 + r]);
    if (five) {
      auto value = [&](int l) { return static_cast<uint8_t>(ops::q5_k_int(blk, 32 * j + l)); };
      pack_nibbles(b + 32, r, value);
      pack_fifth_bits(b + 288, r, value);
    } else {
      pack_nibbles(b + 32, r, [&](int l) { return q4k_value(blk + 16, j, l); });
    }
  }
}

void pack_q6_k(const uint8_t* blk, size_t r, uint8_t* p) {
  std::memcpy(p + 2 * r, blk + 208, 2);  // d
  for (int j = 0; j < 8; ++j) {
    uint8_t* b = p + kQ6KTileHeader + j * kQ6KTileBlock;
    b[r] = blk[192 + 2 * j];
    b[16 + r] = blk[192 + 2 * j + 1];
    auto value = [&](int l) { return q6k_value(blk, 32 * j + l); };
    pack_nibbles(b + 32, r, value);
    pack_crumbs(b + 288, r, [&](int l) { return value(l) >> 4; });
  }
}

void pack_q2_k(const uint8_t* blk, size_t r, uint8_t* p) {
  std::memcpy(p + 2 * r, blk + 80, 2);       // d
  std::memcpy(p + 32 + 2 * r, blk + 82, 2);  // dmin
  for (int j = 0; j < 8; ++j) {
    uint8_t* b = p + kQ2KTileHeader + j * kQ2KTileBlock;
    for (int half = 0; half < 2; ++half) {
      const uint8_t scale = blk[2 * j + half];  // low nibble: scale, high nibble: min
      b[16 * half + r] = scale & 0x0f;
      b[32 + 16 * half + r] = scale >> 4;
    }
    pack_crumbs(b + 64, r,
                [&](int l) { return static_cast<uint8_t>(ops::q2_k_int(blk, 32 * j + l)); });
  }
}

void pack_iq4_xs(const uint8_t* blk, size_t r, uint8_t* p) {
  std::memcpy(p + 2 * r, blk, 2);  // d
  for (int j = 0; j < 8; ++j) {
    uint8_t* b = p + kIQ4XSTileHeader + j * kIQ4XSTileBlock;
    b[r] =
        static_cast<uint8_t>(static_cast<int8_t>(ops::iq4_xs_scale(blk, static_cast<unsigned>(j))));
    pack_nibbles(b + 16, r, [&](int l) { return nibble(blk + 8 + 16 * j, l); });
  }
}

// Tile t of a super-block type (layout in cpu/qmatmul.h): each row's super-blocks unpacked into
// the tile's.
void pack_k_tile(GgmlType type, const uint8_t* src, size_t n, size_t k, size_t t, uint8_t* dst) {
  const size_t nsb = k / 256, row_bytes = ggml_bytes(type, k);
  const size_t super = 8 * q_tile_block_bytes(type);
  std::memset(dst, 0, nsb * super);
  for (size_t r = 0; r < kQTileRows && t * kQTileRows + r < n; ++r) {
    const uint8_t* row = src + (t * kQTileRows + r) * row_bytes;
    for (size_t sb = 0; sb < nsb; ++sb) {
      uint8_t* p = dst + sb * super;
      const uint8_t* blk = row + sb * ggml_type_size(type);
      switch (type) {
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
          pack_q4_k(blk, r, p, type == GgmlType::Q5_K);
          break;
        case GgmlType::Q6_K:
          pack_q6_k(blk, r, p);
          break;
        case GgmlType::Q2_K:
          pack_q2_k(blk, r, p);
          break;
        default:
          pack_iq4_xs(blk, r, p);
          break;
      }
    }
  }
}

float dot_f32(const float* a, const float* b, size_t k) {
  size_t i = 0;
  float total = 0;
#if defined(__AVX2__) && defined(__FMA__)
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  for (; i + 16 <= k; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(s0, s1));
  for (float v : lanes) total += v;
#endif
  for (; i < k; ++i) total += a[i] * b[i];
  return total;
}

// Rows of a type without a tile layout: each weight row dequantised once (into a buffer that
// stays in L1/L2), then dotted with every activation row.
void qmatmul_rows(GgmlType type, const uint8_t* w, size_t n, size_t k, const float* x, size_t m,
                  float* y) {
  const size_t row_bytes = ggml_bytes(type, k);
  size_t grain = std::max<size_t>(1, 65536 / (k * m + 1));
  parallel_for(n, grain, [&](size_t lo, size_t hi) {
    std::vector<float> row(k);
    for (size_t j = lo; j < hi; ++j) {
      dequantize(type, w + j * row_bytes, row.data(), k);
      for (size_t i = 0; i < m; ++i) y[i * n + j] = dot_f32(row.data(), x + i * k, k);
    }
  });
}

// Q3_K's (d sc) q as Q6_K holds it: the same 16 sub-blocks of 16 in the same order, sc (-32..31)
// as Q6_K's int8 scale and q (-4..3) as its q - 32, d as is; the values are equal bit for bit.
void q3_k_as_q6_k(const uint8_t* b, uint8_t* out) {
  std::memset(out, 0, 210);
  for (unsigned v = 0; v < 256; ++v) {
    const unsigned half = v / 128, quarter = (v % 128) / 32, l = v % 32;
    const auto q = static_cast<uint8_t>(ops::q3_k_int(b, v) + 32);
    uint8_t& low = out[64 * half + l + 32 * (quarter & 1)];
    low |= static_cast<uint8_t>(quarter < 2 ? (q & 0x0f) : (q & 0x0f) << 4);
    out[128 + 32 * half + l] |= static_cast<uint8_t>((q >> 4) << (2 * quarter));
  }
  for (unsigned i = 0; i < 16; ++i) out[192 + i] = static_cast<uint8_t>(ops::q3_k_scale(b, i));
  out[208] = b[108];
  out[209] = b[109];
}

// The tiled type whose blocks hold a type's values exactly (the type itself for those with
// kernels of their own).
GgmlType tile_type(GgmlType type) {
  return type == GgmlType::Q3_K ? GgmlType::Q6_K : type;
}

}  // namespace

// The packed weights are streamed once per token: they sit in 2 MiB pages (asked of the kernel by
// madvise), since a stream over 4 KiB pages misses the TLB at every page. A model's matrices are
// packed one by one, most smaller than a huge page, so they share chunks of kChunkBytes, each
// freed with its last matrix. Matrices below kArenaMinBytes take malloc's memory.
struct TilesChunk {
  uint8_t* base = nullptr;
  size_t size = 0, used = 0, live = 0;
};

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kChunkBytes = size_t{32} << 20;
constexpr size_t kArenaMinBytes = size_t{64} << 10;

class TileArena {
 public:
  std::pair<uint8_t*, TilesChunk*> alloc(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > kChunkBytes) {
      TilesChunk* own = new_chunk(bytes);
      own->used = bytes;
      own->live = 1;
      return {own->base, own};
    }
    if (current_ == nullptr || current_->used + bytes > current_->size) {
      if (current_ != nullptr && current_->live == 0) release(current_);
      current_ = new_chunk(kChunkBytes);
    }
    uint8_t* p = current_->base + current_->used;
    current_->used += bytes;
    ++current_->live;
    return {p, current_};
  }

  void free(TilesChunk* c) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--c->live == 0 && c != current_) release(c);
  }

 private:
  static TilesChunk* new_chunk(size_t bytes) {
    const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, size);
    if (p == nullptr) throw BackendError(str("qmatmul: out of memory packing ", bytes, " bytes"));
#if defined(MADV_HUGEPAGE)
    madvise(p, size, MADV_HUGEPAGE);
#endif
    return new TilesChunk{static_cast<uint8_t*>(p), size};
  }
  static void release(TilesChunk* c) {
    std::free(c->base);
    delete c;
  }

  std::mutex mutex_;
  TilesChunk* current_ = nullptr;
};

TileArena& tile_arena() {
  static TileArena* arena = new TileArena;  // never destroyed: tiles may outlive static objects
  return *arena;
}

}  // namespace

bool q_tiled(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q8_0:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

size_t q_tile_block_bytes(GgmlType type) {
  switch (tile_type(type)) {
    case GgmlType::Q4_0:
    case GgmlType::IQ4_NL:
      return 32 + 256;
    case GgmlType::Q4_1:
      return 64 + 256;
    case GgmlType::Q8_0:
      return 32 + 512;
    case GgmlType::Q5_0:
      return kQ5TileBlock;
    case GgmlType::Q5_1:
      return kQ51TileBlock;
    case GgmlType::Q4_K:
      return kQ4KTileSuper / 8;
    case GgmlType::Q5_K:
      return kQ5KTileSuper / 8;
    case GgmlType::Q6_K:
      return kQ6KTileSuper / 8;
    case GgmlType::Q2_K:
      return kQ2KTileSuper / 8;
    case GgmlType::IQ4_XS:
      return kIQ4XSTileSuper / 8;
    default:
      throw UnsupportedDType(str("qmatmul: no tile layout for ", ggml_type_name(type)));
  }
}

std::shared_ptr<const QPacked> q_pack(GgmlType type, const uint8_t* src, size_t n, size_t k) {
  if (tile_type(type) != type) {
    // Rewritten block by block into the type that holds its values, then packed as that one.
    const GgmlType as = tile_type(type);
    const size_t blocks = n * k / ggml_block_size(type);
    const size_t from = ggml_type_size(type), to = ggml_type_size(as);
    std::vector<uint8_t> converted(blocks * to);
    parallel_for(blocks, 256, [&](size_t lo, size_t hi) {
      for (size_t i = lo; i < hi; ++i) q3_k_as_q6_k(src + i * from, converted.data() + i * to);
    });
    return q_pack(as, converted.data(), n, k);
  }
  auto packed = std::make_shared<QPacked>();
  packed->type = type;
  packed->n = n;
  packed->k = k;
  packed->tiles = (n + kQTileRows - 1) / kQTileRows;
  const size_t tile_bytes = (k / 32) * q_tile_block_bytes(type);
  const size_t bytes = packed->tiles * tile_bytes;
  if (bytes >= kArenaMinBytes) {
    auto [p, chunk] = tile_arena().alloc(bytes);
    packed->bytes = std::unique_ptr<uint8_t[], TilesFree>(p, TilesFree{chunk});
  } else {
    auto* p = static_cast<uint8_t*>(std::malloc(std::max<size_t>(bytes, 1)));
    if (p == nullptr) throw BackendError(str("qmatmul: out of memory packing ", bytes, " bytes"));
    packed->bytes.reset(p);
  }
  uint8_t* dst = packed->bytes.get();
  parallel_for(packed->tiles, 4, [&](size_t lo, size_t hi) {
    for (size_t t = lo; t < hi; ++t) {
      if (ggml_block_size(type) == 256) {
        pack_k_tile(type, src, n, k, t, dst + t * tile_bytes);
      } else {
        pack_tile(type, src, n, k, t, dst + t * tile_bytes);
      }
    }
  });
  return packed;
}

void TilesFree::operator()(uint8_t* p) const {
  if (chunk != nullptr) {
    tile_arena().free(chunk);
  } else {
    std::free(p);
  }
}

const QPacked& q_packed(detail::QCache& cache, GgmlType type, const uint8_t* src, size_t n,
                        size_t k) {
  std::call_once(cache.cpu_once, [&] { cache.cpu_packed = q_pack(type, src, n, k); });
  return *cache.cpu_packed;
}

void Q8Rows::quantize(const float* x, size_t rows, size_t cols, bool wide_digits) {
  m = rows;
  k = cols;
  wide = wide_digits;
  const size_t nb = k / 32;
  const float top = wide ? kQ16Max : kQ8Max;
  qs.resize(m * k);
  lo.resize(wide ? m * k : 0);
  q16.resize(wide ? m * k : 0);
  d.resize(m * nb);
  ds.resize(m * nb);
  s.resize(m * nb);
  s16.resize(m * nb);
  size_t i = 0;
#if defined(__AVX2__)
  // The same arithmetic 8 lanes at a time (cvtps rounds to nearest even, as lrintf does).
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 inv255 = _mm256_set1_ps(1.0f / 255);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  // 32 i32 lanes to 32 i8 in order: packs interleave 128-bit lanes, a permute restores it.
  auto pack_store = [&](const __m256i(&v)[4], int8_t* dst) {
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm256_permutevar8x32_epi32(p, order));
  };
  for (; i < m * nb; ++i) {
    const float* v = x + i * 32;
    __m256 a[4];
    for (int j = 0; j < 4; ++j) a[j] = _mm256_loadu_ps(v + 8 * j);
    __m256 mx =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, a[0]), _mm256_andnot_ps(sign, a[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, a[2]), _mm256_andnot_ps(sign, a[3])));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float amax = _mm_cvtss_f32(h);
    float scale = amax / top;
    float inv = scale != 0 ? 1.0f / scale : 0.0f;
    __m256 vi = _mm256_set1_ps(inv);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(a[j], vi));
    __m256i sum32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m256i half32 = _mm256_add_epi32(q[0], q[1]);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    __m128i h4 = _mm_add_epi32(_mm256_castsi256_si128(half32), _mm256_extracti128_si256(half32, 1));
    s4 = _mm_hadd_epi32(s4, h4);  // sum, sum, half, half (pairs)
    s4 = _mm_hadd_epi32(s4, s4);  // lane 0: sum, lane 1: half
    if (wide) {
      // q = 255 hi + lo: hi = round(q / 255) (|q / 255 - hi| is never near 1/2 for |q| <=
      // 32512), so |lo| <= 127.
      __m256i hi[4], low[4];
      for (int j = 0; j < 4; ++j) {
        hi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(q[j]), inv255));
        low[j] = _mm256_sub_epi32(q[j], _mm256_sub_epi32(_mm256_slli_epi32(hi[j], 8), hi[j]));
      }
      pack_store(hi, qs.data() + i * 32);
      pack_store(low, lo.data() + i * 32);
      // packs interleave 128-bit lanes: the 64-bit quarters put back in order.
      for (int j = 0; j < 4; j += 2) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16.data() + i * 32 + 8 * j),
                            _mm256_permute4x64_epi64(_mm256_packs_epi32(q[j], q[j + 1]), 0xd8));
      }
    } else {
      pack_store(q, qs.data() + i * 32);
    }
    d[i] = scale;
    s[i] = _mm_cvtsi128_si32(s4);
    s16[i] = _mm_extract_epi32(s4, 1);
    ds[i] = scale * static_cast<float>(s[i]);
  }
#endif
  for (; i < m * nb; ++i) {
    const float* v = x + i * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    float scale = amax / top;
    float inv = scale != 0 ? 1.0f / scale : 0.0f;
    int32_t sum = 0;
    for (size_t j = i * 32; j < i * 32 + 32; ++j) {
      auto q = static_cast<int32_t>(std::lrintf(x[j] * inv));
      sum += q;
      if (j == i * 32 + 15) s16[i] = sum;
      if (wide) {
        auto hi = static_cast<int32_t>(std::lrintf(static_cast<float>(q) * (1.0f / 255)));
        qs[j] = static_cast<int8_t>(hi);
        lo[j] = static_cast<int8_t>(q - 255 * hi);
        q16[j] = static_cast<int16_t>(q);
      } else {
        qs[j] = static_cast<int8_t>(q);
      }
    }
    d[i] = scale;
    s[i] = sum;
    ds[i] = scale * static_cast<float>(sum);
  }
}

QActivations q_activations() {
  static const QActivations acts = [] {
    const std::string& name = settings::qmatmul_activations();
    if (name == "f32") return QActivations::F32;
    if (name == "int8") return QActivations::Int8;
    return QActivations::Int16;
  }();
  return acts;
}

const QKernels& q_kernels() {
#if defined(WICK_NO_AVX512_KERNELS)
  return kQAvx2Kernels;
#else
  static const bool vnni = cpu_isa() == "avx512" && cpu_has_avx512_vnni();
  return vnni ? kQAvx512VnniKernels : kQAvx2Kernels;
#endif
}

void qmatmul(GgmlType type, const uint8_t* w_raw, const QPacked* packed, size_t n, size_t k,
             const float* x, size_t m, float* y, QActivations acts) {
  if (packed == nullptr || acts == QActivations::F32) {
    return qmatmul_rows(type, w_raw, n, k, x, m, y);
  }
  const bool wide = acts == QActivations::Int16;
  const QKernels& kern = q_kernels();
  if (m == 1) {
    // One row (decoding): one share a thread, so that no chunk boundary leaves a thread idle at
    // the end; each thread quantizes the row itself (the same bits) rather than wait for the
    // caller to.
    const size_t grain = std::max<size_t>(1, packed->tiles / num_threads());
    parallel_for(packed->tiles, grain, [&](size_t lo, size_t hi) {
      thread_local Q8Rows own;
      own.quantize(x, 1, k, wide);
      kern.gemm_tiles(*packed, own, y, lo, hi);
    });
    return;
  }
  thread_local Q8Rows xq;
  xq.quantize(x, m, k, wide);
  // A tile is 16 rows: at least ~64k multiply-adds a chunk.
  const size_t grain = std::max<size_t>(1, 65536 / (kQTileRows * k * m + 1));
  const Q8Rows& xr = xq;
  parallel_for(packed->tiles, grain,
               [&](size_t lo, size_t hi) { kern.gemm_tiles(*packed, xr, y, lo, hi); });
}

}  // namespace wick::cpu

namespace wick {

std::string cpu_qmatmul_isa() {
  return &cpu::q_kernels() == &cpu::kQAvx2Kernels ? "avx2" : "avx512-vnni";
}

}  // namespace wick

namespace wick::fused {

std::optional<TensorList> QMatmulOp::cpu(const TensorList& in) const {
  auto locks = detail::lock_inputs(*this, in);
  const Tensor& raw = in[0];
  const Tensor& x = in[1];
  const size_t m = x.dims()[0];
  const auto* w_bytes = static_cast<const uint8_t*>(cpu::as_cpu(detail::backend_of(raw)).data()) +
                        raw.layout().start_offset();
  const cpu::QPacked* packed = nullptr;
  // The tiled types run the integer tile kernels over 16-bit activations (8-bit as llama.cpp,
  // or f32, through WICK_QMATMUL_ACTIVATIONS; docs/NUMERICS.md says why 16).
  const cpu::QActivations acts = cpu::q_activations();
  if (cpu::q_tiled(type) && acts != cpu::QActivations::F32) {
    // apply holds the blocks' read lock.
    packed = &cpu::q_packed(*cache, type, w_bytes, n, k);
  }
  auto out = cpu::device().alloc(m * n, DType::F32);
  const float* xp = cpu::as_cpu(detail::backend_of(x)).as<float>() + x.layout().start_offset();
  cpu::qmatmul(type, w_bytes, packed, n, k, xp, m, cpu::as_cpu(*out).as<float>(), acts);
  return TensorList{detail::from_storage(std::move(out), Shape{m, n})};
}

}  // namespace wick::fused
