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

}  // namespace wick::ops

#undef WICK_GGML_HD
