#pragma once
// The decode step's projections for a single token fused with what comes before and after each
// one, on CUDA (src/cuda/decode_gemv.*): one kernel instead of a norm, a matmul and an
// element-wise kernel. The weight is plain (the activations' dtype) or one part of GGML blocks
// (every block type qmatmul takes). Where a projection takes `norm_weight` (defined), its input is
// x.rms_norm(norm_weight, eps), computed inside: a weight of x's dtype, or of f32 for f16/bf16 x
// (in f32, rounded once, as Tensor::rms_norm takes it). Each returns false, doing nothing, when it
// does not apply (not CUDA, more than one row, unaligned or unsupported operands,
// WICK_DECODE_GEMV=0); the caller then composes the step from separate ops, which is also what
// the CPU runs and what the GPU tests compare against.

#include "decode_plan.h"
#include "nn/qlinear.h"
#include "wick/tensor.h"

namespace wick::cuda {

using nn::QLinear;

/// Whether the fused projections may be used (WICK_DECODE_GEMV unset or not "0").
bool decode_gemv_enabled();

/// Whether fused_linear reads w faster than a matmul would (GGML blocks; plain rows that split
/// evenly over the kernel's threads).
bool fused_linear_preferred(const QLinear& w);

/// linear(norm(x), w) for x (..., k) holding one row: (..., n). With `argmax`, also y's argmax over
/// its last dim, as y.argmax(-1) gives it (plain weights only, unless WICK_GEMV_ARGMAX=0: false
/// otherwise).
bool fused_linear(const Tensor& x, const Tensor& norm_weight, double eps, const QLinear& w,
                  Tensor* y, Tensor* argmax = nullptr);

/// q (1, h, 1, d) from norm(x) (x (1, 1, k)) times wqkv (n, k)^T plus bias, rope at the position,
/// keys and values into the caches: rms_norm + linear + rope_write_at_position in one kernel.
/// With `slot` (one U32 on the device) the caches are a paged cache's pools (pages, h_kv,
/// page_size, d) and the keys and values go to that slot (nn::paged_kv_write's).
bool fused_qkv_rope(const Tensor& x, const Tensor& norm_weight, double eps, const QLinear& wqkv,
                    const Tensor& bias, size_t h, size_t h_kv, const Tensor& cos, const Tensor& sin,
                    const Tensor& k_cache, const Tensor& v_cache, const Tensor& position, Tensor* q,
                    const Tensor& slot = Tensor());

/// act(gate) * up of linear(norm(x), w_gate_up) (gate rows, then up rows; act SiLU, or the
/// tanh-approximated GELU): (1, 1, n / 2), as silu_mul, or gelu then mul, leave it. `next`: the
/// projection after this one, whose first rows this one's blocks ask the L2 for
/// (GemvArgs::l2_next): every block as it starts where this one is latency-bound, else its last
/// blocks as they finish.
bool fused_gate_up(const Tensor& x, const Tensor& norm_weight, double eps, const QLinear& w_gate_up,
                   GatedActivation activation, Tensor* act, const QLinear* next = nullptr);

/// residual + linear(x, w), in residual's shape. prefetch_rows: the op before lets this one
/// launch early (attend_to_position's launch_next_early): each block asks the L2 for the rest of
/// its plain rows before it waits for that op (GemvArgs::prefetch_rows), and for a share of the
/// first rows of `next` (plain gate/up weights, the projection after this one: GemvArgs::l2_next);
/// without prefetch_rows, `next` as in fused_gate_up.
bool fused_project_add(const Tensor& x, const QLinear& w, const Tensor& residual, Tensor* sum,
                       bool prefetch_rows = false, const QLinear* next = nullptr);

/// While a decode step is recorded as a CUDA graph (CudaGraph::capture): a side branch, which the
/// step does not wait for, asks the L2 for the first rows of `next` (plain gate/up weights over 4
/// MB, instead of the output projection: fused_project_add) while the attention leaves the HBM
/// idle. Does nothing otherwise.
void ask_l2_aside(const Tensor& x, const QLinear& next);

}  // namespace wick::cuda
