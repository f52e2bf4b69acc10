// The CUDA kernels of fused::AddRmsNormOp, AddRmsNormedOp (rms_norm's kernels, fused.cu),
// SiluMulOp, RopeWriteOp and AttendToPositionOp (src/fused/decoder.h, kv_write.h; checked by their
// front ends), and the token mailbox.

#include "cuda/decoder_ops.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>

#include "cuda/cuda_storage.h"
#include "cuda/fused_kernels.h"
#include "fused/decoder.h"
#include "fused/kv_write.h"
#include "fused_op.h"
#include "tensor_internal.h"
#include "token_mailbox.h"

namespace wick {

namespace {

const void* ptr_of(const Tensor& t) {
  const TensorImpl& i = *t.impl();
  return cuda::as_cuda(i.storage->backend()).data_at(i.layout.start_offset());
}

cuda::CudaDevice& device_of(const Tensor& t) {
  return cuda::as_cuda(t.impl()->storage->backend()).cuda_device();
}

}  // namespace

namespace fused {

std::optional<TensorList> AddRmsNormOp::cuda_kernel(const AddRmsNormOp& op, const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor& x = in[0];
  const Tensor& delta = in[1];
  const Tensor& weight = in[2];
  double eps = op.eps;
  size_t rows = x.dims()[0], d = x.dims()[1];
  cuda::CudaDevice& dev = device_of(x);
  auto sum = std::make_unique<cuda::CudaStorage>(dev, rows * d, x.dtype());
  auto normed = std::make_unique<cuda::CudaStorage>(dev, rows * d, x.dtype());
  dev.queue().enqueue("add_rms_norm", x.dtype(), [&](cudaStream_t s) {
    cuda::launch_add_rms_norm(x.dtype(), ptr_of(x), ptr_of(delta), ptr_of(weight), sum->data(),
                              normed->data(), rows, d, eps, s);
  });
  return TensorList{detail::from_storage(std::move(sum), x.shape()),
                    detail::from_storage(std::move(normed), x.shape())};
}

std::optional<TensorList> AddRmsNormedOp::cuda_kernel(const AddRmsNormedOp& op,
                                                      const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor& x = in[0];
  const Tensor& delta = in[1];
  const Tensor& weight = in[2];
  double eps = op.eps;
  size_t rows = x.dims()[0], d = x.dims()[1];
  cuda::CudaDevice& dev = device_of(x);
  auto out = std::make_unique<cuda::CudaStorage>(dev, rows * d, x.dtype());
  // rms_norm's kernels with x as their residual: the norm's summation order, so its bits.
  dev.queue().enqueue(op.name(), x.dtype(), [&](cudaStream_t s) {
    if (weight.dtype() != x.dtype()) {
      cuda::launch_rms_norm_f32_weight(x.dtype(), ptr_of(delta),
                                       static_cast<const float*>(ptr_of(weight)), out->data(), rows,
                                       d, eps, s, ptr_of(x));
    } else {
      cuda::launch_norm(x.dtype(), true, ptr_of(delta), ptr_of(weight), nullptr, out->data(), rows,
                        d, eps, s, ptr_of(x));
    }
  });
  return TensorList{detail::from_storage(std::move(out), x.shape())};
}

std::optional<TensorList> SiluMulOp::cuda_kernel(const SiluMulOp& op, const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor& gate_up = in[0];
  size_t rows = gate_up.dims()[0], n = gate_up.dims()[1] / 2;
  cuda::CudaDevice& dev = device_of(gate_up);
  auto out = std::make_unique<cuda::CudaStorage>(dev, rows * n, gate_up.dtype());
  dev.queue().enqueue("silu_mul", gate_up.dtype(), [&](cudaStream_t s) {
    cuda::launch_silu_mul(gate_up.dtype(), ptr_of(gate_up), out->data(), rows, n, s);
  });
  return TensorList{detail::from_storage(std::move(out), Shape{rows, n})};
}

std::optional<TensorList> RopeWriteOp::cuda_kernel(const RopeWriteOp& op, const TensorList& in) {
  const Tensor &qkv = in[0], &bias = in[1], &cos = in[2], &sin = in[3];
  const Tensor &k_cache = in[4], &v_cache = in[5], &position = in[6], &slots = in[7];
  const Tensor &q_norm = in[8], &k_norm = in[9];
  const bool paged = slots.defined();
  size_t h = op.h, h_kv = op.h_kv, d = k_cache.dims()[3];
  size_t b = paged ? 1 : qkv.dims()[0], s = paged ? qkv.dims()[0] : qkv.dims()[1];
  auto ptr_or_null = [](const Tensor& t) { return t.defined() ? ptr_of(t) : nullptr; };
  cuda::RopeWriteArgs a{};
  a.qkv = ptr_of(qkv);
  a.bias = ptr_or_null(bias);
  a.q_norm = ptr_or_null(q_norm);
  a.k_norm = ptr_or_null(k_norm);
  a.norms_f32 = (q_norm.defined() && q_norm.dtype() == DType::F32) ||
                (k_norm.defined() && k_norm.dtype() == DType::F32);
  a.eps = op.eps;
  a.cos = ptr_of(cos);
  a.sin = ptr_of(sin);
  a.k_cache = const_cast<void*>(ptr_of(k_cache));
  a.v_cache = const_cast<void*>(ptr_of(v_cache));
  a.position = static_cast<const uint32_t*>(ptr_of(position));
  a.slots = static_cast<const uint32_t*>(ptr_or_null(slots));
  a.b = static_cast<int64_t>(b);
  a.s = static_cast<int64_t>(s);
  a.h = static_cast<int64_t>(h);
  a.h_kv = static_cast<int64_t>(h_kv);
  a.d = static_cast<int64_t>(d);
  a.max_len = static_cast<int64_t>(k_cache.dims()[2]);
  a.rot_half = static_cast<int64_t>(cos.dims()[1]);
  if (!cuda::rope_write_fits(a)) return std::nullopt;
  auto locks = wick::detail::lock_inputs(op, in);
  cuda::CudaDevice& dev = device_of(qkv);
  auto q = std::make_unique<cuda::CudaStorage>(dev, b * h * s * d, qkv.dtype());
  a.q = q->data();
  dev.queue().enqueue(op.name(), qkv.dtype(),
                      [&](cudaStream_t st) { cuda::launch_rope_write(qkv.dtype(), a, st); });
  return TensorList{
      wick::detail::from_storage(std::move(q), paged ? Shape{s, h, d} : Shape{b, h, s, d})};
}

std::optional<TensorList> AttendToPositionOp::cuda_kernel(const AttendToPositionOp& op,
                                                          const TensorList& in) {
  auto locks = wick::detail::lock_inputs(op, in);
  const Tensor &q = in[0], &keys = in[1], &values = in[2], &position = in[3];
  bool launch_next_early = op.launch_next_early;
  cuda::AttentionArgs a;
  a.q = ptr_of(q);
  a.k = ptr_of(keys);
  a.v = ptr_of(values);
  a.last_key = static_cast<const uint32_t*>(ptr_of(position));
  a.launch_next_early = launch_next_early;
  for (int i = 0; i < 3; ++i) {
    a.q_strides[i] = static_cast<int64_t>(q.layout().strides()[i]);
    a.k_strides[i] = static_cast<int64_t>(keys.layout().strides()[i]);
    a.v_strides[i] = static_cast<int64_t>(values.layout().strides()[i]);
  }
  a.b = static_cast<int>(q.dims()[0]);
  a.h = static_cast<int>(q.dims()[1]);
  a.s = 1;
  a.d = static_cast<int>(q.dims()[3]);
  a.h_kv = static_cast<int>(keys.dims()[1]);
  a.s_kv = static_cast<int>(keys.dims()[2]);
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.d)));
  bool last_dims_contiguous = q.layout().strides()[3] == 1 && keys.layout().strides()[3] == 1 &&
                              values.layout().strides()[3] == 1;
  if (!last_dims_contiguous || !cuda::attention_last_key_fits(q.dtype(), a)) return std::nullopt;
  cuda::CudaDevice& dev = device_of(q);
  size_t n = q.elem_count();
  auto storage = std::make_unique<cuda::CudaStorage>(dev, n, q.dtype());
  a.out = storage->data();
  cuda::TempBuffers temps(dev);
  dev.queue().enqueue(op.name(), q.dtype(), [&](cudaStream_t st) {
    cuda::launch_attention(q.dtype(), a, temps.alloc(), st);
  });
  return TensorList{wick::detail::from_storage(std::move(storage), q.shape())};
}

}  // namespace fused

