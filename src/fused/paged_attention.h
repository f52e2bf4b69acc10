#pragma once
// Attention over paged KV caches and the paged cache write, as CustomOps (front ends, checks and
// fallbacks: src/nn/paged_attention.cpp; kernels: src/cpu/paged_attention.cpp and
// src/cuda/paged_attention.cpp over paged_attention.cu). Inference only: no gradients.

#include "wick/custom_op.h"

namespace wick::fused {

/// Inputs: q (T, h, d), k_pages and v_pages (pages, h_kv, page_size, d), page_table (n_seqs,
/// width), token_seq and token_pos (T) U32, all contiguous and checked by nn::paged_attention.
/// Output: (T, h, d), token t attending to positions 0..token_pos[t] of sequence token_seq[t]
/// (the `window` latest of them when window > 0), scores soft-capped when softcap > 0.
class PagedAttentionOp final : public CustomOp {
 public:
  PagedAttentionOp(double scale, size_t window, double softcap, bool launch_next_early = false,
                   bool indices_ready = false)
      : scale(scale),
        window(window),
        softcap(softcap),
        launch_next_early(launch_next_early),
        indices_ready(indices_ready) {}
  const char* name() const override { return "paged_attention"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  static std::optional<TensorList> cuda_kernel(const PagedAttentionOp& op,
                                               const TensorList& inputs);

  double scale;    // resolved: never 0
  size_t window;   // 0: every key up to the token's position
  double softcap;  // 0: off
  // CUDA: the kernel after this one may launch as this one starts, for a next kernel that only
  // loads weights before it waits (a decode plan's output projection).
  bool launch_next_early;
  // CUDA: page_table, token_seq and token_pos were written before the kernel before this one
  // started (uploads ahead of a decode step's kernels, not a kernel's outputs), so the kernel reads
  // them, and asks the L2 for the pages, while that kernel runs.
  bool indices_ready;

  /// The first key position token position `pos` attends to.
  size_t first_key(size_t pos) const {
    return window > 0 && pos + 1 > window ? pos + 1 - window : 0;
  }
};

/// Inputs: k_pages, v_pages, k and v (T, h_kv, d) contiguous, slots (T) U32 (page * page_size +
/// row). No output: the pools are written.
class PagedKvWriteOp final : public CustomOp {
 public:
  const char* name() const override { return "paged_kv_write"; }
  TensorList fallback(const TensorList& inputs) const override;
  std::optional<TensorList> cpu(const TensorList& inputs) const override;
  std::optional<TensorList> cuda(const TensorList& inputs) const override {
    return registered_cuda_kernel(*this, inputs);
  }
  std::vector<size_t> written_inputs() const override { return {0, 1}; }
  static std::optional<TensorList> cuda_kernel(const PagedKvWriteOp& op, const TensorList& inputs);
};

}  // namespace wick::fused
