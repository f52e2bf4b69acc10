#pragma once
// Device pieces of the decode projections (decode_gemv*.cu): the weight formats (plain rows,
// GGML rows of every block type and their integer dots against quantized activations), the
// input (x, or its RMSNorm as transformers computes it in the dtype), the block's dot of its rows
// and the epilogues (store, qkv + rope + cache write, SiLU product, residual add), with the L2
// requests the step's kernels make. Each includer expands WICK_TIMELINE_TU first.

#include <algorithm>

#include "cuda/decode_gemv.h"
#include "cuda/decode_gemv_launch.h"
#include "cuda/device_timeline.cuh"
#include "cuda/kernel_utils.cuh"
#include "ops/ggml_blocks.h"
#include "ops/norm_math.h"
#include "ops/rope_math.h"

namespace wick::cuda::gemv {

template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_compute(convert<T>(v));
}

// Activation v after RMSNorm with weight w, as transformers computes it in the dtype:
// w * round(v * rstd), rounded.
template <class T>
__device__ __forceinline__ float rms_normed(float v, float w, float rstd) {
  return round_to<T>(w * round_to<T>(v * rstd));
}

__device__ __forceinline__ float warp_total(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// ---- weight formats: a row is a run of units, each unit's raw bits loaded apart from its use
// (the first units are loaded before the programmatic-launch wait) and dotted with the unit's
// activations, read as V floats in runs of R (16-byte aligned) at x_start(unit, run): as they
// are (plain weights) or quantized (GGML blocks: QUnit below).

template <class T>
struct DenseRows {  // 16 bytes of T a unit
  static constexpr int V = 16 / sizeof(T), R = V;
  using Raw = uint4;
  // Read once a token: not kept in the L1, and left in the L2's normal eviction class.
  __device__ static Raw load(const uint8_t* row, int64_t unit) {
    Raw r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(reinterpret_cast<const uint4*>(row) + unit));
    return r;
  }
  __device__ static int64_t x_start(int64_t unit, int) { return unit * V; }
  __device__ static float dot(const Raw& r, const float (&x)[V]) {
    Vec<T, V> w;
    memcpy(&w, &r, 16);
    float s = 0;
#pragma unroll
    for (int e = 0; e < V; ++e) s += to_compute(w.v[e]) * x[e];
    return s;
  }
};

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

// 16 bytes of T as floats.
template <class T>
__device__ __forceinline__ void unpack16(const uint4& bits, float* out) {
  constexpr int PER = 16 / sizeof(T);
  Vec<T, PER> v;
  memcpy(&v, &bits, 16);
#pragma unroll
  for (int e = 0; e < PER; ++e) out[e] = to_compute(v.v[e]);
}

// N activations from p (16-byte aligned) as floats.
template <class T, int N>
__device__ __forceinline__ void load_run(const T* p, float* out) {
  constexpr int PER = 16 / sizeof(T);
#pragma unroll
  for (int i = 0; i < N / PER; ++i) {
    unpack16<T>(__ldg(reinterpret_cast<const uint4*>(p) + i), out + i * PER);
  }
}

// The block's totals of s[0 .. R), on every thread of the N.
template <int R, int N = kGemvThreads>
__device__ __forceinline__ void block_totals(float (&s)[R]) {
  __shared__ float part[R][N / 32];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float t = warp_total(s[r]);
    if (threadIdx.x % 32 == 0) part[r][threadIdx.x / 32] = t;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    s[r] = 0;
#pragma unroll
    for (int i = 0; i < N / 32; ++i) s[r] += part[r][i];
  }
}

