// Dequantisation of GGML blocks to f32 (block layouts as in ggml-common.h; the arithmetic in the
// order of ggml's reference dequantize_row_* so results are bit-identical: this file is compiled
// without floating-point contraction).

#include "cpu/dequant.h"

#include <cstring>

#include "cpu/cpu_storage.h"
#include "cpu/parallel.h"
#include "fused/quantized.h"
#include "fused_op.h"
#include "ops/ggml_blocks.h"
#include "tensor_internal.h"
#include "wick/error.h"
#include "wick/half.h"

namespace wick::cpu {

namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return detail::half_bits_to_float(h);
}

// Q8_0: f16 d, int8 qs[32].
void dq_q8_0(const uint8_t* b, float* y) {
  float d = half_at(b);
  for (unsigned j = 0; j < 32; ++j) y[j] = static_cast<float>(ops::q8_0_int(b, j)) * d;
}

// Q4_0: f16 d, qs[16] (low nibbles: values 0..15, high nibbles: 16..31), offset 8.
void dq_q4_0(const uint8_t* b, float* y) {
  float d = half_at(b);
  for (unsigned j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(ops::q4_0_int(b, j)) * d;
    y[j + 16] = static_cast<float>(ops::q4_0_int(b, j + 16)) * d;
  }
}

// Q4_1: f16 d, f16 m, qs[16]: d * q + m.
void dq_q4_1(const uint8_t* b, float* y) {
  float d = half_at(b), m = half_at(b + 2);
  for (unsigned j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(ops::q4_1_int(b, j)) * d + m;
    y[j + 16] = static_cast<float>(ops::q4_1_int(b, j + 16)) * d + m;
  }
}

// Q5_0: f16 d, uint32 qh (the fifth bits), qs[16]; offset 16.
void dq_q5_0(const uint8_t* b, float* y) {
  float d = half_at(b);
  const uint32_t qh = ops::q5_0_high_bits(b);
  for (unsigned j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(ops::q5_0_int(b, qh, j)) * d;
    y[j + 16] = static_cast<float>(ops::q5_0_int(b, qh, j + 16)) * d;
  }
}

