#include "wick/kv_cache.h"

#include <limits>

#include "util.h"
#include "wick/error.h"

namespace wick::models {

KvCache KvCache::allocate(size_t layers, size_t batch, size_t kv_heads, size_t max_len,
                          size_t head_dim, DType dtype, const Device& device, Tensor cos,
                          Tensor sin) {
  if (batch == 0 || max_len == 0) {
    throw Error(str("KvCache: batch ", batch, " and max_len ", max_len, " must be positive"));
  }
  // Partial rotary: fewer columns, for the first 2 * columns dims of a head.
  if (cos.rank() != 2 || cos.dims()[0] != max_len || cos.dims()[1] == 0 ||
      cos.dims()[1] > head_dim / 2 || sin.shape() != cos.shape()) {
    throw ShapeMismatch(str("KvCache: rope tables ", cos.shape(), " and ", sin.shape(), " for ",
                            max_len, " positions of head_dim ", head_dim));
  }
  KvCache cache;
  cache.batch_ = batch;
  cache.max_len_ = max_len;
  Shape shape{batch, kv_heads, max_len, head_dim};
  for (size_t i = 0; i < layers; ++i) {
    cache.k_.push_back(Tensor::zeros(shape, dtype, device));
    cache.v_.push_back(Tensor::zeros(shape, dtype, device));
  }
  float fill[2] = {-std::numeric_limits<float>::infinity(), 0.0f};
  cache.mask_fill_ =
      Tensor::from_vec(std::vector<float>(fill, fill + 2), {2}, device).to_dtype(dtype);
  cache.positions_ = Tensor::arange<uint32_t>(0, static_cast<uint32_t>(max_len), device);
  cache.cos_ = std::move(cos);
  cache.sin_ = std::move(sin);
  return cache;
}

size_t KvCache::bytes() const {
  size_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i) {
    n += k_[i].elem_count() * size_in_bytes(k_[i].dtype());
    n += v_[i].elem_count() * size_in_bytes(v_[i].dtype());
  }
  return n;
}

void KvCache::set_length(size_t length) {
  if (length > max_len_) {
    throw IndexOutOfRange(str("KvCache::set_length: ", length, " > max_len ", max_len_));
  }
  length_ = length;
}

}  // namespace wick::models
