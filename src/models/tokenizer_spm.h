#pragma once
// SentencePiece-style tokenizers (Llama 2, Mistral, TinyLlama, Gemma, Phi-3): the tokenizer.json
// stages they use (Metaspace, Replace, Prepend, Strip, ByteFallback, Fuse) and llama.cpp's
// score-ordered merging for GGUF tokenizer.ggml.model "llama".

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "models/tokenizer_models.h"
#include "models/tokenizer_pipeline.h"

namespace wick {
struct GgufVocab;
}

namespace wick::tok {

/// The SentencePiece-style stages of a tokenizer.json object, or nullptr when `j` is another
/// type (the caller then reports it as unsupported).
std::unique_ptr<Normalizer> make_spm_normalizer(const Json& j);
std::unique_ptr<PreTokenizer> make_spm_pre_tokenizer(const Json& j);
std::unique_ptr<Decoder> make_spm_decoder(const Json& j);

/// SentencePiece's BPE as llama.cpp runs it on a GGUF vocabulary: characters merge pairwise,
/// highest-scoring merged token first (leftmost on ties), whenever the concatenation is a
/// vocabulary entry; pieces left that are not tokens split back along their merges, down to
/// <0xNN> byte tokens.
class Spm final : public Model {
 public:
  /// scores: one per token (empty: all 0). Throws TokenizerError for a count mismatch.
  Spm(Vocab vocab, std::vector<float> scores, std::optional<uint32_t> unk);
  void tokenize(std::string_view piece, std::vector<uint32_t>& out) const override;
  std::optional<uint32_t> unk_id() const override { return unk_; }

 private:
  struct Symbol {
    size_t begin;
    size_t bytes;
    int32_t prev;
    int32_t next;
  };
  void resegment(std::string_view piece, const std::vector<Symbol>& symbols, size_t index,
                 const std::unordered_map<std::string_view, std::pair<int32_t, int32_t>>& splits,
                 std::vector<uint32_t>& out) const;

  std::vector<float> scores_;
  std::optional<uint32_t> unk_;
  std::vector<int64_t> byte_ids_;  // the <0xNN> token of each byte (else its 1-byte token), or -1
};

/// The normaliser, model and decoder of a GGUF "llama" vocabulary: "▁" for spaces, one "▁" before
/// each piece of text when add_space_prefix, score-ordered merging, and the decoder chain
/// Hugging Face converts it to (Replace, ByteFallback, Fuse, Strip).
struct SpmGgufStages {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<Decoder> decoder;
};
SpmGgufStages spm_gguf_stages(const GgufVocab& vocab);

}  // namespace wick::tok
