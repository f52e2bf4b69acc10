#pragma once
// The CPU side of qmatmul (src/cpu/qmatmul.cpp): weights repacked into tiles of 16 rows so that
// one 512-bit integer dot (or two 256-bit ones) serves 16 output rows, activations quantized to
// 8-bit blocks of 32, and the per-ISA tile kernels (src/cpu/qmatmul_kernels.cpp and
// qmatmul_kernels_k.cpp, compiled for AVX2 and for AVX-512 with VNNI).
//
// Tile layout, per tile of 16 rows and per block b of 32 values (tiles, then blocks, in order):
//   d[16]  f16 scales of the 16 rows' blocks
//   m[16]  f16 minimums (Q4_1 and Q5_1 only)
//   Q4_0 / Q4_1 / IQ4_NL: 4 chunks of 64 bytes; byte 4r + j of chunk c holds row r's value 8c + j
//     in its low nibble and value 8c + 4 + j in its high nibble (0..15, Q4_0's offset 8 not
//     applied; IQ4_NL's level indices)
//   Q8_0: 8 chunks of 64 bytes; byte 4r + j of chunk g holds row r's value 4g + j plus 128 (u8)
//   Q5_0 / Q5_1: 4 chunks of 64 bytes of nibbles as Q4_0's (the low 4 bits), then 64 bytes of
//     fifth bits: bit i of byte 4r + j belongs to row r's value 4i + j (Q5_0's offset 16 not
//     applied)
// The super-block types keep their super-blocks of 256 values (8 blocks of 32); per tile and
// super-block:
//   Q4_K / Q5_K: d[16], dmin[16] (f16), then per block of 32: sc[16], m[16] (u8, the 6-bit
//     scale and min of each row's sub-block), 4 chunks of 64 bytes of nibbles as Q4_0's (0..15)
//     and, for Q5_K, 64 bytes of fifth bits as Q5_0's
//   Q6_K: d[16] (f16), then per block of 32: sc[2][16] (i8, the scales of values 0..15 and
//     16..31), 4 chunks of 64 bytes of nibbles as Q4_0's (the low 4 bits, 0..15) and 2 chunks
//     of 64 bytes of the high 2 bits: bits 2i, 2i + 1 of byte 4r + j of chunk h belong to row r's
//     value 16h + 4i + j (the offset 32 not applied)
//   Q2_K: d[16], dmin[16] (f16), then per block of 32: sc[2][16], m[2][16] (u8, the 4-bit scales
//     and mins of values 0..15 and 16..31) and 2 chunks of 64 bytes of the 2-bit values, laid out
//     as Q6_K's high bits
//   IQ4_XS: d[16] (f16), then per block of 32: sc[16] (i8, the 6-bit scale less 32) and 4 chunks
//     of 64 bytes of the 4-bit level indices as Q4_0's nibbles
// Rows past n are zero (scale 0). Q3_K is first rewritten exactly as Q6_K blocks and packed as
// those (QPacked::type is then Q6_K).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/isa_ns.h"
#include "wick/quantized.h"

