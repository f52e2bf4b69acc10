// The CUDA kernels of the fused ops (include/wick/custom_op.h): one line per op class, run once
// when the first CUDA device is created. A build without CUDA leaves every slot empty, and no
// tensor can reach one.

#include "cuda/cuda_device.h"
#include "fused/attention.h"
#include "fused/decoder.h"
#include "fused/kv_write.h"
#include "fused/norm.h"
#include "fused/paged_attention.h"
#include "fused/quantized.h"
#include "fused/rope.h"

namespace wick::cuda {

namespace {

template <class Op>
void set_kernel() {
  CudaKernel<Op>::fn = &Op::cuda_kernel;
}

}  // namespace

void register_custom_kernels() {
  set_kernel<fused::AttentionOp>();
  set_kernel<fused::NormOp>();
  set_kernel<fused::RopeOp>();
  set_kernel<fused::AddRmsNormOp>();
  set_kernel<fused::AddRmsNormedOp>();
  set_kernel<fused::SiluMulOp>();
  set_kernel<fused::KvWriteOp>();
  set_kernel<fused::RopeWriteOp>();
  set_kernel<fused::AttendToPositionOp>();
  set_kernel<fused::QMatmulOp>();
  set_kernel<fused::DequantizeOp>();
  set_kernel<fused::PagedAttentionOp>();
  set_kernel<fused::PagedKvWriteOp>();
}

}  // namespace wick::cuda
