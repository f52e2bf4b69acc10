// CudaGraph (wick/cuda.h): one function's device work recorded once and replayed.

#include "cuda/check.h"
#include "cuda/cuda_device.h"
#include "util.h"
#include "wick/cuda.h"

namespace wick {

struct CudaGraph::Impl {
  cuda::CudaDevice* device = nullptr;
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  size_t ops = 0;
  std::vector<cuda::Allocator::Block> reserved;
  std::vector<std::shared_ptr<const void>> kept;

  ~Impl() {
    if (exec != nullptr) {
      // A replay may still be queued: the executable is destroyed after the stream has run it
      // (an open graph-mode batch is launched first: a capturing stream cannot be waited on).
      try {
        device->queue().flush();
      } catch (...) {
        // Destructors stay silent; a lost batch is reported at the next synchronize.
      }
      (void)cudaStreamSynchronize(device->stream());
      (void)cudaGraphExecDestroy(exec);
    }
    device->allocator().release_reserved(reserved);
  }
};

CudaGraph CudaGraph::capture(const Device& device, const std::function<void()>& record) {
  if (!device.is_cuda()) {
    throw DeviceMismatch(str("CudaGraph::capture: needs a CUDA device, got ", device));
  }
  cuda::CudaDevice& dev = cuda::cuda_device(device.ordinal());
  auto impl = std::make_shared<Impl>();
  impl->device = &dev;
  dev.begin_step_capture();
  cudaGraph_t graph = nullptr;
  try {
    record();
  } catch (...) {
    try {
      graph = dev.end_step_capture(impl->reserved, impl->kept, impl->ops);
      (void)cudaGraphDestroy(graph);
    } catch (...) {
      // The recording's own error is the one to report.
    }
    throw;
  }
  graph = dev.end_step_capture(impl->reserved, impl->kept, impl->ops);
  (void)cudaGraphGetNodes(graph, nullptr, &impl->nodes);
  cudaError_t st = cudaGraphInstantiate(&impl->exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    impl->exec = nullptr;
    throw BackendError(str("CudaGraph::capture on ", device, ": cudaGraphInstantiate of ",
                           impl->nodes, " nodes failed: ", cudaGetErrorName(st)));
  }
  CudaGraph g;
  g.impl_ = std::move(impl);
  return g;
}

void CudaGraph::replay() const {
  if (!impl_) throw Error("CudaGraph::replay: an empty graph");
  impl_->device->queue().launch_graph(impl_->exec);
}

size_t CudaGraph::node_count() const {
  return impl_ ? impl_->nodes : 0;
}

size_t CudaGraph::reserved_bytes() const {
  size_t n = 0;
  if (impl_) {
    for (const auto& b : impl_->reserved) n += b.second;
  }
  return n;
}

}  // namespace wick
