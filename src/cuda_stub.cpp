// Built when WICK_CUDA is OFF: the CUDA entry points answer "built without CUDA". The settings
// (cuda_allow_tf32 and the like) live in cuda_config.cpp, shared with the CUDA build.

#include "backend.h"
#include "token_mailbox.h"
#include "wick/cuda.h"
#include "wick/error.h"

namespace wick::cuda {

BackendDevice& device(int ordinal) {
  throw BackendError("no CUDA device: wick was built without CUDA (cuda:" +
                     std::to_string(ordinal) + " requested)");
}

int device_count() {
  return 0;
}

}  // namespace wick::cuda

namespace wick::detail {

struct TokenMailbox::Impl {};

TokenMailbox::TokenMailbox(const Device& device) {
  cuda::device(device.ordinal());  // throws: built without CUDA
}
TokenMailbox::~TokenMailbox() = default;
void TokenMailbox::advance(const Tensor&, const Tensor&) {}
void TokenMailbox::clear() {}
uint32_t TokenMailbox::wait(uint32_t) {
  return 0;
}

struct PendingTokens::Impl {};

PendingTokens::PendingTokens(const Tensor& tokens) {
  cuda::device(tokens.device().ordinal());  // throws: built without CUDA
}
PendingTokens::~PendingTokens() = default;
std::vector<uint32_t> PendingTokens::wait() {
  return {};
}

}  // namespace wick::detail

namespace wick {

CudaMemoryStats cuda_memory_stats(int ordinal) {
  cuda::device(ordinal);  // throws: built without CUDA
  return {};
}

void cuda_empty_cache(int ordinal) {
  cuda::device(ordinal);
}

CudaQueueStats cuda_queue_stats(int ordinal) {
  cuda::device(ordinal);
  return {};
}

struct CudaGraph::Impl {};

CudaGraph CudaGraph::capture(const Device& device, const std::function<void()>&) {
  cuda::device(device.is_cuda() ? device.ordinal() : 0);  // throws: built without CUDA
  return {};
}
void CudaGraph::replay() const {
  cuda::device(0);
}
size_t CudaGraph::node_count() const {
  return 0;
}
size_t CudaGraph::reserved_bytes() const {
  return 0;
}

}  // namespace wick
