#include "nn/varlen_attention.h"

#include <string>
#include <vector>

#include "fused/varlen_attention.h"
#include "util.h"
#include "wick/error.h"
#include "wick/nn.h"
#include "wick/numerics.h"

namespace wick {

namespace fused {

void VarlenAttentionOp::check(const TensorList& in) const {
  if (in.size() != 2 || !in[0].defined() || !in[1].defined()) {
    throw Error("varlen_attention: expected qkv and offsets");
  }
  const Tensor &qkv = in[0], &off = in[1];
  if (!numerics::is_float_dtype(qkv.dtype()) || off.dtype() != DType::U32) {
    throw DTypeMismatch(str("varlen_attention: qkv must be a float dtype and offsets u32, got ",
                            dtype_name(qkv.dtype()), " and ", dtype_name(off.dtype())));
  }
  if (qkv.rank() != 2 || off.rank() != 1 || off.dim(0) < 1 || heads == 0 ||
      qkv.dim(1) % (3 * heads) != 0) {
    throw ShapeMismatch(str("varlen_attention: expected qkv (tokens, 3 x ", heads,
                            " heads x d) and offsets (sequences + 1), got qkv ",
                            qkv.shape().to_string(), " offsets ", off.shape().to_string()));
  }
}

TensorList VarlenAttentionOp::fallback(const TensorList& in) const {
  const Tensor &qkv = in[0], &off = in[1];
  const size_t h = qkv.dim(1) / 3, d = h / heads;
  auto o = off.to_device(Device::cpu()).to_vec1<uint32_t>();
  nn::AttentionOptions options;
  options.scale = scale;
  std::vector<Tensor> parts;
  for (size_t i = 0; i + 1 < o.size(); ++i) {
    const size_t s = o[i + 1] - o[i];
    auto rows = qkv.narrow(0, o[i], s).reshape({1, s, 3, heads, d});
    auto part = [&](size_t j) { return rows.narrow(2, j, 1).squeeze(2).transpose(1, 2); };
    auto ctx = nn::scaled_dot_product_attention(part(0), part(1), part(2), options);
    parts.push_back(ctx.transpose(1, 2).reshape({s, h}));
  }
  if (parts.empty()) return {Tensor::zeros({0, h}, qkv.dtype(), qkv.device())};
  return {parts.size() == 1 ? parts[0] : Tensor::cat(parts, 0)};
}

}  // namespace fused

namespace nn::detail {

Tensor varlen_attention(const Tensor& qkv, const Tensor& offsets, size_t heads, double scale) {
  if (offsets.rank() == 1 && offsets.dtype() == DType::U32 && qkv.rank() == 2) {
    auto o = offsets.to_device(Device::cpu()).to_vec1<uint32_t>();
    bool ok = !o.empty() && o.front() == 0 && o.back() == qkv.dim(0);
    for (size_t i = 0; ok && i + 1 < o.size(); ++i) ok = o[i + 1] > o[i];
    if (!ok) {
      throw ShapeMismatch(str("varlen_attention: offsets must rise from 0 to the ", qkv.dim(0),
                              " tokens, each sequence non-empty"));
    }
  }
  return wick::apply(fused::VarlenAttentionOp(heads, scale), {qkv, offsets})[0];
}

}  // namespace nn::detail

}  // namespace wick
