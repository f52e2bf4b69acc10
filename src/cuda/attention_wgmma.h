#pragma once
// The prefill attention kernel for sm_90a (attention_wgmma.cu, whose machine code is built for
// sm_90a alone): launch_attention (attention.cu) takes it where flash_wgmma_fits says it applies.

#include <cuda_runtime.h>

#include "cuda/fused_kernels.h"
#include "wick/dtype.h"

namespace wick::cuda {

/// Whether flash_wgmma_kernel can run `a`: set_flash_wgmma not off (TuningOverrides::flash_wgmma
/// sets it first), a GPU of compute capability 9.0 exactly, f16/bf16, d 128, no mask and no device
/// last key, q/k/v 16-byte aligned with strides of multiples of 8 elements, positive and below 2^39
/// (a size-1 dimension's stride is free), out 4-byte aligned, s and s_kv not 0, and the driver's
/// tensor-map encoder at hand; causal or not, any group.
bool flash_wgmma_fits(DType dtype, const AttentionArgs& a);

/// Enqueues flash_wgmma_kernel on `s`; flash_wgmma_fits(dtype, a) must hold.
void launch_flash_wgmma(DType dtype, const AttentionArgs& a, cudaStream_t s);

}  // namespace wick::cuda