// What a block dots its rows with: x, or with a norm weight nw the RMSNorm of x as transformers
// computes it in the dtype, nw * round(x * rstd) rounded, rstd found by the block first (every
// block reads all of x anyway; this replaces a separate norm kernel, or a serial tail in the
// kernel that made x). Finding rstd from the values the products use instead (no second read
// of x) held both in registers at once and cost more in occupancy than it saved. With a post-norm
// add before the projection (GemvArgs::pre_delta), x is made first: the residual plus the
// normalised delta, into the block's shared memory, where the dots read it.
template <class T>
struct Input {
  const T* x;
  const T* nw;        // null: x as it is (unless nw32)
  const float* nw32;  // an f32 weight of f16/bf16 x: round(nw32 * (x * rstd)), one rounding
  float rstd = 1;
  // The post-norm add: x (the residual) + round(pre_w * (delta * rstd(delta))), into `made`.
  const T* delta = nullptr;
  const float* pre_w = nullptr;
  T* pre_sum = nullptr;  // where block 0 stores the sum
  T* made = nullptr;     // shared memory, k elements
  float pre_eps = 0;

  __device__ bool normed() const { return nw != nullptr || nw32 != nullptr; }

  // N activations of x from element i (16-byte aligned) as floats: from global memory, or from
  // the block's shared copy once make_x has made it.
  template <int N>
  __device__ void load_x(int64_t i, float* out) const {
    if (made == nullptr) return load_run<T, N>(x + i, out);
    constexpr int PER = 16 / sizeof(T);
#pragma unroll
    for (int j = 0; j < N / PER; ++j) {
      unpack16<T>(reinterpret_cast<const uint4*>(made + i)[j], out + j * PER);
    }
  }

  // rstd, and first x where the add makes it (every thread of the block of N calls this).
  template <int N = kGemvThreads>
  __device__ void find_rstd(int64_t k, double eps) {
    constexpr int PER = 16 / sizeof(T);
    // (f16/bf16 only: in the f32 kernels its registers would spill those of the rows in flight)
    if constexpr (sizeof(T) == 2) {
      if (delta != nullptr) make_x<N>(k);
    }
    float sq = 0;
    for (int64_t c = threadIdx.x; c < k / PER; c += N) {
      float v[PER];
      load_x<PER>(c * PER, v);
#pragma unroll
      for (int e = 0; e < PER; ++e) sq += v[e] * v[e];
    }
    float t[1] = {sq};
    block_totals<1, N>(t);
    rstd = ops::norm_rstd(t[0], static_cast<float>(k), static_cast<float>(eps));
  }

  // x + the normalised delta into `made` (and pre_sum by block 0), rounded as
  // nn::add_rms_normed's kernel rounds it.
  template <int N>
  __device__ void make_x(int64_t k) {
    constexpr int PER = 16 / sizeof(T);
    T* shared = made;
    made = nullptr;  // x from global memory until the copy is made
    float sq = 0;
    for (int64_t c = threadIdx.x; c < k / PER; c += N) {
      float v[PER];
      load_run<T, PER>(delta + c * PER, v);
#pragma unroll
      for (int e = 0; e < PER; ++e) sq += v[e] * v[e];
    }
    float t[1] = {sq};
    block_totals<1, N>(t);
    const float delta_rstd = ops::norm_rstd(t[0], static_cast<float>(k), pre_eps);
    // Four elements at a time: the block's first weights are in flight in registers meanwhile.
    for (int64_t c = threadIdx.x; c < k / 4; c += N) {
      Vec<T, 4> res = reinterpret_cast<const Vec<T, 4>*>(x)[c];
      Vec<T, 4> d = reinterpret_cast<const Vec<T, 4>*>(delta)[c];
      const float4 w = reinterpret_cast<const float4*>(pre_w)[c];
      const float ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float normed = round_to<T>(ws[e] * (to_compute(d.v[e]) * delta_rstd));
        res.v[e] = convert<T>(__fadd_rn(to_compute(res.v[e]), normed));
      }
      reinterpret_cast<Vec<T, 4>*>(shared)[c] = res;
      if (blockIdx.x == 0) reinterpret_cast<Vec<T, 4>*>(pre_sum)[c] = res;
    }
    __syncthreads();  // the copy is whole, and block_totals' scratch free for the next sum
    made = shared;
  }
};

