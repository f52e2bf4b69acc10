#pragma once
// The GGML weight formats of the decode projections (decode_gemv_device.cuh's weight formats, the
// plain rows aside): each block type's rows as units of 16 values, their integers dotted (dp4a)
// with the activations quantized as the CPU's qmatmul quantizes them, and by_ggml_rows, the one
// switch from a GemvWeights format to its rows type.

#include <cstdint>

#include "cuda/decode_gemv.h"
#include "cuda/kernel_utils.cuh"
#include "ops/ggml_blocks.h"

namespace wick::cuda::gemv {
// ---- GGML rows: integer dots (dp4a) of the weights' integers with the activations quantized as
// the CPU's qmatmul takes them by default (cpu/qmatmul.h, 16-bit blocks of 32: q = round(x / d),
// d = max |x| / 32512), each block sum scaled in f32 by the two scales.

constexpr float kQ16Max = 32512;
// 1.5 * 2^23: v + kMagic, for |v| < 2^22, is a float whose low 23 bits are 2^22 + round(v) (to
// nearest even, as lrintf): integers to and from floats with adds (conversion instructions issue
// at an eighth of the rate of float adds on sm_90).
constexpr float kMagic = 12582912;
constexpr int kMagicBits = 0x4b400000;

// A unit's 16 activations quantized: each q as its two bytes, q = 256 hi + lo (hi signed, lo
// unsigned), four values to a word in the unit's order; s = the sum of the unit's 16 q (exact),
// d = the scale of the block of 32 that holds the unit.
struct QUnit {
  uint32_t hi[4], lo[4];
  float s, d;
};

// Four products of the signed bytes of a and the unsigned bytes of b, plus c.
__device__ __forceinline__ int dp4a_su(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Weight bytes w (signed; nibbles 0..15 read the same) dotted with x's q, plus c (an integer
// below 2^22 in magnitude): the integer sum rounded once to f32. The two digits' sums (each below
// 2^22 in magnitude: at most 16 x 128 x 255) start from kMagicBits and come out as floats.
__device__ __forceinline__ float dot_q(const uint32_t (&w)[4], const QUnit& x, float c) {
  int hi = kMagicBits, lo = kMagicBits;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    hi = __dp4a(static_cast<int>(w[i]), static_cast<int>(x.hi[i]), hi);
    lo = dp4a_su(w[i], x.lo[i], lo);
  }
  return __fmaf_rn(256.0f, __int_as_float(hi) - kMagic, __int_as_float(lo) - (kMagic - c));
}

// max(a, b), NaN when either is (fmaxf drops a NaN): a NaN activation makes its block's sums NaN,
// as the f32 products would.
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Unit x (16 values, zeros past the end) quantized. The unit's block of 32 is units c and c ^ 1,
// on lanes l and l ^ 1 of the warp (c and l even together): its max |x| is found with one shuffle,
// so every lane of the warp calls this. The arithmetic is the CPU's (Q8Rows::quantize).
__device__ __forceinline__ QUnit quantize_unit(const float (&x)[16]) {
  float amax = 0;
#pragma unroll
  for (int e = 0; e < 16; ++e) amax = max_nan(amax, fabsf(x[e]));
  amax = max_nan(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  QUnit u;
  u.d = amax / kQ16Max;
  const float inv = u.d != 0 ? 1.0f / u.d : 0.0f;
  // |x inv| <= 32512: bytes 0 and 1 of the sum's bits are q's lo and hi.
  uint32_t b[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) b[e] = __float_as_uint(__fadd_rn(__fmul_rn(x[e], inv), kMagic));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t p = __byte_perm(b[4 * i], b[4 * i + 1], 0x5140);      // lo0 lo1 hi0 hi1
    const uint32_t q = __byte_perm(b[4 * i + 2], b[4 * i + 3], 0x5140);  // lo2 lo3 hi2 hi3
    u.lo[i] = __byte_perm(p, q, 0x5410);
    u.hi[i] = __byte_perm(p, q, 0x7632);
  }
  constexpr uint32_t kOnes[4] = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};
  u.s = dot_q(kOnes, u, 0);
  return u;
}

