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
