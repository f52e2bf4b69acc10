#include "wick/tokenizer.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "cpu/parallel.h"
#include "formats/format_util.h"
#include "formats/json_util.h"
#include "models/json_file.h"
#include "models/tokenizer_chat.h"
#include "models/tokenizer_models.h"
#include "models/tokenizer_pipeline.h"
#include "models/tokenizer_spm.h"
#include "models/tokenizer_unicode.h"

namespace wick {

namespace tok {

struct AddedToken {
  uint32_t id = 0;
  std::string content;  // as written in text
  std::string match;    // what is matched: content, normalised for normalized tokens
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

/// A piece of text to tokenise, or an added token found in it (id >= 0).
struct Segment {
  size_t begin;
  size_t end;
  int64_t id;
};

/// Tokens matched in text before pre-tokenisation (tokenizer.json's added_tokens), found leftmost
/// first and longest first at one position, as HF's Aho-Corasick matcher does.
class AddedVocab {
 public:
  void add(AddedToken t) {
    by_id_[t.id] = tokens_.size();
    tokens_.push_back(std::move(t));
  }

  /// Prepares the matchers; `normalize` gives the normalised form of normalized tokens.
  template <class Normalize>
  void build(Normalize&& normalize) {
    for (auto& first : first_) first.clear();
    has_normalized_ = false;
    for (size_t i = 0; i < tokens_.size(); ++i) {
      AddedToken& t = tokens_[i];
      t.match = t.normalized ? normalize(t.content) : t.content;
      if (t.match.empty()) continue;
      has_normalized_ |= t.normalized;
      first_[static_cast<uint8_t>(t.match[0])].push_back(i);
    }
    for (auto& first : first_) {
      std::stable_sort(first.begin(), first.end(), [&](size_t a, size_t b) {
        return tokens_[a].match.size() > tokens_[b].match.size();
      });
    }
  }

  bool has_normalized() const { return has_normalized_; }

  const AddedToken* find(uint32_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &tokens_[it->second];
  }
  const std::vector<AddedToken>& tokens() const { return tokens_; }

  /// Splits `text` at the added tokens whose `normalized` flag equals `normalized`.
  void split(std::string_view text, bool normalized, std::vector<Segment>& out) const {
    size_t last = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto& candidates = first_[static_cast<uint8_t>(text[i])];
      if (candidates.empty()) continue;
      for (size_t k : candidates) {
        const AddedToken& t = tokens_[k];
        if (t.normalized != normalized || text.compare(i, t.match.size(), t.match) != 0) continue;
        size_t begin = i, end = i + t.match.size();
        if (t.single_word && !(at_word_boundary(text, begin) && at_word_boundary(text, end))) {
          continue;
        }
        if (t.lstrip) begin = strip_left(text, last, begin);
        if (t.rstrip) end = strip_right(text, end);
        if (last < begin) out.push_back({last, begin, -1});
        out.push_back({begin, end, t.id});
        last = end;
        i = end - 1;
        break;
      }
    }
    if (last < text.size()) out.push_back({last, text.size(), -1});
  }

 private:
  static bool is_word_char(char32_t cp) { return cp == '_' || is_alphanumeric(cp); }
  // True when `at` is not inside a word (the characters on both sides are not both word ones).
  static bool at_word_boundary(std::string_view text, size_t at) {
    if (at == 0 || at == text.size()) return true;
    size_t before = at - 1;
    while (before > 0 && (static_cast<uint8_t>(text[before]) & 0xC0) == 0x80) --before;
    size_t i = before;
    char32_t left = next_code_point(text, i);
    i = at;
    char32_t right = next_code_point(text, i);
    return !(is_word_char(left) && is_word_char(right));
  }
  static size_t strip_left(std::string_view text, size_t floor, size_t begin) {
    while (begin > floor) {
      size_t prev = begin - 1;
      while (prev > floor && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
      size_t i = prev;
      if (!is_whitespace(next_code_point(text, i))) break;
      begin = prev;
    }
    return begin;
  }
  static size_t strip_right(std::string_view text, size_t end) {
    while (end < text.size()) {
      size_t i = end;
      if (!is_whitespace(next_code_point(text, i))) break;
      end = i;
    }
    return end;
  }

  std::vector<AddedToken> tokens_;
  std::unordered_map<uint32_t, size_t> by_id_;
  std::array<std::vector<size_t>, 256> first_;
  bool has_normalized_ = false;
};

}  // namespace tok

using namespace tok;

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> post;
  std::unique_ptr<Decoder> decoder;
  AddedVocab added;
  bool byte_level = false;
  bool prefix_space = false;
  std::optional<uint32_t> bos, eos, unk;
  uint32_t pad = 0;
  size_t truncation = 0;
  size_t vocab_size = 0;
  TokenizerChat chat;

