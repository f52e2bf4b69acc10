// Scaled dot-product attention on CUDA: launch_attention picks, in order, attn_rounded_kernel
// (attention_rounded.cu: f16/bf16 rounded as transformers' eager attention, when asked),
// attn_decode_kernel (attention_decode.cu: flash-decoding of one query with tensor cores),
// flash_wgmma_kernel (attention_wgmma.cu: sm_90a prefill, f16/bf16, d 128, no mask),
// flash_mma_kernel (attention_prefill.cu: mma.sync prefill, f16/bf16, d 64 or 128) and
// attn_split_kernel (attention_split.cu: every float dtype, d <= 256, split-KV). History:
// docs/perf/.

#include <cstdint>

#include "cuda/attention_kernels.h"
#include "cuda/attention_wgmma.h"
#include "cuda/check.h"
#include "cuda/device_timeline.cuh"
#include "cuda/fused_kernels.h"
#include "util.h"
#include "wick/error.h"

namespace wick::cuda {
namespace {

// The kernels launch_attention chooses from, in the order it asks whether they apply.
enum class AttentionKernel { Rounded, Decode, FlashWgmma, FlashMma, NoKeys, Split };

AttentionKernel choose_kernel(DType dtype, const AttentionArgs& a) {
  if (rounded_attention_fits(dtype, a)) return AttentionKernel::Rounded;
  if (decode_attention_fits(dtype, a)) return AttentionKernel::Decode;
  if ((dtype == DType::BF16 || dtype == DType::F16) && flash_mma_fits(a)) {
    return flash_wgmma_fits(dtype, a) ? AttentionKernel::FlashWgmma : AttentionKernel::FlashMma;
  }
  if (a.s_kv == 0) return AttentionKernel::NoKeys;
  return AttentionKernel::Split;
}

}  // namespace

bool attention_last_key_fits(DType dtype, const AttentionArgs& a) {
  return a.mask == nullptr && !a.causal && choose_kernel(dtype, a) == AttentionKernel::Decode;
}

const char* attention_kernel_name(DType dtype, const AttentionArgs& a) {
  switch (choose_kernel(dtype, a)) {
    case AttentionKernel::Rounded:
      return "attn_rounded_kernel";
    case AttentionKernel::Decode:
      return "attn_decode_kernel";
    case AttentionKernel::FlashWgmma:
      return "flash_wgmma_kernel";
    case AttentionKernel::FlashMma:
      return "flash_mma_kernel";
    case AttentionKernel::NoKeys:
      return "none (no keys: zeros)";
    case AttentionKernel::Split:
      break;
  }
  return "attn_split_kernel";
}

void launch_attention(DType dtype, const AttentionArgs& a, const TempAlloc& temp, cudaStream_t s) {
#ifdef WICK_DEVICE_TIMELINE
  timeline::write_at_exit();
#endif
  if (static_cast<int64_t>(a.b) * a.h * a.s * a.d == 0) return;
  if (a.last_key != nullptr && !attention_last_key_fits(dtype, a)) {
    throw BackendError("scaled_dot_product_attention: a device last key needs the decode kernel");
  }
  if (a.d > kSplitMaxDim && !((dtype == DType::BF16 || dtype == DType::F16) && flash_mma_fits(a))) {
    throw UnsupportedDType(
        str("scaled_dot_product_attention: head dim ", a.d, " is above 256 on cuda"));
  }
  switch (choose_kernel(dtype, a)) {
    case AttentionKernel::Rounded:
      return launch_rounded_attention(dtype, a, s);
    case AttentionKernel::Decode:
      return launch_decode_attention(dtype, a, temp, s);
    case AttentionKernel::FlashWgmma:
      return launch_flash_wgmma(dtype, a, s);
    case AttentionKernel::FlashMma:
      return launch_flash_mma(dtype, a, s);
    case AttentionKernel::NoKeys:
      // No keys: zeros, as the CPU.
      WICK_CUDA_CHECK(cudaMemsetAsync(
          a.out, 0, static_cast<size_t>(a.b) * a.h * a.s * a.d * size_in_bytes(dtype), s));
      return;
    case AttentionKernel::Split:
      break;
  }
  launch_split_attention(dtype, a, temp, s);
}

}  // namespace wick::cuda