// GemvArgs' input: x and its norm weight of the dtype, or of f32 (GemvArgs::norm_f32), and the
// post-norm add before it, whose copy of x goes to `shared` (k elements).
template <class T>
__device__ __forceinline__ Input<T> input_of(const GemvArgs& a, T* shared = nullptr) {
  const void* nw = a.norm_weight;
  Input<T> in{static_cast<const T*>(a.x), a.norm_f32 ? nullptr : static_cast<const T*>(nw),
              a.norm_f32 ? static_cast<const float*>(nw) : nullptr};
  if (sizeof(T) == 2 && a.pre_delta != nullptr && shared != nullptr) {
    in.delta = static_cast<const T*>(a.pre_delta);
    in.pre_w = a.pre_weight;
    in.pre_sum = static_cast<T*>(a.pre_sum);
    in.made = shared;
    in.pre_eps = static_cast<float>(a.pre_eps);
  }
  return in;
}

// The activations of the U units from `base` N apart (zeros past the end), normalised when the
// input takes a norm.
template <class T, class F, int U, int N = kGemvThreads>
__device__ __forceinline__ void load_inputs(const Input<T>& in, int64_t base, int64_t units,
                                            float (&xv)[U][F::V]) {
  constexpr int V = F::V, RUN = F::R;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t c = base + u * N;
#pragma unroll
    for (int run = 0; run < V / RUN; ++run) {
      float* out = &xv[u][run * RUN];
      if (c >= units) {
#pragma unroll
        for (int e = 0; e < RUN; ++e) out[e] = 0;
        continue;
      }
      in.template load_x<RUN>(F::x_start(c, run), out);
      if (in.nw != nullptr) {
        float w[RUN];
        load_run<T, RUN>(in.nw + F::x_start(c, run), w);
#pragma unroll
        for (int e = 0; e < RUN; ++e) out[e] = rms_normed<T>(out[e], w[e], in.rstd);
      } else if (in.nw32 != nullptr) {
        float w[RUN];
        load_run<float, RUN>(in.nw32 + F::x_start(c, run), w);
#pragma unroll
        for (int e = 0; e < RUN; ++e) out[e] = round_to<T>(w[e] * (out[e] * in.rstd));
      }
    }
  }
}

// Units of each GGML row a thread quantizes and dots at once: fewer when a block has many rows
// (registers).
template <int R>
inline constexpr int kUnroll = R >= 8 ? 1 : 2;

// Plain rows w[0 .. R) (k values each) dotted with the input by the whole block of N threads,
// totals on every thread. The first units of the weights are loaded before pdl_wait(): they do not
// depend on the kernel before. A thread holds one unit of each row at a time, so that more blocks
// fit a multiprocessor. kPrefetchRows: the rest of the rows is asked of the L2 before pdl_wait too
// (GemvArgs::prefetch_rows; one prefetch a row and unit, no registers).
template <class T, class F, int R, bool kPrefetchRows, int N>
__device__ __forceinline__ void dot_rows(const uint8_t* const (&w)[R], Input<T>& in, int64_t k,
                                         double eps, float (&acc)[R]) {
  constexpr int V = F::V;
  const int64_t units = k / V;
  typename F::Raw raw[R];
  // A unit past the end is all zero bits: zero elements add nothing.
  auto load_weights = [&](int64_t c) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (c < units) {
        raw[r] = F::load(w[r], c);
      } else {
        memset(&raw[r], 0, sizeof(raw[r]));
      }
    }
  };
  int64_t base = threadIdx.x;
  load_weights(base);
  if constexpr (kPrefetchRows) {
    for (int64_t c = base + N; c < units; c += N) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w[r] + c * 16) : "memory");
      }
    }
  }
  // The first unit's norm weights too: they are weights. A unit is 16 bytes of T.
  const bool nw_first = in.nw != nullptr && base < units;
  uint4 nw_bits = make_uint4(0, 0, 0, 0);
  if (nw_first) nw_bits = __ldg(reinterpret_cast<const uint4*>(in.nw) + base);
  pdl_wait();
  WICK_TL_WAITED();
  if (in.normed()) in.template find_rstd<N>(k, eps);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0;
  for (bool first = true;; first = false) {
    float xv[1][V];
    if (first && nw_first) {
      float w[V];
      in.template load_x<V>(base * V, xv[0]);
      unpack16<T>(nw_bits, w);
#pragma unroll
      for (int e = 0; e < V; ++e) xv[0][e] = rms_normed<T>(xv[0][e], w[e], in.rstd);
    } else {
      load_inputs<T, F, 1, N>(in, base, units, xv);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += F::dot(raw[r], xv[0]);
    base += N;
    if (base >= units) break;
    load_weights(base);
  }
  pdl_launch_dependents();  // the next kernel may start loading its weights
  block_totals<R, N>(acc);
}

