// libFuzzer target: model.safetensors.index.json of a sharded checkpoint. The input is the index
// of a folder holding a tiny Llama's config.json and two shards (written once per process); it is
// opened by safetensors::ShardedFile, nn::Weights and Llama::load. Any input must either load or
// throw a wick::Error.

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "wick/models.h"
#include "wick/nn.h"
#include "wick/safetensors.h"
#include "wick/wick.h"

namespace fs = std::filesystem;

namespace {

// A Llama of hidden size 8, 2 heads of 4, 1 layer, vocab 16, split over two shards (the layer
// in model-00002-of-00002.safetensors, the rest in the first).
std::string make_folder() {
  fs::path dir = fs::temp_directory_path() / ("wick-fuzz-sharded-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "llama", "vocab_size": 16,
    "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "max_position_embeddings": 16})";
  auto t = [](wick::Shape s) {
    std::vector<float> v(s.elem_count());
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
    return wick::Tensor::from_vec(v, s, wick::Device::cpu());
  };
  std::map<std::string, wick::Tensor> first{{"model.embed_tokens.weight", t({16, 8})},
                                            {"model.norm.weight", t({8})},
                                            {"lm_head.weight", t({16, 8})}};
  std::string l = "model.layers.0.";
  std::map<std::string, wick::Tensor> second{
      {l + "input_layernorm.weight", t({8})},     {l + "post_attention_layernorm.weight", t({8})},
      {l + "self_attn.q_proj.weight", t({8, 8})}, {l + "self_attn.k_proj.weight", t({4, 8})},
      {l + "self_attn.v_proj.weight", t({4, 8})}, {l + "self_attn.o_proj.weight", t({8, 8})},
      {l + "mlp.gate_proj.weight", t({12, 8})},   {l + "mlp.up_proj.weight", t({12, 8})},
      {l + "mlp.down_proj.weight", t({8, 12})}};
  wick::safetensors::save(first, (dir / "model-00001-of-00002.safetensors").string());
  wick::safetensors::save(second, (dir / "model-00002-of-00002.safetensors").string());
  return dir.string();
}

// The folder, removed when the process ends.
struct Folder {
  std::string path = make_folder();
  ~Folder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Folder folder;
  const std::string& dir = folder.path;
  static const std::string index = dir + "/model.safetensors.index.json";
  {
    std::ofstream out(index, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    auto file = wick::safetensors::ShardedFile::open(index);
    for (const auto& name : file.names()) {
      (void)file.info(name);
      (void)file.get(name).to_vec_f64();
    }
  } catch (const wick::Error&) {
  }
  try {
    auto w = wick::nn::Weights::from_safetensors({index}, wick::DType::F32, wick::Device::cpu());
    (void)w.get("model.norm.weight", wick::Shape{8});
  } catch (const wick::Error&) {
  }
  try {
    wick::models::Llama model = wick::models::Llama::load(dir, wick::Device::cpu());
    wick::models::KvCache cache = model.make_cache(1, 2);
    std::vector<uint32_t> ids{1};
    (void)model.forward_last(wick::Tensor::from_vec(ids, wick::Shape{1, 1}, wick::Device::cpu()),
                             cache);
  } catch (const wick::Error&) {
  }
  return 0;
}
