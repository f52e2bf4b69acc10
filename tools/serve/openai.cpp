#include "openai.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace wick::serve_http {

const char* error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "invalid_request_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string error_body(int status, const std::string& message, const std::string& param,
                       const std::string& code) {
  json err = {{"message", message},
              {"type", error_type(status)},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

json parse_body(const std::string& body) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw HttpError(400, std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw HttpError(400, "the body must be a JSON object");
  return j;
}

std::string model_field(const json& body) {
  auto it = body.find("model");
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    throw HttpError(400, "'model' must be a non-empty string", "model");
  }
  return it->get<std::string>();
}

namespace {

// A field that is absent or null reads as absent, as OpenAI's API reads it.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

double number_field(const json& v, const char* name, double lo, double hi, bool open_lo) {
  if (!v.is_number()) throw HttpError(400, std::string("'") + name + "' must be a number", name);
  double x = v.get<double>();
  if (!std::isfinite(x) || (open_lo ? x <= lo : x < lo) || x > hi) {
    throw HttpError(400,
                    std::string("'") + name + "' must be in " + (open_lo ? "(" : "[") +
                        json(lo).dump() + ", " + json(hi).dump() + "], got " + v.dump(),
                    name);
  }
  return x;
}

uint64_t count_field(const json& v, const char* name, uint64_t max) {
  bool ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  if (!ok || v.get<uint64_t>() > max) {
    throw HttpError(400,
                    std::string("'") + name + "' must be a whole number from 0 to " +
                        std::to_string(max) + ", got " + v.dump(),
                    name);
  }
  return v.get<uint64_t>();
}

}  // namespace

GenerationParams parse_generation(const json& body, size_t max_tokens_limit) {
  GenerationParams p;
  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    if (const json* v = field(body, name)) {
      uint64_t n = count_field(*v, name, std::numeric_limits<uint32_t>::max());
      if (n > max_tokens_limit) {
        throw HttpError(400,
                        std::string("'") + name + "' is " + std::to_string(n) +
                            ", more than this server's limit of " +
                            std::to_string(max_tokens_limit),
                        name);
      }
      p.sampling.max_tokens = n;
      p.max_tokens_given = true;
      break;
    }
  }
  if (const json* v = field(body, "temperature")) {
    p.sampling.temperature = number_field(*v, "temperature", 0, 2, false);
  }
  if (const json* v = field(body, "top_p"))
    p.sampling.top_p = number_field(*v, "top_p", 0, 1, true);
  if (const json* v = field(body, "seed")) {
    if (!v->is_number_integer()) throw HttpError(400, "'seed' must be an integer", "seed");
    p.sampling.seed =
        v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
  if (const json* v = field(body, "stop")) {
    if (v->is_string()) {
      p.sampling.stop.push_back(v->get<std::string>());
    } else if (v->is_array() && v->size() <= 16) {
      for (const json& s : *v) {
        if (!s.is_string()) throw HttpError(400, "'stop' must hold strings", "stop");
        p.sampling.stop.push_back(s.get<std::string>());
      }
    } else {
      throw HttpError(400, "'stop' must be a string or a list of at most 16 strings", "stop");
    }
    for (const std::string& s : p.sampling.stop) {
      if (s.empty()) throw HttpError(400, "'stop' strings must not be empty", "stop");
    }
  }
  if (const json* v = field(body, "stream")) {
    if (!v->is_boolean()) throw HttpError(400, "'stream' must be a boolean", "stream");
    p.stream = v->get<bool>();
  }
  if (const json* v = field(body, "stream_options")) {
    if (!v->is_object())
      throw HttpError(400, "'stream_options' must be an object", "stream_options");
    if (const json* u = field(*v, "include_usage")) {
      if (!u->is_boolean()) {
        throw HttpError(400, "'stream_options.include_usage' must be a boolean",
                        "stream_options.include_usage");
      }
      p.include_usage = u->get<bool>();
    }
  }
  if (const json* v = field(body, "n")) {
    if (!(v->is_number_integer() && v->get<int64_t>() == 1)) {
      throw HttpError(400, "'n' must be 1 (one choice per prompt)", "n");
    }
  }
  for (const char* name : {"logprobs", "echo"}) {
    if (const json* v = field(body, name); v != nullptr && !(v->is_boolean() && !v->get<bool>()) &&
                                           !(v->is_number_integer() && v->get<int64_t>() == 0)) {
      throw HttpError(400, std::string("'") + name + "' is not supported by this server", name);
    }
  }
  return p;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  const json* msgs = field(body, "messages");
  if (msgs == nullptr || !msgs->is_array() || msgs->empty()) {
    throw HttpError(400, "'messages' must be a non-empty list", "messages");
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw HttpError(400, "'" + where + "' must be an object", where);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      throw HttpError(400, "'" + where + ".role' must be a string", where + ".role");
    }
    ChatMessage msg;
    msg.role = role->get<std::string>();
    auto content = m.find("content");
    if (content != m.end() && content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content != m.end() && content->is_array()) {
      for (const json& part : *content) {
        auto text = part.is_object() ? part.find("text") : part.end();
        if (!part.is_object() || part.value("type", "") != "text" || text == part.end() ||
            !text->is_string()) {
          throw HttpError(400, "'" + where + ".content' parts must be {\"type\": \"text\", ...}",
                          where + ".content");
        }
        msg.content += text->get<std::string>();
      }
    } else if (content != m.end() && !content->is_null()) {
      throw HttpError(400, "'" + where + ".content' must be a string, a list of parts or null",
                      where + ".content");
    }
    for (auto it = m.begin(); it != m.end(); ++it) {
      if (it.key() != "role" && it.key() != "content") msg.fields[it.key()] = it.value();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

namespace {

bool is_id_list(const json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 ||
        x.get<uint64_t>() > std::numeric_limits<uint32_t>::max()) {
      return false;
    }
  }
  return true;
}

Prompt ids_prompt(const json& v) {
  Prompt p;
  p.is_ids = true;
  for (const json& x : v) p.ids.push_back(static_cast<uint32_t>(x.get<uint64_t>()));
  return p;
}

}  // namespace

std::vector<Prompt> parse_prompts(const json& body, size_t max_prompts) {
  const json* v = field(body, "prompt");
  const char* what =
      "'prompt' must be a string, a list of strings, a list of token ids or a "
      "list of lists of token ids";
  if (v == nullptr) throw HttpError(400, "'prompt' is required", "prompt");
  std::vector<Prompt> out;
  if (v->is_string()) {
    out.push_back(Prompt{v->get<std::string>(), {}, false});
  } else if (is_id_list(*v)) {
    out.push_back(ids_prompt(*v));
  } else if (v->is_array() && !v->empty()) {
    for (const json& x : *v) {
      if (x.is_string()) {
        out.push_back(Prompt{x.get<std::string>(), {}, false});
      } else if (is_id_list(x)) {
        out.push_back(ids_prompt(x));
      } else {
        throw HttpError(400, what, "prompt");
      }
    }
  } else {
    throw HttpError(400, what, "prompt");
  }
  if (out.size() > max_prompts) {
    throw HttpError(400,
                    "'prompt' holds " + std::to_string(out.size()) + " prompts, more than " +
                        std::to_string(max_prompts),
                    "prompt");
  }
  return out;
}

EmbeddingParams parse_embeddings(const json& body, size_t max_inputs, size_t dim) {
  EmbeddingParams p;
  const json* v = field(body, "input");
  const char* what = "'input' must be a non-empty string or a list of non-empty strings";
  if (v == nullptr) throw HttpError(400, "'input' is required", "input");
  if (v->is_string()) {
    p.inputs.push_back(v->get<std::string>());
  } else if (v->is_array() && !v->empty()) {
    for (const json& x : *v) {
      if (!x.is_string()) throw HttpError(400, what, "input");
      p.inputs.push_back(x.get<std::string>());
    }
  } else {
    throw HttpError(400, what, "input");
  }
  for (const std::string& s : p.inputs) {
    if (s.empty()) throw HttpError(400, what, "input");
  }
  if (p.inputs.size() > max_inputs) {
    throw HttpError(400,
                    "'input' holds " + std::to_string(p.inputs.size()) + " texts, more than " +
                        std::to_string(max_inputs),
                    "input");
  }
  if (const json* f = field(body, "encoding_format")) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) {
      throw HttpError(400, "'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
    }
    p.base64 = *f == "base64";
  }
  if (const json* d = field(body, "dimensions")) {
    if (!d->is_number_integer() || d->get<int64_t>() != static_cast<int64_t>(dim)) {
      throw HttpError(400, "'dimensions' must be the model's own, " + std::to_string(dim),
                      "dimensions");
    }
  }
  return p;
}

std::string base64_floats(const float* values, size_t n) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(n * sizeof(float), '\0');
  std::memcpy(bytes.data(), values, bytes.size());  // x86-64 and aarch64: little-endian
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                 uint32_t(uint8_t(bytes[i + 2]));
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (size_t rest = bytes.size() - i; rest > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

json finish_reason_json(serve::FinishReason reason) {
  switch (reason) {
    case serve::FinishReason::Stop:
      return "stop";
    case serve::FinishReason::Length:
      return "length";
    default:
      return nullptr;
  }
}

json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

std::string sse(const json& chunk) {
  return "data: " + chunk.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace wick::serve_http
