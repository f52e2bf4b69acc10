#pragma once
// The backend halves of nn::paged_attention and nn::paged_kv_write (src/nn/paged_attention.cpp
// checks shapes, dtypes and devices and passes contiguous operands): src/cpu/paged_attention.cpp
// and src/cuda/paged_attention.cu (a stub without CUDA: src/cuda_paged_attention_stub.cpp).

#include "wick/tensor.h"

namespace wick::detail {

Tensor cpu_paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                           const Tensor& page_table, const Tensor& token_seq,
                           const Tensor& token_pos, double scale);
Tensor cuda_paged_attention(const Tensor& q, const Tensor& k_pages, const Tensor& v_pages,
                            const Tensor& page_table, const Tensor& token_seq,
                            const Tensor& token_pos, double scale);
/// k, v: contiguous (T, h_kv, d).
void cpu_paged_kv_write(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k,
                        const Tensor& v, const Tensor& slots);
void cuda_paged_kv_write(const Tensor& k_pages, const Tensor& v_pages, const Tensor& k,
                         const Tensor& v, const Tensor& slots);

}  // namespace wick::detail
