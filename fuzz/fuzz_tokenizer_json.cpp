// libFuzzer target: Hugging Face tokenizer.json (and tokenizer_config.json after a NUL byte).
// Any input must either load or throw a wick::Error; a loaded tokenizer must encode, decode and
// render a chat without crashing.

#include <cstdint>
#include <string>
#include <string_view>

#include "wick/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  size_t nul = all.find('\0');
  std::string_view tokenizer = all.substr(0, nul);
  std::string_view config =
      nul == std::string_view::npos ? std::string_view{} : all.substr(nul + 1);
  try {
    wick::Tokenizer tok = wick::Tokenizer::from_json(tokenizer, config);
    for (std::string_view text : {"Hello, world! 123 ", "caf\xc3\xa9 \xe4\xb8\xad\xff x\n\n  y"}) {
      std::vector<uint32_t> ids = tok.encode(text, true);
      (void)tok.decode(ids, false);
      (void)tok.decode(ids, true);
      for (uint32_t id : ids) (void)tok.id_to_bytes(id);
    }
    (void)tok.encode_batch({"a b", "", "hello there"}, true, 8);
    size_t n = tok.vocab_size();
    for (uint32_t id = 0; id < n && id < 64; ++id) {
      std::string t = tok.id_to_token(id);
      (void)tok.token_to_id(t);
      (void)tok.is_special(id);
    }
    (void)tok.pad_id();
    try {
      (void)tok.end_of_turn_ids();
      (void)tok.apply_chat_template({{"user", "hi"}});
    } catch (const wick::Error&) {
    }
  } catch (const wick::Error&) {
  }
  return 0;
}
