// libFuzzer target: chat templates. The input is a Jinja template; it is parsed and, when it
// parses, rendered for a small conversation with tools under tight bounds. Any failure must be a
// wick::ChatTemplateError: no crash, no hang, no runaway memory.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "wick/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi \u00e9 \ud83c\udf0d"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "abc123def", "type": "function",
      "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, null, true]}}}]},
    {"role": "tool", "tool_call_id": "abc123def", "content": "42"},
    {"role": "assistant", "content": "<think>t</think>done"}])");
  static const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false,
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]})");
  std::string source(reinterpret_cast<const char*>(data), size);
  try {
    wick::ChatTemplate tpl(source);
    wick::ChatTemplateLimits limits;
    limits.max_output = 1 << 20;
    limits.max_steps = 200'000;
    limits.max_call_depth = 32;
    tpl.set_limits(limits);
    tpl.set_now(0);
    (void)tpl.render_json(messages, size % 2 == 0, extra);
  } catch (const wick::ChatTemplateError&) {
  }
  return 0;
}
