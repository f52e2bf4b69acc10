#pragma once
// The pre-tokenizers' regular expressions (GPT-2, Llama 3, Qwen2, ...) through PCRE2 in UTF and
// Unicode-property mode, JIT-compiled.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wick::tok {

class Regex {
 public:
  /// Compiles a pattern written for Hugging Face tokenizers (Oniguruma syntax). \s and \S are
  /// read as Unicode White_Space, as Oniguruma does. Throws TokenizerError.
  explicit Regex(std::string_view pattern);

  /// Appends [begin, end) of each non-empty match in `text` (valid UTF-8), left to right.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::shared_ptr<Code> code_;
};

/// Pre-split patterns of the byte-level BPE families.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace wick::tok
