#pragma once
// nn::paged_attention's CPU kernel (src/cpu/paged_attention.cpp) for callers inside the CPU
// backend that hold plain buffers: the CPU decode plan's paged step calls it once a layer without
// the op's dispatch, output allocation and copy.

#include <cstddef>

#include "wick/tensor.h"

namespace wick::cpu {

/// The attention of `tokens` rows of q (tokens, h, d), f32, contiguous, over the f32 pools
/// k_pages / v_pages (pages, h_kv, page_size, d) of a paged cache, into out (tokens, h, d):
/// nn::paged_attention's bits with its sliding `window` (0: none), `scale` (0: 1 / sqrt(d)) and
/// score cap `softcap` (0: none). page_table, token_seq and token_pos are its CPU u32 operands;
/// the indices are checked as it checks them.
void paged_attention_f32(const float* q, size_t tokens, size_t h, const Tensor& k_pages,
                         const Tensor& v_pages, const Tensor& page_table, const Tensor& token_seq,
                         const Tensor& token_pos, size_t window, double scale, double softcap,
                         float* out);

}  // namespace wick::cpu
