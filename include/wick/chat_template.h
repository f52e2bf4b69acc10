#pragma once
// wick::ChatTemplate: renders the Jinja chat template a model ships (tokenizer_config.json
// `chat_template`, GGUF `tokenizer.chat_template`) byte for byte as Python's jinja2 renders it for
// transformers' apply_chat_template: an ImmutableSandboxedEnvironment with trim_blocks,
// lstrip_blocks and loop controls, transformers' `tojson` filter (ensure_ascii=False) and its
// `raise_exception` and `strftime_now` globals.

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "wick/error.h"

namespace wick {

/// A chat template that cannot be read or rendered, or that raised (raise_exception). The
/// message names the template line and the construct, or the template's own message.
class ChatTemplateError : public Error {
 public:
  using Error::Error;
};

/// One turn of a conversation.
struct ChatMessage {
  std::string role;  ///< "system", "user", "assistant", "tool", ...
  std::string content;
  /// Further keys of the message as templates read them (tool_calls, tool_call_id, name,
  /// reasoning_content, ...), in order after role and content. A "content" key here replaces
  /// `content` (null for an assistant turn that only calls tools, a list of parts).
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
};

/// Bounds on one render, so that no template (a hostile one included) runs away: each is a
/// ChatTemplateError when exceeded.
struct ChatTemplateLimits {
  size_t max_output = size_t{64} << 20;  ///< bytes of the prompt, and of any one string value
  uint64_t max_steps = 20'000'000;       ///< statements, expressions and loop turns evaluated
  int max_call_depth = 64;               ///< macro calls inside macro calls
};

/// A parsed chat template. Immutable once built; render may be called from several threads.
class ChatTemplate {
 public:
  /// Parses `jinja_source`; throws ChatTemplateError naming the line and the construct it
  /// cannot read (syntax errors, tags such as include/extends/import that it does not support).
  explicit ChatTemplate(std::string jinja_source);

  /// The prompt for `messages`, as transformers' apply_chat_template(tokenize=False). The
  /// template sees `messages`, `add_generation_prompt`, `tools` and `documents` (None unless
  /// `extra` gives them) and every key of `extra` (bos_token, eos_token, tools,
  /// enable_thinking, ...). Throws ChatTemplateError when the template fails or raises.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = {}) const;
  /// Same with the messages as JSON (an array of objects), keeping the key order of objects,
  /// which `tojson` shows (nlohmann::json sorts keys).
  std::string render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& extra = {}) const;

  /// Fixes the time strftime_now reads (as UTC), for reproducible prompts; nullopt (the
  /// default) reads the local clock at each render.
  void set_now(std::optional<std::time_t> now) { now_ = now; }
  /// Replaces the default bounds on each render.
  void set_limits(const ChatTemplateLimits& limits) { limits_ = limits; }
  /// The template's source text.
  const std::string& source() const { return source_; }

 private:
  struct Parsed;
  std::string source_;
  std::shared_ptr<const Parsed> parsed_;
  std::optional<std::time_t> now_;
  ChatTemplateLimits limits_;
};

}  // namespace wick
