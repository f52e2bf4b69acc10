// libFuzzer target: safetensors headers and data. Any input must either load or throw a
// wick::Error; sanitizers report everything else.

#include <cstdint>
#include <vector>

#include "wick/formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = wick::safetensors::File::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
    (void)file.metadata();
    for (const auto& name : file.names()) {
      try {
        wick::Tensor t = file.get(name);
        if (t.elem_count() <= 4096) (void)t.to_vec_f64();  // touches every byte of the view
      } catch (const wick::Error&) {
      }
    }
  } catch (const wick::Error&) {
  }
  return 0;
}
