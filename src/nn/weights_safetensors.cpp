// Weights::from_safetensors: a WeightSource over memory-mapped safetensors files (a sharded
// checkpoint is several files; each name must be in one of them).

#include <map>
#include <memory>
#include <type_traits>
#include <utility>

#include "util.h"
#include "wick/nn/weights.h"

#if __has_include("wick/formats.h")
#include "wick/formats.h"
#define WICK_NN_HAVE_SAFETENSORS 1
#endif

namespace wick::nn {

#ifdef WICK_NN_HAVE_SAFETENSORS
namespace {

// File::open may hand back the file or a pointer to it; this gives the file either way.
template <class F>
auto& file_ref(F& f) {
  if constexpr (requires { f->names(); }) {
    return *f;
  } else {
    return f;
  }
}

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(const std::vector<std::string>& paths) {
    for (const std::string& path : paths) {
      files_.push_back(std::make_shared<File>(safetensors::File::open(path)));
      size_t index = files_.size() - 1;
      for (const std::string& name : file_ref(*files_.back()).names()) {
        auto [it, inserted] = where_.emplace(name, index);
        if (!inserted) {
          throw Error(str("nn::Weights: tensor '", name, "' is in both ", paths[it->second],
                          " and ", path));
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
    return Shape(file_ref(*files_[it->second]).info(name).shape);
  }
  Tensor load(const std::string& name, const std::optional<Device>& device) const override {
    return file_ref(*files_[where_.at(name)]).get(name, device ? *device : Device::cpu());
  }

 private:
  using File = std::decay_t<decltype(safetensors::File::open(std::string()))>;
  std::vector<std::shared_ptr<File>> files_;
  std::map<std::string, size_t> where_;
};

}  // namespace

Weights Weights::from_safetensors(const std::vector<std::string>& paths, DType dtype,
                                  const Device& device) {
  return Weights(std::make_shared<SafetensorsSource>(paths), dtype, device);
}

#else

Weights Weights::from_safetensors(const std::vector<std::string>& paths, DType, const Device&) {
  throw Error(str("nn::Weights::from_safetensors: wick was built without the safetensors reader (",
                  paths.size(), " files asked for)"));
}

#endif

}  // namespace wick::nn