namespace detail {

// Slots by position: the host reads a step's token while up to two graphs of at most 8 steps each
// (Generator, TuningOverrides::graph_steps) are queued after it.
constexpr int kMailboxSlots = 32;

struct TokenMailbox::Impl {
  cuda::CudaDevice* device = nullptr;
  uint64_t* slots = nullptr;         // pinned, mapped: (position << 32) | token
  uint64_t* device_slots = nullptr;  // the same memory as the GPU addresses it
};

TokenMailbox::TokenMailbox(const Device& device) : impl_(std::make_unique<Impl>()) {
  if (!device.is_cuda())
    throw DeviceMismatch(str("TokenMailbox: needs a CUDA device, got ", device));
  impl_->device = &cuda::cuda_device(device.ordinal());
  cuda::make_current(device.ordinal());
  void* p = nullptr;
  WICK_CUDA_CHECK(cudaHostAlloc(&p, kMailboxSlots * sizeof(uint64_t), cudaHostAllocMapped));
  impl_->slots = static_cast<uint64_t*>(p);
  WICK_CUDA_CHECK(cudaHostGetDevicePointer(&p, impl_->slots, 0));
  impl_->device_slots = static_cast<uint64_t*>(p);
  clear();
}

TokenMailbox::~TokenMailbox() {
  if (impl_->slots == nullptr) return;
  try {
    impl_->device->queue().synchronize();  // a queued step may still write the slots
  } catch (...) {
    // Destructors stay silent; the error was or will be reported by the queue's user.
  }
  (void)cudaFreeHost(impl_->slots);
}

void TokenMailbox::advance(const Tensor& next, const Tensor& input) {
  if (next.dtype() != DType::U32 || next.elem_count() != 1 || input.dtype() != DType::U32 ||
      input.elem_count() != 2 || !input.is_contiguous() || next.device() != input.device() ||
      !input.device().is_cuda() || input.device().ordinal() != impl_->device->ordinal()) {
    throw ShapeMismatch(str("TokenMailbox::advance: next must be (1) u32 and input (2) u32 ",
                            "contiguous, on cuda:", impl_->device->ordinal(), "; got ",
                            next.shape(), " ", next.dtype(), " on ", next.device(), " and ",
                            input.shape(), " ", input.dtype(), " on ", input.device()));
  }
  Storage* in_storage = input.impl()->storage.get();
  StorageLocks locks({next.impl()->storage.get()}, {in_storage});
  auto* in = static_cast<uint32_t*>(const_cast<void*>(ptr_of(input)));
  uint64_t* slots = impl_->device_slots;
  impl_->device->queue().enqueue("advance_decode", DType::U32, [&](cudaStream_t s) {
    cuda::launch_advance_decode(static_cast<const uint32_t*>(ptr_of(next)), in, slots,
                                kMailboxSlots, s);
  });
  in_storage->bump_version();  // as Tensor::assign: recorded ops that saved input are stale
}

void TokenMailbox::clear() {
  for (int i = 0; i < kMailboxSlots; ++i) {
    std::atomic_ref<uint64_t>(impl_->slots[i]).store(0, std::memory_order_release);
  }
}

uint32_t TokenMailbox::wait(uint32_t position) {
  std::atomic_ref<uint64_t> slot(impl_->slots[position % kMailboxSlots]);
  auto posted = [&](uint64_t v) { return static_cast<uint32_t>(v >> 32) == position; };
  while (true) {
    uint64_t v = slot.load(std::memory_order_acquire);
    if (posted(v)) return static_cast<uint32_t>(v);
    if (impl_->device->queue().finished("TokenMailbox::wait")) {
      v = slot.load(std::memory_order_acquire);
      if (posted(v)) return static_cast<uint32_t>(v);
      throw BackendError(str("TokenMailbox::wait: the device is idle and no decode step left a ",
                             "token for position ", position));
    }
  }
}

struct PendingTokens::Impl {
  cuda::CudaDevice* device = nullptr;
  std::shared_ptr<void> buffer;  // a pinned chunk of the device's staging
  cudaEvent_t done = nullptr;    // recorded after the copy into it
  size_t count = 0;
  bool waited = false;

