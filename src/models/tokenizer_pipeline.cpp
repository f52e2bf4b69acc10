#include "models/tokenizer_pipeline.h"

#include <array>
#include <functional>
#include <optional>

#include "formats/json_util.h"
#include "models/tokenizer_regex.h"
#include "models/tokenizer_spm.h"
#include "models/tokenizer_unicode.h"
#include "wick/tokenizer.h"

namespace wick::tok {

namespace {

[[noreturn]] void unsupported(const char* stage, const Json& j) {
  auto it = j.is_object() ? j.find("type") : j.end();
  std::string type = formats::describe(it != j.end() ? *it : j);
  throw TokenizerError(std::string("tokenizer.json: ") + stage + " " + type + " is not supported");
}

// A token id: an integer in [0, 2^32), not wrapped from a negative or wider number.
uint32_t token_id(const Json& v, const char* where) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= UINT32_MAX) return v.get<uint32_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= UINT32_MAX) {
    return static_cast<uint32_t>(v.get<int64_t>());
  }
  std::string msg = "tokenizer.json: ";
  msg += where;
  msg += " id must be an integer in [0, 2^32), got ";
  msg += formats::describe(v);
  throw TokenizerError(msg);
}

template <class T>
T get_or(const Json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

// ---------------------------------------------------------------------------------------------
// Normalizers

class BertNormalizer final : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_text_(clean_text), chinese_(chinese), strip_(strip_accents), lower_(lowercase) {}

  std::string normalize(std::string_view text) const override {
    std::string out;
    out.reserve(text.size() + 8);
    // Clean-up and CJK padding, in one pass.
    for (size_t i = 0; i < text.size();) {
      char32_t cp = next_code_point(text, i);
      if (clean_text_) {
        if (cp == 0 || cp == 0xFFFD || is_bert_control(cp)) continue;
        if (is_whitespace(cp)) cp = ' ';
      }
      if (chinese_ && is_cjk_ideograph(cp)) {
        out.push_back(' ');
        append_utf8(out, cp);
        out.push_back(' ');
      } else {
        append_utf8(out, cp);
      }
    }
    if (strip_ && !is_ascii(out)) out = strip_accents(normalize_nfd(out));
    if (lower_) out = lowercase(out);
    return out;
  }

  static std::string normalize_nfd(std::string_view s) {
    return tok::normalize(s, NormalForm::NFD);
  }

  static std::string strip_accents(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      size_t start = i;
      char32_t cp = next_code_point(s, i);
      if (!is_bert_accent(cp)) out.append(s.substr(start, i - start));
    }
    return out;
  }

  static std::string lowercase(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      auto c = static_cast<uint8_t>(s[i]);
      if (c < 0x80) {
        out.push_back(static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c));
        ++i;
        continue;
      }
      append_lowercase(out, next_code_point(s, i));
    }
    return out;
  }

 private:
  bool clean_text_, chinese_, strip_, lower_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  std::string normalize(std::string_view text) const override {
    return tok::normalize(text, form_);
  }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override {
    return BertNormalizer::lowercase(text);
  }
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override {
    return BertNormalizer::strip_accents(text);
  }
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& p : parts_) s = p->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

// ---------------------------------------------------------------------------------------------
// Splitting, as Hugging Face's NormalizedString::split.

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const Json& j) {
  std::string b = j.is_string() ? j.get<std::string>() : "Isolated";
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  throw TokenizerError("tokenizer.json: split behavior '" + b + "' is not supported");
}

struct Piece {
  size_t begin, end;
  bool match;
};

