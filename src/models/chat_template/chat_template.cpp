#include "wick/chat_template.h"

#include "models/chat_template/eval.h"
#include "models/chat_template/parser.h"

namespace wick {

struct ChatTemplate::Parsed {
  jinja::Body body;
};

ChatTemplate::ChatTemplate(std::string jinja_source) : source_(std::move(jinja_source)) {
  auto parsed = std::make_shared<Parsed>();
  parsed->body = jinja::parse(source_);
  parsed_ = std::move(parsed);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const nlohmann::json& extra) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json msg = nlohmann::ordered_json::object();
    msg["role"] = m.role;
    msg["content"] = m.content;
    if (!m.fields.is_object())
      throw ChatTemplateError("ChatTemplate::render: a message's fields must be a JSON object");
    for (const auto& [k, v] : m.fields.items()) msg[k] = v;
    list.push_back(std::move(msg));
  }
  return render_json(list, add_generation_prompt, nlohmann::ordered_json(extra));
}

std::string ChatTemplate::render_json(const nlohmann::ordered_json& messages,
                                      bool add_generation_prompt,
                                      const nlohmann::ordered_json& extra) const {
  if (!extra.is_null() && !extra.is_object())
    throw ChatTemplateError("ChatTemplate::render: extra must be a JSON object");
  jinja::Dict context;
  context.set("messages", jinja::from_json(messages));
  context.set("tools", jinja::Value::none());
  context.set("documents", jinja::Value::none());
  context.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  if (extra.is_object())
    for (const auto& [k, v] : extra.items()) context.set(k, jinja::from_json(v));
  jinja::Renderer renderer(parsed_->body, std::move(context), limits_, now_);
  return renderer.render();
}

}  // namespace wick
