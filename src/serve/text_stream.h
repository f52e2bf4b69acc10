#pragma once
// The text of one request's completion as tokens arrive: complete UTF-8 characters (through
// DecodeStream), with stop strings found across token boundaries and the text that may begin a
// stop string held back until it cannot.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "wick/tokenizer.h"

namespace wick::serve {

class TextStream {
 public:
  /// Without a tokenizer every text is "" and no stop string can be met.
  TextStream(const Tokenizer* tokenizer, std::vector<std::string> stop);
  /// Adds `token`'s text; returns the text that may be sent now. Sets stopped() when a stop
  /// string occurs (the returned text then ends before it).
  std::string push(uint32_t token);
  /// The text held back (the request ends without a stop string).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::optional<DecodeStream> decode_;
  std::vector<std::string> stop_;
  std::string text_;  // the completion so far
  size_t sent_ = 0;   // bytes of text_ returned
  bool stopped_ = false;
};

}  // namespace wick::serve
