#pragma once
// Decode tokens read back without waiting for the steps queued after them, so the host can queue
// the next steps before it reads these and the GPU does not wait for the host between them (a
// stream-ordered read-back would wait for every step queued before it). TokenMailbox: where the
// graph-captured greedy decode step leaves its token, pinned host memory written by the step's
// last kernel. PendingTokens: a copy of a window of steps' tokens to pinned host memory.

#include <cstdint>
#include <memory>
#include <vector>

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

/// The U32 tokens of a device tensor, copied to the host after the work queued before them.
class PendingTokens {
 public:
  /// Enqueues the copy of `tokens` (contiguous U32 on CUDA). BackendError without CUDA.
  explicit PendingTokens(const Tensor& tokens);
  /// Waits for the copy still under way (a window whose tokens nobody read).
  ~PendingTokens();
  PendingTokens(const PendingTokens&) = delete;
  PendingTokens& operator=(const PendingTokens&) = delete;

  /// Waits for the copy (so for the work queued before it, not after) and returns the tokens;
  /// rethrows the errors of that work. Once.
  std::vector<uint32_t> wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wick::detail