// Q4_K: f16 d, f16 dmin, scales[12] (eight 6-bit scales and mins), qs[128]; 256 values in 8
// sub-blocks of 32: d * sc * q - dmin * m.
void dq_q4_k(const uint8_t* b, float* y) {
  float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  unsigned is = 0;
  for (int j = 0; j < 256; j += 64) {
    uint8_t sc, m;
    ops::q4_k_scale_min(is, scales, sc, m);
    float d1 = d * sc, m1 = dmin * m;
    ops::q4_k_scale_min(is + 1, scales, sc, m);
    float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d; offset 32.
void dq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = half_at(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (unsigned l = 0; l < 32; ++l) {
      int is = l / 16;
      int q1 = ops::q6_k_int(ql, qh, 0, l);
      int q2 = ops::q6_k_int(ql, qh, 1, l);
      int q3 = ops::q6_k_int(ql, qh, 2, l);
      int q4 = ops::q6_k_int(ql, qh, 3, l);
      y[l] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

// The types below are also the qmatmul row path's (each weight row dequantised per call), so
// their loops run over whole runs of values that share a scale, in forms the compiler vectorises;
// each value's arithmetic is still ggml's.

// Q5_1: f16 d, f16 m, uint32 qh, qs[16]: d * q + m.
void dq_q5_1(const uint8_t* b, float* y) {
  float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = ops::q5_1_high_bits(b);
  const uint8_t* qs = b + 8;
  for (unsigned j = 0; j < 16; ++j) {
    int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

// Q2_K: scales[16], qs[64], f16 d, f16 dmin; 16 sub-blocks of 16: (d * sc) * q - dmin * m.
// Values 128 h + 32 s + l take bits 2s of qs[32 h + l] (ops::q2_k_int).
void dq_q2_k(const uint8_t* b, float* y) {
  float d = half_at(b + 80), dmin = half_at(b + 82);
  for (unsigned h = 0; h < 2; ++h) {
    const uint8_t* qs = b + 16 + 32 * h;
    for (unsigned s = 0; s < 4; ++s) {
      for (unsigned g = 0; g < 2; ++g) {  // the two sub-blocks of 16
        const uint8_t sc = b[8 * h + 2 * s + g];
        float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
        float* out = y + 128 * h + 32 * s + 16 * g;
        for (unsigned l = 0; l < 16; ++l) {
          out[l] = dl * static_cast<float>((qs[16 * g + l] >> (2 * s)) & 3) - ml;
        }
      }
    }
  }
}

// Q3_K: hmask[32], qs[64], scales[12], f16 d; 16 sub-blocks of 16: (d * sc) * q, q the 2 bits
// as Q2_K's less 4 where bit 4h + s of hmask[l] is clear (ops::q3_k_int).
void dq_q3_k(const uint8_t* b, float* y) {
  float d = half_at(b + 108);
  for (unsigned h = 0; h < 2; ++h) {
    const uint8_t* qs = b + 32 + 32 * h;
    for (unsigned s = 0; s < 4; ++s) {
      for (unsigned g = 0; g < 2; ++g) {
        float dl = d * static_cast<float>(ops::q3_k_scale(b, 8 * h + 2 * s + g));
        float* out = y + 128 * h + 32 * s + 16 * g;
        for (unsigned l = 0; l < 16; ++l) {
          const unsigned at = 16 * g + l;
          int q = ((qs[at] >> (2 * s)) & 3) - (((b[at] >> (4 * h + s)) & 1) ? 0 : 4);
          out[l] = dl * static_cast<float>(q);
        }
      }
    }
  }
}

// Q5_K: f16 d, f16 dmin, scales[12], qh[32], qs[128]; 8 sub-blocks of 32:
// (d * sc) * q - dmin * m (ops::q5_k_int).
void dq_q5_k(const uint8_t* b, float* y) {
  float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* qh = b + 16;
  for (unsigned i = 0; i < 8; ++i) {
    uint8_t sc, m;
    ops::q4_k_scale_min(i, b + 4, sc, m);
    float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const uint8_t* qs = b + 48 + 32 * (i / 2);
    const unsigned shift = 4 * (i % 2);
    for (unsigned l = 0; l < 32; ++l) {
      int q = ((qs[l] >> shift) & 0x0f) | (((qh[l] >> i) & 1) << 4);
      y[32 * i + l] = d1 * static_cast<float>(q) - m1;
    }
  }
}

// IQ4_NL: f16 d, qs[16]: d * level.
void dq_iq4_nl(const uint8_t* b, float* y) {
  float d = half_at(b);
  for (unsigned j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(ops::iq4_level(b[2 + j] & 0x0f));
    y[j + 16] = d * static_cast<float>(ops::iq4_level(b[2 + j] >> 4));
  }
}

// IQ4_XS: f16 d, scales_h, scales_l[4], qs[128]; 8 sub-blocks of 32: (d * sc) * level.
void dq_iq4_xs(const uint8_t* b, float* y) {
  float d = half_at(b);
  for (unsigned i = 0; i < 8; ++i) {
    float dl = d * static_cast<float>(ops::iq4_xs_scale(b, i));
    const uint8_t* qs = b + 8 + 16 * i;
    for (unsigned j = 0; j < 16; ++j) {
      y[32 * i + j] = dl * static_cast<float>(ops::iq4_level(qs[j] & 0x0f));
      y[32 * i + j + 16] = dl * static_cast<float>(ops::iq4_level(qs[j] >> 4));
    }
  }
}

template <size_t kBlock, size_t kBytes, void (*Fn)(const uint8_t*, float*)>
void run_blocks(const uint8_t* src, float* dst, size_t n) {
  size_t blocks = n / kBlock;
  parallel_for(blocks, 4096 / kBlock + 1, [&](size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; ++i) Fn(src + i * kBytes, dst + i * kBlock);
  });
}

}  // namespace

void dequantize(GgmlType type, const uint8_t* src, float* dst, size_t n) {
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case GgmlType::F16:
      parallel_for(n, 16384, [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i) dst[i] = half_at(src + 2 * i);
      });
      return;
    case GgmlType::BF16:
      parallel_for(n, 16384, [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i) {
          uint16_t b;
          std::memcpy(&b, src + 2 * i, 2);
          dst[i] = detail::bf16_bits_to_float(b);
        }
      });
      return;
    case GgmlType::Q8_0:
      return run_blocks<32, 34, dq_q8_0>(src, dst, n);
    case GgmlType::Q4_0:
      return run_blocks<32, 18, dq_q4_0>(src, dst, n);
    case GgmlType::Q4_1:
      return run_blocks<32, 20, dq_q4_1>(src, dst, n);
    case GgmlType::Q5_0:
      return run_blocks<32, 22, dq_q5_0>(src, dst, n);
    case GgmlType::Q4_K:
      return run_blocks<256, 144, dq_q4_k>(src, dst, n);
    case GgmlType::Q6_K:
      return run_blocks<256, 210, dq_q6_k>(src, dst, n);
    case GgmlType::Q5_1:
      return run_blocks<32, 24, dq_q5_1>(src, dst, n);
    case GgmlType::Q2_K:
      return run_blocks<256, 84, dq_q2_k>(src, dst, n);
    case GgmlType::Q3_K:
      return run_blocks<256, 110, dq_q3_k>(src, dst, n);
    case GgmlType::Q5_K:
      return run_blocks<256, 176, dq_q5_k>(src, dst, n);
    case GgmlType::IQ4_NL:
      return run_blocks<32, 18, dq_iq4_nl>(src, dst, n);
    case GgmlType::IQ4_XS:
      return run_blocks<256, 136, dq_iq4_xs>(src, dst, n);
    default:
      throw UnsupportedDType("dequantize: unsupported ggml type");
  }
}

}  // namespace wick::cpu

namespace wick::fused {

std::optional<TensorList> DequantizeOp::cpu(const TensorList& in) const {
  auto locks = detail::lock_inputs(*this, in);
  auto out = cpu::device().alloc(n, DType::F32);
  const auto& src = cpu::as_cpu(detail::backend_of(in[0]));
  cpu::dequantize(type, static_cast<const uint8_t*>(src.data()) + in[0].layout().start_offset(),
                  cpu::as_cpu(*out).as<float>(), n);
  return TensorList{detail::from_storage(std::move(out), Shape{n})};
}

}  // namespace wick::fused