// Turns the matches and gaps covering one span into the spans the behavior keeps.
void apply_behavior(std::vector<Piece>& pieces, Behavior behavior, bool invert,
                    std::vector<Span>& out) {
  if (invert) {
    for (auto& p : pieces) p.match = !p.match;
  }
  std::vector<Span> kept;
  switch (behavior) {
    case Behavior::Isolated:
      for (const auto& p : pieces) kept.push_back({p.begin, p.end});
      break;
    case Behavior::Removed:
      for (const auto& p : pieces) {
        if (!p.match) kept.push_back({p.begin, p.end});
      }
      break;
    case Behavior::Contiguous: {
      bool previous = false;
      for (const auto& p : pieces) {
        if (p.match == previous && !kept.empty()) {
          kept.back().end = p.end;
        } else {
          kept.push_back({p.begin, p.end});
        }
        previous = p.match;
      }
      break;
    }
    case Behavior::MergedWithPrevious: {
      bool previous = false;
      for (const auto& p : pieces) {
        if (p.match && !previous && !kept.empty()) {
          kept.back().end = p.end;
        } else {
          kept.push_back({p.begin, p.end});
        }
        previous = p.match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      bool previous = false;
      for (size_t k = pieces.size(); k-- > 0;) {
        const auto& p = pieces[k];
        if (p.match && !previous && !kept.empty()) {
          kept.back().begin = p.begin;
        } else {
          kept.push_back({p.begin, p.end});
        }
        previous = p.match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const auto& s : kept) {
    if (s.end > s.begin) out.push_back(s);
  }
}

// Matches and gaps of a predicate over characters: each matching character is its own match.
template <class Pred>
void char_pieces(std::string_view text, Span span, Pred&& pred, std::vector<Piece>& pieces) {
  size_t last = span.begin;
  for (size_t i = span.begin; i < span.end;) {
    size_t start = i;
    char32_t cp = next_code_point(text, i);
    if (pred(cp)) {
      if (last < start) pieces.push_back({last, start, false});
      pieces.push_back({start, i, true});
      last = i;
    }
  }
  if (last < span.end) pieces.push_back({last, span.end, false});
}

void regex_pieces(std::string_view text, Span span, const Regex& re, std::vector<Piece>& pieces) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  re.find_all(text.substr(span.begin, span.end - span.begin), matches);
  size_t last = 0, n = span.end - span.begin;
  for (auto [b, e] : matches) {
    if (last < b) pieces.push_back({span.begin + last, span.begin + b, false});
    pieces.push_back({span.begin + b, span.begin + e, true});
    last = e;
  }
  if (last < n) pieces.push_back({span.begin + last, span.end, false});
}

void literal_pieces(std::string_view text, Span span, const std::string& lit,
                    std::vector<Piece>& pieces) {
  std::string_view s = text.substr(span.begin, span.end - span.begin);
  size_t last = 0;
  if (!lit.empty()) {
    for (size_t at = s.find(lit); at != std::string_view::npos; at = s.find(lit, at)) {
      if (last < at) pieces.push_back({span.begin + last, span.begin + at, false});
      pieces.push_back({span.begin + at, span.begin + at + lit.size(), true});
      at += lit.size();
      last = at;
    }
  }
  if (last < s.size()) pieces.push_back({span.begin + last, span.end, false});
}

// Applies `make_pieces` to every span and keeps what `behavior` says.
template <class MakePieces>
void refine(std::vector<Span>& spans, Behavior behavior, bool invert, MakePieces&& make_pieces) {
  thread_local std::vector<Piece> pieces;
  std::vector<Span> out;
  out.reserve(spans.size() * 2);
  for (Span s : spans) {
    pieces.clear();
    make_pieces(s, pieces);
    apply_behavior(pieces, behavior, invert, out);
  }
  spans.swap(out);
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

class BertPreTokenizer final : public PreTokenizer {
 public:
  void split(std::string_view text, std::vector<Span>& spans) const override {
    refine(spans, Behavior::Removed, false,
           [&](Span s, std::vector<Piece>& p) { char_pieces(text, s, is_whitespace, p); });
    refine(spans, Behavior::Isolated, false,
           [&](Span s, std::vector<Piece>& p) { char_pieces(text, s, is_bert_punctuation, p); });
  }
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : prefix_space_(add_prefix_space) {
    if (use_regex) regex_.emplace(kGpt2Pattern);
  }
  void split(std::string_view text, std::vector<Span>& spans) const override {
    if (!regex_) return;
    refine(spans, Behavior::Isolated, false,
           [&](Span s, std::vector<Piece>& p) { regex_pieces(text, s, *regex_, p); });
  }
  bool byte_level() const override { return true; }
  bool adds_prefix_space() const override { return prefix_space_; }

 private:
  bool prefix_space_;
  std::optional<Regex> regex_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::optional<Regex> regex, std::string literal, Behavior behavior, bool invert)
      : regex_(std::move(regex)),
        literal_(std::move(literal)),
        behavior_(behavior),
        invert_(invert) {}
  void split(std::string_view text, std::vector<Span>& spans) const override {
    refine(spans, behavior_, invert_, [&](Span s, std::vector<Piece>& p) {
      if (regex_) {
        regex_pieces(text, s, *regex_, p);
      } else {
        literal_pieces(text, s, literal_, p);
      }
    });
  }

 private:
  std::optional<Regex> regex_;
  std::string literal_;
  Behavior behavior_;
  bool invert_;
};

class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  CharSplitPreTokenizer(bool (*pred)(char32_t), Behavior behavior)
      : pred_(pred), behavior_(behavior) {}
  void split(std::string_view text, std::vector<Span>& spans) const override {
    refine(spans, behavior_, false,
           [&](Span s, std::vector<Piece>& p) { char_pieces(text, s, pred_, p); });
  }

 private:
  bool (*pred_)(char32_t);
  Behavior behavior_;
};

class WhitespacePreTokenizer final : public PreTokenizer {
 public:
  WhitespacePreTokenizer() : regex_(R"(\w+|[^\w\s]+)") {}
  void split(std::string_view text, std::vector<Span>& spans) const override {
    refine(spans, Behavior::Removed, true,
           [&](Span s, std::vector<Piece>& p) { regex_pieces(text, s, regex_, p); });
  }

 private:
  Regex regex_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {
    for (size_t i = 1; i < parts_.size(); ++i) {
      if (parts_[i]->rewrites()) {
        throw TokenizerError(
            "tokenizer.json: a Metaspace pre-tokenizer after others in a Sequence is not "
            "supported");
      }
    }
    for (size_t i = 0; i < parts_.size(); ++i) {
      // The byte-level mapping is done by the model on raw bytes, so it must come last; a
      // prefix space is added to the whole text, so only a first ByteLevel may ask for one.
      if (parts_[i]->byte_level() && i + 1 != parts_.size()) {
        throw TokenizerError(
            "tokenizer.json: a ByteLevel pre-tokenizer before others in a "
            "Sequence is not supported");
      }
      if (parts_[i]->adds_prefix_space() && i != 0) {
        throw TokenizerError(
            "tokenizer.json: ByteLevel add_prefix_space after another "
            "pre-tokenizer is not supported");
      }
    }
  }
  void split(std::string_view text, std::vector<Span>& spans) const override {
    for (const auto& p : parts_) p->split(text, spans);
  }
  bool byte_level() const override { return !parts_.empty() && parts_.back()->byte_level(); }
  bool adds_prefix_space() const override {
    return !parts_.empty() && parts_.front()->adds_prefix_space();
  }
  bool rewrites() const override { return !parts_.empty() && parts_.front()->rewrites(); }
  std::string rewrite(std::string_view text, bool first) const override {
    return parts_.front()->rewrite(text, first);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

bool is_numeric_char(char32_t cp) {
  return is_numeric(cp);
}
bool is_whitespace_char(char32_t cp) {
  return is_whitespace(cp);
}
bool is_punctuation_char(char32_t cp) {
  // Hugging Face's Punctuation pre-tokenizer uses BERT's definition.
  return is_bert_punctuation(cp);
}

std::unique_ptr<PreTokenizer> digits(bool individual) {
  return std::make_unique<CharSplitPreTokenizer>(
      is_numeric_char, individual ? Behavior::Isolated : Behavior::Contiguous);
}

// ---------------------------------------------------------------------------------------------
// Post-processors

class TemplateProcessor final : public PostProcessor {
 public:
  // Each item: ids to insert, or empty for "the sequence".
  explicit TemplateProcessor(std::vector<std::optional<std::vector<uint32_t>>> items)
      : items_(std::move(items)) {
    for (const auto& it : items_) added_ += it ? it->size() : 0;
  }
  void process(std::vector<uint32_t>& ids) const override {
    std::vector<uint32_t> out;
    out.reserve(ids.size() + added_);
    for (const auto& it : items_) {
      if (it) {
        out.insert(out.end(), it->begin(), it->end());
      } else {
        out.insert(out.end(), ids.begin(), ids.end());
      }
    }
    ids.swap(out);
  }
  size_t added() const override { return added_; }

 private:
  std::vector<std::optional<std::vector<uint32_t>>> items_;
  size_t added_ = 0;
};

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void process(std::vector<uint32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }
  size_t added() const override {
    size_t n = 0;
    for (const auto& p : parts_) n += p->added();
    return n;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

std::unique_ptr<PostProcessor> template_processor(const Json& j) {
  const Json& special = j.at("special_tokens");
  std::vector<std::optional<std::vector<uint32_t>>> items;
  for (const Json& item : j.at("single")) {
    if (item.contains("Sequence")) {
      if (item["Sequence"].at("id").get<std::string>() != "A") {
        throw TokenizerError(
            "tokenizer.json: TemplateProcessing single template names "
            "sequence B");
      }
      items.emplace_back(std::nullopt);
    } else if (item.contains("SpecialToken")) {
      std::string name = item["SpecialToken"].at("id").get<std::string>();
      if (!special.contains(name)) {
        throw TokenizerError("tokenizer.json: TemplateProcessing names special token '" + name +
                             "' missing from special_tokens");
      }
      std::vector<uint32_t> ids;
      for (const Json& id : special[name].at("ids")) ids.push_back(token_id(id, "special token"));
      items.emplace_back(std::move(ids));
    } else {
      unsupported("TemplateProcessing item", item);
    }
  }
  return std::make_unique<TemplateProcessor>(std::move(items));
}

// ---------------------------------------------------------------------------------------------
// Decoders

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      if (!byte_level_to_bytes(t, bytes)) bytes += t;
    }
    tokens.assign(1, is_valid_utf8(bytes) ? std::move(bytes) : to_valid_utf8(bytes));
  }
};

class WordPieceDecoder final : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup)
      : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (t.starts_with(prefix_)) {
          t.erase(0, prefix_.size());
        } else {
          t.insert(t.begin(), ' ');
        }
      }
      if (cleanup_) t = cleanup(t);
    }
  }

  // Hugging Face's wordpiece cleanup, applied to each token as it does.
  static std::string cleanup(std::string s) {
    static const std::array<std::pair<std::string_view, std::string_view>, 11> rules = {{
        {" .", "."},
        {" ?", "?"},
        {" !", "!"},
        {" ,", ","},
        {" ' ", "'"},
        {" n't", "n't"},
        {" 'm", "'m"},
        {" do not", " don't"},
        {" 's", "'s"},
        {" 've", "'ve"},
        {" 're", "'re"},
    }};
    for (auto [from, to] : rules) {
      for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
        s.replace(at, from.size(), to);
      }
    }
    return s;
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }
  std::string token_bytes(std::string token) const override {
    for (const auto& p : parts_) token = p->token_bytes(std::move(token));
    return token;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// GPT-2's table: printable Latin-1 bytes stand for themselves, the others take the code points
// from U+0100 up, in byte order.
struct ByteTable {
  std::array<std::string, 256> symbol;
  std::array<int, 324> byte_of;
  ByteTable() {
    byte_of.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      int cp = printable ? b : next++;
      append_utf8(symbol[b], static_cast<char32_t>(cp));
      byte_of[cp] = b;
    }
  }
};

