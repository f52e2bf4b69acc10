// The CUDA side of cuda/decode_fusions.h: operands to GemvArgs, one enqueue each.

#include "cuda/decode_gemv.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include "cuda/cuda_storage.h"
#include "cuda/decode_fusions.h"
#include "cuda_config.h"
#include "fused/norm.h"
#include "tensor_internal.h"

namespace wick::cuda {

namespace {

void* ptr_of(const Tensor& t) {
  const TensorImpl& i = *t.impl();
  return cuda::as_cuda(i.storage->backend()).data_at(i.layout.start_offset());
}

int64_t bytes_of(const Tensor& t) {
  return static_cast<int64_t>(t.elem_count() * size_in_bytes(t.dtype()));
}

cuda::CudaDevice& device_of(const Tensor& t) {
  return cuda::as_cuda(t.impl()->storage->backend()).cuda_device();
}

// The weight's bytes and format, when the kernel takes it: plain (x's dtype, row-major) or one
// part of GGML blocks (every quantized type but F16/BF16/F32 parts); x one contiguous row on the
// same CUDA device.
struct WeightView {
  const Tensor* bytes = nullptr;  // the tensor to lock and address
  cuda::GemvWeights format = cuda::GemvWeights::Dense;
  int64_t n = 0, k = 0;
};

bool usable(const Tensor& x, const QLinear& w, WeightView* view) {
  if (!decode_gemv_enabled() || !x.device().is_cuda() || !x.is_contiguous()) return false;
  if (!w.quantized()) {
    const Tensor& d = w.dense();
    if (d.device() != x.device() || x.dtype() != d.dtype() || d.rank() != 2 || !d.is_contiguous()) {
      return false;
    }
    *view = {&d, cuda::GemvWeights::Dense, static_cast<int64_t>(d.dims()[0]),
             static_cast<int64_t>(d.dims()[1])};
  } else {
    if (w.parts().size() != 1) return false;
    const QTensor& q = w.parts()[0];
    if (q.device() != x.device() || !q.data().is_contiguous()) return false;
    cuda::GemvWeights format;
    switch (q.type()) {
      case GgmlType::Q4_0:
        format = cuda::GemvWeights::Q4_0;
        break;
      case GgmlType::Q4_1:
        format = cuda::GemvWeights::Q4_1;
        break;
      case GgmlType::Q5_0:
        format = cuda::GemvWeights::Q5_0;
        break;
      case GgmlType::Q5_1:
        format = cuda::GemvWeights::Q5_1;
        break;
      case GgmlType::Q8_0:
        format = cuda::GemvWeights::Q8_0;
        break;
      case GgmlType::IQ4_NL:
        format = cuda::GemvWeights::IQ4_NL;
        break;
      case GgmlType::Q2_K:
        format = cuda::GemvWeights::Q2_K;
        break;
      case GgmlType::Q3_K:
        format = cuda::GemvWeights::Q3_K;
        break;
      case GgmlType::Q4_K:
        format = cuda::GemvWeights::Q4_K;
        break;
      case GgmlType::Q5_K:
        format = cuda::GemvWeights::Q5_K;
        break;
      case GgmlType::Q6_K:
        format = cuda::GemvWeights::Q6_K;
        break;
      case GgmlType::IQ4_XS:
        format = cuda::GemvWeights::IQ4_XS;
        break;
      default:
        return false;
    }
    *view = {&q.data(), format, static_cast<int64_t>(q.shape()[0]),
             static_cast<int64_t>(q.shape()[1])};
  }
  return x.elem_count() == static_cast<size_t>(view->k);
}

// The kernel's operands for x (times the weight, normalised first when norm_weight is defined),
// and the tensors to lock while it is enqueued; false when the kernel does not apply.
struct Launch {
  cuda::GemvArgs args{};
  WeightView weight;
  std::vector<const Tensor*> reads;
};

bool prepare(cuda::GemvEpilogue e, const Tensor& x, const Tensor& norm_weight, double eps,
             const QLinear& w, Launch* l) {
  if (!usable(x, w, &l->weight)) return false;
  // A norm weight of x's dtype, or of f32 for f16/bf16 x (Gemma's 1 + w).
  if (norm_weight.defined() &&
      (norm_weight.device() != x.device() ||
       !fused::rms_norm_weight_fits(x.dtype(), norm_weight.dtype()) ||
       !norm_weight.is_contiguous() || norm_weight.elem_count() != x.elem_count() ||
       reinterpret_cast<uintptr_t>(ptr_of(norm_weight)) % 16 != 0)) {
    return false;
  }
  cuda::GemvArgs& a = l->args;
  a.epilogue = e;
  a.weights = l->weight.format;
  a.w = ptr_of(*l->weight.bytes);
  a.x = ptr_of(x);
  a.n = l->weight.n;
  a.k = l->weight.k;
  a.norm_weight = norm_weight.defined() ? ptr_of(norm_weight) : nullptr;
  a.norm_f32 = norm_weight.defined() && fused::f32_weight_of_half(x.dtype(), norm_weight.dtype());
  a.eps = eps;
  l->reads = {&x, l->weight.bytes};
  if (norm_weight.defined()) l->reads.push_back(&norm_weight);
  return true;
}

// One enqueue of the kernel under the read locks of l.reads (and any write locks the caller
// holds); the output `elems` long.
Tensor run(const char* name, Launch& l, const Tensor& x, size_t elems, const Shape& shape) {
  DType dt = x.dtype();
  cuda::CudaDevice& dev = device_of(x);
  auto out = std::make_unique<cuda::CudaStorage>(dev, elems, dt);
  if (l.args.epilogue == cuda::GemvEpilogue::QkvRope) {
    l.args.q = out->data();
  } else {
    l.args.out = out->data();
  }
  {
    auto locks = wick::detail::read_locks(wick::detail::Inputs(l.reads.data(), l.reads.size()));
    dev.queue().enqueue(name, dt, [&](cudaStream_t s) { cuda::launch_gemv(dt, l.args, s); });
  }
  return wick::detail::from_storage(std::move(out), shape);
}

}  // namespace

bool decode_gemv_enabled() {
  static const bool enabled = cuda::tuning().decode_gemv;
  return enabled;
}

// Plain rows: when each of the kernel's threads takes the same number of 16-byte units of a row
// (otherwise cuBLAS serves the projection better).
bool fused_linear_preferred(const QLinear& w) {
  if (w.quantized()) return true;
  const Tensor& d = w.dense();
  return d.rank() == 2 && d.dims()[1] * size_in_bytes(d.dtype()) % (16 * cuda::kGemvThreads) == 0;
}

bool fused_linear(const Tensor& x, const Tensor& norm_weight, double eps, const QLinear& w,
                  Tensor* y, Tensor* argmax) {
  Launch l;
  if (!prepare(cuda::GemvEpilogue::Store, x, norm_weight, eps, w, &l) ||
      (argmax != nullptr && !cuda::tuning().gemv_argmax)) {
    return false;
  }
  cuda::CudaDevice& dev = device_of(x);
  std::unique_ptr<cuda::CudaStorage> index;
  if (argmax != nullptr) {
    index = std::make_unique<cuda::CudaStorage>(dev, 1, DType::U32);
    l.args.argmax = static_cast<uint32_t*>(index->data());
  }
  if (!cuda::gemv_fits(x.dtype(), l.args)) return false;
  std::vector<size_t> dims = x.dims();
  dims.back() = static_cast<size_t>(l.weight.n);
  *y = run("linear_gemv", l, x, static_cast<size_t>(l.weight.n), Shape(dims));
  if (argmax != nullptr) {
    dims.pop_back();
    *argmax = wick::detail::from_storage(std::move(index), Shape(dims));
  }
  return true;
}

bool fused_qkv_rope(const Tensor& x, const Tensor& norm_weight, double eps, const QLinear& wqkv,
                    const Tensor& bias, size_t h, size_t h_kv, const Tensor& cos, const Tensor& sin,
                    const Tensor& k_cache, const Tensor& v_cache, const Tensor& position, Tensor* q,
                    const Tensor& slot) {
  Launch l;
  const bool one_slot = slot.defined() && slot.elem_count() == 1 && slot.dtype() == DType::U32 &&
                        slot.device() == x.device();
  if (!prepare(cuda::GemvEpilogue::QkvRope, x, norm_weight, eps, wqkv, &l) ||
      (slot.defined() ? !one_slot : k_cache.dims()[0] != 1) || !k_cache.is_contiguous() ||
      !v_cache.is_contiguous() || k_cache.shape() != v_cache.shape() || !cos.is_contiguous() ||
      !sin.is_contiguous() || cos.rank() != 2 || cos.shape() != sin.shape() ||
      cos.dtype() != x.dtype() || sin.dtype() != x.dtype() ||
      (bias.defined() && (!bias.is_contiguous() || bias.dtype() != x.dtype()))) {
    return false;
  }
  size_t d = k_cache.dims()[3];
  cuda::GemvArgs& a = l.args;
  a.bias = bias.defined() ? ptr_of(bias) : nullptr;
  a.cos = ptr_of(cos);
  a.sin = ptr_of(sin);
  a.k_cache = ptr_of(k_cache);
  a.v_cache = ptr_of(v_cache);
  a.position = static_cast<const uint32_t*>(ptr_of(position));
  a.slot = slot.defined() ? static_cast<const uint32_t*>(ptr_of(slot)) : nullptr;
  a.h = static_cast<int64_t>(h);
  a.h_kv = static_cast<int64_t>(h_kv);
  a.d = static_cast<int64_t>(d);
  a.max_len = static_cast<int64_t>(k_cache.dims()[2]);
  a.rot_half = static_cast<int64_t>(cos.dims()[1]);
  // Its blocks, launched as the down projection before them retires, ask the L2 for the rest of
  // their rows before pdl_wait (GemvArgs::prefetch_rows); with the end asks of the projection
  // before, this fills the gap between that projection's end and qkv's first block.
  a.prefetch_rows = cuda::tuning().qkv_prefetch;
  if (!cuda::gemv_fits(x.dtype(), a)) return false;
  for (const Tensor* t : {&cos, &sin, &position}) l.reads.push_back(t);
  if (bias.defined()) l.reads.push_back(&bias);
  if (slot.defined()) l.reads.push_back(&slot);
  std::lock_guard write_k(k_cache.impl()->storage->mutex());
  std::lock_guard write_v(v_cache.impl()->storage->mutex());
  *q = run("qkv_rope_gemv", l, x, h * d, Shape{1, h, 1, d});
  return true;
}

// Plain weights on x's device that bulk requests can address (contiguous, 16-byte aligned).
const Tensor* plain_ahead(const Tensor& x, const QLinear* next) {
  if (next == nullptr || next->quantized()) return nullptr;
  const Tensor& d = next->dense();
  const bool ok = d.device() == x.device() && d.is_contiguous() &&
                  reinterpret_cast<uintptr_t>(ptr_of(d)) % 16 == 0;
  return ok ? &d : nullptr;
}

// How much of the next projection's plain weights a projection's blocks ask the L2 for
// (GemvArgs::l2_next). `early`: the output projection, launched as the attention starts, asks for
// the start of each half of gate/up while the HBM idles under the attention, capped at half the
// weight so that most of it still streams behind the kernel's own loads
// (TuningOverrides::l2_next_mb). Otherwise a latency-bound projection (weights up to
// kLatencyBoundBytes) asks for the next one's first rows as it starts, for the HBM's idle time at
// its end (TuningOverrides::l2_tail_mb). A larger projection asks for `end_bytes` instead, from its
// last kL2EndBlocks blocks as each finishes (its last wave: the HBM idles as they end).
constexpr int kL2EndBlocks = 512;

// MB asked through `forced_mb` (TuningOverrides::l2_end_mb or l2_end_gu_mb, -1 when not set), else
// `bytes`.
int64_t end_bytes_or(int forced_mb, int64_t bytes) {
  return forced_mb >= 0 ? int64_t{forced_mb} << 20 : bytes;
}

// The decode step's side branch (ask_l2_aside) asks for the first ArchTuning::l2_aside_bytes of
// plain gate/up weights over 4 MB, half from each half, and the output projection then asks for
// none.

// Bytes ask_l2_aside asks for from each half of `next` (x's projection after the attention), 0
// when it asks for none (TuningOverrides::l2_aside_mb sets the total; 0 turns it off).
int64_t aside_region(const Tensor& x, const QLinear* next) {
  const int mb = cuda::tuning().l2_aside_mb;
  const Tensor* ahead = plain_ahead(x, next);
  if (mb == 0 || ahead == nullptr) return 0;
  const int64_t bytes = bytes_of(*ahead);
  const int64_t half = bytes / 2;
  if (bytes <= cuda::kLatencyBoundBytes || half % 16 != 0) return 0;
  const int64_t want = mb > 0 ? int64_t{mb} << 20 : cuda::tuning().l2_aside_bytes;
  return std::min(half, want / 2) / 16 * 16;
}

void ask_l2_for_next(const Launch& l, const Tensor& x, const QLinear* next, bool early,
                     int64_t end_bytes, cuda::GemvArgs& a) {
  const Tensor* ahead = plain_ahead(x, next);
  if (ahead == nullptr) return;
  const int64_t bytes = bytes_of(*ahead);
  int64_t region = 0, stride = 0;  // bytes asked from the start of each of two regions, apart
  bool at_end = false;             // asked by the last blocks as they finish
  if (early) {
    const int64_t half = bytes / 2;
    if (half % 16 != 0 || aside_region(x, next) > 0) return;
    const int forced = cuda::tuning().l2_next_mb;
    const int64_t total =
        forced >= 0 ? int64_t{forced} << 20 : std::min(cuda::tuning().l2_next_bytes, half);
    region = std::min(half, total / 2) / 16 * 16;
    stride = half;
  } else {
    const Tensor& own = *l.weight.bytes;
    const int forced = cuda::tuning().l2_tail_mb;
    const bool latency_bound = bytes_of(own) <= cuda::kLatencyBoundBytes;
    // Only the plain-row kernel takes end asks (gemv_kernel): a large GGML projection asks for
    // none.
    at_end = forced < 0 && !latency_bound;
    if (at_end && l.weight.format != cuda::GemvWeights::Dense) return;
    const int64_t want = forced >= 0 ? int64_t{forced} << 20
                         : at_end    ? end_bytes
                                     : cuda::tuning().l2_tail_bytes;
    region = std::min(bytes, want) / 2 / 16 * 16;
    stride = region;  // the second region goes on where the first ends
  }
  if (region == 0) return;
  if (at_end) a.l2_next_end_blocks = kL2EndBlocks;
  a.l2_next = ptr_of(*ahead);
  a.l2_next_bytes = region;
  a.l2_next_half = stride;
}

void ask_l2_aside(const Tensor& x, const QLinear& next) {
  const int64_t region = aside_region(x, &next);
  if (region == 0) return;
  const Tensor& w = next.dense();
  const void* base = ptr_of(w);
  auto lock = wick::detail::read_locks({&w});
  device_of(x).queue().enqueue_aside(
      [&](cudaStream_t s) { cuda::launch_l2_aside(base, region, bytes_of(w) / 2, s); });
}

bool fused_gate_up(const Tensor& x, const Tensor& norm_weight, double eps, const QLinear& w_gate_up,
                   GatedActivation activation, Tensor* act, const QLinear* next) {
  Launch l;
  const cuda::GemvEpilogue e = activation == GatedActivation::GeluTanh
                                   ? cuda::GemvEpilogue::GeluMul
                                   : cuda::GemvEpilogue::SiluMul;
  if (!prepare(e, x, norm_weight, eps, w_gate_up, &l) || !cuda::gemv_fits(x.dtype(), l.args)) {
    return false;
  }
  ask_l2_for_next(l, x, next, false,
                  end_bytes_or(cuda::tuning().l2_end_gu_mb, cuda::tuning().l2_end_gate_up_bytes),
                  l.args);
  size_t n = static_cast<size_t>(l.weight.n) / 2;
  *act = run(activation == GatedActivation::GeluTanh ? "gate_up_gelu_gemv" : "gate_up_silu_gemv", l,
             x, n, Shape{1, 1, n});
  return true;
}

bool fused_project_add(const Tensor& x, const QLinear& w, const Tensor& residual, Tensor* sum,
                       bool prefetch_rows, const QLinear* next) {
  Launch l;
  if (!prepare(cuda::GemvEpilogue::Add, x, Tensor(), 0, w, &l) ||
      residual.elem_count() != static_cast<size_t>(l.weight.n) || !residual.is_contiguous() ||
      residual.dtype() != x.dtype() || residual.device() != x.device()) {
    return false;
  }
  l.args.residual = ptr_of(residual);
  l.args.prefetch_rows = prefetch_rows;
  ask_l2_for_next(l, x, next, prefetch_rows,
                  end_bytes_or(cuda::tuning().l2_end_mb, cuda::tuning().l2_end_project_add_bytes),
                  l.args);
  if (!cuda::gemv_fits(x.dtype(), l.args)) return false;
  l.reads.push_back(&residual);
  *sum = run("project_add_gemv", l, x, residual.elem_count(), residual.shape());
  return true;
}

}  // namespace wick::cuda
