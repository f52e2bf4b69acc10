// Built when WICK_CUDA is OFF: the CUDA entry points answer "built without CUDA".

#include "backend.h"
#include "wick/error.h"

namespace wick::cuda {

BackendDevice& device(int ordinal) {
  throw BackendError("no CUDA device: wick was built without CUDA (cuda:" +
                     std::to_string(ordinal) + " requested)");
}

int device_count() {
  return 0;
}

}  // namespace wick::cuda
