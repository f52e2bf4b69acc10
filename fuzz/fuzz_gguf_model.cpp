// libFuzzer target: a GGUF file loaded as a Llama model (metadata to config, tensor shapes, the
// q/k row permutation), dequantised and kept quantized, and its tokenizer.ggml.* vocabulary.
// Any input must either load or throw a wick::Error; a loaded model of small size runs one
// forward step.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "wick/models.h"
#include "wick/wick.h"

namespace {

void run(const wick::models::Llama& model) {
  const wick::models::LlamaConfig& c = model.config();
  if (c.vocab_size * c.hidden_size > (1u << 20) || c.num_hidden_layers > 8 ||
      c.intermediate_size * c.hidden_size > (1u << 20)) {
    return;
  }
  wick::models::KvCache cache = model.make_cache(1, 4);
  std::vector<uint32_t> ids{0, static_cast<uint32_t>(c.vocab_size - 1)};
  wick::Tensor t = wick::Tensor::from_vec(ids, wick::Shape{1, 2}, wick::Device::cpu());
  (void)model.forward_last(t, cache).to_vec_f64();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/wick-fuzz-model-" + std::to_string(getpid()) + ".gguf";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  for (bool quantized : {false, true}) {
    try {
      run(wick::models::Llama::load(path, wick::Device::cpu(), wick::DType::F32, quantized));
    } catch (const wick::Error&) {
    }
  }
  try {
    wick::Tokenizer tok = wick::models::load_gguf_tokenizer(path);
    std::vector<uint32_t> ids = tok.encode("Hello, world! <|im_end|> caf\xc3\xa9", true);
    (void)tok.decode(ids, false);
    (void)tok.end_of_turn_ids();
    (void)tok.apply_chat_template({{"user", "hi"}});
  } catch (const wick::Error&) {
  }
  std::remove(path.c_str());  // the loaders read a path: one file per input, none left behind
  return 0;
}
