// The CUDA decode plan: one token's step of a standard decoder (decode_plan.h) with each
// projection fused with the norm before it and what follows it (decode_fusions.h), rope and the
// cache write in the q/k/v kernel, attention bounded by the position read on the device, and the
// output head with its argmax in one kernel. Any part whose operands a fused kernel does not take
// (weight format, dtype, alignment) runs composed from the same ops the model uses, so the step
// stays correct for every model; projections also ask the L2 for the weights the next kernel
// reads, and let it launch early where that kernel only loads weights before it waits.

#include "decode_plan.h"

#include "cuda/cuda_device.h"
#include "cuda/decode_fusions.h"
#include "nn/kv_write.h"
#include "wick/nn/attention.h"
#include "wick/nn/decoder_ops.h"

namespace wick::cuda {

namespace {

class CudaDecodePlan final : public DecodePlan {
 public:
  explicit CudaDecodePlan(const DecoderWeights& w) : w_(w) {}

  Tensor step(const Tensor& token, const Tensor& position, models::KvCache& cache, Tensor* logits,
              size_t key_window) const override {
    if (token.elem_count() != 1) return Tensor();  // batches: the model composes the step
    const DecoderWeights& m = w_;
    for (const DecoderWeights::Layer& l : m.layers) {
      if (l.window > 0 && l.window < key_window) return Tensor();  // a window that masks
    }
    const size_t h = m.heads, h_kv = m.kv_heads, hd = m.head_dim, len = key_window;
    const double eps = m.eps;
    Tensor mask;  // made once per step where attention needs it
    auto position_mask = [&] {
      if (!mask.defined()) mask = nn::detail::position_mask(cache, position, len);
      return mask;
    };
    Tensor x = m.embed.embedding(token);  // (1, 1, d): the residual stream
    Tensor normed;                        // x.rms_norm(the next norm), when a composed add made it
    auto normed_by = [&](const Tensor& w) {
      if (!normed.defined()) normed = x.rms_norm(w, eps);
      return normed;
    };
    // Each residual add: fused into the projection, or composed with the norm that follows.
    auto project_add = [&](const Tensor& in, const QLinear& w, const Tensor& next_norm, bool early,
                           const QLinear* next) {
      Tensor sum;
      if (fused_project_add(in, w, x, &sum, early, next)) {
        x = sum;
      } else {
        nn::ResidualNorm r = nn::add_rms_norm(x, w.forward(in), next_norm, eps);
        x = r.residual;
        normed = r.normed;
      }
    };
    for (size_t li = 0; li < m.layers.size(); ++li) {
      const DecoderWeights::Layer& l = m.layers[li];
      Tensor q;
      if (l.q_norm.defined()) {
        // Per-head q/k norms between the projection and rope: the projection fused with the
        // norm before it, the head norms composed.
        Tensor qkv, bias = l.bqkv;
        if (normed.defined() || !fused_linear(x, l.ln1, eps, l.wqkv, &qkv)) {
          qkv = nn::detail::project_qkv(normed_by(l.ln1), l.wqkv, l.bqkv, &bias);
        }
        if (bias.defined()) qkv = qkv.broadcast_add(bias);  // the bias comes before the norms
        auto heads = [&](size_t first, size_t n) {
          return qkv.narrow(2, first * hd, n * hd).reshape({1, 1, n, hd});
        };
        qkv = Tensor::cat({heads(0, h).rms_norm(l.q_norm, eps).reshape({1, 1, h * hd}),
                           heads(h, h_kv).rms_norm(l.k_norm, eps).reshape({1, 1, h_kv * hd}),
                           qkv.narrow(2, (h + h_kv) * hd, h_kv * hd)},
                          2);
        q = nn::detail::rope_write_at_position(qkv, Tensor(), h, h_kv, cache.cos(), cache.sin(),
                                               cache.k(li), cache.v(li), position);
      } else if (normed.defined() ||
                 !fused_qkv_rope(x, l.ln1, eps, l.wqkv, l.bqkv, h, h_kv, cache.cos(), cache.sin(),
                                 cache.k(li), cache.v(li), position, &q)) {
        Tensor bias;
        Tensor qkv = nn::detail::project_qkv(normed_by(l.ln1), l.wqkv, l.bqkv, &bias);
        q = nn::detail::rope_write_at_position(qkv, bias, h, h_kv, cache.cos(), cache.sin(),
                                               cache.k(li), cache.v(li), position);
      }
      normed = Tensor();
      Tensor keys = cache.k(li).narrow(2, 0, len), values = cache.v(li).narrow(2, 0, len);
      // A plain output projection launches as the attention starts and asks the L2 for its
      // rows, and a side branch asks for gate/up's, while the attention leaves HBM idle.
      const bool plain_o = !l.wo.quantized();
      if (plain_o) ask_l2_aside(q, l.wgate_up);
      Tensor att;  // (1, h, 1, hd)
      const bool attended =
          nn::detail::attend_to_position(q, keys, values, position, &att, plain_o);
      if (!attended) {
        nn::AttentionOptions opts;
        opts.mask = position_mask();
        att = nn::scaled_dot_product_attention(q, keys, values, opts);
      }
      att = att.transpose(1, 2).reshape({1, 1, h * hd});
      project_add(att, l.wo, l.ln2, attended && plain_o, &l.wgate_up);
      Tensor act;
      if (normed.defined() || !fused_gate_up_silu(x, l.ln2, eps, l.wgate_up, &act, &l.wdown)) {
        act = nn::silu_mul(l.wgate_up.forward(normed_by(l.ln2)));
      }
      normed = Tensor();
      const bool last = li + 1 == m.layers.size();
      project_add(act, l.wdown, last ? m.norm : m.layers[li + 1].ln1, false,
                  last ? &m.lm_head : &m.layers[li + 1].wqkv);
    }
    // The output head: the final norm inside the projection, the argmax as it stores the logits.
    Tensor out, next;
    if (normed.defined() || !fused_linear_preferred(m.lm_head) ||
        !(fused_linear(x.squeeze(1), m.norm, eps, m.lm_head, &out, &next) ||
          fused_linear(x.squeeze(1), m.norm, eps, m.lm_head, &out))) {
      out = m.lm_head.forward(normed_by(m.norm).squeeze(1));
    }
    if (logits != nullptr) *logits = out;
    return next.defined() ? next : out.argmax(1);
  }

 private:
  DecoderWeights w_;
};

}  // namespace

std::unique_ptr<DecodePlan> CudaDevice::decode_plan(const DecoderWeights& weights) {
  return std::make_unique<CudaDecodePlan>(weights);
}

}  // namespace wick::cuda
