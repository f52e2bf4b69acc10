#pragma once
// wick::Tokenizer: text to token ids and back, with the same ids as Hugging Face `tokenizers`.
// Reads tokenizer.json (WordPiece with BERT's normaliser, byte-level BPE as GPT-2, Llama 3,
// Qwen2 and SmolLM2 use it, SentencePiece-style BPE with byte fallback as Llama 2, Mistral,
// Gemma and Phi-3 use it) or plain vocabulary data such as a GGUF file's tokenizer.ggml.*.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "wick/chat_template.h"
#include "wick/error.h"

namespace wick {

/// A tokenizer file or vocabulary that cannot be read or uses a feature wick does not support.
class TokenizerError : public Error {
 public:
  using Error::Error;
};

/// Ids of a batch, padded to its longest row: row-major (batch, seq_len).
struct BatchEncoding {
  size_t batch = 0;
  size_t seq_len = 0;
  std::vector<uint32_t> ids;             ///< padding positions hold pad_id()
  std::vector<uint32_t> attention_mask;  ///< 1 for real tokens, 0 for padding
  std::vector<size_t> lengths;           ///< real tokens per row
};

/// A vocabulary as plain data (a GGUF file's tokenizer.ggml.* keys), so that a model loader can
/// build a Tokenizer without wick reading GGUF here: byte-level BPE ("gpt2") or SentencePiece
/// ("llama").
struct GgufVocab {
  std::string model = "gpt2";  ///< tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SPM)
  std::string pre;             ///< tokenizer.ggml.pre: "gpt2", "llama-bpe", "smollm", "qwen2", ...
  std::vector<std::string> tokens;  ///< tokenizer.ggml.tokens ("Ġthe" for gpt2, "▁the" for llama)
  std::vector<std::string> merges;  ///< tokenizer.ggml.merges, "left right" by rank (gpt2)
  std::vector<float> scores;        ///< tokenizer.ggml.scores (llama: merge priority; may be empty)
  std::vector<int32_t> token_types;  ///< 1 normal, 2 unknown, 3 control, 4 user defined, 6 byte
  bool add_space_prefix = true;      ///< tokenizer.ggml.add_space_prefix (llama)
  std::optional<uint32_t> bos_id, eos_id, unk_id, pad_id;
  bool add_bos = false;       ///< tokenizer.ggml.add_bos_token
  bool add_eos = false;       ///< tokenizer.ggml.add_eos_token
  std::string chat_template;  ///< tokenizer.chat_template (apply_chat_template renders it)
  std::string source;         ///< the file the vocabulary comes from, named in errors
};

/// Text <-> ids. Immutable after loading; copies share the loaded data and every method may be
/// called from several threads at once.
class Tokenizer {
 public:
  /// An empty tokenizer to assign a loaded one to; any other use throws TokenizerError.
  Tokenizer() = default;

  /// Loads a Hugging Face tokenizer.json (or a model folder's). A tokenizer_config.json next to
  /// it, when present, supplies bos/eos/pad tokens and the chat template; a chat_template.jinja
  /// (with additional_chat_templates/<name>.jinja), else a chat_template.json, beside it replaces
  /// that template, as transformers reads them. Throws TokenizerError
  /// naming the file: for a path that is not a regular file, a file over 512 MB, JSON nested
  /// deeper than 128 levels, ids that are not integers below the number of tokens, and any
  /// layout or feature wick does not read.
  static Tokenizer from_file(const std::string& file_or_dir);
  /// Same from the text of tokenizer.json (and optionally of tokenizer_config.json).
  static Tokenizer from_json(std::string_view tokenizer_json,
                             std::string_view tokenizer_config_json = {});
  /// Builds a tokenizer from GGUF-style vocabulary data: byte-level BPE for model "gpt2", and for
  /// "llama" SentencePiece's BPE with byte fallback, merged by score as llama.cpp does (spaces
  /// become "▁", one "▁" starts each piece of text when add_space_prefix). Control tokens (type
  /// 3), user-defined tokens (type 4) and, for llama, the unknown token (type 2) are matched in
  /// text before pre-tokenisation; control and unknown tokens are special. Throws TokenizerError
  /// for an unknown `pre` (gpt2) or an unsupported `model`.
  static Tokenizer from_gguf_vocab(const GgufVocab& vocab);

