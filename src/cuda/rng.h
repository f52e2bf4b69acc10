#pragma once
// The random generator state of one GPU. The generator is counter-based (random.cu): (seed,
// offset) alone decide the values, so a draw only needs to reserve its range of the counter.

#include <cstddef>
#include <cstdint>
#include <mutex>

namespace wick::cuda {

class RngState {
 public:
  struct Draw {
    uint64_t seed;
    uint64_t offset;
  };

  /// The seed and counter offset for `count` values. Counter blocks hold 4 values: the next draw
  /// starts on a fresh block.
  Draw take(size_t count) {
    std::lock_guard lock(mutex_);
    Draw d{seed_, offset_};
    offset_ += (count + 3) / 4 * 4;
    return d;
  }
  /// Restarts the sequence of `seed`.
  void set_seed(uint64_t seed) {
    std::lock_guard lock(mutex_);
    seed_ = seed;
    offset_ = 0;
  }

 private:
  std::mutex mutex_;
  uint64_t seed_ = 299792458;
  uint64_t offset_ = 0;
};

}  // namespace wick::cuda