// From the block's shared-memory copy of its rows.
__device__ __forceinline__ uint16_t u16_at(const uint8_t* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ float f16_bits(uint16_t b) {
  return __half2float(__ushort_as_half(b));
}

// Q4_0 (18-byte blocks: f16 d, 16 bytes of nibbles; value = d * (q - 8)) and Q4_1 (20 bytes:
// f16 d, f16 m, nibbles; value = d * q + m). A unit is half a block: nibble bytes 8h .. 8h + 7,
// whose low nibbles are values 8h + i and high nibbles values 16 + 8h + i. Blocks are only
// 2-byte aligned (Q4_0), so the bytes come as 16-bit loads (from shared memory: dot_rows_staged).
template <bool kMin>
struct Q4Rows {
  static constexpr int kBlock = kMin ? 20 : 18, kQs = kMin ? 4 : 2;
  static constexpr int V = 16, R = 8;
  struct Raw {
    uint16_t d, m;
    uint32_t q[2];
  };
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 1) * kBlock;
    const uint8_t* qs = b + kQs + (unit & 1) * 8;
    Raw r;
    r.d = u16_at(b);
    r.m = kMin ? u16_at(b + 2) : 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r.q[i] = u16_at(qs + 4 * i) | (static_cast<uint32_t>(u16_at(qs + 4 * i + 2)) << 16);
    }
    return r;
  }
  __device__ static int64_t x_start(int64_t unit, int run) {
    return (unit >> 1) * 32 + (unit & 1) * 8 + run * 16;
  }
  // The CPU's tile kernels: d dx (dot(q, x) - 8 s) for Q4_0; d dx dot(q, x) + m dx s for Q4_1,
  // here per half block.
  __device__ static float dot(const Raw& r, const QUnit& x) {
    const uint32_t w[4] = {r.q[0] & 0x0f0f0f0fu, r.q[1] & 0x0f0f0f0fu, (r.q[0] >> 4) & 0x0f0f0f0fu,
                           (r.q[1] >> 4) & 0x0f0f0f0fu};
    float v = dot_q(w, x, kMin ? 0.0f : -8 * x.s) * (f16_bits(r.d) * x.d);
    if constexpr (kMin) v = fmaf(f16_bits(r.m), x.d * x.s, v);
    return v;
  }
};

// Q8_0 (34-byte blocks: f16 d, 32 int8; value = d * q). A unit is half a block, 16 values.
struct Q8Rows {
  static constexpr int V = 16, R = 8;
  struct Raw {
    uint16_t d;
    uint32_t q[4];
  };
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 1) * 34;
    const uint8_t* qs = b + 2 + (unit & 1) * 16;
    Raw r;
    r.d = u16_at(b);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.q[i] = u16_at(qs + 4 * i) | (static_cast<uint32_t>(u16_at(qs + 4 * i + 2)) << 16);
    }
    return r;
  }
  __device__ static int64_t x_start(int64_t unit, int run) {
    return unit * 16 + run * 8;
  }
  __device__ static float dot(const Raw& r, const QUnit& x) {
    return dot_q(r.q, x, 0) * (f16_bits(r.d) * x.d);
  }
};

