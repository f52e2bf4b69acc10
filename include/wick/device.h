#pragma once
// Where a tensor lives.

#include <cstdint>
#include <ostream>
#include <string>

namespace wick {

/// A device (CPU or one GPU by ordinal): a small value, safe to copy and read from any thread.
class Device {
 public:
  enum class Kind : uint8_t { Cpu, Cuda };

  static Device cpu() { return Device(Kind::Cpu, 0); }
  /// The CUDA GPU `ordinal`; using it throws BackendError when there is no such GPU.
  static Device cuda(int ordinal = 0) { return Device(Kind::Cuda, ordinal); }
  /// Parses "cpu", "cuda", "cuda:N"; throws wick::Error on anything else.
  static Device parse(const std::string& name);

  Kind kind() const { return kind_; }
  bool is_cpu() const { return kind_ == Kind::Cpu; }
  bool is_cuda() const { return kind_ == Kind::Cuda; }
  int ordinal() const { return ordinal_; }

  /// Waits for all work queued on the device (a no-op on the CPU); rethrows deferred errors.
  void synchronize() const;
  /// Seeds the device's random generator (rand, randn).
  void set_seed(uint64_t seed) const;

  /// "cpu" or "cuda:N".
  std::string to_string() const;
  bool operator==(const Device& other) const = default;

 private:
  Device(Kind kind, int ordinal) : kind_(kind), ordinal_(ordinal) {}
  Kind kind_;
  int ordinal_;
};

std::ostream& operator<<(std::ostream& os, const Device& device);

/// True when wick was built with CUDA and at least one GPU is visible.
bool cuda_is_available();
/// Number of visible GPUs (0 when built without CUDA).
int cuda_device_count();

}  // namespace wick
