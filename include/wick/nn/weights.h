#pragma once
// nn::Weights: named tensors under a prefix path, read lazily from safetensors files or a map
// (as Candle's VarBuilder). `w.pp("encoder").pp("layer").pp(0).get("weight", {768, 768})` reads
// "encoder.layer.0.weight", converted to the Weights' dtype and device.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "wick/device.h"
#include "wick/dtype.h"
#include "wick/shape.h"
#include "wick/tensor.h"

namespace wick::nn {

/// Where the named tensors of a Weights come from. Implement it to load from another format.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// Every tensor name, sorted.
  virtual std::vector<std::string> names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  /// The stored shape, without reading the data; nullopt when the name is absent.
  virtual std::optional<Shape> shape_of(const std::string& name) const = 0;
  /// Reads the tensor (its stored dtype) onto `device`; nullopt: where the source keeps it (the
  /// CPU for files).
  virtual Tensor load(const std::string& name, const std::optional<Device>& device) const = 0;
};

class Weights {
 public:
  /// Tensors from `tensors`; float tensors are converted to `dtype` on get (nullopt keeps each
  /// tensor's own dtype) and moved to `device`.
  static Weights from_map(std::map<std::string, Tensor> tensors, std::optional<DType> dtype,
                          const Device& device);
  /// Tensors as given: their own dtype and device.
  static Weights from_map(std::map<std::string, Tensor> tensors);
  /// The tensors of one or more safetensors files, memory-mapped and read when asked for; a path
  /// may also be a model.safetensors.index.json (a sharded checkpoint). Throws FormatError for a
  /// bad file, Error when a name is in two of them.
  static Weights from_safetensors(const std::vector<std::string>& paths, DType dtype,
                                  const Device& device);
  /// Any source (see WeightSource).
  Weights(std::shared_ptr<const WeightSource> source, std::optional<DType> dtype,
          const Device& device);

  /// The same tensors under `prefix.name`.
  Weights pp(const std::string& name) const;
  Weights pp(size_t index) const;
  /// The full name of `name` under this prefix ("encoder.layer.0.weight").
  std::string path(const std::string& name) const;
  const std::string& prefix() const { return prefix_; }

  /// The tensor `name` (under the prefix) with shape `expected`, converted to this Weights'
  /// dtype (float tensors only) and device. Throws wick::Error naming the full path when it is
  /// missing, ShapeMismatch naming the path and the expected and found shapes.
  Tensor get(const std::string& name, const Shape& expected) const;
  /// The tensor `name` with whatever shape it has.
  Tensor get(const std::string& name) const;
  bool contains(const std::string& name) const;
  /// The full names under this prefix (without it), sorted.
  std::vector<std::string> names() const;

  std::optional<DType> dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  /// The same tensors, read with another dtype / onto another device.
  Weights with_dtype(DType dtype) const;
  Weights with_device(const Device& device) const;

 private:
  Tensor convert(Tensor t) const;

  std::shared_ptr<const WeightSource> source_;
  std::optional<DType> dtype_;
  Device device_;
  bool keep_device_ = false;  // from_map without a device: each tensor stays where it is
  std::string prefix_;
};

}  // namespace wick::nn
