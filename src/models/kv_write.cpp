#include "models/kv_write.h"

#include "util.h"
#include "wick/error.h"

namespace wick::models::detail {

namespace {

void check_pair(const Tensor& cache, const Tensor& src, const Tensor& position) {
  if (cache.rank() != 4 || src.rank() != 4 || src.dims()[0] != cache.dims()[0] ||
      src.dims()[1] != cache.dims()[1] || src.dims()[3] != cache.dims()[3] ||
      src.dims()[2] > cache.dims()[2] || !cache.is_contiguous()) {
    throw ShapeMismatch(str("kv write: cache ", cache.shape(), " (row-major) and rows ",
                            src.shape(), " do not match"));
  }
  if (src.dtype() != cache.dtype()) {
    throw DTypeMismatch(str("kv write: cache ", cache.dtype(), ", rows ", src.dtype()));
  }
  if (position.elem_count() != 1 || position.dtype() != DType::U32) {
    throw DTypeMismatch(str("kv write: position must be one u32, got ", position.shape(), " ",
                            position.dtype()));
  }
  if (src.device() != cache.device() || position.device() != cache.device()) {
    throw DeviceMismatch(str("kv write: cache on ", cache.device(), ", rows on ", src.device(),
                             ", position on ", position.device()));
  }
}

}  // namespace

void write_at_position(const Tensor& k_cache, const Tensor& k, const Tensor& v_cache,
                       const Tensor& v, const Tensor& position) {
  check_pair(k_cache, k, position);
  check_pair(v_cache, v, position);
  if (k.shape() != v.shape() || k_cache.shape() != v_cache.shape() || k.dtype() != v.dtype() ||
      k.device() != v.device()) {
    throw ShapeMismatch(str("kv write: keys ", k.shape(), " ", k.dtype(), " into ",
                            k_cache.shape(), ", values ", v.shape(), " ", v.dtype(), " into ",
                            v_cache.shape()));
  }
  if (k_cache.device().is_cuda()) {
    cuda_write_at_position(k_cache, k, v_cache, v, position);
    return;
  }
  size_t p = position.flatten_all().to_vec1<uint32_t>()[0];
  size_t s = k.dims()[2];
  if (p + s > k_cache.dims()[2]) {
    throw IndexOutOfRange(str("kv write: position ", p, " + ", s, " rows past the cache's ",
                              k_cache.dims()[2]));
  }
  k_cache.narrow(2, p, s).assign(k);
  v_cache.narrow(2, p, s).assign(v);
}

}  // namespace wick::models::detail
