#pragma once
// The stages of a Hugging Face tokenizer around its model: normaliser, pre-tokeniser,
// post-processor and decoder, each built from its tokenizer.json object.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace wick::tok {

using Json = nlohmann::json;

/// A piece of the text being tokenised: bytes [begin, end).
struct Span {
  size_t begin;
  size_t end;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// The normalised form of `text` (valid UTF-8).
  virtual std::string normalize(std::string_view text) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Splits each span of `text` into smaller ones (empty spans are dropped).
  virtual void split(std::string_view text, std::vector<Span>& spans) const = 0;
  /// True when the pieces go to the model as bytes mapped to GPT-2's byte-level symbols.
  virtual bool byte_level() const { return false; }
  /// True when each text gets a leading space first (ByteLevel's add_prefix_space).
  virtual bool adds_prefix_space() const { return false; }
  /// True when the text is rewritten before split() cuts it (Metaspace replaces spaces and may
  /// prepend its replacement).
  virtual bool rewrites() const { return false; }
  /// The rewritten text, for a pre-tokeniser that rewrites(); `first` says whether the text
  /// starts the input.
  virtual std::string rewrite(std::string_view text, bool first) const {
    (void)first;
    return std::string(text);
  }
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  /// Adds the special tokens around one sequence.
  virtual void process(std::vector<uint32_t>& ids) const = 0;
  /// How many ids process adds.
  virtual size_t added() const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Hugging Face's decode_chain: rewrites the token strings, the result is their concatenation.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  /// What one token contributes inside a decoded text, as raw bytes: the decoder's per-token
  /// rewriting (Replace, ByteFallback, Metaspace) without the steps that depend on the token's
  /// place (Strip, the first token's Metaspace prefix).
  virtual std::string token_bytes(std::string token) const { return token; }
};

/// Builders from tokenizer.json objects; a null JSON value gives nullptr. Unsupported types
/// throw TokenizerError naming the type.
std::unique_ptr<Normalizer> make_normalizer(const Json& j);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j);
std::unique_ptr<PostProcessor> make_post_processor(const Json& j);
std::unique_ptr<Decoder> make_decoder(const Json& j);

/// Stages for tokenizers built from GGUF-style data.
/// The pre-tokeniser of a tokenizer.ggml.pre name ("gpt2", "llama-bpe", "smollm", "qwen2", ...).
std::unique_ptr<PreTokenizer> pre_tokenizer_for_gguf(const std::string& pre);
/// The normaliser HF's tokenizer.json of that family has: NFC for qwen2, none otherwise.
std::unique_ptr<Normalizer> normalizer_for_gguf(const std::string& pre);
/// bos + ids (+ eos) as add_bos/add_eos ask.
std::unique_ptr<PostProcessor> make_bos_eos_processor(std::vector<uint32_t> prefix,
                                                      std::vector<uint32_t> suffix);
std::unique_ptr<Decoder> make_byte_level_decoder();

/// GPT-2's byte-to-symbol table: the UTF-8 of the code point standing for byte b.
const std::string& byte_to_symbol(uint8_t b);
/// The byte a symbol code point stands for, or -1.
int symbol_to_byte(char32_t cp);
/// Maps a byte-level token back to bytes; false (out untouched) when a character is not a
/// byte-level symbol.
bool byte_level_to_bytes(std::string_view token, std::string& out);

}  // namespace wick::tok
