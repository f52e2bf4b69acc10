#include "models/tokenizer_spm.h"

#include <cstdio>
#include <optional>
#include <queue>

#include "formats/json_util.h"
#include "models/tokenizer_regex.h"
#include "models/tokenizer_unicode.h"
#include "wick/tokenizer.h"

namespace wick::tok {

namespace {

constexpr std::string_view kMetaspace = "\u2581";

bool flag(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    throw TokenizerError(std::string("tokenizer.json: '") + key + "' must be true or false, got " +
                         formats::describe(*it));
  }
  return it->get<bool>();
}

std::string text_of(const Json& j, const char* key, const char* stage) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    throw TokenizerError(std::string("tokenizer.json: ") + stage + " needs a string '" + key +
                         "', got " + (it == j.end() ? "none" : formats::describe(*it)));
  }
  return it->get<std::string>();
}

// A single character, as tokenizer.json writes Metaspace's replacement and Strip's content.
std::string one_char(const Json& j, const char* key, const char* stage, std::string fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  std::string s = text_of(j, key, stage);
  if (s.empty() || count_code_points(s) != 1) {
    throw TokenizerError(std::string("tokenizer.json: ") + stage + " '" + key +
                         "' must be one character, got '" + s + "'");
  }
  return s;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t last = 0;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, last)) {
    out.append(s, last, at - last);
    out.append(to);
    last = at + from.size();
  }
  if (last == 0) return;
  out.append(s, last);
  s.swap(out);
}

// Hugging Face's Replace: a literal string or a regular expression, and what replaces it.
class Replacement {
 public:
  explicit Replacement(const Json& j) : content_(text_of(j, "content", "Replace")) {
    const Json& pattern = j.at("pattern");
    if (pattern.contains("Regex")) {
      regex_.emplace(pattern["Regex"].get<std::string>());
    } else {
      literal_ = pattern.at("String").get<std::string>();
    }
  }
  void apply(std::string& s) const {
    if (!regex_) {
      replace_all(s, literal_, content_);
      return;
    }
    std::vector<std::pair<size_t, size_t>> matches;
    regex_->find_all(s, matches);
    if (matches.empty()) return;
    std::string out;
    size_t last = 0;
    for (auto [b, e] : matches) {
      out.append(s, last, b - last);
      out += content_;
      last = e;
    }
    out.append(s, last);
    s.swap(out);
  }

 private:
  std::string content_;
  std::string literal_;
  std::optional<Regex> regex_;
};

// ---------------------------------------------------------------------------------------------
// Normalizers

class ReplaceNormalizer final : public Normalizer {
 public:
  explicit ReplaceNormalizer(Replacement r) : r_(std::move(r)) {}
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    r_.apply(s);
    return s;
  }

 private:
  Replacement r_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    if (text.empty()) return {};
    return prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t i = begin;
        if (!is_whitespace(next_code_point(text, i))) break;
        begin = i;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_whitespace(next_code_point(text, i))) break;
        end = start;
      }
    }
    return std::string(text.substr(begin, end - begin));
  }

 private:
  bool left_, right_;
};

// ---------------------------------------------------------------------------------------------
// Metaspace: spaces become the replacement character, which also starts the text (always, or
// only at the start of the input) and, with split, starts each piece.

enum class Prepend { Always, First, Never };

Prepend prepend_scheme(const Json& j) {
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    std::string s = text_of(j, "prepend_scheme", "Metaspace");
    if (s == "always") return Prepend::Always;
    if (s == "first") return Prepend::First;
    if (s == "never") return Prepend::Never;
    throw TokenizerError("tokenizer.json: Metaspace prepend_scheme '" + s +
                         "' is not supported (always, first, never)");
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return flag(j, "add_prefix_space", true) ? Prepend::Always : Prepend::Never;
}

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, Prepend scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  bool rewrites() const override { return true; }
  std::string rewrite(std::string_view text, bool first) const override {
    std::string s(text);
    replace_all(s, " ", replacement_);
    bool prepend = scheme_ == Prepend::Always || (scheme_ == Prepend::First && first);
    if (prepend && !s.starts_with(replacement_)) s.insert(0, replacement_);
    return s;
  }
  void split(std::string_view text, std::vector<Span>& spans) const override {
    if (!split_) return;
    // Each replacement character starts a piece (Hugging Face's MergedWithNext).
    std::vector<Span> out;
    out.reserve(spans.size() * 2);
    for (Span span : spans) {
      size_t begin = span.begin;
      std::string_view s = text.substr(0, span.end);
      for (size_t at = s.find(replacement_, span.begin + 1); at != std::string_view::npos;
           at = s.find(replacement_, at + 1)) {
        out.push_back({begin, at});
        begin = at;
      }
      if (begin < span.end) out.push_back({begin, span.end});
    }
    spans.swap(out);
  }

 private:
  std::string replacement_;
  Prepend scheme_;
  bool split_;
};

