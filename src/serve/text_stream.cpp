#include "serve/text_stream.h"

#include <algorithm>

namespace wick::serve {

TextStream::TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop)
    : stop_(std::move(stop)) {
  if (tokenizer != nullptr) decode_.emplace(*tokenizer, true);
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
}

std::string TextStream::push(uint32_t token) {
  if (!decode_ || stopped_) return {};
  text_ += decode_->step(token);
  // A stop string begins at or after sent_: text that could begin one was held back.
  size_t found = std::string::npos;
  for (const std::string& s : stop_) found = std::min(found, text_.find(s, sent_));
  if (found != std::string::npos) {
    stopped_ = true;
    std::string out = text_.substr(sent_, found - sent_);
    sent_ = text_.size();
    return out;
  }
  // Hold back the longest tail of the unsent text that is a proper prefix of a stop string.
  size_t hold = 0;
  const size_t unsent = text_.size() - sent_;
  for (const std::string& s : stop_) {
    for (size_t n = std::min(unsent, s.size() - 1); n > hold; --n) {
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = text_.substr(sent_, unsent - hold);
  sent_ += out.size();
  return out;
}

std::string TextStream::finish() {
  if (!decode_ || stopped_) return {};
  text_ += decode_->flush();
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace wick::serve