// Four bytes of a row's shared-memory copy, at a 4-aligned address (blocks of 84, 136, 144, 176
// bytes) or a 2-aligned one (22, 24, 110, 210).
__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}
__device__ __forceinline__ uint32_t u32_at2(const uint8_t* p) {
  return u16_at(p) | static_cast<uint32_t>(u16_at(p + 2)) << 16;
}
// Bits 0..3 of b as bit 4 of bytes 0..3 (the shifted copies of b do not overlap: no carries).
__device__ __forceinline__ uint32_t spread_to_bit4(uint32_t b) {
  return ((b * 0x00204081u) & 0x01010101u) << 4;
}
// Four nibbles (one a byte) as IQ4_NL's and IQ4_XS's signed levels (ops::iq4_level), four to a
// word: two byte permutes of the levels 0..7 and 8..15, chosen by each nibble's bit 3.
__device__ __forceinline__ uint32_t iq4_levels(uint32_t nibbles) {
  const uint32_t sel = (nibbles & 0x7u) | ((nibbles >> 4) & 0x70u) | ((nibbles >> 8) & 0x700u) |
                       ((nibbles >> 12) & 0x7000u);
  const uint32_t lo = __byte_perm(0xbfad9881u, 0xf6eaddcfu, sel);  // -127 -104 -83 -65 -49 ...
  const uint32_t hi = __byte_perm(0x26190d01u, 0x71594535u, sel);  // 1 13 25 38 53 69 89 113
  const uint32_t high = ((nibbles >> 3) & 0x01010101u) * 0xffu;
  return (lo & ~high) | (hi & high);
}

// What the super-block types' rows share (256 values, 16 units of 16, each within one sub-block;
// units 2b and 2b + 1 are x's block of 32 b): unit u is values 16 u .. 16 u + 15, its integers as
// bytes (signed where the type offsets them), d its scale times the super-block's d and, with
// kMins, m its min times dmin.
template <bool kMins>
struct SuperBlockUnits {
  static constexpr int V = 16, R = 8;
  struct Raw {
    float d, m;  // m: kMins only
    uint32_t q[4];
  };
  __device__ static int64_t x_start(int64_t unit, int run) { return unit * 16 + run * 8; }
  __device__ static float dot(const Raw& r, const QUnit& x) {
    if constexpr (kMins) return fmaf(dot_q(r.q, x, 0), r.d * x.d, -r.m * (x.d * x.s));
    return dot_q(r.q, x, 0) * (r.d * x.d);
  }
};

// Q4_K (144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles, a
// byte holding value l of sub-blocks 2i (low) and 2i + 1 (high)) and Q5_K (176 bytes: the same
// header, 32 bytes of fifth bits, bit j of byte l for value l of sub-block j, then the nibbles):
// value = d sc q - dmin m per sub-block of 32.
template <bool kFifth>
struct QKRows : SuperBlockUnits<true> {
  static constexpr int kBlock = kFifth ? 176 : 144, kQs = kFifth ? 48 : 16;
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 4) * kBlock;
    const unsigned j = static_cast<unsigned>(unit & 15) >> 1, half = unit & 1;
    unsigned sc, mn;
    ops::q4_k_scale_min(j, b + 4, sc, mn);
    Raw r;
    r.d = f16_bits(u16_at(b)) * static_cast<float>(sc);
    r.m = f16_bits(u16_at(b + 2)) * static_cast<float>(mn);
    const uint8_t* qs = b + kQs + 32 * (j >> 1) + 16 * half;
    const unsigned shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.q[i] = (u32_at(qs + 4 * i) >> shift) & 0x0f0f0f0fu;
      if constexpr (kFifth)
        r.q[i] |= ((u32_at(b + 16 + 16 * half + 4 * i) >> j) & 0x01010101u) << 4;
    }
    return r;
  }
};