// Rows src[0 .. R) (row_bytes each) into shared memory at dst, `stride` apart: cp.async, `copy`
// bytes (16, 8 or 4) at a time.
template <int R>
__device__ __forceinline__ void stage_rows(uint8_t* dst, const uint8_t* const (&src)[R],
                                           int64_t row_bytes, int64_t stride, int copy) {
  auto run = [&]<int N>() {
    for (int64_t i = threadIdx.x * N; i < row_bytes; i += kGemvThreads * N) {
#pragma unroll
      for (int r = 0; r < R; ++r) cp_async<N>(dst + r * stride + i, src[r] + i);
    }
  };
  if (copy == 16) {
    run.template operator()<16>();
  } else if (copy == 8) {
    run.template operator()<8>();
  } else {
    run.template operator()<4>();
  }
}

// The U units from `base` a kGemvThreads apart, quantized. Every lane, units past the end too
// (zeros): the two halves of a block of 32 are units c and c ^ 1, on lanes l and l ^ 1
// (kGemvThreads is even), past the end together (units is even).
template <class T, class F, int U>
__device__ __forceinline__ void quantize_inputs(const Input<T>& in, int64_t base, int64_t units,
                                                QUnit (&xq)[U]) {
  float xv[U][F::V];
  load_inputs<T, F, U>(in, base, units, xv);
#pragma unroll
  for (int u = 0; u < U; ++u) xq[u] = quantize_unit(xv[u]);
}

// Rows of GGML blocks: copied whole into shared memory (cp.async, `copy` bytes at a time: 16, 8
// or 4, as the rows' alignment allows) before pdl_wait(), then dotted from there. A few wide
// loads per thread keep more bytes in flight than 16-bit loads of the blocks would, and the
// copies do not hold registers. Each unit of activations is quantized once for the R rows.
template <class T, class F, int R>
__device__ __forceinline__ void dot_rows_staged(const uint8_t* const (&w)[R], Input<T>& in,
                                                int64_t k, double eps, int64_t row_bytes, int copy,
                                                float (&acc)[R]) {
  constexpr int V = F::V, U = kUnroll<R>;
  extern __shared__ __align__(16) uint8_t gemv_rows[];
  const int64_t stride = staged_stride(row_bytes);
  stage_rows<R>(gemv_rows, w, row_bytes, stride, copy);
  cp_async_commit();
  pdl_wait();
  WICK_TL_WAITED();
  const int64_t units = k / V;
  if (in.normed()) in.find_rstd(k, eps);
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0;
  // Every thread runs every round (the first has a block barrier), units past the end idle.
  const int64_t rounds = (units + U * kGemvThreads - 1) / (U * kGemvThreads);
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t base = threadIdx.x + round * U * kGemvThreads;
    QUnit xq[U];
    quantize_inputs<T, F, U>(in, base, units, xq);
    if (round == 0) {  // the rows have landed (the first activations' loads went out before)
      cp_async_wait<0>();
      __syncthreads();
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = base + u * kGemvThreads;
      if (c < units) {
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += F::dot(F::load(gemv_rows + r * stride, c), xq[u]);
      }
    }
  }
  pdl_launch_dependents();
  block_totals<R>(acc);
}

