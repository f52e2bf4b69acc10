// Built when WICK_CUDA is OFF: qmatmul on CUDA answers "built without CUDA".

#include "qmatmul_backend.h"
#include "wick/error.h"

namespace wick::cuda {

StoragePtr qmatmul(GgmlType, const BackendStorage&, size_t, size_t, size_t, const BackendStorage&,
                   size_t, size_t, DType) {
  throw BackendError("qmatmul: built without CUDA");
}

}  // namespace wick::cuda
