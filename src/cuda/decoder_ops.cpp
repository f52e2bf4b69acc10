// The CUDA halves of nn::add_rms_norm, nn::silu_mul (decoder_ops_backend.h) and
// nn::detail::rope_write_at_position (checked by their callers).

#include "cuda/decoder_ops.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>

#include "cuda/cuda_storage.h"
#include "cuda/fused_kernels.h"
#include "decoder_ops_backend.h"
#include "nn/kv_write.h"
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

namespace detail {

nn::ResidualNorm cuda_add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                   double eps) {
  size_t rows = x.dims()[0], d = x.dims()[1];
  cuda::CudaDevice& dev = device_of(x);
  auto sum = std::make_unique<cuda::CudaStorage>(dev, rows * d, x.dtype());
  auto normed = std::make_unique<cuda::CudaStorage>(dev, rows * d, x.dtype());
  auto locks = read_locks({&x, &delta, &weight});
  dev.queue().enqueue("add_rms_norm", x.dtype(), [&](cudaStream_t s) {
    cuda::launch_add_rms_norm(x.dtype(), ptr_of(x), ptr_of(delta), ptr_of(weight), sum->data(),
                              normed->data(), rows, d, eps, s);
  });
  return {from_storage(std::move(sum), x.shape()), from_storage(std::move(normed), x.shape())};
}

Tensor cuda_silu_mul(const Tensor& gate_up) {
  size_t rows = gate_up.dims()[0], n = gate_up.dims()[1] / 2;
  cuda::CudaDevice& dev = device_of(gate_up);
  auto out = std::make_unique<cuda::CudaStorage>(dev, rows * n, gate_up.dtype());
  auto locks = read_locks({&gate_up});
  dev.queue().enqueue("silu_mul", gate_up.dtype(), [&](cudaStream_t s) {
    cuda::launch_silu_mul(gate_up.dtype(), ptr_of(gate_up), out->data(), rows, n, s);
  });
  return from_storage(std::move(out), Shape{rows, n});
}

}  // namespace detail

namespace nn::detail {

Tensor cuda_rope_write_at_position(const Tensor& qkv, const Tensor& bias, size_t h, size_t h_kv,
                                   const Tensor& cos, const Tensor& sin, const Tensor& k_cache,
                                   const Tensor& v_cache, const Tensor& position) {
  size_t b = qkv.dims()[0], s = qkv.dims()[1], d = k_cache.dims()[3];
  cuda::CudaDevice& dev = device_of(qkv);
  auto q = std::make_unique<cuda::CudaStorage>(dev, b * h * s * d, qkv.dtype());
  cuda::RopeWriteArgs a{};
  a.qkv = ptr_of(qkv);
  a.bias = bias.defined() ? ptr_of(bias) : nullptr;
  a.cos = ptr_of(cos);
  a.sin = ptr_of(sin);
  a.q = q->data();
  a.k_cache = const_cast<void*>(ptr_of(k_cache));
  a.v_cache = const_cast<void*>(ptr_of(v_cache));
  a.position = static_cast<const uint32_t*>(ptr_of(position));
  a.b = static_cast<int64_t>(b);
  a.s = static_cast<int64_t>(s);
  a.h = static_cast<int64_t>(h);
  a.h_kv = static_cast<int64_t>(h_kv);
  a.d = static_cast<int64_t>(d);
  a.max_len = static_cast<int64_t>(k_cache.dims()[2]);
  {
    auto locks = bias.defined() ? wick::detail::read_locks({&qkv, &bias, &cos, &sin, &position})
                                : wick::detail::read_locks({&qkv, &cos, &sin, &position});
    // The caches are written: hold their locks as any op that writes a storage does.
    std::lock_guard write_k(k_cache.impl()->storage->mutex());
    std::lock_guard write_v(v_cache.impl()->storage->mutex());
    dev.queue().enqueue("rope_write", qkv.dtype(),
                        [&](cudaStream_t st) { cuda::launch_rope_write(qkv.dtype(), a, st); });
  }
  return wick::detail::from_storage(std::move(q), Shape{b, h, s, d});
}

bool cuda_attend_to_position(const Tensor& q, const Tensor& keys, const Tensor& values,
                             const Tensor& position, Tensor* out, bool launch_next_early) {
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
  if (!last_dims_contiguous || !cuda::attention_last_key_fits(q.dtype(), a)) return false;
  cuda::CudaDevice& dev = device_of(q);
  size_t n = q.elem_count();
  auto storage = std::make_unique<cuda::CudaStorage>(dev, n, q.dtype());
  a.out = storage->data();
  cuda::TempBuffers temps(dev);
  {
    auto locks = wick::detail::read_locks({&q, &keys, &values, &position});
    dev.queue().enqueue("attend_to_position", q.dtype(), [&](cudaStream_t st) {
      cuda::launch_attention(q.dtype(), a, temps.alloc(), st);
    });
  }
  *out = wick::detail::from_storage(std::move(storage), q.shape());
  return true;
}

}  // namespace nn::detail

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

}  // namespace detail

}  // namespace wick