// The two rows of output pair p.
__device__ __forceinline__ void pair_rows(const GemvArgs& a, int64_t p, int64_t& r0, int64_t& r1) {
  if (a.epilogue == GemvEpilogue::QkvRope) {
    const int64_t half = a.d / 2;
    const ops::RopePair e = ops::rope_pair(p % half, half, a.rot_half);
    r0 = (p / half) * a.d + e.lo;
    r1 = (p / half) * a.d + e.hi;
  } else if (a.epilogue == GemvEpilogue::SiluMul || a.epilogue == GemvEpilogue::GeluMul) {
    r0 = p;
    r1 = a.n / 2 + p;
  } else {
    r0 = 2 * p;
    r1 = r0 + 1;
  }
}

// What follows the product of pair p: rows r0 and r1 with f32 sums a0 and a1.
template <class T>
__device__ __forceinline__ void epilogue(const GemvArgs& a, int64_t p, int64_t r0, int64_t r1,
                                         float a0, float a1) {
  // The product as a matmul (nn.Linear) would store it: a bias joins the f32 sum, then one
  // rounding.
  if (a.epilogue == GemvEpilogue::QkvRope && a.bias != nullptr) {
    const T* bias = static_cast<const T*>(a.bias);
    a0 += to_compute(bias[r0]);
    a1 += to_compute(bias[r1]);
  }
  a0 = round_to<T>(a0);
  a1 = round_to<T>(a1);
  if (a.epilogue == GemvEpilogue::QkvRope) {
    const int64_t half = a.d / 2, head = p / half, i = p % half;
    const ops::RopePair e = ops::rope_pair(i, half, a.rot_half);
    const int64_t pos = static_cast<int64_t>(*a.position);
    // The cache row: the position's in (h_kv, max_len, d) caches, or the slot's in pools of
    // pages (pages, h_kv, max_len, d) whose pages are max_len rows long.
    int64_t row = pos, page = 0;
    if (a.slot != nullptr) {
      row = static_cast<int64_t>(*a.slot) % a.max_len;
      page = static_cast<int64_t>(*a.slot) / a.max_len;
    } else if (pos >= a.max_len) {
      return;
    }
    if (head < a.h + a.h_kv && e.rotates) {
      // Each product rounded, then the sum: transformers' q * cos + rotate_half(q) * sin in the
      // model's dtype (f32: plain products).
      float c = to_compute(static_cast<const T*>(a.cos)[pos * a.rot_half + i]);
      float s = to_compute(static_cast<const T*>(a.sin)[pos * a.rot_half + i]);
      float x1 = round_to<T>(__fmul_rn(a0, c)) - round_to<T>(__fmul_rn(a1, s));
      float x2 = round_to<T>(__fmul_rn(a1, c)) + round_to<T>(__fmul_rn(a0, s));
      a0 = x1;
      a1 = x2;
    }
    T* dst;
    if (head < a.h) {
      dst = static_cast<T*>(a.q) + head * a.d;
    } else if (head < a.h + a.h_kv) {
      dst = static_cast<T*>(a.k_cache) + (((page * a.h_kv) + head - a.h) * a.max_len + row) * a.d;
    } else {
      dst = static_cast<T*>(a.v_cache) +
            (((page * a.h_kv) + head - a.h - a.h_kv) * a.max_len + row) * a.d;
    }
    dst[e.lo] = convert<T>(a0);
    dst[e.hi] = convert<T>(a1);
  } else if (a.epilogue == GemvEpilogue::Store) {
    static_cast<T*>(a.out)[r0] = convert<T>(a0);
    static_cast<T*>(a.out)[r1] = convert<T>(a1);
  } else if (a.epilogue == GemvEpilogue::SiluMul) {
    // silu rounded, then the product: transformers' act_fn(gate) * up in the dtype.
    static_cast<T*>(a.out)[p] = convert<T>(round_to<T>(a0 / (1.0f + expf(-a0))) * a1);
  } else if (a.epilogue == GemvEpilogue::GeluMul) {
    // gelu rounded, then the product, as gelu (the tanh approximation of wick/unary_ops.def)
    // then mul compute it in the dtype.
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    const float g = 0.5f * a0 * (1.0f + tanhf(k * a0 * (1.0f + 0.044715f * a0 * a0)));
    static_cast<T*>(a.out)[p] = convert<T>(round_to<T>(g) * a1);
  } else {  // Add
    const T* res = static_cast<const T*>(a.residual);
    T* out = static_cast<T*>(a.out);
    out[r0] = convert<T>(to_compute(res[r0]) + a0);
    out[r1] = convert<T>(to_compute(res[r1]) + a1);
  }
}