  // Pre-tokenises and tokenises text that holds no added token; `first` when it starts the input.
  void tokenize_text(std::string_view text, bool first, std::vector<uint32_t>& ids) const {
    if (text.empty()) return;
    std::string spaced;
    if (pre_tokenizer && pre_tokenizer->rewrites()) {
      spaced = pre_tokenizer->rewrite(text, first);
      text = spaced;
    } else if (prefix_space && text.front() != ' ') {
      spaced.reserve(text.size() + 1);
      spaced.push_back(' ');
      spaced.append(text);
      text = spaced;
    }
    thread_local std::vector<Span> spans;
    spans.assign(1, Span{0, text.size()});
    if (pre_tokenizer) pre_tokenizer->split(text, spans);
    for (Span s : spans) model->tokenize(text.substr(s.begin, s.end - s.begin), ids);
  }

  void encode_content(std::string_view text, std::vector<uint32_t>& ids) const {
    std::vector<Segment> raw;
    added.split(text, false, raw);
    for (const Segment& seg : raw) {
      if (seg.id >= 0) {
        ids.push_back(static_cast<uint32_t>(seg.id));
        continue;
      }
      std::string_view piece = text.substr(seg.begin, seg.end - seg.begin);
      std::string normalized;
      if (normalizer) {
        normalized = normalizer->normalize(piece);
        piece = normalized;
      }
      if (!added.has_normalized()) {
        tokenize_text(piece, seg.begin == 0, ids);
        continue;
      }
      std::vector<Segment> parts;
      added.split(piece, true, parts);
      for (const Segment& part : parts) {
        if (part.id >= 0) {
          ids.push_back(static_cast<uint32_t>(part.id));
        } else {
          tokenize_text(piece.substr(part.begin, part.end - part.begin),
                        seg.begin == 0 && part.begin == 0, ids);
        }
      }
    }
  }

  std::vector<uint32_t> encode(std::string_view text, bool add_special, size_t max_length) const {
    std::string valid;
    if (!is_valid_utf8(text)) {
      valid = to_valid_utf8(text);
      text = valid;
    }
    std::vector<uint32_t> ids;
    ids.reserve(text.size() / 3 + 4);
    encode_content(text, ids);
    size_t extra = add_special && post ? post->added() : 0;
    if (max_length > 0) {
      if (max_length < extra) {
        throw TokenizerError("Tokenizer::encode_batch: max_length " + std::to_string(max_length) +
                             " cannot hold the " + std::to_string(extra) + " special tokens");
      }
      if (ids.size() > max_length - extra) ids.resize(max_length - extra);
    }
    if (add_special && post) post->process(ids);
    return ids;
  }

  std::string token_text(uint32_t id, const char* op) const {
    // HF names a normalized added token by its normalised form (id_to_token, decode).
    if (const AddedToken* t = added.find(id)) return t->normalized ? t->match : t->content;
    const auto& tokens = model->vocab().tokens;
    if (id < tokens.size() && (!tokens[id].empty() || model->vocab().find("") == id)) {
      return tokens[id];
    }
    throw IndexOutOfRange(std::string(op) + ": id " + std::to_string(id) +
                          " is not in the vocabulary (size " + std::to_string(vocab_size) + ")");
  }
};

namespace {

Tokenizer::Impl& finish(Tokenizer::Impl& impl) {
  impl.added.build([&](const std::string& content) {
    return impl.normalizer ? impl.normalizer->normalize(content) : content;
  });
  impl.vocab_size = impl.model->vocab().tokens.size();
  for (const auto& t : impl.added.tokens()) {
    impl.vocab_size = std::max(impl.vocab_size, static_cast<size_t>(t.id) + 1);
  }
  if (!impl.unk) impl.unk = impl.model->unk_id();
  return impl;
}

std::optional<uint32_t> lookup(const Tokenizer::Impl& impl, std::string_view token) {
  for (const auto& t : impl.added.tokens()) {
    if (t.content == token) return t.id;
  }
  return impl.model->vocab().find(token);
}

std::optional<uint32_t> first_known(const Tokenizer::Impl& impl,
                                    std::initializer_list<std::string_view> names) {
  for (auto name : names) {
    if (auto id = lookup(impl, name)) return id;
  }
  return std::nullopt;
}

// A token named in tokenizer_config.json: a string or an AddedToken object.
std::optional<std::string> config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return std::nullopt;
}

std::vector<std::pair<std::string, std::string>> parse_merges(const Json& merges) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Json& m : merges) {
    if (m.is_array() && m.size() == 2) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      continue;
    }
    std::string s = m.get<std::string>();
    size_t space = s.find(' ', 1);
    if (space == std::string::npos) {
      throw TokenizerError("tokenizer.json: merge '" + s + "' is not two tokens");
    }
    out.emplace_back(s.substr(0, space), s.substr(space + 1));
  }
  return out;
}

