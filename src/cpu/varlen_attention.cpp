// The CPU kernel of fused::VarlenAttentionOp: f32 through the kernel of the CPU's instruction
// set (src/cpu/varlen_attention_f32.cpp); other dtypes and strided operands take the fallback.

#include "fused/varlen_attention.h"

#include <memory>

#include "cpu/cpu_storage.h"
#include "cpu/kernels.h"
#include "fused_op.h"
#include "tensor_internal.h"

namespace wick::fused {

std::optional<TensorList> VarlenAttentionOp::cpu(const TensorList& in) const {
  const Tensor &qkv = in[0], &off = in[1];
  if (qkv.dtype() != DType::F32 || !qkv.impl()->layout.is_contiguous() ||
      !off.impl()->layout.is_contiguous()) {
    return std::nullopt;
  }
  auto locks = detail::lock_inputs(*this, in);
  const size_t t = qkv.dim(0), h = qkv.dim(1) / 3;
  auto out = std::make_unique<cpu::CpuStorage>(t * h, DType::F32);
  cpu::kernels().varlen_attention_f32(
      cpu::as_cpu(detail::backend_of(qkv)).as<float>() + qkv.impl()->layout.start_offset(),
      cpu::as_cpu(detail::backend_of(off)).as<uint32_t>() + off.impl()->layout.start_offset(),
      off.dim(0) - 1, heads, h / heads, static_cast<float>(scale), out->as<float>());
  return TensorList{detail::from_storage(std::move(out), Shape{t, h})};
}

}  // namespace wick::fused
