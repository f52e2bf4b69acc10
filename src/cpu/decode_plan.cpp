// The CPU decode plan: one token of one sequence through a standard decoder (decode_plan.h) whose
// projections are quantized, as one pass over plain buffers. The projections (qmatmul's tile
// kernels) and the attention (the f32 kernel) split over the pool's threads; the one-row steps
// between them (residual adds and RMS norms, bias, rope, the cache write, silu) are loops on the
// calling thread. A step so allocates a handful of buffers and dispatches no op, where the
// composed forward makes some 300 tensors and op calls, all on the calling thread while the
// other threads wait. The arithmetic is that of the ops the model composes (add_rms_norm,
// rope_write_at_position, silu_mul, scaled_dot_product_attention, qmatmul). Weights it does not
// take (plain or several-part projections, f16/bf16 models) get no plan. Each layer's attention
// takes its sliding window (Mistral's, Gemma's), scale and score cap (Gemma 2's). Qwen3's and Gemma
// 3's per-head q/k norms and Gemma's post-norms run as rows of Tensor::rms_norm, Gemma's GELU gate
// and final soft-cap as the ops the model composes.

#include "decode_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cpu/attention.h"
#include "cpu/cpu_storage.h"
#include "cpu/fused.h"
#include "cpu/kernels.h"
#include "cpu/paged_attention.h"
#include "cpu/qmatmul.h"
#include "fused/quantized.h"
#include "ops/norm_math.h"
#include "ops/rope_math.h"
#include "ops/unary_math.h"
#include "tensor_internal.h"
#include "wick/paged_kv_cache.h"

namespace wick::cpu {

namespace {

const float* f32_data(const Tensor& t) {
  return as_cpu(detail::backend_of(t)).as<float>() + t.layout().start_offset();
}

float* f32_data_mut(const Tensor& t) {
  return as_cpu(detail::backend_of(t)).as<float>() + t.layout().start_offset();
}

bool f32_cpu(const Tensor& t, size_t n) {
  return t.defined() && t.dtype() == DType::F32 && t.device().is_cpu() && t.shape() == Shape{n} &&
         t.is_contiguous();
}

// A rope table (positions, rot_half) in f32 on the CPU.
bool f32_table(const Tensor& t, size_t rot_half) {
  return t.defined() && t.rank() == 2 && t.dims()[1] == rot_half && t.dtype() == DType::F32 &&
         t.device().is_cpu() && t.is_contiguous();
}

// A projection the plan takes: one part of a type with a tile layout, (n, k) blocks on the CPU.
bool tiled(const nn::QLinear& l, size_t n, size_t k) {
  if (!l.quantized() || l.parts().size() != 1) return false;
  const QTensor& w = l.parts()[0];
  return q_tiled(w.type()) && w.device().is_cpu() && w.data().is_contiguous() &&
         w.shape() == Shape{n, k};
}

// y (n) = w x, x of w's k values.
void project(const nn::QLinear& l, const float* x, float* y) {
  const QTensor& w = l.parts()[0];
  const Tensor& raw = w.data();
  const auto* blocks = as_cpu(detail::backend_of(raw)).as<uint8_t>() + raw.layout().start_offset();
  const size_t n = w.shape()[0], k = w.shape()[1];
  const QActivations acts = q_activations();
  const QPacked* packed =
      acts == QActivations::F32 ? nullptr : &q_packed(detail::qcache_of(w), w.type(), blocks, n, k);
  qmatmul(w.type(), blocks, packed, n, k, x, 1, y, acts);
}

// x += delta; normed = w * (x * rstd): add_rms_norm's f32 arithmetic.
void add_rms_norm(float* x, const float* delta, const float* w, float eps, float* normed,
                  size_t d) {
  float sq = 0;
  for (size_t c = 0; c < d; ++c) {
    const float s = x[c] + delta[c];
    x[c] = s;
    sq += s * s;
  }
  const float rstd = ops::norm_rstd(sq, static_cast<float>(d), eps);
  for (size_t c = 0; c < d; ++c) normed[c] = w[c] * (x[c] * rstd);
}

// dst = rotate-half rope of the head of d values at src by the table rows c, s (rot_half values
// each): its first 2 rot_half values rotate, the others are copied (partial rotary).
void rotate(const float* src, const float* c, const float* s, size_t rot_half, size_t d,
            float* dst) {
  auto same = [](float v) { return v; };
  for (size_t i = 0; i < rot_half; ++i) {
    dst[i] = ops::rope_lo(src[i], src[i + rot_half], c[i], s[i], same);
    dst[i + rot_half] = ops::rope_hi(src[i], src[i + rot_half], c[i], s[i], same);
  }
  std::memcpy(dst + 2 * rot_half, src + 2 * rot_half, (d - 2 * rot_half) * sizeof(float));
}

class CpuDecodePlan final : public DecodePlan {
 public:
  explicit CpuDecodePlan(const DecoderWeights& w) : w_(w) {
    for (const DecoderWeights::Layer& l : w_.layers) {
      if (l.cos.defined()) layer_table_rows_ = std::min(layer_table_rows_, l.cos.dims()[0]);
    }
  }