  /// Ids for `text`. Special tokens written in the text (e.g. "<|im_end|>") always map to their
  /// ids; add_special_tokens adds the post-processor's ([CLS] ... [SEP], a BOS). No truncation.
  /// Invalid UTF-8 is read as U+FFFD per bad sequence.
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  /// Encodes each text (in parallel), truncates the content so that a row holds at most
  /// max_length ids with the special tokens (0 = no limit), and pads to the longest row.
  BatchEncoding encode_batch(const std::vector<std::string>& texts, bool add_special_tokens = true,
                             size_t max_length = 0) const;
  /// Text for `ids`, as Hugging Face's decode. Throws IndexOutOfRange for an id outside the
  /// vocabulary.
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = true) const;
  /// The raw bytes one token stands for (byte-level and <0xNN> tokens may hold part of a UTF-8
  /// character; "▁" stands for a space): concatenate these when streaming and print complete
  /// characters. A SentencePiece tokenizer's first "▁", which decode() strips, is kept here.
  std::string id_to_bytes(uint32_t id) const;

  /// The id of a vocabulary entry written as in tokenizer.json ("Ġthe", "##ing", "[CLS]").
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  /// The vocabulary entry of `id`; throws IndexOutOfRange.
  std::string id_to_token(uint32_t id) const;
  /// Number of ids (model vocabulary and added tokens).
  size_t vocab_size() const;
  /// True for ids of special added tokens (skipped by decode(ids, true)).
  bool is_special(uint32_t id) const;
  /// How many ids add_special_tokens adds to one text.
  size_t num_special_tokens_to_add() const;

  std::optional<uint32_t> bos_id() const;
  std::optional<uint32_t> eos_id() const;
  std::optional<uint32_t> unk_id() const;
  /// The padding id of encode_batch: tokenizer.json's padding, else a [PAD]/<pad> token, else eos,
  /// else 0.
  uint32_t pad_id() const;
  /// tokenizer.json's truncation max_length (0 when it sets none).
  size_t truncation_max_length() const;

  /// Renders a conversation with the model's own Jinja chat template through wick::ChatTemplate,
  /// as transformers' apply_chat_template(tokenize=False): the template sees the special tokens
  /// of tokenizer_config.json (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token,
  /// mask_token and the model-specific extra_special_tokens; a GGUF vocabulary's bos, eos, unk
  /// and pad), then each key of `extra` (tools, documents, enable_thinking, ...; they replace
  /// the special tokens). Of named templates, "tool_use" is used when `extra` has tools, else
  /// "default". Encode the result with add_special_tokens = false. Throws TokenizerError naming
  /// the file when the tokenizer has no chat template, ChatTemplateError when the template
  /// cannot be read, fails or raises.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt = true,
                                  const nlohmann::json& extra = {}) const;
  /// Same with the messages and `extra` as JSON, keeping the key order of objects (tool calls,
  /// tools), which `tojson` shows.
  std::string apply_chat_template_json(const nlohmann::ordered_json& messages,
                                       bool add_generation_prompt,
                                       const nlohmann::ordered_json& extra = {}) const;
  /// The Jinja chat template text used without tools ("" when none).
  const std::string& chat_template() const;
  /// The ids that end an assistant turn: eos, and the special token the chat template writes
  /// right after an assistant message's content (<|im_end|>, <|eot_id|>, <end_of_turn>,
  /// <|end|>, ...), found by rendering a short conversation. Stop generation at any of them.
  std::vector<uint32_t> end_of_turn_ids() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  // from_json reading the chat templates beside `path` too (from_file; "" for none).
  static Tokenizer from_json_at(std::string_view tokenizer_json,
                                std::string_view tokenizer_config_json, const std::string& path);
  const Impl& impl() const;
  std::shared_ptr<const Impl> impl_;
};

/// Text of ids that arrive one at a time (generation), printable as it comes: a byte-level token
/// may end inside a UTF-8 character, so those bytes wait for the next token. For byte-level BPE
/// the concatenated output equals decode(all ids) for valid UTF-8; for SentencePiece-style BPE
/// it keeps the leading space of the first "▁" that decode() strips. Holds the pending bytes: one
/// thread at a time (one stream per generation).
class DecodeStream {
 public:
  explicit DecodeStream(Tokenizer tokenizer, bool skip_special_tokens = true);
  /// The complete characters this id finishes (may be ""). Throws IndexOutOfRange.
  std::string step(uint32_t id);
  /// What is left (an unfinished character becomes U+FFFD), and resets the stream.
  std::string flush();

 private:
  Tokenizer tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace wick
