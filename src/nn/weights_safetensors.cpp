// Weights::from_safetensors: a WeightSource over memory-mapped safetensors files. Each path is a
// .safetensors file or a model.safetensors.index.json (a sharded checkpoint); together they form
// one set of names, each of which must be in exactly one of them.

#include <map>
#include <memory>

#include "util.h"
#include "wick/nn/weights.h"
#include "wick/safetensors.h"

namespace wick::nn {

namespace {

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(const std::vector<std::string>& paths) {
    if (paths.empty()) throw Error("nn::Weights::from_safetensors: no files given");
    for (const std::string& path : paths) {
      files_.push_back(safetensors::ShardedFile::open(path));
      for (const std::string& name : files_.back().names()) {
        auto [it, inserted] = where_.emplace(name, files_.size() - 1);
        if (!inserted) {
          throw Error(str("nn::Weights::from_safetensors: tensor '", name, "' is in both ",
                          paths[it->second], " and ", path));
        }
      }
    }
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, index] : where_) out.push_back(name);
    return out;
  }
  bool contains(const std::string& name) const override { return where_.count(name) != 0; }
  std::optional<Shape> shape_of(const std::string& name) const override {
    auto it = where_.find(name);
    if (it == where_.end()) return std::nullopt;
    return files_[it->second].info(name).shape;
  }
  Tensor load(const std::string& name, const std::optional<Device>& device) const override {
    return files_[where_.at(name)].get(name, device ? *device : Device::cpu());
  }

 private:
  std::vector<safetensors::ShardedFile> files_;
  std::map<std::string, size_t> where_;
};

}  // namespace

Weights Weights::from_safetensors(const std::vector<std::string>& paths, DType dtype,
                                  const Device& device) {
  return Weights(std::make_shared<SafetensorsSource>(paths), dtype, device);
}

}  // namespace wick::nn
