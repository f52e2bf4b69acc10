// libFuzzer target: GGUF metadata, tensor infos and dequantisation.

#include <cstdint>
#include <vector>

#include "wick/formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto file = wick::gguf::File::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    for (const auto& [key, value] : file.metadata()) (void)value.to_string();
    (void)file.architecture();
    for (const auto& name : file.tensor_names()) {
      try {
        if (file.info(name).shape.elem_count() > (1u << 16)) continue;
        wick::Tensor t = file.get(name);
        (void)t.to_vec_f64();
        (void)file.get_quantized(name);
      } catch (const wick::Error&) {
      }
    }
  } catch (const wick::Error&) {
  }
  return 0;
}
