#pragma once
// The tokenizer models: WordPiece (BERT) and BPE (byte-level for GPT-2, Llama 3, Qwen2, SmolLM2).

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace wick::tok {

/// Hash and equality that look std::string keys up by std::string_view without a copy.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
using VocabMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

/// A vocabulary: token strings by id and ids by string.
struct Vocab {
  std::vector<std::string> tokens;  // by id; ids missing from the file are ""
  VocabMap ids;

  std::optional<uint32_t> find(std::string_view token) const {
    auto it = ids.find(token);
    if (it == ids.end()) return std::nullopt;
    return it->second;
  }
  void add(std::string token, uint32_t id);
};

class Model {
 public:
  virtual ~Model() = default;
  /// Appends the ids of one pre-tokenised piece.
  virtual void tokenize(std::string_view piece, std::vector<uint32_t>& out) const = 0;
  const Vocab& vocab() const { return vocab_; }
  /// The model's unknown token, if it has one.
  virtual std::optional<uint32_t> unk_id() const = 0;

 protected:
  Vocab vocab_;
};

class WordPiece final : public Model {
 public:
  WordPiece(Vocab vocab, const std::string& unk_token, std::string prefix, size_t max_chars);
  void tokenize(std::string_view piece, std::vector<uint32_t>& out) const override;
  std::optional<uint32_t> unk_id() const override { return unk_; }

 private:
  uint32_t unk_;
  std::string prefix_;
  size_t max_chars_;
  size_t max_token_bytes_ = 0;  // the longest vocabulary entry: no longer candidate can match
};

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;  // a piece found whole in the vocabulary is one token (Llama 3)
  bool byte_level = false;     // pieces are raw bytes, read as GPT-2's byte-level symbols
};

class Bpe final : public Model {
 public:
  /// merges: (left, right) by rank. Throws TokenizerError for a merge outside the vocabulary.
  Bpe(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      BpeOptions options);
  void tokenize(std::string_view piece, std::vector<uint32_t>& out) const override;
  std::optional<uint32_t> unk_id() const override { return unk_; }

 private:
  struct Symbol {
    uint32_t id;
    uint32_t bytes;
    int32_t prev;
    int32_t next;
  };
  void initial_symbols(std::string_view piece, std::vector<Symbol>& symbols) const;
  void merge(std::vector<Symbol>& symbols) const;

  BpeOptions options_;
  std::optional<uint32_t> unk_;
  std::vector<int64_t> byte_ids_;  // byte-level: the id of each byte's symbol, or -1
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges_;

  // Pieces seen before, as HF caches words: text repeats its words.
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>, StringHash, std::equal_to<>>
      cache_;
};

}  // namespace wick::tok
