#pragma once
// Launchers of the paged attention and paged KV-write kernels (src/cuda/paged_attention.cu), for
// nn::paged_attention and nn::paged_kv_write (src/cuda/paged_attention.cpp).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernels.h"
#include "wick/dtype.h"

namespace wick::cuda {

struct PagedAttentionArgs {
  const void* q;  // (tokens, h, d)
  const void* k;  // (pages, h_kv, page_size, d)
  const void* v;
  void* out;              // (tokens, h, d)
  const uint32_t* table;  // (n_seqs, width)
  const uint32_t* seq;    // (tokens)
  const uint32_t* pos;    // (tokens)
  int64_t tokens, h, h_kv, d, pages, page_size, n_seqs, width;
  int64_t window;  // > 0: keys pos - window < j <= pos only
  float scale;
  float softcap;  // > 0: scores softcap tanh(score / softcap)
  // The kernel after this one may launch as this one starts (fused::PagedAttentionOp's).
  bool launch_next_early;
  // table, seq and pos were written before the kernel before this one started: they are read
  // before pdl_wait (fused::PagedAttentionOp's).
  bool indices_ready;
};

/// A programmatic dependent launch. f16/bf16 with a head dim of 16, 32, 64, 96, 128 or 256 (pages
/// of whole 16-key tiles, no soft-cap) take the tensor-core decode kernel's paged mode
/// (attention_decode.cu); the rest, d up to 256, one block per (token, query head)
/// (paged_attention.cu).
void launch_paged_attention(DType dtype, const PagedAttentionArgs& a, const TempAlloc& temp,
                            cudaStream_t s);

/// attention_decode.cu: whether its paged mode takes `a`, and its launch.
bool paged_decode_fits(DType dtype, const PagedAttentionArgs& a);
void launch_paged_decode_attention(DType dtype, const PagedAttentionArgs& a, const TempAlloc& temp,
                                   cudaStream_t s);

/// k, v (tokens, h_kv, d) row-major into the pools at slots[t]; slots outside the pool skipped.
void launch_paged_kv_write(size_t elem_bytes, void* k_pages, void* v_pages, const void* k,
                           const void* v, const uint32_t* slots, int64_t tokens, int64_t h_kv,
                           int64_t d, int64_t pages, int64_t page_size, cudaStream_t s);

}  // namespace wick::cuda
