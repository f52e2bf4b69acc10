// nn::Weights over a WeightSource: prefixes are string joins, tensors are read on get.

#include "wick/nn/weights.h"

#include <algorithm>

#include "util.h"

namespace wick::nn {

namespace {

// Tensors held in memory.
class MapSource final : public WeightSource {
 public:
  explicit MapSource(std::map<std::string, Tensor> tensors) : tensors_(std::move(tensors)) {}
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, t] : tensors_) out.push_back(name);
    return out;
  }
  bool contains(const std::string& name) const override { return tensors_.count(name) != 0; }
  std::optional<Shape> shape_of(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return std::nullopt;
    return it->second.shape();
  }
  Tensor load(const std::string& name, const std::optional<Device>& device) const override {
    const Tensor& t = tensors_.at(name);
    return device ? t.to_device(*device) : t;
  }

 private:
  std::map<std::string, Tensor> tensors_;
};

}  // namespace

Weights::Weights(std::shared_ptr<const WeightSource> source, std::optional<DType> dtype,
                 const Device& device)
    : source_(std::move(source)), dtype_(dtype), device_(device) {
  if (!source_) throw Error("nn::Weights: no source");
}

Weights Weights::from_map(std::map<std::string, Tensor> tensors, std::optional<DType> dtype,
                          const Device& device) {
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) throw Error(str("nn::Weights: tensor '", name, "' is an empty handle"));
  }
  return Weights(std::make_shared<MapSource>(std::move(tensors)), dtype, device);
}

Weights Weights::from_map(std::map<std::string, Tensor> tensors) {
  Weights w = from_map(std::move(tensors), std::nullopt, Device::cpu());
  w.keep_device_ = true;
  return w;
}

Weights Weights::pp(const std::string& name) const {
  Weights w = *this;
  w.prefix_ = path(name);
  return w;
}

Weights Weights::pp(size_t index) const {
  return pp(std::to_string(index));
}

std::string Weights::path(const std::string& name) const {
  if (prefix_.empty()) return name;
  if (name.empty()) return prefix_;
  return prefix_ + "." + name;
}

bool Weights::contains(const std::string& name) const {
  return source_->contains(path(name));
}

std::vector<std::string> Weights::names() const {
  std::vector<std::string> out;
  std::string lead = prefix_.empty() ? "" : prefix_ + ".";
  for (const std::string& n : source_->names()) {
    if (n.compare(0, lead.size(), lead) == 0) out.push_back(n.substr(lead.size()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Tensor Weights::convert(Tensor t) const {
  if (dtype_ && is_float(t.dtype()) && t.dtype() != *dtype_) t = t.to_dtype(*dtype_);
  if (!keep_device_ && t.device() != device_) t = t.to_device(device_);
  return t;
}

Tensor Weights::get(const std::string& name) const {
  std::string full = path(name);
  if (!source_->contains(full)) {
    throw Error(str("nn::Weights: no tensor '", full, "'"));
  }
  std::optional<Device> where;
  if (!keep_device_) where = device_;
  return convert(source_->load(full, where));
}

Tensor Weights::get(const std::string& name, const Shape& expected) const {
  std::string full = path(name);
  std::optional<Shape> found = source_->shape_of(full);
  if (!found) {
    throw Error(str("nn::Weights: no tensor '", full, "' (expected shape ", expected, ")"));
  }
  if (*found != expected) {
    throw ShapeMismatch(
        str("nn::Weights: tensor '", full, "' has shape ", *found, ", expected ", expected));
  }
  return get(name);
}

Weights Weights::with_dtype(DType dtype) const {
  Weights w = *this;
  w.dtype_ = dtype;
  return w;
}

Weights Weights::with_device(const Device& device) const {
  Weights w = *this;
  w.device_ = device;
  w.keep_device_ = false;
  return w;
}

}  // namespace wick::nn
