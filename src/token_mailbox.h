#pragma once
// Where the graph-captured greedy decode step leaves its token for the host: pinned host memory
// written by the step's last kernel. The host can queue the next step before it reads this one's
// token, so the GPU does not wait for the host between steps (a stream-ordered read-back would
// wait for every step queued before it).

#include <cstdint>
#include <memory>

#include "wick/tensor.h"

namespace wick::detail {

class TokenMailbox {
 public:
  /// BackendError without CUDA.
  explicit TokenMailbox(const Device& device);
  ~TokenMailbox();
  TokenMailbox(const TokenMailbox&) = delete;
  TokenMailbox& operator=(const TokenMailbox&) = delete;

  /// Enqueues the step's end: input, (2) U32 (token, position), becomes (next, position + 1),
  /// next being (1) U32, and the mailbox gets next for position + 1. Both on this device.
  void advance(const Tensor& next, const Tensor& input);
  /// Forgets the tokens of earlier steps; no step that writes may be queued.
  void clear();
  /// The token of the step that advanced the input to `position`: waits for that step, not for
  /// later ones; rethrows the errors of failed device work (BackendError when the device went
  /// idle with no token for `position`).
  uint32_t wait(uint32_t position);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wick::detail