  ~Impl() {
    if (done == nullptr) return;
    // The copy writes the chunk until its event: wait before the chunk goes back to the pool.
    if (!waited && cudaEventSynchronize(done) != cudaSuccess) (void)cudaGetLastError();
    (void)cudaEventDestroy(done);
  }
};

PendingTokens::PendingTokens(const Tensor& tokens) : impl_(std::make_unique<Impl>()) {
  if (tokens.dtype() != DType::U32 || !tokens.is_contiguous() || !tokens.device().is_cuda()) {
    throw ShapeMismatch(str("PendingTokens: tokens must be contiguous u32 on CUDA; got ",
                            tokens.shape(), " ", tokens.dtype(), " on ", tokens.device()));
  }
  impl_->device = &cuda::cuda_device(tokens.device().ordinal());
  impl_->count = tokens.elem_count();
  cuda::make_current(tokens.device().ordinal());
  impl_->buffer = impl_->device->staging().upload_chunk(impl_->count * sizeof(uint32_t));
  WICK_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->done, cudaEventDisableTiming));
  auto locks = read_locks({&tokens});
  impl_->device->queue().read_back_later(ptr_of(tokens), impl_->count * sizeof(uint32_t),
                                         impl_->buffer.get(), impl_->done);
}

PendingTokens::~PendingTokens() = default;

std::vector<uint32_t> PendingTokens::wait() {
  if (impl_->waited) throw Error("PendingTokens::wait: the tokens were read already");
  impl_->device->queue().wait_for(impl_->done, "PendingTokens::wait");
  impl_->waited = true;
  const auto* p = static_cast<const uint32_t*>(impl_->buffer.get());
  return std::vector<uint32_t>(p, p + impl_->count);
}

}  // namespace detail

}  // namespace wick
