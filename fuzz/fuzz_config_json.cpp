// libFuzzer target: config.json of the Llama family (LlamaConfig::from_json) and of BERT
// (BertConfig::from_file). Any input must either load or throw a wick::Error.

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "wick/bert.h"
#include "wick/models.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    wick::models::LlamaConfig c = wick::models::LlamaConfig::from_json(text, "fuzz/config.json");
    c.validate("fuzz/config.json");
  } catch (const wick::Error&) {
  }
  static const std::string path = "/tmp/wick-fuzz-config-" + std::to_string(getpid()) + ".json";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  try {
    (void)wick::models::BertConfig::from_file(path);
  } catch (const wick::Error&) {
  }
  std::remove(path.c_str());  // one file per input, none left behind
  return 0;
}