// The text of `path` (bounded), with errors as TokenizerError naming it.
std::string read_file(const std::string& path) {
  try {
    return formats::read_file_bounded(path, json_file::kMaxTokenizerBytes);
  } catch (const FormatError& e) {
    throw TokenizerError(std::string("Tokenizer::from_file: ") + e.what());
  }
}

Json parse_json(std::string_view text, const char* origin) {
  try {
    return json_file::parse(text, origin, json_file::kMaxTokenizerBytes);
  } catch (const FormatError& e) {
    throw TokenizerError(std::string("Tokenizer::from_json: ") + e.what());
  }
}

// A token id in [0, limit): ids index tables sized from them, so they are bounded by the
// number of tokens the file declares.
uint32_t bounded_id(const Json& v, size_t limit, const std::string& what) {
  if (v.is_number_integer()) {
    bool negative = !v.is_number_unsigned() && v.get<int64_t>() < 0;
    if (!negative && v.get<uint64_t>() < limit) return static_cast<uint32_t>(v.get<uint64_t>());
  }
  throw TokenizerError("tokenizer.json: " + what + " must be an integer id below " +
                       std::to_string(limit) + " (the number of tokens), got " +
                       formats::describe(v));
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

const Tokenizer::Impl& Tokenizer::impl() const {
  if (!impl_) throw TokenizerError("Tokenizer: used before one was loaded (default-constructed)");
  return *impl_;
}

Tokenizer Tokenizer::from_file(const std::string& file_or_dir) {
  std::error_code ec;
  std::string path = std::filesystem::is_directory(file_or_dir, ec)
                         ? (std::filesystem::path(file_or_dir) / "tokenizer.json").string()
                         : file_or_dir;
  std::string json = read_file(path);
  std::string config;
  auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path, ec)) config = read_file(config_path.string());
  try {
    return from_json_at(json, config, path);
  } catch (const TokenizerError& e) {
    throw TokenizerError(std::string(e.what()) + " (in '" + path + "')");
  }
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json,
                               std::string_view tokenizer_config_json) {
  return from_json_at(tokenizer_json, tokenizer_config_json, {});
}