  // The host-side forward only: the device-position step stays composed.
  Tensor step(const Tensor&, const Tensor&, models::KvCache&, Tensor*, size_t) const override {
    return Tensor();
  }

  Tensor forward_one(const Tensor& token, models::KvCache& cache) const override {
    const size_t hk = w_.kv_heads, hd = w_.head_dim;
    const size_t p = cache.length(), max_len = cache.max_len();
    if (token.elem_count() != 1 || cache.batch() != 1 || cache.k(0).dtype() != DType::F32 ||
        !rope_tables_fit(cache.cos(), p)) {
      return Tensor();
    }
    // This position's key and value written into the caches; attention over the keys up to it.
    auto write = [&](size_t li, size_t i) {
      const size_t at = (i * max_len + p) * hd;
      return std::pair{f32_data_mut(cache.k(li)) + at, f32_data_mut(cache.v(li)) + at};
    };
    std::vector<KernelOperand> operands(3);
    auto attend = [&](size_t li, const Tensor& q, float* att) {
      // The layer's scale (0: 1 / sqrt(hd)), sliding window and score cap.
      const DecoderWeights::Layer& l = w_.layers[li];
      const AttentionParams params{
          l.scale != 0 ? l.scale : 1.0 / std::sqrt(static_cast<double>(hd)), false, l.window,
          l.softcap};
      const Tensor &kc = cache.k(li), &vc = cache.v(li);
      const Shape keys{1, hk, p + 1, hd};
      operands[0] = {&detail::backend_of(q), Layout::contiguous(Shape{1, w_.heads, 1, hd})};
      operands[1] = {&detail::backend_of(kc),
                     Layout(keys, kc.layout().strides(), kc.layout().start_offset())};
      operands[2] = {&detail::backend_of(vc),
                     Layout(keys, vc.layout().strides(), vc.layout().start_offset())};
      kernels().attention_f32(params, operands, att);
    };
    return run(token, p, cache.cos(), cache.sin(), write, attend);
  }

  // The serving engine's step of one sequence's one token: the same pass, the key and value
  // written into the token's slot of the pools and the attention nn::paged_attention's, so that
  // the token's logits are the bits it gets inside a larger batch (whose step composes the ops).
  Tensor paged_step(const models::PagedBatchTensors& b,
                    models::PagedKvCache& cache) const override {
    const size_t hk = w_.kv_heads, hd = w_.head_dim, ps = cache.page_size();
    if (b.ids.elem_count() != 1 || !b.ids.device().is_cpu() || cache.k(0).dtype() != DType::F32) {
      return Tensor();
    }
    const uint32_t p = b.positions.to_vec1<uint32_t>()[0], slot = b.slots.to_vec1<uint32_t>()[0];
    if (slot / ps >= cache.pages() || !rope_tables_fit(cache.cos(), p)) return Tensor();
    auto write = [&](size_t li, size_t i) {
      const size_t at = (((slot / ps) * hk + i) * ps + slot % ps) * hd;
      return std::pair{f32_data_mut(cache.k(li)) + at, f32_data_mut(cache.v(li)) + at};
    };
    auto attend = [&](size_t li, const Tensor& q, float* att) {
      const DecoderWeights::Layer& l = w_.layers[li];
      paged_attention_f32(f32_data(q), 1, w_.heads, cache.k(li), cache.v(li), b.page_table,
                          b.token_seq, b.positions, l.window, l.scale, l.softcap, att);
    };
    return run(b.ids.reshape({1, 1}), p, cache.cos(), cache.sin(), write, attend);
  }

