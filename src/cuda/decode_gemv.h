#pragma once
// The decode step's projections for one token (one row), each fused with what follows it
// (decode_gemv.cu): W (n, k) row-major, in the activations' dtype or as GGML blocks (Q4_0 ...
// IQ4_XS: GemvWeights), times x (k) -- or times RMSNorm(x) * norm_weight when norm_weight is given
// -- f32 accumulation, the product rounded to the dtype as a separate matmul would leave it, then
//   Store:   the product -> out;
//   QkvRope: + bias, rope of the q and k heads at *position, q out, k and v into the caches
//            (or into the pools of a paged cache);
//   SiluMul: rows j and n/2 + j give silu(gate) * up -> out;
//   GeluMul: the same with the tanh-approximated GELU (Gemma's GeGLU);
//   Add:     residual + product -> out.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "wick/dtype.h"

namespace wick::cuda {

enum class GemvEpilogue { Store, QkvRope, SiluMul, GeluMul, Add };

/// Threads a block of the kernel, unless dense_threads in decode_gemv.cu picks others for a large
/// projection; each takes 16 bytes of a plain row at a time.
inline constexpr int kGemvThreads = 128;

/// Weights up to this size make a latency-bound projection (SmolLM2's: 0.7-3.5 MB in bf16;
/// Llama-1B's are 8.4 MB and up).
inline constexpr int64_t kLatencyBoundBytes = int64_t{4} << 20;

/// How W's rows are stored: plain elements of the activations' dtype, or GGML blocks of 32.
enum class GemvWeights {
  Dense,
  Q4_0,
  Q4_1,
  Q5_0,
  Q5_1,
  Q8_0,
  IQ4_NL,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
  IQ4_XS
};

struct GemvArgs {
  GemvEpilogue epilogue;
  GemvWeights weights = GemvWeights::Dense;
  const void* w;  // (n, k)
  const void* x;  // (k)
  int64_t n, k;
  const void* norm_weight;  // (k), or null: x is multiplied as it is
  // norm_weight is f32 for f16/bf16 activations: the norm in f32, rounded once (Gemma's 1 + w,
  // as transformers computes it), instead of the dtype's two roundings.
  bool norm_f32 = false;
  double eps;
  // QkvRope
  const void* bias;  // (n) or null
  const void* cos;   // (max_len, rot_half)
  const void* sin;
  void* q;  // (h, d)
  void* k_cache;
  void* v_cache;             // (h_kv, max_len, d)
  const uint32_t* position;  // the token's position: its rows of cos and sin
  // Null: the caches are (h_kv, max_len, d) and the token's row is *position (none past max_len).
  // Set: they are pools of pages (pages, h_kv, max_len, d), and the row is *slot (page
  // *slot / max_len, row *slot % max_len): a paged step's one token.
  const uint32_t* slot = nullptr;
  int64_t h, h_kv, d, max_len;
  // Half the rotated dims of a head: d / 2, or less for partial rotary (the first 2 rot_half
  // dims rotate, the others pass through).
  int64_t rot_half = 0;
  // Store, SiluMul / GeluMul, Add
  void* out;             // (n), (n / 2), (n)
  const void* residual;  // Add: (n)
  // Store with plain weights: also the index of the largest stored product (the first of equals;
  // the first NaN), as argmax gives it; null when not wanted.
  uint32_t* argmax = nullptr;
  // Plain weights: each block asks the L2 for the rest of its rows before pdl_wait, where the
  // kernel before lets this one launch early (AttentionArgs::launch_next_early).
  bool prefetch_rows = false;
  // Each block's share of the first `l2_next_bytes` of two regions `l2_next_half` apart (the next
  // projection's weights: gate/up's gate and up halves, or, with l2_next_half == l2_next_bytes,
  // one run of rows), asked of the L2 in bulk as the block starts (see l2_next_end_blocks); null
  // when not wanted.
  const void* l2_next = nullptr;
  int64_t l2_next_bytes = 0;
  int64_t l2_next_half = 0;
  // > 0: the ask comes from the grid's last this many blocks, each as it finishes, instead of
  // from every block as it starts (plain rows only).
  int l2_next_end_blocks = 0;
};

/// False when the operands do not suit the kernel (k % 8 or 32, alignment, head_dim): the
/// caller composes the step from separate ops then.
bool gemv_fits(DType dtype, const GemvArgs& a);
void launch_gemv(DType dtype, const GemvArgs& a, cudaStream_t s);

/// Asks the L2 for the first `bytes` of two regions `half` apart from `base` (bulk prefetches from
/// a few blocks): the decode step's side branch, for the HBM's idle time under the attention.
void launch_l2_aside(const void* base, int64_t bytes, int64_t half, cudaStream_t s);

}  // namespace wick::cuda
