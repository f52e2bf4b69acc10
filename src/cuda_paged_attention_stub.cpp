// Built when WICK_CUDA is OFF: the CUDA halves of nn::paged_attention and nn::paged_kv_write
// answer "built without CUDA".

#include "backend.h"
#include "nn/paged_attention_backend.h"

namespace wick::detail {

Tensor cuda_paged_attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, double) {
  cuda::device(0);  // throws: built without CUDA
  return {};
}

void cuda_paged_kv_write(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&) {
  cuda::device(0);  // throws: built without CUDA
}

}  // namespace wick::detail