 private:
  // The cache's rope tables of (positions, rotary_dims / 2) in f32 on the CPU, and every table
  // (the cache's, the layers' own) holding position p.
  bool rope_tables_fit(const Tensor& cos, size_t p) const {
    return f32_table(cos, w_.rotary_dims / 2) && p < cos.dims()[0] && p < layer_table_rows_;
  }

  // The token (1, 1) at position p through the layers and the head: its logits (1, vocab).
  // write(li, i): where layer li's key and value rows of k/v head i go; attend(li, q, att): the
  // attention of the rotated q (h, hd), contiguous, into att.
  template <class Write, class Attend>
  Tensor run(const Tensor& token, size_t p, const Tensor& cos_table, const Tensor& sin_table,
             const Write& write, const Attend& attend) const {
    const DecoderWeights& m = w_;
    const size_t h = m.heads, hk = m.kv_heads, hd = m.head_dim, rot_half = m.rotary_dims / 2;
    const size_t d = m.embed.dims()[1], rows = (h + 2 * hk) * hd;
    const size_t inter = m.layers[0].wgate_up.parts()[0].shape()[0] / 2;
    const size_t vocab = m.lm_head.parts()[0].shape()[0];
    const float eps = static_cast<float>(m.eps);
    // The embedding (scaled where the model scales it) and the first norm as the model composes
    // them (once a step).
    Tensor x0 = m.embed.embedding(token).reshape({d});
    if (m.embed_scale != 1) x0 = x0.affine(m.embed_scale, 0);
    std::vector<float> x = x0.to_vec1<float>();
    std::vector<float> normed = x0.rms_norm(m.layers[0].ln1, m.eps).to_vec1<float>();
    std::vector<float> qkv(rows), att(h * hd), y(d), act(inter), normed_head(hd);
    Tensor q = detail::from_storage(device().alloc(h * hd, DType::F32), Shape{h, hd});
    Tensor gate_up = detail::from_storage(device().alloc(2 * inter, DType::F32), Shape{2 * inter});
    // Each residual add and the norm after it: add_rms_norm's arithmetic, or, after a post-norm
    // (Gemma's), x + rms_norm(y) then the next norm, as the model composes them.
    auto add_and_norm = [&](const Tensor& post_norm, const Tensor& next_norm) {
      if (post_norm.defined()) {
        rms_norm_row<float>(y.data(), f32_data(post_norm), eps, d, false, normed.data());
        for (size_t c = 0; c < d; ++c) x[c] += normed[c];
        rms_norm_row<float>(x.data(), f32_data(next_norm), eps, d, false, normed.data());
      } else {
        add_rms_norm(x.data(), y.data(), f32_data(next_norm), eps, normed.data(), d);
      }
    };
    for (size_t li = 0; li < m.layers.size(); ++li) {
      const DecoderWeights::Layer& l = m.layers[li];
      // The layer's own rope tables (Gemma 3's local layers), else the cache's.
      const float* cos = f32_data(l.cos.defined() ? l.cos : cos_table) + p * rot_half;
      const float* sin = f32_data(l.sin.defined() ? l.sin : sin_table) + p * rot_half;
      project(l.wqkv, normed.data(), qkv.data());
      if (l.bqkv.defined()) {
        const float* b = f32_data(l.bqkv);
        for (size_t i = 0; i < rows; ++i) qkv[i] += b[i];
      }
      // Qwen3's per-head norms of q and k (Tensor::rms_norm's rows), before rope.
      if (l.q_norm.defined()) {
        auto norm_heads = [&](size_t first, size_t n, const Tensor& w) {
          for (size_t i = first; i < first + n; ++i) {
            float* head = qkv.data() + i * hd;
            rms_norm_row<float>(head, f32_data(w), eps, hd, false, normed_head.data());
            std::memcpy(head, normed_head.data(), hd * sizeof(float));
          }
        };
        norm_heads(0, h, l.q_norm);
        norm_heads(h, hk, l.k_norm);
      }
      // q rotated into its buffer; this position's key (rotated) and value into the cache.
      float* qp = f32_data_mut(q);
      for (size_t i = 0; i < h; ++i) {
        rotate(qkv.data() + i * hd, cos, sin, rot_half, hd, qp + i * hd);
      }
      for (size_t i = 0; i < hk; ++i) {
        auto [k_row, v_row] = write(li, i);
        rotate(qkv.data() + (h + i) * hd, cos, sin, rot_half, hd, k_row);
        std::memcpy(v_row, qkv.data() + (h + hk + i) * hd, hd * sizeof(float));
      }
      attend(li, q, att.data());
      project(l.wo, att.data(), y.data());
      add_and_norm(l.post_attn_norm, l.ln2);
      project(l.wgate_up, normed.data(), f32_data_mut(gate_up));
      gated(gate_up, act.data());
      project(l.wdown, act.data(), y.data());
      add_and_norm(l.post_ffn_norm, li + 1 == m.layers.size() ? m.norm : m.layers[li + 1].ln1);
    }
    StoragePtr storage = device().alloc(vocab, DType::F32);
    project(m.lm_head, normed.data(), as_cpu(*storage).as<float>());
    Tensor logits = detail::from_storage(std::move(storage), Shape{1, vocab});
    if (m.final_softcap > 0) {  // as the model caps them
      const double cap = m.final_softcap;
      logits = logits.affine(1 / cap, 0).tanh().affine(cap, 0);
    }
    return logits;
  }

