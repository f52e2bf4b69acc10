// Built when WICK_CUDA is OFF: the CUDA side of the file formats answers "built without CUDA".

#include "formats_backend.h"
#include "wick/error.h"

namespace wick::cuda {

StoragePtr upload_staged(int ordinal, const void*, size_t, DType) {
  device(ordinal);  // throws: built without CUDA
  throw BackendError("upload: built without CUDA");
}

StoragePtr dequantize(GgmlType, const BackendStorage&, size_t) {
  throw BackendError("dequantize: built without CUDA");
}

}  // namespace wick::cuda
