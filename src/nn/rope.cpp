// rope_tables and padding_mask: built on the host, then converted and moved once.

#include "wick/nn/rope.h"

#include <cmath>
#include <limits>
#include <vector>

#include "util.h"
#include "wick/half.h"

namespace wick::nn {

std::pair<Tensor, Tensor> rope_tables(size_t positions, size_t dim, double theta, DType dtype,
                                      const Device& device) {
  if (dim == 0 || dim % 2 != 0) throw Error(str("nn::rope_tables: dim must be even, got ", dim));
  if (!(theta > 0)) throw Error(str("nn::rope_tables: theta must be > 0, got ", theta));
  size_t half = dim / 2;
  std::vector<float> inv_freq(half);
  for (size_t i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  std::vector<double> c(positions * half), s(positions * half);
  for (size_t p = 0; p < positions; ++p) {
    for (size_t i = 0; i < half; ++i) {
      double angle = static_cast<double>(static_cast<float>(p) * inv_freq[i]);
      c[p * half + i] = std::cos(angle);
      s[p * half + i] = std::sin(angle);
    }
  }
  Shape shape{positions, half};
  return {Tensor::from_vec(c, shape, Device::cpu()).to_dtype(dtype).to_device(device),
          Tensor::from_vec(s, shape, Device::cpu()).to_dtype(dtype).to_device(device)};
}

Tensor padding_mask(const Tensor& keep, DType dtype) {
  if (!keep.defined() || keep.rank() != 2) {
    throw ShapeMismatch(str("nn::padding_mask: keep must be (b, s_kv), got ",
                            keep.defined() ? keep.shape().to_string() : "an empty handle"));
  }
  double lowest;
  switch (dtype) {
    case DType::BF16:
      lowest = -3.3895313892515355e38;
      break;
    case DType::F16:
      lowest = -65504.0;
      break;
    case DType::F32:
      lowest = std::numeric_limits<float>::lowest();
      break;
    case DType::F64:
      lowest = std::numeric_limits<double>::lowest();
      break;
    default:
      throw UnsupportedDType(str("nn::padding_mask: float dtypes only, got ", dtype));
  }
  std::vector<double> values = keep.to_vec_f64();
  for (double& v : values) v = v != 0 ? 0.0 : lowest;
  size_t b = keep.dims()[0], s = keep.dims()[1];
  return Tensor::from_vec(values, Shape{b, 1, 1, s}, Device::cpu())
      .to_dtype(dtype)
      .to_device(keep.device());
}

}  // namespace wick::nn
