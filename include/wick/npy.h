#pragma once
// NumPy's .npy (one array) and .npz (a zip of .npy members, stored or deflated).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "wick/device.h"
#include "wick/tensor.h"

namespace wick::npy {

/// Loads an .npy file: dtypes '<f4' '<f8' '<f2' '<i8' '<u4' '|u1' (and '|b1' as u8), big-endian
/// variants byte-swapped, C or Fortran order (a Fortran array comes back as a transposed view).
/// FormatError naming the file for a malformed file, UnsupportedDType for other dtypes.
Tensor load(const std::string& path, const Device& device = Device::cpu());
/// The same from bytes in memory; `name` stands for the path in errors.
Tensor load_bytes(std::vector<uint8_t> bytes, const std::string& name = "<memory>",
                  const Device& device = Device::cpu());
/// Writes `t` (any layout, C order, little-endian) atomically. UnsupportedDType for bf16 (numpy
/// has no bfloat16).
void save(const Tensor& t, const std::string& path);
/// The .npy bytes of `t`.
std::vector<uint8_t> to_bytes(const Tensor& t);

}  // namespace wick::npy

namespace wick::npz {

/// Every member "<name>.npy" of an .npz file, keyed by "<name>". FormatError naming the file and
/// member for members that share bytes, that expand past 1100 times the archive's size in all,
/// or whose CRC-32 is wrong.
std::map<std::string, Tensor> load(const std::string& path, const Device& device = Device::cpu());
std::map<std::string, Tensor> load_bytes(std::vector<uint8_t> bytes,
                                         const std::string& name = "<memory>",
                                         const Device& device = Device::cpu());
/// Writes an .npz atomically: members stored (as numpy.savez) or deflated (as savez_compressed).
void save(const std::map<std::string, Tensor>& tensors, const std::string& path,
          bool compress = false);

}  // namespace wick::npz
