#include "wick/paged_kv_cache.h"

#include "util.h"
#include "wick/error.h"

namespace wick::models {

PagedKvCache PagedKvCache::allocate(size_t layers, size_t pages, size_t page_size, size_t kv_heads,
                                    size_t head_dim, DType dtype, const Device& device, Tensor cos,
                                    Tensor sin) {
  if (pages == 0 || page_size == 0 || layers == 0) {
    throw Error(str("PagedKvCache: layers ", layers, ", pages ", pages, " and page_size ",
                    page_size, " must be positive"));
  }
  if (cos.defined() != sin.defined() ||
      (cos.defined() && (cos.rank() != 2 || cos.dims()[1] == 0 || cos.dims()[1] > head_dim / 2 ||
                         sin.shape() != cos.shape()))) {
    throw ShapeMismatch(
        str("PagedKvCache: rope tables ", cos.defined() ? cos.shape().to_string() : "none", " and ",
            sin.defined() ? sin.shape().to_string() : "none", " for head_dim ", head_dim));
  }
  PagedKvCache cache;
  cache.pages_ = pages;
  cache.page_size_ = page_size;
  Shape shape{pages, kv_heads, page_size, head_dim};
  for (size_t i = 0; i < layers; ++i) {
    cache.k_.push_back(Tensor::zeros(shape, dtype, device));
    cache.v_.push_back(Tensor::zeros(shape, dtype, device));
  }
  cache.cos_ = std::move(cos);
  cache.sin_ = std::move(sin);
  return cache;
}

size_t PagedKvCache::page_bytes() const {
  if (k_.empty()) return 0;
  const Tensor& k = k_[0];
  return paged_page_bytes(k_.size(), page_size_, k.dims()[1], k.dims()[3], k.dtype());
}

size_t paged_page_bytes(size_t layers, size_t page_size, size_t kv_heads, size_t head_dim,
                        DType dtype) {
  return 2 * layers * page_size * kv_heads * head_dim * size_in_bytes(dtype);
}

}  // namespace wick::models
