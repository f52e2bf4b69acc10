// libFuzzer target: .npy and .npz. The first byte picks the parser, the rest is the file.

#include <cstdint>
#include <vector>

#include "wick/formats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<uint8_t> bytes(data + 1, data + size);
  try {
    if (data[0] & 1) {
      for (auto& [name, t] : wick::npz::load_bytes(std::move(bytes), "fuzz.npz")) {
        if (t.elem_count() <= 4096) (void)t.to_vec_f64();
      }
    } else {
      wick::Tensor t = wick::npy::load_bytes(std::move(bytes), "fuzz.npy");
      if (t.elem_count() <= 4096) (void)t.to_vec_f64();
    }
  } catch (const wick::Error&) {
  }
  return 0;
}