// ---------------------------------------------------------------------------------------------
// Decoders

class ReplaceDecoder final : public Decoder {
 public:
  explicit ReplaceDecoder(Replacement r) : r_(std::move(r)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) r_.apply(t);
  }
  std::string token_bytes(std::string token) const override {
    r_.apply(token);
    return token;
  }

 private:
  Replacement r_;
};

// The byte of a "<0xNN>" token (either case of hex digit), or -1.
int byte_token(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return -1;
  int value = 0;
  for (char c : t.substr(3, 2)) {
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

class ByteFallbackDecoder final : public Decoder {
 public:
  // Runs of byte tokens become their text when it is valid UTF-8, else one U+FFFD per byte.
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (is_valid_utf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.emplace_back("\uFFFD");
      }
      bytes.clear();
    };
    for (auto& t : tokens) {
      int b = byte_token(t);
      if (b >= 0) {
        bytes.push_back(static_cast<char>(b));
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens.swap(out);
  }
  std::string token_bytes(std::string token) const override {
    int b = byte_token(token);
    return b >= 0 ? std::string(1, static_cast<char>(b)) : token;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t begin = 0, end = t.size();
      for (size_t n = 0; n < start_ && begin + content_.size() <= end &&
                         t.compare(begin, content_.size(), content_) == 0;
           ++n) {
        begin += content_.size();
      }
      for (size_t n = 0; n < stop_ && end >= begin + content_.size() &&
                         t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++n) {
        end -= content_.size();
      }
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, Prepend scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  // Hugging Face drops every replacement character of the first token unless the scheme is
  // never, and turns the others into spaces.
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      replace_all(tokens[i], replacement_, i == 0 && scheme_ != Prepend::Never ? "" : " ");
    }
  }
  std::string token_bytes(std::string token) const override {
    replace_all(token, replacement_, " ");
    return token;
  }

 private:
  std::string replacement_;
  Prepend scheme_;
};

size_t count_of(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    throw TokenizerError(std::string("tokenizer.json: Strip '") + key +
                         "' must be a non-negative integer, got " + formats::describe(*it));
  }
  return it->get<size_t>();
}

std::unique_ptr<Normalizer> spm_normalizer(bool add_space_prefix) {
  Json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMetaspace}};
  if (!add_space_prefix) return make_normalizer(replace);
  Json prepend = {{"type", "Prepend"}, {"prepend", kMetaspace}};
  return make_normalizer({{"type", "Sequence"}, {"normalizers", Json::array({prepend, replace})}});
}

}  // namespace

std::unique_ptr<Normalizer> make_spm_normalizer(const Json& j) {
  std::string type = j.at("type").get<std::string>();
  if (type == "Replace") return std::make_unique<ReplaceNormalizer>(Replacement(j));
  if (type == "Prepend")
    return std::make_unique<PrependNormalizer>(text_of(j, "prepend", "Prepend"));
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(flag(j, "strip_left", true),
                                             flag(j, "strip_right", true));
  }
  return nullptr;
}

std::unique_ptr<PreTokenizer> make_spm_pre_tokenizer(const Json& j) {
  if (j.at("type").get<std::string>() != "Metaspace") return nullptr;
  return std::make_unique<MetaspacePreTokenizer>(
      one_char(j, "replacement", "Metaspace", std::string(kMetaspace)), prepend_scheme(j),
      flag(j, "split", true));
}