// Q6_K (210 bytes: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, f16 d): value
// = d sc (q - 32) per sub-block of 16, the unit. Its values l (0..15) of quarter g (0..3) of half
// h: low nibble (g < 2) or high nibble of byte 64 h + 32 (g % 2) + 16 (unit % 2) + l, bits 2g of
// byte 128 + 32 h + 16 (unit % 2) + l, scale 192 + 8 h + unit % 2 + 2g.
struct Q6KRows : SuperBlockUnits<false> {
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 4) * 210;
    const unsigned quarter = static_cast<unsigned>(unit & 15) >> 1, odd = unit & 1;
    const unsigned h = quarter >> 2, g = quarter & 3;
    const uint8_t* ql = b + 64 * h + 32 * (g & 1) + 16 * odd;
    const uint8_t* qh = b + 128 + 32 * h + 16 * odd;
    Raw r;
    r.d = f16_bits(u16_at(b + 208)) *
          static_cast<float>(static_cast<int8_t>(b[192 + 8 * h + odd + 2 * g]));
    const unsigned shift = 4 * (g >> 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (u32_at2(ql + 4 * i) >> shift) & 0x0f0f0f0fu;
      const uint32_t hi = (u32_at2(qh + 4 * i) >> (2 * g)) & 0x03030303u;
      const uint32_t q = lo | hi << 4;
      r.q[i] = __vsub4(q, 0x20202020u);  // q - 32 as signed bytes
    }
    return r;
  }
};

// Q2_K (84 bytes: 16 scale bytes, the low nibble scaling d and the high one dmin, 64 bytes of
// 2-bit values, f16 d, f16 dmin): value = d sc q - dmin m per sub-block of 16, the unit. Sub-block
// v (0..15) of half n = v / 8: bits 2j (j = v % 8 / 2) of bytes 16 + 32 n + 16 (v % 2) + l.
struct Q2KRows : SuperBlockUnits<true> {
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 4) * 84;
    const unsigned v = unit & 15, n = v >> 3, j = (v & 7) >> 1;
    const unsigned sc = b[v];
    Raw r;
    r.d = f16_bits(u16_at(b + 80)) * static_cast<float>(sc & 15);
    r.m = f16_bits(u16_at(b + 82)) * static_cast<float>(sc >> 4);
    const uint8_t* qs = b + 16 + 32 * n + 16 * (v & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = (u32_at(qs + 4 * i) >> (2 * j)) & 0x03030303u;
    return r;
  }
};

// Q3_K (110 bytes: 32 bytes of high bits, 64 of 2-bit values laid out as Q2_K's, 12 of 6-bit
// scales, f16 d): value = d sc q per sub-block of 16, q = the 2 low bits, less 4 where the high
// bit (bit 4 n + j of byte 16 (v % 2) + l) is clear. 2-aligned super-blocks: 16-bit loads.
struct Q3KRows : SuperBlockUnits<false> {
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 4) * 110;
    const unsigned v = unit & 15, n = v >> 3, j = (v & 7) >> 1;
    Raw r;
    r.d = f16_bits(u16_at(b + 108)) * static_cast<float>(ops::q3_k_scale(b, v));
    const uint8_t* qs = b + 32 + 32 * n + 16 * (v & 1);
    const uint8_t* hm = b + 16 * (v & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t low = (u32_at2(qs + 4 * i) >> (2 * j)) & 0x03030303u;
      const uint32_t high = (u32_at2(hm + 4 * i) >> (4 * n + j)) & 0x01010101u;
      r.q[i] = __vsub4(low | high << 2, 0x04040404u);  // -4..3 as signed bytes
    }
    return r;
  }
};

// IQ4_XS (136 bytes: f16 d, 16-bit high scale bits, 4 bytes of low scale bits, 128 bytes of
// nibbles, 16 a sub-block of 32: values 0..15 low, 16..31 high): value = d sc level.
struct IQ4XSRows : SuperBlockUnits<false> {
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 4) * 136;
    const unsigned j = static_cast<unsigned>(unit & 15) >> 1, shift = 4 * (unit & 1);
    Raw r;
    r.d = f16_bits(u16_at(b)) * static_cast<float>(ops::iq4_xs_scale(b, j));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.q[i] = iq4_levels((u32_at(b + 8 + 16 * j + 4 * i) >> shift) & 0x0f0f0f0fu);
    }
    return r;
  }
};

