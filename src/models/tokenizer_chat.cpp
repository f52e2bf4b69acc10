#include "models/tokenizer_chat.h"

#include <algorithm>
#include <filesystem>

#include "formats/format_util.h"
#include "models/json_file.h"
#include "wick/tokenizer.h"

namespace wick::tok {

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

NamedTemplate make_template(std::string name, std::string source) {
  NamedTemplate t;
  t.name = std::move(name);
  t.source = std::move(source);
  try {
    t.parsed = std::make_shared<const ChatTemplate>(t.source);
  } catch (const ChatTemplateError& e) {
    t.error = e.what();
  }
  return t;
}

// A `chat_template` value: one template, or transformers' list of {name, template}.
std::vector<NamedTemplate> read_templates(const Json& value, const std::string& file) {
  std::vector<NamedTemplate> out;
  if (value.is_string()) {
    out.push_back(make_template("default", value.get<std::string>()));
  } else if (value.is_array()) {
    for (const Json& t : value) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
          !t.contains("template") || !t["template"].is_string()) {
        throw TokenizerError(file +
                             ": chat_template entries must be {\"name\": ..., \"template\": ...} "
                             "objects of strings, got " +
                             formats::describe(t));
      }
      out.push_back(make_template(t["name"].get<std::string>(), t["template"].get<std::string>()));
    }
  } else if (!value.is_null()) {
    throw TokenizerError(file +
                         ": chat_template must be a string or a list of named templates, got " +
                         formats::describe(value));
  }
  return out;
}

// A token named in tokenizer_config.json: a string or an AddedToken object.
std::optional<std::string> token_text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

std::string read_text(const fs::path& path) {
  try {
    return formats::read_file_bounded(path.string(), json_file::kMaxConfigBytes);
  } catch (const FormatError& e) {
    throw TokenizerError(std::string("Tokenizer::from_file: ") + e.what());
  }
}

}  // namespace

const std::string& TokenizerChat::default_source() const {
  static const std::string none;
  for (const NamedTemplate& t : templates) {
    if (t.name == "default") return t.source;
  }
  return none;
}

std::string TokenizerChat::render(const OrderedJson& messages, bool add_generation_prompt,
                                  const OrderedJson& extra) const {
  if (templates.empty()) {
    throw TokenizerError("Tokenizer::apply_chat_template: " + origin +
                         " has no chat template (tokenizer_config.json \"chat_template\", "
                         "chat_template.jinja or GGUF tokenizer.chat_template)");
  }
  if (!extra.is_null() && !extra.is_object()) {
    throw ChatTemplateError("Tokenizer::apply_chat_template: extra must be a JSON object");
  }
  // As transformers' get_chat_template: "tool_use" when there are tools and the tokenizer names
  // one, else "default" (a single template is the default).
  auto named = [&](std::string_view name) -> const NamedTemplate* {
    for (const NamedTemplate& t : templates) {
      if (t.name == name) return &t;
    }
    return nullptr;
  };
  const bool tools = extra.is_object() && extra.contains("tools") && !extra["tools"].is_null();
  const NamedTemplate* chosen = tools ? named("tool_use") : nullptr;
  if (chosen == nullptr) chosen = named("default");
  if (chosen == nullptr) {
    std::string names;
    for (const NamedTemplate& t : templates) names += (names.empty() ? "" : ", ") + t.name;
    throw TokenizerError("Tokenizer::apply_chat_template: " + origin +
                         " has several chat templates and none named 'default' (" + names + ")");
  }
  if (!chosen->parsed) {
    throw ChatTemplateError("Tokenizer::apply_chat_template: the chat template '" + chosen->name +
                            "' of " + origin + " cannot be read: " + chosen->error);
  }
  OrderedJson vars = special_tokens;
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items()) vars[key] = value;
  }
  return chosen->parsed->render_json(messages, add_generation_prompt, vars);
}

