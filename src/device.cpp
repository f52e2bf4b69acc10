#include "wick/device.h"

#include <cstdlib>

#include "backend.h"
#include "decode_plan.h"
#include "util.h"
#include "wick/error.h"

namespace wick {

Device Device::parse(const std::string& name) {
  if (name == "cpu") return cpu();
  if (name == "cuda") return cuda(0);
  if (name.rfind("cuda:", 0) == 0 && name.size() > 5) {
    char* end = nullptr;
    long ordinal = std::strtol(name.c_str() + 5, &end, 10);
    if (*end == '\0' && ordinal >= 0 && ordinal < 1024) return cuda(static_cast<int>(ordinal));
  }
  throw Error(str("device: unknown device '", name, "' (expected cpu, cuda or cuda:N)"));
}

void Device::synchronize() const {
  backend_device(*this).synchronize();
}

void Device::set_seed(uint64_t seed) const {
  backend_device(*this).set_seed(seed);
}

std::string Device::to_string() const {
  return is_cpu() ? "cpu" : "cuda:" + std::to_string(ordinal_);
}

std::ostream& operator<<(std::ostream& os, const Device& device) {
  return os << device.to_string();
}

bool cuda_is_available() {
  return cuda::device_count() > 0;
}

int cuda_device_count() {
  return cuda::device_count();
}

std::unique_ptr<DecodePlan> BackendDevice::decode_plan(const DecoderWeights&) {
  return nullptr;
}

BackendDevice& backend_device(const Device& device) {
  if (device.is_cpu()) return cpu::device();
  return cuda::device(device.ordinal());
}

}  // namespace wick
