// The CUDA kernels of the fused ops (include/wick/custom_op.h): one line per op class, run once
// when the first CUDA device is created. A build without CUDA leaves every slot empty, and no
// tensor can reach one.

#include "cuda/cuda_device.h"
#include "fused/attention.h"

namespace wick::cuda {

namespace {

template <class Op>
void set_kernel() {
  CudaKernel<Op>::fn = &Op::cuda_kernel;
}

}  // namespace

void register_custom_kernels() {
  set_kernel<fused::AttentionOp>();
}

}  // namespace wick::cuda
