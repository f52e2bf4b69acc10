#pragma once
// Random GGML blocks for the qmatmul tests (CPU and CUDA): random quantized values with scales
// that keep the dequantised weights about +-1.

#include <cstring>

#include "test_util.h"
#include "wick/half.h"
#include "wick/quantized.h"

namespace wick::testing {

inline QTensor random_qtensor(GgmlType type, size_t n, size_t k) {
  size_t bytes = ggml_bytes(type, n * k), bs = ggml_type_size(type);
  std::vector<uint8_t> raw(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 0.05f), shift(-0.5f, 0.5f);
  auto& gen = rng();
  for (auto& b : raw) b = static_cast<uint8_t>(byte(gen));
  auto put = [&](size_t at, float v) {
    uint16_t h = detail::float_to_half_bits(v);
    std::memcpy(raw.data() + at, &h, 2);
  };
  for (size_t off = 0; off < bytes; off += bs) {
    switch (type) {
      case GgmlType::Q4_0:
      case GgmlType::Q8_0:
      case GgmlType::Q5_0:
        put(off, scale(gen) * (type == GgmlType::Q8_0 ? 0.1f : 1.0f));
        break;
      case GgmlType::Q4_1:
        put(off, scale(gen));
        put(off + 2, shift(gen));
        break;
      case GgmlType::Q4_K:
        put(off, scale(gen) * 0.05f);
        put(off + 2, scale(gen) * 0.05f);
        break;
      case GgmlType::Q6_K:
        put(off + 208, scale(gen) * 0.002f);
        break;
      case GgmlType::Q5_1:
        put(off, scale(gen) * 0.5f);
        put(off + 2, shift(gen));
        break;
      case GgmlType::Q2_K:
        put(off + 80, scale(gen) * 0.5f);
        put(off + 82, scale(gen) * 0.5f);
        break;
      case GgmlType::Q3_K:
        put(off + 108, scale(gen) * 0.2f);
        break;
      case GgmlType::Q5_K:
        put(off, scale(gen) * 0.02f);
        put(off + 2, scale(gen) * 0.02f);
        break;
      case GgmlType::IQ4_NL:
        put(off, scale(gen) * 0.1f);
        break;
      case GgmlType::IQ4_XS:
        put(off, scale(gen) * 0.005f);
        break;
      default:
        break;
    }
  }
  return QTensor(type, {n, k}, Tensor::from_vec(raw, {bytes}, Device::cpu()));
}

/// The weight types qmatmul takes as blocks.
inline std::vector<GgmlType> qmatmul_block_types() {
  return {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0,   GgmlType::Q5_0,
          GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_1,   GgmlType::Q2_K,
          GgmlType::Q3_K, GgmlType::Q5_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
}

}  // namespace wick::testing