std::unique_ptr<Decoder> make_spm_decoder(const Json& j) {
  std::string type = j.at("type").get<std::string>();
  if (type == "Replace") return std::make_unique<ReplaceDecoder>(Replacement(j));
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    return std::make_unique<StripDecoder>(one_char(j, "content", "Strip", " "),
                                          count_of(j, "start"), count_of(j, "stop"));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspaceDecoder>(
        one_char(j, "replacement", "Metaspace", std::string(kMetaspace)), prepend_scheme(j));
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Spm

Spm::Spm(Vocab vocab, std::vector<float> scores, std::optional<uint32_t> unk)
    : scores_(std::move(scores)), unk_(unk) {
  vocab_ = std::move(vocab);
  if (scores_.empty()) scores_.assign(vocab_.tokens.size(), 0.0f);
  if (scores_.size() != vocab_.tokens.size()) {
    throw TokenizerError("Tokenizer::from_gguf_vocab: " + std::to_string(scores_.size()) +
                         " scores for " + std::to_string(vocab_.tokens.size()) + " tokens");
  }
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto id = vocab_.find(name);
    if (!id) id = vocab_.find(std::string(1, static_cast<char>(b)));
    if (id) byte_ids_[b] = *id;
  }
}

void Spm::resegment(std::string_view piece, const std::vector<Symbol>& symbols, size_t index,
                    const std::unordered_map<std::string_view, std::pair<int32_t, int32_t>>& splits,
                    std::vector<uint32_t>& out) const {
  const Symbol& s = symbols[index];
  std::string_view text = piece.substr(s.begin, s.bytes);
  if (auto id = vocab_.find(text)) {
    out.push_back(*id);
    return;
  }
  auto it = splits.find(text);
  if (it == splits.end()) {
    for (char c : text) {
      int64_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        out.push_back(static_cast<uint32_t>(id));
      } else if (unk_) {
        out.push_back(*unk_);
      } else {
        throw TokenizerError("Tokenizer: byte " + std::to_string(static_cast<uint8_t>(c)) +
                             " has no <0xNN> token and the vocabulary no unknown token");
      }
    }
    return;
  }
  resegment(piece, symbols, static_cast<size_t>(it->second.first), splits, out);
  resegment(piece, symbols, static_cast<size_t>(it->second.second), splits, out);
}

void Spm::tokenize(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.empty()) return;
  std::vector<Symbol> symbols;
  for (size_t i = 0; i < piece.size();) {
    size_t start = i;
    next_code_point(piece, i);
    auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({start, i - start, n - 1, i == piece.size() ? -1 : n + 1});
  }
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    size_t bytes;
    // Highest score first, then leftmost.
    bool operator<(const Bigram& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Bigram> queue;
  // The last pair each merged text came from, to split pieces that are not tokens.
  std::unordered_map<std::string_view, std::pair<int32_t, int32_t>> splits;
  auto try_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    std::string_view text =
        piece.substr(symbols[left].begin, symbols[left].bytes + symbols[right].bytes);
    auto id = vocab_.find(text);
    if (!id) return;
    queue.push({scores_[*id], left, right, text.size()});
    splits[text] = {left, right};
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_pair(i - 1, i);
  while (!queue.empty()) {
    Bigram top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.bytes == 0 || right.bytes == 0 || left.bytes + right.bytes != top.bytes) continue;
    left.bytes += right.bytes;
    right.bytes = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    try_pair(left.prev, top.left);
    try_pair(top.left, left.next);
  }
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    resegment(piece, symbols, static_cast<size_t>(i), splits, out);
  }
}

SpmGgufStages spm_gguf_stages(const GgufVocab& v) {
  SpmGgufStages stages;
  stages.normalizer = spm_normalizer(v.add_space_prefix);
  Vocab vocab;
  for (size_t i = 0; i < v.tokens.size(); ++i) vocab.add(v.tokens[i], static_cast<uint32_t>(i));
  stages.model = std::make_unique<Spm>(std::move(vocab), v.scores, v.unk_id);
  Json replace = {{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}};
  Json decoders = Json::array({replace, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}});
  if (v.add_space_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  stages.decoder = make_decoder({{"type", "Sequence"}, {"decoders", decoders}});
  return stages;
}

}  // namespace wick::tok