  // act (ff) = act(gate) * up of gate_up (2 ff): SiLU as silu_mul computes it; the tanh GELU
  // (Gemma's GeGLU) by the ops the model composes, gelu then mul.
  void gated(const Tensor& gate_up, float* act) const {
    const size_t ff = gate_up.dims()[0] / 2;
    const float* gu = f32_data(gate_up);
    if (w_.activation == GatedActivation::SiLU) {
      for (size_t c = 0; c < ff; ++c) act[c] = gu[c] * ops::math::sigmoid(gu[c]) * gu[ff + c];
      return;
    }
    Tensor out = gate_up.narrow(0, 0, ff).gelu().mul(gate_up.narrow(0, ff, ff));
    std::memcpy(act, f32_data(out), ff * sizeof(float));
  }

  DecoderWeights w_;
  size_t layer_table_rows_ = SIZE_MAX;  // positions the layers' own rope tables hold (the fewest)
};

// Whether the plan takes these weights (see the design note).
bool takes(const DecoderWeights& m) {
  if (m.layers.empty() || m.heads == 0 || m.kv_heads == 0 || m.head_dim % 2 != 0 ||
      m.rotary_dims == 0 || m.rotary_dims % 2 != 0 || m.rotary_dims > m.head_dim ||
      !std::isfinite(m.embed_scale) || !std::isfinite(m.final_softcap) || !m.embed.defined() ||
      m.embed.rank() != 2 || m.embed.dtype() != DType::F32 || !m.embed.device().is_cpu()) {
    return false;
  }
  const size_t d = m.embed.dims()[1], hd = m.head_dim;
  const size_t q_out = m.heads * hd, rows = (m.heads + 2 * m.kv_heads) * hd;
  const nn::QLinear& gu = m.layers[0].wgate_up;
  if (!gu.quantized() || gu.parts().empty()) return false;
  const size_t inter = gu.parts()[0].shape()[0] / 2;
  if (!f32_cpu(m.norm, d) || !tiled(m.lm_head, m.embed.dims()[0], d)) return false;
  for (const DecoderWeights::Layer& l : m.layers) {
    if (!f32_cpu(l.ln1, d) || !f32_cpu(l.ln2, d) || (l.bqkv.defined() && !f32_cpu(l.bqkv, rows)) ||
        l.q_norm.defined() != l.k_norm.defined() ||
        (l.q_norm.defined() && (!f32_cpu(l.q_norm, hd) || !f32_cpu(l.k_norm, hd))) ||
        (l.post_attn_norm.defined() && !f32_cpu(l.post_attn_norm, d)) ||
        (l.post_ffn_norm.defined() && !f32_cpu(l.post_ffn_norm, d)) ||
        (l.cos.defined() &&
         !(f32_table(l.cos, m.rotary_dims / 2) && f32_table(l.sin, m.rotary_dims / 2) &&
           l.sin.dims()[0] == l.cos.dims()[0])) ||
        !(l.softcap >= 0) || !(l.scale >= 0) || !tiled(l.wqkv, rows, d) || !tiled(l.wo, d, q_out) ||
        !tiled(l.wgate_up, 2 * inter, d) || !tiled(l.wdown, d, inter)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::unique_ptr<DecodePlan> CpuDevice::decode_plan(const DecoderWeights& weights) {
  if (!takes(weights)) return nullptr;
  return std::make_unique<CpuDecodePlan>(weights);
}

}  // namespace wick::cpu
