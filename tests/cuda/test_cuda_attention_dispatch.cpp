// Which kernel launch_attention runs for prefill (src/cuda internals: CUDA builds only). On a GPU
// of compute capability 9.0 the wgmma kernel takes every case it supports unless switched off
// (TuningOverrides::flash_wgmma, set_flash_wgmma); the mma.sync kernel takes the rest. test_cuda_nn
// checks the numbers of both (CTest runs its attention tests again with WICK_FLASH_WGMMA=0).

#include <string>

#include "cuda/check.h"
#include "cuda/fused_kernels.h"
#include "cuda_config.h"
#include "test_util.h"

namespace wick {
namespace {

// Nothing is launched: the operands' addresses only need their alignment.
alignas(256) char operands[64];

// q and out (b, h, s, d), k and v (b, h_kv, s_kv, d), all contiguous.
cuda::AttentionArgs prefill(int b, int h, int h_kv, int s, int s_kv, int d, bool causal) {
  cuda::AttentionArgs a;
  a.q = a.k = a.v = a.out = operands;
  auto strides = [&](int64_t(&st)[3], int heads, int rows) {
    st[0] = int64_t{heads} * rows * d;
    st[1] = int64_t{rows} * d;
    st[2] = d;
  };
  strides(a.q_strides, h, s);
  strides(a.k_strides, h_kv, s_kv);
  strides(a.v_strides, h_kv, s_kv);
  a.b = b;
  a.h = h;
  a.h_kv = h_kv;
  a.s = s;
  a.s_kv = s_kv;
  a.d = d;
  a.scale = 0.088f;
  a.causal = causal;
  return a;
}

TEST(CudaAttentionDispatch, PrefillTakesTheWgmmaKernelOnComputeCapability90) {
  WICK_REQUIRE_GPU();
  const std::string wgmma =
      cuda::compute_capability() == 90 ? "flash_wgmma_kernel" : "flash_mma_kernel";
  const cuda::AttentionArgs cases[] = {
      prefill(1, 32, 32, 1024, 1024, 128, true), prefill(1, 8, 2, 200, 457, 128, true),
      prefill(2, 6, 3, 260, 130, 128, false), prefill(3, 2, 1, 16, 20, 128, false),
      prefill(1, 4, 2, 333, 190, 128, true)};
  for (bool on : {true, false}) {
    cuda::set_flash_wgmma(on);
    for (DType dt : {DType::BF16, DType::F16}) {
      for (const cuda::AttentionArgs& a : cases) {
        EXPECT_EQ(cuda::attention_kernel_name(dt, a), on ? wgmma : "flash_mma_kernel")
            << dt << " s " << a.s << " s_kv " << a.s_kv << " switch " << on;
      }
    }
  }
  cuda::set_flash_wgmma(cuda::tuning_overrides().flash_wgmma != 0);
}

TEST(CudaAttentionDispatch, OtherPrefillCasesKeepTheMmaKernel) {
  WICK_REQUIRE_GPU();
  cuda::set_flash_wgmma(true);
  auto expect_mma = [](const cuda::AttentionArgs& a, const char* what) {
    EXPECT_EQ(std::string(cuda::attention_kernel_name(DType::BF16, a)), "flash_mma_kernel") << what;
  };
  expect_mma(prefill(1, 8, 8, 512, 512, 64, true), "d 64");
  cuda::AttentionArgs masked = prefill(1, 8, 8, 512, 512, 128, false);
  masked.mask = operands;
  expect_mma(masked, "a mask");
  cuda::AttentionArgs q_8_bytes = prefill(1, 8, 8, 512, 512, 128, true);
  q_8_bytes.q = operands + 8;
  expect_mma(q_8_bytes, "q 8-byte aligned");
  cuda::AttentionArgs q_rows_264 = prefill(1, 8, 8, 512, 512, 128, true);
  q_rows_264.q_strides[2] = 132;  // rows 264 bytes apart: not 16-byte aligned
  expect_mma(q_rows_264, "q rows 264 bytes apart");
  EXPECT_STREQ(cuda::attention_kernel_name(DType::F32, prefill(1, 8, 8, 512, 512, 128, true)),
               "attn_split_kernel");
  cuda::set_flash_wgmma(cuda::tuning_overrides().flash_wgmma != 0);
}

}  // namespace
}  // namespace wick