// The R rows of output pairs p0, p0 + 1, ... (a pair past the last repeats it, and finish_pairs
// writes nothing for it).
template <int R>
__device__ __forceinline__ void group_rows(const GemvArgs& a, int64_t p0, int64_t (&rows)[R]) {
#pragma unroll
  for (int j = 0; j < R / 2; ++j) {
    pair_rows(a, min(p0 + j, a.n / 2 - 1), rows[2 * j], rows[2 * j + 1]);
  }
}

// Where rows start in the weight.
template <int R>
__device__ __forceinline__ void row_starts(const GemvArgs& a, int64_t row_bytes,
                                           const int64_t (&rows)[R], const uint8_t* (&ptr)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) ptr[r] = static_cast<const uint8_t*>(a.w) + rows[r] * row_bytes;
}

// Thread j < R / 2 runs the epilogue of pair p0 + j with the block's totals acc.
template <class T, int R>
__device__ __forceinline__ void finish_pairs(const GemvArgs& a, int64_t p0,
                                             const int64_t (&rows)[R], const float (&acc)[R]) {
  if (threadIdx.x >= R / 2) return;
  const int j = static_cast<int>(threadIdx.x);
  // acc is indexed by a constant in each branch (registers, not local memory).
#pragma unroll
  for (int jj = 0; jj < R / 2; ++jj) {
    if (jj == j && p0 + jj < a.n / 2) {
      epilogue<T>(a, p0 + jj, rows[2 * jj], rows[2 * jj + 1], acc[2 * jj], acc[2 * jj + 1]);
    }
  }
}

// The qkv projection's first 2 h_kv blocks each ask the L2 for one k/v head's cache rows before
// the position (read before pdl_wait: a stale position only makes the hint a row short), so that
// the attention after this kernel finds them there instead of waiting on the HBM behind this
// kernel's weight stream.
template <class T>
__device__ __forceinline__ void prefetch_cache_rows(const GemvArgs& a) {
  if (a.epilogue != GemvEpilogue::QkvRope || a.slot != nullptr || threadIdx.x != 0) return;
  const int64_t region = blockIdx.x;
  if (region >= 2 * a.h_kv || (a.d * static_cast<int64_t>(sizeof(T))) % 16 != 0) return;
  const int64_t rows = min(static_cast<int64_t>(*a.position), a.max_len);
  const uint32_t bytes = static_cast<uint32_t>(rows * a.d * static_cast<int64_t>(sizeof(T)));
  if (bytes == 0) return;
  const T* base = static_cast<const T*>(region < a.h_kv ? a.k_cache : a.v_cache) +
                  (region % a.h_kv) * a.max_len * a.d;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base), "r"(bytes) : "memory");
}

// The share of GemvArgs::l2_next of block `index` of the `blocks` that share the ask (its slice of
// the two regions' bytes), asked of the L2 by thread 0 in bulk: one request a region it touches.
__device__ __forceinline__ void prefetch_next_share(const GemvArgs& a, int64_t index,
                                                    int64_t blocks) {
  if (threadIdx.x != 0 || a.l2_next == nullptr) return;
  const int64_t bytes = a.l2_next_bytes, slice = (2 * bytes / blocks + 15) / 16 * 16;
  const int64_t from = index * slice, to = min(from + slice, 2 * bytes);
  for (int64_t region = 0; region < 2; ++region) {
    const int64_t lo = max(from, region * bytes), hi = min(to, (region + 1) * bytes);
    if (lo >= hi) continue;
    const uint8_t* p =
        static_cast<const uint8_t*>(a.l2_next) + region * a.l2_next_half + (lo - region * bytes);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p),
                 "r"(static_cast<uint32_t>(hi - lo))
                 : "memory");
  }
}

}  // namespace wick::cuda::gemv
