#pragma once
// The chat part of a Tokenizer: the model's own Jinja templates (tokenizer_config.json
// `chat_template`, chat_template.jinja / chat_template.json and additional_chat_templates/ beside
// tokenizer.json, GGUF tokenizer.chat_template), rendered through wick::ChatTemplate with the
// special-token variables transformers' apply_chat_template gives them.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wick/chat_template.h"

namespace wick::tok {

/// One template of a tokenizer. A template wick cannot parse keeps its error, which rendering
/// it throws: loading the tokenizer does not depend on the template.
struct NamedTemplate {
  std::string name;  // "default", "tool_use", ...
  std::string source;
  std::shared_ptr<const ChatTemplate> parsed;
  std::string error;
};

/// The tokenizer's templates and the values they see besides the conversation.
struct TokenizerChat {
  std::vector<NamedTemplate> templates;
  /// bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token and the
  /// model-specific tokens, as transformers' special_tokens_map holds them.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  /// Where the templates were looked for, named when there is none.
  std::string origin = "the tokenizer";

  /// The source of the template used without tools ("" when there is none).
  const std::string& default_source() const;
  /// transformers' apply_chat_template(tokenize=False): the template ("tool_use" when `extra`
  /// has tools and the tokenizer names one, else "default") with the special tokens, then
  /// `extra`'s keys. TokenizerError when there is no template, ChatTemplateError when it fails.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra) const;
};

/// The templates of tokenizer_config.json (`config`, null when there is none) and, when
/// `tokenizer_path` is not empty, of the files beside it (which replace the config's, as
/// transformers reads them).
TokenizerChat load_chat(const nlohmann::json& config, const std::string& tokenizer_path);

/// The template of a GGUF file's tokenizer.chat_template; `special_tokens` as in TokenizerChat.
TokenizerChat load_gguf_chat(const std::string& chat_template,
                             nlohmann::ordered_json special_tokens, const std::string& origin);

/// What the end-of-turn search needs of a tokenizer.
struct TurnEndProbe {
  std::function<std::vector<uint32_t>(std::string_view)> encode;  // without special tokens
  std::function<bool(uint32_t)> is_special;
  std::function<std::string(uint32_t)> text;  // a token's text
};

/// The special token the template writes right after an assistant message's content, found by
/// rendering a short conversation (nullopt when none, or when the template cannot render it).
std::optional<uint32_t> template_turn_end(const TokenizerChat& chat, const TurnEndProbe& probe);

}  // namespace wick::tok