// The blocks of 32 laid out as Q4_0's nibbles (a unit is half a block, as Q4Rows): Q5_0 (22
// bytes: f16 d, 32 fifth bits, nibbles; value = d (q - 16)), Q5_1 (24 bytes: f16 d, f16 m, fifth
// bits, nibbles; value = d q + m) and IQ4_NL (18 bytes: f16 d, nibbles; value = d level), their
// integers made whole at load. (Q4Rows, which splits its nibbles in dot, is the measured path of
// Q4_0 and Q4_1: docs/perf/gemv.md.)
enum class Blocks32 { Q5_0, Q5_1, IQ4_NL };
template <Blocks32 kType>
struct Blocks32Rows {
  static constexpr bool kFifth = kType != Blocks32::IQ4_NL, kMin = kType == Blocks32::Q5_1;
  static constexpr int kBlock = kType == Blocks32::Q5_0 ? 22 : kMin ? 24 : 18;
  static constexpr int kQs = kBlock - 16;
  static constexpr int V = 16, R = 8;
  struct Raw {
    uint16_t d, m;
    uint32_t q[4];
  };
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    const uint8_t* b = row + (unit >> 1) * kBlock;
    const unsigned h = unit & 1;
    Raw r;
    r.d = u16_at(b);
    r.m = kMin ? u16_at(b + 2) : 0;
    const uint32_t qh = kFifth ? u32_at2(b + kQs - 4) : 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t bytes = u32_at2(b + kQs + 8 * h + 4 * i);
      uint32_t lo = bytes & 0x0f0f0f0fu, hi = (bytes >> 4) & 0x0f0f0f0fu;
      if constexpr (kFifth) {
        lo |= spread_to_bit4((qh >> (8 * h + 4 * i)) & 15);
        hi |= spread_to_bit4((qh >> (16 + 8 * h + 4 * i)) & 15);
      }
      if constexpr (kType == Blocks32::Q5_0) {
        lo = __vsub4(lo, 0x10101010u);
        hi = __vsub4(hi, 0x10101010u);
      } else if constexpr (kType == Blocks32::IQ4_NL) {
        lo = iq4_levels(lo);
        hi = iq4_levels(hi);
      }
      r.q[i] = lo;
      r.q[2 + i] = hi;
    }
    return r;
  }
  __device__ static int64_t x_start(int64_t unit, int run) {
    return Q4Rows<false>::x_start(unit, run);
  }
  __device__ static float dot(const Raw& r, const QUnit& x) {
    float v = dot_q(r.q, x, 0) * (f16_bits(r.d) * x.d);
    if constexpr (kMin) v = fmaf(f16_bits(r.m), x.d * x.s, v);
    return v;
  }
};

// f.template operator()<F>() with F the rows type of a GGML format (not Dense).
template <class Fn>
__host__ void by_ggml_rows(GemvWeights weights, Fn&& f) {
  switch (weights) {
    case GemvWeights::Q4_0:
      return f.template operator()<Q4Rows<false>>();
    case GemvWeights::Q4_1:
      return f.template operator()<Q4Rows<true>>();
    case GemvWeights::Q5_0:
      return f.template operator()<Blocks32Rows<Blocks32::Q5_0>>();
    case GemvWeights::Q5_1:
      return f.template operator()<Blocks32Rows<Blocks32::Q5_1>>();
    case GemvWeights::IQ4_NL:
      return f.template operator()<Blocks32Rows<Blocks32::IQ4_NL>>();
    case GemvWeights::Q4_K:
      return f.template operator()<QKRows<false>>();
    case GemvWeights::Q5_K:
      return f.template operator()<QKRows<true>>();
    case GemvWeights::Q6_K:
      return f.template operator()<Q6KRows>();
    case GemvWeights::Q2_K:
      return f.template operator()<Q2KRows>();
    case GemvWeights::Q3_K:
      return f.template operator()<Q3KRows>();
    case GemvWeights::IQ4_XS:
      return f.template operator()<IQ4XSRows>();
    case GemvWeights::Q8_0:
      return f.template operator()<Q8Rows>();
    case GemvWeights::Dense:  // plain rows: decode_gemv_plain.cu
      return;
  }
}

}  // namespace wick::cuda::gemv
