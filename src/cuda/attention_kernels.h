#pragma once
// The attention kernels launch_attention (attention.cu) chooses from, a file each, beside
// flash_wgmma_kernel (attention_wgmma.h): whether each applies to a call, and its launcher.

#include <cuda_runtime.h>

#include "cuda/fused_kernels.h"
#include "wick/dtype.h"

namespace wick::cuda {

/// attention_rounded.cu: f16/bf16 rounded where transformers' eager attention rounds, for short
/// queries, when WICK_ATTENTION_ROUNDING=transformers asks for it.
bool rounded_attention_fits(DType dtype, const AttentionArgs& a);
void launch_rounded_attention(DType dtype, const AttentionArgs& a, cudaStream_t s);

/// attention_decode.cu: flash-decoding of one query (s = 1) per head, f16/bf16, d 16 to 128.
bool decode_attention_fits(DType dtype, const AttentionArgs& a);
void launch_decode_attention(DType dtype, const AttentionArgs& a, const TempAlloc& temp,
                             cudaStream_t s);

/// attention_prefill.cu: flash_mma_kernel, f16/bf16 (dtype), d 64 or 128, aligned operands.
bool flash_mma_fits(const AttentionArgs& a);
void launch_flash_mma(DType dtype, const AttentionArgs& a, cudaStream_t s);

/// attention_split.cu: split-KV over the keys, every float dtype, d up to kSplitMaxDim.
inline constexpr int kSplitMaxDim = 256;
void launch_split_attention(DType dtype, const AttentionArgs& a, const TempAlloc& temp,
                            cudaStream_t s);

}  // namespace wick::cuda
