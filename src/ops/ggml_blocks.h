#pragma once
// GGML block decoding written once for the CPU and the CUDA dequantisation (cpu/dequant.cpp,
// cuda/dequant.cu): the integer of each value of a block (layouts as in ggml-common.h), which
// each backend then scales in the order of ggml's reference dequantize_row_* (the CPU without
// contraction, CUDA by round-to-nearest intrinsics). Blocks are byte-aligned only: multi-byte
// fields are read byte by byte.

#include <cstdint>

#if defined(__CUDACC__)
#define WICK_GGML_HD __host__ __device__ __forceinline__
#else
#define WICK_GGML_HD inline
#endif

namespace wick::ops {

/// Q8_0 (34 bytes: f16 d, int8 qs[32]): value j's integer.
WICK_GGML_HD int q8_0_int(const uint8_t* b, unsigned j) {
  return static_cast<int8_t>(b[2 + j]);
}

/// Q4_0 (18 bytes: f16 d, qs[16]; low nibbles values 0..15, high nibbles 16..31): q - 8.
WICK_GGML_HD int q4_0_int(const uint8_t* b, unsigned j) {
  const uint8_t byte = b[2 + j % 16];
  return (j < 16 ? (byte & 0x0f) : (byte >> 4)) - 8;
}

/// Q4_1 (20 bytes: f16 d, f16 m, qs[16]): q.
WICK_GGML_HD int q4_1_int(const uint8_t* b, unsigned j) {
  const uint8_t byte = b[4 + j % 16];
  return j < 16 ? (byte & 0x0f) : (byte >> 4);
}

/// Q5_0 (22 bytes: f16 d, uint32 qh of fifth bits, qs[16]): the fifth bits, little-endian.
WICK_GGML_HD uint32_t q5_0_high_bits(const uint8_t* b) {
  return static_cast<uint32_t>(b[2]) | (static_cast<uint32_t>(b[3]) << 8) |
         (static_cast<uint32_t>(b[4]) << 16) | (static_cast<uint32_t>(b[5]) << 24);
}
/// Q5_0: value j's integer, q - 16, with qh = q5_0_high_bits(b).
WICK_GGML_HD int q5_0_int(const uint8_t* b, uint32_t qh, unsigned j) {
  const uint8_t byte = b[6 + j % 16];
  const int low = j < 16 ? (byte & 0x0f) : (byte >> 4);
  return (low | static_cast<int>(((qh >> j) & 1u) << 4)) - 16;
}

/// Q4_K: the 6-bit scale and min of sub-block j (0..7) from the block's 12 scale bytes.
template <class U>
WICK_GGML_HD void q4_k_scale_min(unsigned j, const uint8_t* scales, U& sc, U& m) {
  if (j < 4) {
    sc = static_cast<U>(scales[j] & 63);
    m = static_cast<U>(scales[j + 4] & 63);
  } else {
    sc = static_cast<U>((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
    m = static_cast<U>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

/// Q6_K: value l (0..31) of quarter k (0..3) of a half block: ql and qh point at the half's
/// 64 low-bit and 32 high-bit bytes; q - 32.
WICK_GGML_HD int q6_k_int(const uint8_t* ql, const uint8_t* qh, unsigned k, unsigned l) {
  const uint8_t lo = ql[l + (k & 1) * 32];
  const int low = k < 2 ? (lo & 0x0f) : (lo >> 4);
  const int high = (qh[l] >> (2 * k)) & 3;
  return (low | (high << 4)) - 32;
}

/// Q5_1 (24 bytes: f16 d, f16 m, uint32 qh of fifth bits, qs[16]): the fifth bits.
WICK_GGML_HD uint32_t q5_1_high_bits(const uint8_t* b) {
  return static_cast<uint32_t>(b[4]) | (static_cast<uint32_t>(b[5]) << 8) |
         (static_cast<uint32_t>(b[6]) << 16) | (static_cast<uint32_t>(b[7]) << 24);
}
/// Q5_1: value j's integer q (0..31), with qh = q5_1_high_bits(b); the value is d * q + m.
WICK_GGML_HD int q5_1_int(const uint8_t* b, uint32_t qh, unsigned j) {
  const uint8_t byte = b[8 + j % 16];
  const int low = j < 16 ? (byte & 0x0f) : (byte >> 4);
  return low | static_cast<int>(((qh >> j) & 1u) << 4);
}

/// Q2_K (84 bytes: scales[16], qs[64], f16 d, f16 dmin; 256 values in 16 sub-blocks of 16):
/// value j's 2-bit integer. Sub-block j / 16 has scale byte scales[j / 16]: the low nibble
/// scales d, the high nibble dmin; the value is (d * sc) * q - dmin * m.
WICK_GGML_HD int q2_k_int(const uint8_t* b, unsigned j) {
  const unsigned half = j / 128, shift = 2 * ((j % 128) / 32), l = j % 32;
  return (b[16 + 32 * half + l] >> shift) & 3;
}

/// Q3_K (110 bytes: hmask[32], qs[64], scales[12], f16 d; 16 sub-blocks of 16): value j's
/// integer, its 2 low bits minus 4 where its hmask bit is clear (-4..3).
WICK_GGML_HD int q3_k_int(const uint8_t* b, unsigned j) {
  const unsigned half = j / 128, shift = 2 * ((j % 128) / 32), l = j % 32;
  const int low = (b[32 + 32 * half + l] >> shift) & 3;
  const int high = (b[l] >> (j / 32)) & 1;
  return low - (high ? 0 : 4);
}
/// Q3_K: the signed 6-bit scale of sub-block i (0..15) from the 12 scale bytes (b + 96): low
/// nibbles of bytes 0..7 for 0..7, their high nibbles for 8..15, the top 2 bits from bytes
/// 8..11; minus 32. The value is (d * sc) * q.
WICK_GGML_HD int q3_k_scale(const uint8_t* b, unsigned i) {
  const uint8_t* s = b + 96;
  const int low = i < 8 ? (s[i] & 0x0f) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

/// Q5_K (176 bytes: f16 d, f16 dmin, scales[12] as Q4_K's, qh[32], qs[128]; 8 sub-blocks of
/// 32): value j's integer (0..31); the value is (d * sc) * q - dmin * m with q4_k_scale_min of
/// sub-block j / 32.
WICK_GGML_HD int q5_k_int(const uint8_t* b, unsigned j) {
  const unsigned sub = j / 32, l = j % 32;
  const uint8_t byte = b[48 + 32 * (sub / 2) + l];
  const int low = sub % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
  return low | (((b[16 + l] >> sub) & 1) << 4);
}

/// IQ4_NL's and IQ4_XS's 16 non-linear levels.
WICK_GGML_HD int iq4_level(unsigned nibble) {
  constexpr int8_t kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
  return kLevels[nibble & 15];
}

/// IQ4_NL (18 bytes: f16 d, qs[16] as Q4_0's nibbles): value j's level; the value is d * level.
WICK_GGML_HD int iq4_nl_int(const uint8_t* b, unsigned j) {
  const uint8_t byte = b[2 + j % 16];
  return iq4_level(j < 16 ? (byte & 0x0f) : (byte >> 4));
}

/// IQ4_XS (136 bytes: f16 d, uint16 scales_h, scales_l[4], qs[128]; 8 sub-blocks of 32 whose
/// 16 bytes of nibbles are laid out as IQ4_NL's): value j's level.
WICK_GGML_HD int iq4_xs_int(const uint8_t* b, unsigned j) {
  const unsigned sub = j / 32, l = j % 32;
  const uint8_t byte = b[8 + 16 * sub + l % 16];
  return iq4_level(l < 16 ? (byte & 0x0f) : (byte >> 4));
}
/// IQ4_XS: sub-block i's signed 6-bit scale (4 low bits from scales_l, 2 high from scales_h,
/// minus 32); the value is (d * sc) * level.
WICK_GGML_HD int iq4_xs_scale(const uint8_t* b, unsigned i) {
  const unsigned scales_h = static_cast<unsigned>(b[2]) | (static_cast<unsigned>(b[3]) << 8);
  const int low = (b[4 + i / 2] >> (4 * (i % 2))) & 0x0f;
  const int high = (scales_h >> (2 * i)) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace wick::ops

#undef WICK_GGML_HD
