#pragma once
// Attention over paged key/value caches for a ragged batch (wick/paged_kv_cache.h, the serving
// engine): each query token attends to the keys of its own sequence only, up to its position,
// with one fixed order of the keys whatever else the batch holds (a token's output does not
// depend on the other tokens of the batch). Inference only.

#include "wick/tensor.h"

namespace wick::nn {

/// softmax(cap(scale q k^T)) v for each query token t over the keys 0..token_pos[t] of sequence
/// token_seq[t] (window > 0: only the `window` latest, token_pos[t] - window < j), whose
/// position p lives in page page_table[token_seq[t]][p / page_size] at row p % page_size;
/// cap(x) = softcap tanh(x / softcap) when softcap > 0, else x. q (T, h, d); k_pages and v_pages
/// (pages, h_kv, page_size, d) with h a multiple of h_kv, same float dtype and device as q;
/// page_table (n_seqs, max_pages), token_seq and token_pos (T), U32 on q's device. Returns
/// (T, h, d) in q's dtype (f32 arithmetic, f64 for f64). scale 0: 1 / sqrt(d). Error for a
/// negative or non-finite softcap. A sequence, position or page outside the tables is
/// IndexOutOfRange on the CPU (CUDA: the token's output is zeros).
Tensor paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                       const Tensor& page_table, const Tensor& token_seq, const Tensor& token_pos,
                       double scale = 0, size_t window = 0, double softcap = 0);

/// Writes k and v (T, h_kv, d), any strides, into the pools (pages, h_kv, page_size, d) in place:
/// token t at page slots[t] / page_size, row slots[t] % page_size. slots (T) U32 on the pools'
/// device; one dtype. A slot outside the pool is IndexOutOfRange on the CPU (CUDA: not written).
void paged_kv_write(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k, const Tensor& v,
                    const Tensor& slots);

}  // namespace wick::nn