namespace wick::cpu {

constexpr size_t kQTileRows = 16;

/// True for the weight types with a tile layout (the integer kernels).
bool q_tiled(GgmlType type);
/// Bytes of one tile-block (16 rows x 32 values) of a tiled type; for the super-block types an
/// eighth of a tile-super-block (16 rows x 256 values, its header included).
size_t q_tile_block_bytes(GgmlType type);

/// Bytes of the super-block types' tile-super-blocks: the header (d, and dmin where the type has
/// mins) and the 8 blocks of 32 after it; Q5_0's and Q5_1's tile-blocks.
constexpr size_t kQ4KTileHeader = 64, kQ4KTileBlock = 32 + 256;
constexpr size_t kQ6KTileHeader = 32, kQ6KTileBlock = 32 + 256 + 128;
constexpr size_t kQ5KTileBlock = kQ4KTileBlock + 64;
constexpr size_t kQ2KTileHeader = 64, kQ2KTileBlock = 64 + 128;
constexpr size_t kIQ4XSTileHeader = 32, kIQ4XSTileBlock = 16 + 256;
constexpr size_t kQ5TileBlock = 32 + 256 + 64;                              // = 16 x 22
constexpr size_t kQ51TileBlock = 64 + 256 + 64;                             // = 16 x 24
constexpr size_t kQ4KTileSuper = kQ4KTileHeader + 8 * kQ4KTileBlock;        // 2368 = 16 x 148
constexpr size_t kQ5KTileSuper = kQ4KTileHeader + 8 * kQ5KTileBlock;        // 2880 = 16 x 180
constexpr size_t kQ6KTileSuper = kQ6KTileHeader + 8 * kQ6KTileBlock;        // 3360 = 16 x 210
constexpr size_t kQ2KTileSuper = kQ2KTileHeader + 8 * kQ2KTileBlock;        // 1600 = 16 x 100
constexpr size_t kIQ4XSTileSuper = kIQ4XSTileHeader + 8 * kIQ4XSTileBlock;  // 2208 = 16 x 138

/// The owner of packed tiles: a chunk of huge pages shared with other matrices (q_pack), or
/// malloc's memory.
struct TilesChunk;
struct TilesFree {
  TilesChunk* chunk = nullptr;
  void operator()(uint8_t* p) const;
};

/// Weights in the tile layout.
struct QPacked {
  GgmlType type = GgmlType::Q4_0;
  size_t n = 0, k = 0;  // rows, values per row
  size_t tiles = 0;     // ceil(n / 16)
  std::unique_ptr<uint8_t[], TilesFree> bytes;
  const uint8_t* tile(size_t t) const {
    return bytes.get() + t * (k / 32) * q_tile_block_bytes(type);
  }
};

/// Repacks n rows of k values of GGML blocks at `src` (row-major).
std::shared_ptr<const QPacked> q_pack(GgmlType type, const uint8_t* src, size_t n, size_t k);

/// The tiles of the blocks at `src` kept in `cache`, packed at the first call (once, whichever
/// threads ask); the blocks must not change afterwards.
const QPacked& q_packed(detail::QCache& cache, GgmlType type, const uint8_t* src, size_t n,
                        size_t k);

/// Activations quantized per block of 32 values, either to 8 bits (as ggml's Q8_0: value
/// qs * d, d = max|x| / 127) or, `wide`, to 16 bits written as two base-255 digits that each fit
/// the 8-bit kernels: value (255 qs + lo) * d with qs, lo in [-127, 127] and d = max|x| / 32512.
/// The wide form costs two integer dots per block instead of one (AVX2's Q8_0 kernel takes q16,
/// the values whole, in one); its rounding is 256 times smaller (docs/NUMERICS.md). Row i's
/// block b is at i nb + b; s holds each block's integer sum (of 255 qs + lo when wide), s16 that
/// of its first 16 values (Q6_K's sub-blocks) and ds = d * s.
struct Q8Rows {
  size_t m = 0, k = 0;
  bool wide = false;
  std::vector<int8_t> qs, lo;  // lo: wide only
  std::vector<int16_t> q16;    // wide only: the values themselves, 255 qs + lo
  std::vector<float> d, ds;
  std::vector<int32_t> s, s16;
  void quantize(const float* x, size_t m, size_t k, bool wide);
};

/// The largest |integer| a block's values are scaled to.
constexpr int kQ8Max = 127, kQ16Max = 32512;  // 32512 = 255 * 127 + 127

/// y (m, n), rows of n, += nothing: y[i n + j] = sum_k x[i, k] w[j, k] for the rows j of tiles
/// [t0, t1).
struct QKernels {
  void (*gemm_tiles)(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1);
};

extern const QKernels kQAvx2Kernels;
extern const QKernels kQAvx512VnniKernels;

/// The kernels for this CPU: AVX-512 VNNI when present (and WICK_CPU_ISA does not force avx2),
/// else AVX2.
const QKernels& q_kernels();

/// How the tiled types take their activations (WICK_QMATMUL_ACTIVATIONS=f32|int8|int16):
/// f32 (dequantised rows, f32 dots), 8-bit or 16-bit blocks (the integer tile kernels).
enum class QActivations { F32, Int8, Int16 };
QActivations q_activations();

/// y (m, n) = x (m, k, f32) times the transposed w (n, k) of GGML blocks at `w_raw`, or of the
/// tiles in `packed` for the tiled types (activations quantized as `acts`: Int8 or Int16).
void qmatmul(GgmlType type, const uint8_t* w_raw, const QPacked* packed, size_t n, size_t k,
             const float* x, size_t m, float* y, QActivations acts);

inline namespace WICK_ISA_NS {
void q_gemm_tiles(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1);
/// The super-block types' part of q_gemm_tiles (src/cpu/qmatmul_kernels_k.cpp).
void q_gemm_tiles_k(const QPacked& w, const Q8Rows& x, float* y, size_t t0, size_t t1);
}  // namespace WICK_ISA_NS

}  // namespace wick::cpu
