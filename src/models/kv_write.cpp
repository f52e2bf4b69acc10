#include "models/kv_write.h"

#include "util.h"
#include "wick/error.h"

namespace wick::models::detail {

void write_at_position(const Tensor& cache, const Tensor& src, const Tensor& position) {
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
    throw DTypeMismatch(
        str("kv write: position must be one u32, got ", position.shape(), " ", position.dtype()));
  }
  if (src.device() != cache.device() || position.device() != cache.device()) {
    throw DeviceMismatch(str("kv write: cache on ", cache.device(), ", rows on ", src.device(),
                             ", position on ", position.device()));
  }
  if (cache.device().is_cuda()) {
    cuda_write_at_position(cache, src, position);
    return;
  }
  size_t p = position.flatten_all().to_vec1<uint32_t>()[0];
  size_t s = src.dims()[2];
  if (p + s > cache.dims()[2]) {
    throw IndexOutOfRange(
        str("kv write: position ", p, " + ", s, " rows past the cache's ", cache.dims()[2]));
  }
  cache.narrow(2, p, s).assign(src);
}

}  // namespace wick::models::detail