TokenizerChat load_chat(const Json& config, const std::string& tokenizer_path) {
  TokenizerChat chat;
  if (config.is_object()) {
    if (auto it = config.find("chat_template"); it != config.end()) {
      chat.templates = read_templates(*it, "tokenizer_config.json");
    }
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                            "cls_token", "mask_token"}) {
      if (auto it = config.find(key); it != config.end()) {
        if (auto text = token_text(*it)) chat.special_tokens[key] = *text;
      }
    }
    // transformers (5.x) adds the model-specific tokens of an extra_special_tokens object.
    if (auto it = config.find("extra_special_tokens"); it != config.end() && it->is_object()) {
      for (const auto& [key, value] : it->items()) {
        if (auto text = token_text(value)) chat.special_tokens[key] = *text;
      }
    }
  }
  if (tokenizer_path.empty()) return chat;
  chat.origin = "'" + tokenizer_path + "'";
  // Files beside tokenizer.json replace the config's templates, as transformers reads them:
  // chat_template.jinja (the default) and additional_chat_templates/<name>.jinja, else a
  // processor's chat_template.json.
  std::error_code ec;
  const fs::path dir = fs::path(tokenizer_path).parent_path();
  std::vector<NamedTemplate> files;
  if (fs::is_regular_file(dir / "chat_template.jinja", ec)) {
    files.push_back(make_template("default", read_text(dir / "chat_template.jinja")));
  }
  const fs::path extra_dir = dir / "additional_chat_templates";
  if (fs::is_directory(extra_dir, ec)) {
    std::vector<fs::path> paths;
    for (const auto& entry : fs::directory_iterator(extra_dir, ec)) {
      if (entry.path().extension() == ".jinja" && entry.is_regular_file(ec)) {
        paths.push_back(entry.path());
      }
    }
    std::sort(paths.begin(), paths.end());
    for (const fs::path& p : paths) files.push_back(make_template(p.stem().string(), read_text(p)));
  }
  if (files.empty() && fs::is_regular_file(dir / "chat_template.json", ec)) {
    const std::string file = (dir / "chat_template.json").string();
    Json j;
    try {
      j = json_file::parse(read_text(file), file);
    } catch (const FormatError& e) {
      throw TokenizerError(std::string("Tokenizer::from_file: ") + e.what());
    }
    if (!j.is_object() || !j.contains("chat_template")) {
      throw TokenizerError(file + ": no \"chat_template\" key");
    }
    files = read_templates(j["chat_template"], file);
  }
  if (!files.empty()) chat.templates = std::move(files);
  return chat;
}

TokenizerChat load_gguf_chat(const std::string& chat_template, OrderedJson special_tokens,
                             const std::string& origin) {
  TokenizerChat chat;
  if (!chat_template.empty()) chat.templates.push_back(make_template("default", chat_template));
  chat.special_tokens = std::move(special_tokens);
  chat.origin = origin;
  return chat;
}

std::optional<uint32_t> template_turn_end(const TokenizerChat& chat, const TurnEndProbe& probe) {
  const std::string reply = "Xq7 wick probe reply";
  OrderedJson messages = OrderedJson::array();
  messages.push_back({{"role", "user"}, {"content", "Hello"}});
  messages.push_back({{"role", "assistant"}, {"content", reply}});
  std::string text;
  try {
    text = chat.render(messages, false, OrderedJson::object());
  } catch (const Error&) {
    return std::nullopt;  // a template that only renders other conversations names no turn end
  }
  size_t at = text.rfind(reply);
  if (at == std::string::npos) return std::nullopt;
  // The first token after the reply, past whitespace, when it is special.
  for (uint32_t id : probe.encode(std::string_view(text).substr(at + reply.size()))) {
    if (probe.is_special(id)) return id;
    std::string t = probe.text(id);
    if (t.find_first_not_of(" \t\r\n") != std::string::npos) break;
  }
  return std::nullopt;
}

}  // namespace wick::tok
