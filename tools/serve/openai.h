#pragma once
// The OpenAI side of wick-serve: reading request bodies (chat completions, completions,
// embeddings) into the engine's terms, and writing OpenAI's response, chunk and error objects.
// Every bad field is an HttpError (400) naming the field, as OpenAI's `param`.

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "wick/chat_template.h"
#include "wick/serve.h"

namespace wick::serve_http {

using nlohmann::json;

/// An error answered in OpenAI's shape {"error": {"message", "type", "param", "code"}}.
struct HttpError : std::runtime_error {
  HttpError(int status, const std::string& message, std::string param = {}, std::string code = {})
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string param;  // the request field at fault ("" when none)
  std::string code;   // OpenAI's code ("model_not_found", "context_length_exceeded", ...)
};

/// OpenAI's error type for an HTTP status ("invalid_request_error", "authentication_error", ...).
const char* error_type(int status);
/// The error body: {"error": {"message", "type", "param", "code"}} (param and code null when "").
std::string error_body(int status, const std::string& message, const std::string& param = {},
                       const std::string& code = {});

/// The body as a JSON object; 400 for malformed JSON or anything but an object.
json parse_body(const std::string& body);

/// The request's model id ("model", a non-empty string); 400 otherwise.
std::string model_field(const json& body);

/// What a generation request asks besides its prompt.
struct GenerationParams {
  serve::SamplingParams sampling;
  bool max_tokens_given = false;  // max_tokens or max_completion_tokens present
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

/// Reads max_tokens / max_completion_tokens (at most `max_tokens_limit`), temperature ([0, 2]),
/// top_p ((0, 1]), seed, stop (a string or a list of up to 16), stream, stream_options and n (1
/// only); 400 naming the field for a wrong type or value.
GenerationParams parse_generation(const json& body, size_t max_tokens_limit);

/// The chat's messages: a non-empty list of {role, content} objects; content a string, null, or a
/// list of {"type": "text", "text"} parts (joined). Other keys of a message are passed to the
/// template as they are.
std::vector<ChatMessage> parse_messages(const json& body);

/// A completion prompt: text, or token ids given as numbers.
struct Prompt {
  std::string text;
  std::vector<uint32_t> ids;
  bool is_ids = false;
};
/// "prompt": a string, a list of strings, a list of ids, or a list of lists of ids (at most
/// `max_prompts` prompts); 400 otherwise.
std::vector<Prompt> parse_prompts(const json& body, size_t max_prompts);

/// "input" of an embeddings request: a non-empty string or a list of up to `max_inputs`
/// non-empty strings; "encoding_format" float or base64; "dimensions" only the model's own.
struct EmbeddingParams {
  std::vector<std::string> inputs;
  bool base64 = false;
};
EmbeddingParams parse_embeddings(const json& body, size_t max_inputs, size_t dim);

/// The float32 values, little-endian, in base64 (OpenAI's encoding_format "base64").
std::string base64_floats(const float* values, size_t n);

/// OpenAI's finish_reason for an engine's reason ("stop", "length"; null for the others).
json finish_reason_json(serve::FinishReason reason);

/// usage: {"prompt_tokens", "completion_tokens", "total_tokens"} (+ cached prompt tokens).
json usage_json(size_t prompt_tokens, size_t completion_tokens, size_t cached_tokens);

/// One server-sent event: "data: <json>\n\n".
std::string sse(const json& chunk);

}  // namespace wick::serve_http
