// The CUDA decode plan: one token's step of a standard decoder (decode_plan.h) with each
// projection fused with the norm before it and what follows it (decode_fusions.h), rope and the
// cache write in the q/k/v kernel, attention bounded by the position read on the device, and the
// output head with its argmax in one kernel. Any part whose operands a fused kernel does not take
// (weight format, dtype, alignment) runs composed from the same ops the model uses, so the step
// stays correct for every model; projections also ask the L2 for the weights the next kernel
// reads, and let it launch early where that kernel only loads weights before it waits. A paged
// step of one sequence and one token runs the same kernels over the pools of the paged cache.

#include "decode_plan.h"

#include <cmath>
#include <map>

#include "cuda/cuda_device.h"
#include "cuda/decode_fusions.h"
#include "cuda/tuning.h"
#include "nn/kv_write.h"
#include "settings.h"
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
    const size_t len = key_window;
    std::map<size_t, Tensor> masks;  // by window (0: none), made once per step where needed
    auto attend = [&](size_t li, Stream& stream) {
      const DecoderWeights::Layer& l = m.layers[li];
      Tensor q = project_rope(li, stream, cache.cos(), cache.sin(), cache.k(li), cache.v(li),
                              position, Tensor());
      Tensor keys = cache.k(li).narrow(2, 0, len), values = cache.v(li).narrow(2, 0, len);
      // A plain output projection launches as the attention starts and asks the L2 for its
      // rows, and a side branch asks for gate/up's, while the attention leaves HBM idle.
      Attended a;
      a.early = !l.wo.quantized();
      if (a.early) ask_l2_aside(q, l.wgate_up);
      // Attention with a mask where the scores are scaled or capped otherwise, or the window
      // hides some of the keys before the position.
      const size_t window = l.window > 0 && l.window < len ? l.window : 0;
      if (!plain_scores(l) || window > 0 ||
          !nn::detail::attend_to_position(q, keys, values, position, &a.out, a.early)) {
        Tensor& mask = masks[window];
        if (!mask.defined()) mask = nn::detail::position_mask(cache, position, len, window);
        nn::AttentionOptions opts;
        opts.mask = mask;
        opts.scale = l.scale;
        opts.softcap = l.softcap;
        a.out = nn::scaled_dot_product_attention(q, keys, values, opts);
        a.early = false;
      }
      a.out = a.out.transpose(1, 2).reshape({1, 1, m.heads * m.head_dim});
      return a;
    };
    // The output head's kernel gives the argmax unless the logits are soft-capped after it.
    Tensor next;
    Tensor out = layers_and_head(embed(token), attend, m.final_softcap > 0 ? nullptr : &next);
    if (logits != nullptr) *logits = out;
    return next.defined() ? next : out.argmax(1);
  }

  // One sequence's one token (a single stream's decode step), unless batch-invariant products
  // were asked for: the fused projections of `step` over the pools, and attention over the
  // sequence's pages. Its logits are not those the same token gets inside a larger batch (whose
  // projections are matrix products), as on this backend without the switch.
  Tensor paged_step(const models::PagedBatchTensors& b,
                    models::PagedKvCache& cache) const override {
    if (b.ids.elem_count() != 1 || settings::batch_invariant()) {
      return Tensor();
    }
    const DecoderWeights& m = w_;
    auto attend = [&](size_t li, Stream& stream) {
      const DecoderWeights::Layer& l = m.layers[li];
      Tensor q = project_rope(li, stream, cache.cos(), cache.sin(), cache.k(li), cache.v(li),
                              b.positions, b.slots);  // (1, h, hd)
      // As in `step`: a plain output projection launches as the attention starts.
      Attended a;
      a.early = !l.wo.quantized() && tuning().paged_early;
      if (a.early) ask_l2_aside(q, l.wgate_up);
      // The batch's indices are uploads ahead of the step's kernels.
      a.out = nn::detail::paged_attention(q.reshape({1, m.heads, m.head_dim}), cache.k(li),
                                          cache.v(li), b.page_table, b.token_seq, b.positions,
                                          l.scale, l.window, l.softcap, a.early, true)
                  .reshape({1, 1, m.heads * m.head_dim});
      return a;
    };
    return layers_and_head(embed(b.ids.reshape({1, 1})), attend, nullptr);
  }

 private:
  struct Attended {
    Tensor out;          // (1, 1, heads * head_dim)
    bool early = false;  // its kernel lets the output projection launch early
  };

  // The residual stream between the step's kernels: x, and x's next norm where a composed add
  // made it.
  struct Stream {
    Tensor x;
    Tensor normed;  // x.rms_norm(the next norm), when a composed add made it
  };

  // Scores as the decode attention kernel computes them: scaled by 1 / sqrt(head_dim), not
  // soft-capped.
  bool plain_scores(const DecoderWeights::Layer& l) const {
    return l.softcap == 0 &&
           (l.scale == 0 || l.scale == 1 / std::sqrt(static_cast<double>(w_.head_dim)));
  }

  // The embedded token (1, 1, d), scaled where the model scales it.
  Tensor embed(const Tensor& token) const {
    Tensor x = w_.embed.embedding(token);
    return w_.embed_scale == 1 ? x : x.affine(w_.embed_scale, 0);
  }

  // Layer li's q (1, h, 1, hd) from the residual stream (1, 1, d), or from its ln1 norm where a
  // composed add made it: the projection, the bias, the per-head norms, rope at `position` (by
  // the layer's own tables, else the cache's), the keys and values written into the caches at
  // the position or, with `slot`, into the pools of a paged cache at that slot.
  Tensor project_rope(size_t li, Stream& stream, const Tensor& cache_cos, const Tensor& cache_sin,
                      const Tensor& k_cache, const Tensor& v_cache, const Tensor& position,
                      const Tensor& slot) const {
    const DecoderWeights& m = w_;
    const DecoderWeights::Layer& l = m.layers[li];
    const Tensor& cos = l.cos.defined() ? l.cos : cache_cos;
    const Tensor& sin = l.sin.defined() ? l.sin : cache_sin;
    const size_t h = m.heads, h_kv = m.kv_heads, hd = m.head_dim;
    const Tensor& normed = stream.normed;
    Tensor q;
    if (!l.q_norm.defined() && !normed.defined() &&
        fused_qkv_rope(stream.x, l.ln1, m.eps, l.wqkv, l.bqkv, h, h_kv, cos, sin, k_cache, v_cache,
                       position, &q, slot)) {
      return q;
    }
    Tensor qkv, bias = l.bqkv;
    if (normed.defined() || !fused_linear(stream.x, l.ln1, m.eps, l.wqkv, &qkv)) {
      Tensor in = normed.defined() ? normed : stream.x.rms_norm(l.ln1, m.eps);
      qkv = nn::detail::project_qkv(in, l.wqkv, l.bqkv, &bias);
    }
    const nn::detail::HeadNorms norms{l.q_norm, l.k_norm, m.eps};
    if (!slot.defined()) {
      return nn::detail::rope_write_at_position(qkv, bias, h, h_kv, cos, sin, k_cache, v_cache,
                                                position, norms);
    }
    return nn::detail::rope_write_paged(qkv.reshape({1, (h + 2 * h_kv) * hd}), bias, h, h_kv, cos,
                                        sin, k_cache, v_cache, position, slot, norms)
        .reshape({1, h, 1, hd});
  }

  // The layers from the embedded token x (1, 1, d), each attending through `attend`, then the
  // output head: the logits (1, vocab), soft-capped where the model caps them; *next, where
  // given, their argmax where the head's kernel gives it.
  template <class Attend>
  Tensor layers_and_head(Tensor embedded, const Attend& attend, Tensor* next) const {
    const DecoderWeights& m = w_;
    const double eps = m.eps;
    Stream s;
    s.x = std::move(embedded);
    Tensor& x = s.x;
    auto normed_by = [&](const Tensor& w) {
      if (!s.normed.defined()) s.normed = x.rms_norm(w, eps);
      return s.normed;
    };
    // Each residual add: fused into the projection, or composed with the norm that follows (in
    // x's dtype; a norm of another dtype is left to the projection after).
    auto project_add = [&](const Tensor& in, const QLinear& w, const Tensor& next_norm, bool early,
                           const QLinear* after) {
      Tensor sum;
      if (fused_project_add(in, w, x, &sum, early, after)) {
        x = sum;
      } else if (next_norm.dtype() != x.dtype()) {
        x = x.add(w.forward(in));
      } else {
        nn::ResidualNorm r = nn::add_rms_norm(x, w.forward(in), next_norm, eps);
        x = r.residual;
        s.normed = r.normed;
      }
    };
    // A residual add of the projection's output normalised first (Gemma's post-norms): one
    // kernel after the projection.
    auto project_norm_add = [&](const Tensor& in, const QLinear& w, const Tensor& post_norm) {
      Tensor y;
      if (!fused_linear(in, Tensor(), 0, w, &y)) y = w.forward(in);
      x = nn::add_rms_normed(x, y, post_norm, eps);
    };
    for (size_t li = 0; li < m.layers.size(); ++li) {
      const DecoderWeights::Layer& l = m.layers[li];
      Attended att = attend(li, s);
      s.normed = Tensor();
      if (l.post_attn_norm.defined()) {
        project_norm_add(att.out, l.wo, l.post_attn_norm);
      } else {
        project_add(att.out, l.wo, l.ln2, att.early, &l.wgate_up);
      }
      Tensor act;
      if (s.normed.defined() ||
          !fused_gate_up(x, l.ln2, eps, l.wgate_up, m.activation, &act, &l.wdown)) {
        act = gated(l.wgate_up.forward(normed_by(l.ln2)));
      }
      s.normed = Tensor();
      const bool last = li + 1 == m.layers.size();
      if (l.post_ffn_norm.defined()) {
        project_norm_add(act, l.wdown, l.post_ffn_norm);
      } else {
        project_add(act, l.wdown, last ? m.norm : m.layers[li + 1].ln1, false,
                    last ? &m.lm_head : &m.layers[li + 1].wqkv);
      }
    }
    // The output head: the final norm inside the projection, the argmax as it stores the logits.
    Tensor out;
    if (s.normed.defined() || !fused_linear_preferred(m.lm_head) ||
        !((next != nullptr && fused_linear(x.squeeze(1), m.norm, eps, m.lm_head, &out, next)) ||
          fused_linear(x.squeeze(1), m.norm, eps, m.lm_head, &out))) {
      out = m.lm_head.forward(normed_by(m.norm).squeeze(1));
    }
    if (m.final_softcap > 0) {
      const double cap = m.final_softcap;
      out = out.affine(1 / cap, 0).tanh().affine(cap, 0);
    }
    return out;
  }

  // act(gate) * up of the gate/up projection's output (1, 1, 2 ff).
  Tensor gated(const Tensor& gate_up) const {
    if (w_.activation == GatedActivation::SiLU) return nn::silu_mul(gate_up);
    const size_t ff = gate_up.dims()[2] / 2;
    return gate_up.narrow(2, 0, ff).gelu().mul(gate_up.narrow(2, ff, ff));
  }

  DecoderWeights w_;
};

}  // namespace

std::unique_ptr<DecodePlan> CudaDevice::decode_plan(const DecoderWeights& weights) {
  return std::make_unique<CudaDecodePlan>(weights);
}

}  // namespace wick::cuda
