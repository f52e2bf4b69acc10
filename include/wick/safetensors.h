#pragma once
// safetensors files: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the tensor bytes. Files are memory-mapped; on the CPU a
// tensor views the mapping (the mapping lives while any tensor uses it).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/shape.h"
#include "wick/tensor.h"

namespace wick::safetensors {

/// Where one tensor lies in its file.
struct TensorInfo {
  DType dtype = DType::F32;
  Shape shape;
  std::string dtype_name;  // as written in the file ("F32", "BF16", ...)
  size_t data_offset = 0;  // from the start of the file
  size_t byte_size = 0;
  bool supported = true;  // false for safetensors dtypes wick has no type for (I8, F8_E4M3...)
};

/// An opened safetensors file (cheap to copy: copies share the mapping). Immutable after open:
/// every method may be called from several threads at once.
class File {
 public:
  /// Maps and validates `path`. Throws FormatError naming the file for a malformed header (also:
  /// a header over 100 MB or nested deeper than 128 levels, a rank over 64, a path that is not a
  /// regular file).
  static File open(const std::string& path);
  /// The same from bytes in memory; `name` stands for the path in errors.
  static File from_bytes(std::vector<uint8_t> bytes, const std::string& name = "<memory>");

  const std::string& path() const;
  /// Tensor names in the order of their data in the file.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  /// The "__metadata__" string map (empty when absent).
  const std::map<std::string, std::string>& metadata() const;
  /// Dtype, shape and byte range. Throws wick::Error for a missing name, UnsupportedDType for a
  /// dtype wick has no type for (naming the tensor and the file).
  const TensorInfo& info(const std::string& name) const;
  /// The tensor on `device`: on the CPU a view of the mapping when the data is aligned to its
  /// element size (a copy otherwise); on CUDA copied from the mapping through pinned staging.
  Tensor get(const std::string& name, const Device& device = Device::cpu()) const;
  /// Every tensor.
  std::map<std::string, Tensor> load_all(const Device& device = Device::cpu()) const;

  struct Impl;

 private:
  explicit File(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

/// Every tensor of the file at `path`.
std::map<std::string, Tensor> load(const std::string& path, const Device& device = Device::cpu());

/// Writes `tensors` (any device, any layout: written row-major) and the string `metadata` to
/// `path`, atomically (a temporary file in the same folder, then a rename).
void save(const std::map<std::string, Tensor>& tensors, const std::string& path,
          const std::map<std::string, std::string>& metadata = {});

/// A checkpoint split over several files by a `model.safetensors.index.json` ("weight_map":
/// tensor name -> shard file, relative to the index's folder); a single .safetensors path opens
/// as one shard. Immutable after open: every method may be called from several threads at once.
class ShardedFile {
 public:
  /// Opens the index (or single file) and every shard it lists. Throws FormatError naming the
  /// index for a malformed index, a missing shard, a shard path leaving the index's folder, a
  /// tensor missing from its shard or a name in two shards.
  static ShardedFile open(const std::string& path);
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  /// The index's "metadata" object, values as JSON text (or the single file's metadata).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo& info(const std::string& name) const;
  Tensor get(const std::string& name, const Device& device = Device::cpu()) const;
  /// The shard holding `name`.
  const File& file_of(const std::string& name) const;
  const std::vector<File>& shards() const { return shards_; }

 private:
  std::vector<File> shards_;
  std::map<std::string, size_t> shard_of_;
  std::map<std::string, std::string> metadata_;
  std::string path_;
};

/// Every tensor of a sharded checkpoint (index path) or single file.
std::map<std::string, Tensor> load_sharded(const std::string& path,
                                           const Device& device = Device::cpu());

}  // namespace wick::safetensors