Tokenizer Tokenizer::from_json_at(std::string_view tokenizer_json,
                                  std::string_view tokenizer_config_json, const std::string& path) {
  Json j = parse_json(tokenizer_json, "tokenizer.json");
  Json config;
  if (!tokenizer_config_json.empty()) {
    config = parse_json(tokenizer_config_json, "tokenizer_config.json");
  }
  auto impl = std::make_shared<Impl>();
  try {
    if (!j.is_object() || !j.contains("model")) {
      throw TokenizerError("Tokenizer::from_json: no 'model' object (not a tokenizer.json)");
    }
    impl->normalizer = make_normalizer(j.value("normalizer", Json()));
    impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", Json()));
    impl->post = make_post_processor(j.value("post_processor", Json()));
    impl->decoder = make_decoder(j.value("decoder", Json()));
    impl->byte_level = impl->pre_tokenizer && impl->pre_tokenizer->byte_level();
    impl->prefix_space = impl->pre_tokenizer && impl->pre_tokenizer->adds_prefix_space();

    const Json& m = j["model"];
    const Json& vocab_json = m.at("vocab");
    if (!vocab_json.is_object()) {
      throw TokenizerError("tokenizer.json: model.vocab must be an object, got " +
                           formats::describe(vocab_json));
    }
    const Json& added_json = j.value("added_tokens", Json::array());
    if (!added_json.is_array()) {
      throw TokenizerError("tokenizer.json: added_tokens must be an array, got " +
                           formats::describe(added_json));
    }
    size_t id_limit = vocab_json.size() + added_json.size();
    Vocab vocab;
    for (const auto& [token, id] : vocab_json.items()) {
      vocab.add(token, bounded_id(id, id_limit, "vocab entry " + formats::quote_prefix(token)));
    }
    std::string type = m.value("type", m.contains("merges") ? "BPE" : "WordPiece");
    if (type == "WordPiece") {
      auto max_chars = m.find("max_input_chars_per_word");
      size_t max_input_chars = 100;
      if (max_chars != m.end() && !max_chars->is_null()) {
        if (!max_chars->is_number_unsigned()) {
          throw TokenizerError(
              "tokenizer.json: model.max_input_chars_per_word must be a non-negative integer, "
              "got " +
              formats::describe(*max_chars));
        }
        max_input_chars = max_chars->get<size_t>();
      }
      impl->model =
          std::make_unique<WordPiece>(std::move(vocab), m.value("unk_token", "[UNK]"),
                                      m.value("continuing_subword_prefix", "##"), max_input_chars);
    } else if (type == "BPE") {
      BpeOptions options;
      if (m.contains("unk_token") && m["unk_token"].is_string()) {
        options.unk_token = m["unk_token"].get<std::string>();
      }
      auto text_or_empty = [&](const char* key) {
        return m.contains(key) && m[key].is_string() ? m[key].get<std::string>() : std::string();
      };
      options.continuing_subword_prefix = text_or_empty("continuing_subword_prefix");
      options.end_of_word_suffix = text_or_empty("end_of_word_suffix");
      options.fuse_unk = m.value("fuse_unk", false);
      options.byte_fallback = m.value("byte_fallback", false);
      options.ignore_merges = m.value("ignore_merges", false);
      options.byte_level = impl->byte_level;
      impl->model =
          std::make_unique<Bpe>(std::move(vocab), parse_merges(m.at("merges")), std::move(options));
    } else {
      throw TokenizerError("Tokenizer::from_json: model type '" + type +
                           "' is not supported (WordPiece, BPE)");
    }

    for (const Json& t : added_json) {
      AddedToken a;
      a.id = bounded_id(t.at("id"), id_limit, "added token id");
      a.content = t.at("content").get<std::string>();
      a.special = t.value("special", false);
      a.normalized = t.value("normalized", !a.special);
      a.lstrip = t.value("lstrip", false);
      a.rstrip = t.value("rstrip", false);
      a.single_word = t.value("single_word", false);
      impl->added.add(std::move(a));
    }
    finish(*impl);

    if (j.contains("truncation") && j["truncation"].is_object()) {
      impl->truncation = j["truncation"].value("max_length", size_t{0});
    }
    impl->chat = load_chat(config, path);
    auto named = [&](const char* key) -> std::optional<uint32_t> {
      if (!config.is_object()) return std::nullopt;
      auto name = config_token(config, key);
      return name ? lookup(*impl, *name) : std::nullopt;
    };
    impl->bos = named("bos_token");
    if (!impl->bos) impl->bos = first_known(*impl, {"<|begin_of_text|>", "<s>", "<|startoftext|>"});
    impl->eos = named("eos_token");
    if (!impl->eos) impl->eos = first_known(*impl, {"<|end_of_text|>", "</s>", "<|endoftext|>"});
    if (auto unk = named("unk_token")) impl->unk = unk;
    std::optional<uint32_t> pad;
    if (j.contains("padding") && j["padding"].is_object()) {
      pad = bounded_id(j["padding"].value("pad_id", Json(0)), id_limit, "padding.pad_id");
    }
    if (!pad) pad = named("pad_token");
    if (!pad) pad = first_known(*impl, {"[PAD]", "<pad>", "<|pad|>"});
    impl->pad = pad ? *pad : impl->eos.value_or(0);
  } catch (const Json::exception& e) {
    throw TokenizerError(std::string("Tokenizer::from_json: unexpected tokenizer.json layout: ") +
                         e.what());
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_gguf_vocab(const GgufVocab& v) {
  const bool spm = v.model == "llama";
  if (v.model != "gpt2" && !spm) {
    throw TokenizerError("Tokenizer::from_gguf_vocab: tokenizer model '" + v.model +
                         "' is not supported ('gpt2', byte-level BPE; 'llama', SentencePiece)");
  }
  if (v.tokens.empty()) throw TokenizerError("Tokenizer::from_gguf_vocab: no tokens");
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    throw TokenizerError("Tokenizer::from_gguf_vocab: " + std::to_string(v.token_types.size()) +
                         " token types for " + std::to_string(v.tokens.size()) + " tokens");
  }
  auto impl = std::make_shared<Impl>();
  if (spm) {
    SpmGgufStages stages = spm_gguf_stages(v);
    impl->normalizer = std::move(stages.normalizer);
    impl->model = std::move(stages.model);
    impl->decoder = std::move(stages.decoder);
  } else {
    impl->pre_tokenizer = pre_tokenizer_for_gguf(v.pre);
    impl->normalizer = normalizer_for_gguf(v.pre);
    impl->byte_level = true;
    impl->decoder = make_byte_level_decoder();

    Vocab vocab;
    for (size_t i = 0; i < v.tokens.size(); ++i) vocab.add(v.tokens[i], static_cast<uint32_t>(i));
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(v.merges.size());
    for (const std::string& m : v.merges) {
      size_t space = m.find(' ', 1);
      if (space == std::string::npos) {
        throw TokenizerError("Tokenizer::from_gguf_vocab: merge '" + m + "' is not two tokens");
      }
      merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    }
    BpeOptions options;
    options.byte_level = true;
    // Llama 3's tokenizer.json sets ignore_merges; llama.cpp does the same for these names.
    options.ignore_merges = v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3";
    impl->model = std::make_unique<Bpe>(std::move(vocab), merges, std::move(options));
  }

  for (size_t i = 0; i < v.token_types.size(); ++i) {
    int32_t type = v.token_types[i];
    // Control and user-defined tokens, and SentencePiece's unknown token, as llama.cpp matches.
    if (type != 3 && type != 4 && !(spm && type == 2)) continue;
    AddedToken a;
    a.id = static_cast<uint32_t>(i);
    if (spm || !byte_level_to_bytes(v.tokens[i], a.content)) a.content = v.tokens[i];
    a.special = type != 4;
    impl->added.add(std::move(a));
  }
  auto check_id = [&](std::optional<uint32_t> id, const char* what) {
    if (id && *id >= v.tokens.size()) {
      throw TokenizerError(std::string("Tokenizer::from_gguf_vocab: ") + what + " " +
                           std::to_string(*id) + " is outside the " +
                           std::to_string(v.tokens.size()) + "-token vocabulary");
    }
    return id;
  };
  impl->bos = check_id(v.bos_id, "bos id");
  impl->eos = check_id(v.eos_id, "eos id");
  impl->unk = check_id(v.unk_id, "unk id");
  auto pad = check_id(v.pad_id, "pad id");
  if ((v.add_bos && !impl->bos) || (v.add_eos && !impl->eos)) {
    throw TokenizerError("Tokenizer::from_gguf_vocab: add_bos/add_eos set without the token id");
  }
  std::vector<uint32_t> prefix, suffix;
  if (v.add_bos) prefix.push_back(*impl->bos);
  if (v.add_eos) suffix.push_back(*impl->eos);
  impl->post = make_bos_eos_processor(std::move(prefix), std::move(suffix));
  finish(*impl);
  impl->pad = pad ? *pad : impl->eos.value_or(0);
  // The template sees the vocabulary's named tokens, as llama.cpp passes them.
  nlohmann::ordered_json special = nlohmann::ordered_json::object();
  for (auto [key, id] : {std::pair{"bos_token", impl->bos}, std::pair{"eos_token", impl->eos},
                         std::pair{"unk_token", impl->unk}, std::pair{"pad_token", pad}}) {
    if (id) special[key] = impl->token_text(*id, "Tokenizer::from_gguf_vocab");
  }
  impl->chat = load_gguf_chat(v.chat_template, std::move(special),
                              v.source.empty() ? "the GGUF vocabulary" : "'" + v.source + "'");
  return Tokenizer(std::move(impl));
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl().encode(text, add_special_tokens, 0);
}

BatchEncoding Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                      bool add_special_tokens, size_t max_length) const {
  std::vector<std::vector<uint32_t>> rows(texts.size());
  cpu::parallel_for(texts.size(), 4, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      rows[i] = impl().encode(texts[i], add_special_tokens, max_length);
    }
  });
  BatchEncoding out;
  out.batch = texts.size();
  for (const auto& r : rows) out.seq_len = std::max(out.seq_len, r.size());
  out.ids.assign(out.batch * out.seq_len, impl().pad);
  out.attention_mask.assign(out.batch * out.seq_len, 0);
  out.lengths.resize(out.batch);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(rows[i].begin(), rows[i].end(), out.ids.begin() + i * out.seq_len);
    std::fill_n(out.attention_mask.begin() + i * out.seq_len, rows[i].size(), 1u);
    out.lengths[i] = rows[i].size();
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    if (skip_special_tokens) {
      const AddedToken* t = impl().added.find(id);
      if (t && t->special) continue;
    }
    tokens.push_back(impl().token_text(id, "Tokenizer::decode"));
  }
  if (!impl().decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  impl().decoder->decode_chain(tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::string Tokenizer::id_to_bytes(uint32_t id) const {
  std::string text = impl().token_text(id, "Tokenizer::id_to_bytes");
  if (impl().added.find(id)) return text;
  if (impl().byte_level) {
    std::string bytes;
    if (byte_level_to_bytes(text, bytes)) return bytes;
  }
  return impl().decoder ? impl().decoder->token_bytes(std::move(text)) : text;
}

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  return lookup(impl(), token);
}

std::string Tokenizer::id_to_token(uint32_t id) const {
  return impl().token_text(id, "Tokenizer::id_to_token");
}

size_t Tokenizer::vocab_size() const {
  return impl().vocab_size;
}

bool Tokenizer::is_special(uint32_t id) const {
  const AddedToken* t = impl().added.find(id);
  return t && t->special;
}

size_t Tokenizer::num_special_tokens_to_add() const {
  return impl().post ? impl().post->added() : 0;
}

std::optional<uint32_t> Tokenizer::bos_id() const {
  return impl().bos;
}
std::optional<uint32_t> Tokenizer::eos_id() const {
  return impl().eos;
}
std::optional<uint32_t> Tokenizer::unk_id() const {
  return impl().unk;
}
uint32_t Tokenizer::pad_id() const {
  return impl().pad;
}
size_t Tokenizer::truncation_max_length() const {
  return impl().truncation;
}
const std::string& Tokenizer::chat_template() const {
  return impl().chat.default_source();
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                           bool add_generation_prompt,
                                           const nlohmann::json& extra) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    nlohmann::ordered_json msg = {{"role", m.role}, {"content", m.content}};
    if (!m.fields.is_object()) {
      throw ChatTemplateError(
          "Tokenizer::apply_chat_template: a message's fields must be a JSON "
          "object");
    }
    for (const auto& [k, v] : m.fields.items()) msg[k] = v;
    list.push_back(std::move(msg));
  }
  return impl().chat.render(list, add_generation_prompt, nlohmann::ordered_json(extra));
}

std::string Tokenizer::apply_chat_template_json(const nlohmann::ordered_json& messages,
                                                bool add_generation_prompt,
                                                const nlohmann::ordered_json& extra) const {
  return impl().chat.render(messages, add_generation_prompt, extra);
}

std::vector<uint32_t> Tokenizer::end_of_turn_ids() const {
  std::vector<uint32_t> ids;
  if (impl().eos) ids.push_back(*impl().eos);
  TurnEndProbe probe{[&](std::string_view text) { return encode(text, false); },
                     [&](uint32_t id) { return is_special(id); },
                     [&](uint32_t id) { return id_to_bytes(id); }};
  // A special unknown token ([UNK]) stands for text the vocabulary lacks, not for a turn end.
  if (auto end = template_turn_end(impl().chat, probe); end && end != impl().unk) {
    if (std::find(ids.begin(), ids.end(), *end) == ids.end()) ids.push_back(*end);
  }
  return ids;
}

DecodeStream::DecodeStream(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

std::string DecodeStream::step(uint32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.id_to_bytes(id);
  size_t ready = complete_utf8_prefix(pending_);
  std::string out = to_valid_utf8(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string DecodeStream::flush() {
  std::string out = to_valid_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace wick