const ByteTable& byte_table() {
  static const ByteTable table;
  return table;
}

}  // namespace

const std::string& byte_to_symbol(uint8_t b) {
  return byte_table().symbol[b];
}

int symbol_to_byte(char32_t cp) {
  return cp < byte_table().byte_of.size() ? byte_table().byte_of[cp] : -1;
}

bool byte_level_to_bytes(std::string_view token, std::string& out) {
  size_t mark = out.size();
  for (size_t i = 0; i < token.size();) {
    int b = symbol_to_byte(next_code_point(token, i));
    if (b < 0) {
      out.resize(mark);
      return false;
    }
    out.push_back(static_cast<char>(b));
  }
  return true;
}

std::unique_ptr<Normalizer> make_normalizer(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.at("type").get<std::string>();
  if (type == "BertNormalizer") {
    bool lowercase = get_or(j, "lowercase", true);
    return std::make_unique<BertNormalizer>(get_or(j, "clean_text", true),
                                            get_or(j, "handle_chinese_chars", true),
                                            get_or(j, "strip_accents", lowercase), lowercase);
  }
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::NFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const Json& p : j.at("normalizers")) parts.push_back(make_normalizer(p));
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  if (auto spm = make_spm_normalizer(j)) return spm;
  unsupported("normalizer", j);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.at("type").get<std::string>();
  if (type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(get_or(j, "add_prefix_space", true),
                                                   get_or(j, "use_regex", true));
  }
  if (type == "Split") {
    const Json& pattern = j.at("pattern");
    std::optional<Regex> regex;
    std::string literal;
    if (pattern.contains("Regex")) {
      regex.emplace(pattern["Regex"].get<std::string>());
    } else {
      literal = pattern.at("String").get<std::string>();
    }
    return std::make_unique<SplitPreTokenizer>(std::move(regex), std::move(literal),
                                               parse_behavior(j.value("behavior", Json())),
                                               get_or(j, "invert", false));
  }
  if (type == "Digits") return digits(get_or(j, "individual_digits", false));
  if (type == "Whitespace") return std::make_unique<WhitespacePreTokenizer>();
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharSplitPreTokenizer>(is_whitespace_char, Behavior::Removed);
  }
  if (type == "Punctuation") {
    return std::make_unique<CharSplitPreTokenizer>(is_punctuation_char,
                                                   parse_behavior(j.value("behavior", Json())));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const Json& p : j.at("pretokenizers")) parts.push_back(make_pre_tokenizer(p));
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  if (auto spm = make_spm_pre_tokenizer(j)) return spm;
  unsupported("pre_tokenizer", j);
}

