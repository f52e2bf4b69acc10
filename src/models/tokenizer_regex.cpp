#define PCRE2_CODE_UNIT_WIDTH 8
#include "models/tokenizer_regex.h"

#include <pcre2.h>

#include "wick/tokenizer.h"

namespace wick::tok {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int error) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(error, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// Oniguruma's \s is Unicode White_Space; PCRE2's differs (it takes U+180E, leaves U+0085 out
// of classes in some versions), so spell the property out.
std::string rewrite_pattern(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      char next = pattern[i + 1];
      if (next == 's') {
        out += "\\p{White_Space}";
      } else if (next == 'S') {
        out += "\\P{White_Space}";
      } else {
        out += pattern[i];
        out += next;
      }
      ++i;
      continue;
    }
    out += pattern[i];
  }
  return out;
}

// Per-thread match state shared by every pattern: match data sized for the whole match only,
// and a JIT stack large enough for long whitespace or letter runs.
struct MatchState {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern), code_(std::make_shared<Code>()) {
  std::string rewritten = rewrite_pattern(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code_->code == nullptr) {
    throw TokenizerError("tokenizer: regex '" + pattern_ + "' does not compile at offset " +
                         std::to_string(offset) + ": " + pcre2_message(error));
  }
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  MatchState& state = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    int rc = code_->jit ? pcre2_jit_match(code_->code, subject, text.size(), start, 0, state.data,
                                          state.context)
                        : pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                      state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0) {
      throw TokenizerError("tokenizer: regex '" + pattern_ + "' failed on a " +
                           std::to_string(text.size()) + "-byte text: " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      start = end;
    } else {
      // An empty match adds nothing: step over one code point.
      start = begin + 1;
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
}

}  // namespace wick::tok