std::unique_ptr<PostProcessor> make_post_processor(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.at("type").get<std::string>();
  if (type == "TemplateProcessing") return template_processor(j);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    uint32_t cls = token_id(j.at("cls").at(1), "cls");
    uint32_t sep = token_id(j.at("sep").at(1), "sep");
    return make_bos_eos_processor({cls}, {sep});
  }
  if (type == "ByteLevel") return make_bos_eos_processor({}, {});  // offsets only
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const Json& p : j.at("processors")) parts.push_back(make_post_processor(p));
    return std::make_unique<SequenceProcessor>(std::move(parts));
  }
  unsupported("post_processor", j);
}

std::unique_ptr<Decoder> make_decoder(const Json& j) {
  if (j.is_null()) return nullptr;
  std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "WordPiece") {
    return std::make_unique<WordPieceDecoder>(get_or<std::string>(j, "prefix", "##"),
                                              get_or(j, "cleanup", true));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const Json& p : j.at("decoders")) parts.push_back(make_decoder(p));
    return std::make_unique<SequenceDecoder>(std::move(parts));
  }
  if (auto spm = make_spm_decoder(j)) return spm;
  unsupported("decoder", j);
}

std::unique_ptr<PreTokenizer> pre_tokenizer_for_gguf(const std::string& pre) {
  auto byte_level = [] { return std::make_unique<ByteLevelPreTokenizer>(false, false); };
  auto split_then_bytes = [&](std::string_view pattern) {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(std::make_unique<SplitPreTokenizer>(Regex(pattern), std::string(),
                                                        Behavior::Isolated, false));
    parts.push_back(byte_level());
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  };
  // Names as llama.cpp writes them in tokenizer.ggml.pre.
  if (pre.empty() || pre == "default" || pre == "gpt2" || pre == "gpt-2" || pre == "mpt" ||
      pre == "olmo" || pre == "jais") {
    return std::make_unique<ByteLevelPreTokenizer>(false, true);
  }
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "dbrx" ||
      pre == "smaug-bpe") {
    return split_then_bytes(kLlama3Pattern);
  }
  if (pre == "qwen2" || pre == "stablelm2" || pre == "deepseek-r1-qwen") {
    return split_then_bytes(kQwen2Pattern);
  }
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "command-r" ||
      pre == "codeshell") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    parts.push_back(digits(true));
    parts.push_back(std::make_unique<ByteLevelPreTokenizer>(false, true));
    return std::make_unique<SequencePreTokenizer>(std::move(parts));
  }
  throw TokenizerError("Tokenizer::from_gguf_vocab: pre-tokenizer '" + pre +
                       "' is not supported (gpt2, llama-bpe, smollm, qwen2 and their aliases)");
}

std::unique_ptr<Normalizer> normalizer_for_gguf(const std::string& pre) {
  // llama.cpp skips Qwen2's NFC; HF applies it, and wick follows HF.
  if (pre == "qwen2" || pre == "stablelm2" || pre == "deepseek-r1-qwen") {
    return std::make_unique<UnicodeNormalizer>(NormalForm::NFC);
  }
  return nullptr;
}

std::unique_ptr<PostProcessor> make_bos_eos_processor(std::vector<uint32_t> prefix,
                                                      std::vector<uint32_t> suffix) {
  std::vector<std::optional<std::vector<uint32_t>>> items;
  if (!prefix.empty()) items.emplace_back(std::move(prefix));
  items.emplace_back(std::nullopt);
  if (!suffix.empty()) items.emplace_back(std::move(suffix));
  return std::make_unique<TemplateProcessor>(std::move(items));
}

std::unique_ptr<Decoder> make_byte_level_decoder() {
  return std::make_unique<ByteLevelDecoder>();
}

}  // namespace wick::tok
