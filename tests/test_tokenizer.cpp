// wick::Tokenizer against Hugging Face `tokenizers`: ids on a 2,331-line corpus for MiniLM's
// WordPiece, SmolLM2's byte-level BPE and a Llama-3-style BPE (references made by
// scripts/make_tokenizer_refs.py and committed in tests/data/tokenizer/).

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "wick/tokenizer.h"

namespace {

using wick::Tokenizer;
using Json = nlohmann::json;
using Ids = std::vector<uint32_t>;

const std::string kData = WICK_TOKENIZER_DATA;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << "cannot open " << path;
  if (f == nullptr) return {};
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  return out;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    std::istringstream in(read_text(kData + "/corpus.jsonl"));
    for (std::string line; std::getline(in, line);) out.push_back(Json::parse(line));
    return out;
  }();
  return lines;
}

struct Reference {
  std::vector<Ids> plain;    // add_special_tokens = false
  std::vector<Ids> special;  // add_special_tokens = true
};

Ids parse_ids(std::istringstream& in) {
  Ids ids;
  for (std::string word; in >> word && word != "|";) ids.push_back(std::stoul(word));
  return ids;
}

Reference read_reference(const std::string& name) {
  Reference ref;
  std::istringstream in(read_gz(kData + "/" + name + ".ids.gz"));
  for (std::string line; std::getline(in, line);) {
    std::istringstream row(line);
    ref.plain.push_back(parse_ids(row));
    ref.special.push_back(parse_ids(row));
  }
  return ref;
}

std::string show(const Ids& ids) {
  std::string s;
  for (uint32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// Every corpus line's ids equal the reference, with and without special tokens.
void expect_reference_ids(const Tokenizer& tok, const Reference& ref) {
  const auto& lines = corpus();
  ASSERT_EQ(ref.plain.size(), lines.size());
  size_t failures = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    Ids plain = tok.encode(lines[i], false);
    Ids special = tok.encode(lines[i], true);
    if (plain != ref.plain[i] || special != ref.special[i]) {
      if (++failures <= 5) {
        ADD_FAILURE() << "line " << i << ": " << Json(lines[i]).dump()
                      << "\n  wick: " << show(plain) << "\n  HF:   " << show(ref.plain[i]);
      }
    }
  }
  EXPECT_EQ(failures, 0u) << "of " << lines.size() << " lines";
}

// SmolLM2's vocabulary has no symbol for these control bytes, so HF (and wick) drop them.
std::string without_missing_bytes(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c != 0x04 && c != 0x06 && c != 0x13 && c != 0x14 && c != 0x16 && c != 0x1d) out += c;
  }
  return out;
}

void expect_round_trip(const Tokenizer& tok) {
  size_t failures = 0;
  for (const auto& line : corpus()) {
    Ids ids = tok.encode(line, false);
    std::string want = without_missing_bytes(line);
    std::string streamed;
    for (uint32_t id : ids) streamed += tok.id_to_bytes(id);
    if (tok.decode(ids, false) != want || streamed != want) {
      if (++failures <= 5) ADD_FAILURE() << "no round trip for " << Json(line).dump();
    }
  }
  EXPECT_EQ(failures, 0u);
}

class MiniLM : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = new Tokenizer(Tokenizer::from_json(read_gz(kData + "/minilm.json.gz")));
    ref_ = new Reference(read_reference("minilm"));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete ref_;
  }
  static Tokenizer* tok_;
  static Reference* ref_;
};
Tokenizer* MiniLM::tok_ = nullptr;
Reference* MiniLM::ref_ = nullptr;

TEST_F(MiniLM, IdsEqualHuggingFace) {
  expect_reference_ids(*tok_, *ref_);
}

TEST_F(MiniLM, DecodeEqualsHuggingFace) {
  std::istringstream in(read_gz(kData + "/minilm.decoded.jsonl.gz"));
  size_t failures = 0, i = 0;
  for (std::string line; std::getline(in, line); ++i) {
    std::string want = Json::parse(line);
    std::string got = tok_->decode(ref_->special[i], true);
    if (got != want && ++failures <= 5) {
      ADD_FAILURE() << "line " << i << ": wick " << Json(got).dump() << " HF " << Json(want).dump();
    }
  }
  EXPECT_EQ(i, corpus().size());
  EXPECT_EQ(failures, 0u);
}

TEST_F(MiniLM, SpecialTokens) {
  EXPECT_EQ(tok_->token_to_id("[CLS]"), 101u);
  EXPECT_EQ(tok_->token_to_id("[SEP]"), 102u);
  EXPECT_EQ(tok_->token_to_id("hello"), 7592u);
  EXPECT_EQ(tok_->token_to_id("not-a-token"), std::nullopt);
  EXPECT_EQ(tok_->id_to_token(7592), "hello");
  EXPECT_EQ(tok_->unk_id(), 100u);
  EXPECT_EQ(tok_->pad_id(), 0u);
  EXPECT_EQ(tok_->vocab_size(), 30522u);
  EXPECT_EQ(tok_->num_special_tokens_to_add(), 2u);
  EXPECT_EQ(tok_->truncation_max_length(), 128u);
  EXPECT_TRUE(tok_->is_special(101));
  EXPECT_FALSE(tok_->is_special(7592));
  EXPECT_EQ(tok_->encode("Hello, World!", true), (Ids{101, 7592, 1010, 2088, 999, 102}));
  EXPECT_EQ(tok_->decode({101, 7592, 1010, 2088, 999, 102}, false), "[CLS] hello, world! [SEP]");
}

TEST_F(MiniLM, AddedTokenOptions) {
  // lstrip/rstrip, single_word and normalized added tokens; ids from HF tokenizers 0.23 with the
  // same three tokens added (add_special_tokens / add_tokens).
  Json j = Json::parse(read_gz(kData + "/minilm.json.gz"));
  j["added_tokens"].push_back({{"id", 30522},
                               {"content", "<x>"},
                               {"single_word", false},
                               {"lstrip", true},
                               {"rstrip", true},
                               {"normalized", false},
                               {"special", true}});
  j["added_tokens"].push_back({{"id", 30523},
                               {"content", "wick"},
                               {"single_word", true},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  j["added_tokens"].push_back({{"id", 30524},
                               {"content", "\u00dcn\u00efcode"},
                               {"single_word", false},
                               {"lstrip", false},
                               {"rstrip", false},
                               {"normalized", true},
                               {"special", false}});
  Tokenizer t = Tokenizer::from_json(j.dump());
  EXPECT_EQ(t.encode("a <x> b", false), (Ids{1037, 30522, 1038}));
  EXPECT_EQ(t.encode("a<x>b", false), (Ids{1037, 30522, 1038}));
  EXPECT_EQ(t.encode("a   <x>   b", false), (Ids{1037, 30522, 1038}));
  EXPECT_EQ(t.encode("<x><x>", false), (Ids{30522, 30522}));
  EXPECT_EQ(t.encode(" <x>", false), (Ids{30522}));
  EXPECT_EQ(t.encode("wick wicked awick wick.", false),
            (Ids{30523, 10433, 22091, 6799, 30523, 1012}));
  EXPECT_EQ(t.encode("x wick_y wick-z", false),
            (Ids{1060, 15536, 3600, 1035, 1061, 30523, 1011, 1062}));
  EXPECT_EQ(t.encode("\u00e9wick wick\u00e9", false), (Ids{1041, 7184, 15536, 19869}));
  EXPECT_EQ(t.encode("UNICODE \u00dcn\u00efcode unicode", false), (Ids{30524, 30524, 30524}));
  EXPECT_EQ(t.encode("WICK", false), (Ids{30523}));
  EXPECT_EQ(t.decode({1037, 30522, 1038, 30524, 30523}, false), "a <x> b unicode wick");
  EXPECT_EQ(t.decode({1037, 30522, 1038, 30524}, true), "a b unicode");
  EXPECT_EQ(t.token_to_id("\u00dcn\u00efcode"), 30524u);
  EXPECT_EQ(t.id_to_token(30524), "unicode");
  EXPECT_EQ(t.vocab_size(), 30525u);
}

TEST_F(MiniLM, BatchTruncatesAndPads) {
  const auto& lines = corpus();
  std::vector<std::string> texts(lines.begin(), lines.begin() + 200);
  const size_t max_len = 128;
  wick::BatchEncoding b = tok_->encode_batch(texts, true, max_len);
  ASSERT_EQ(b.batch, texts.size());
  size_t longest = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    // HF (checked by the reference script): the first 126 content ids, then [SEP].
    Ids want = ref_->special[i];
    if (want.size() > max_len) {
      want.resize(max_len - 1);
      want.push_back(102);
    }
    longest = std::max(longest, want.size());
    ASSERT_EQ(b.lengths[i], want.size()) << "row " << i;
    for (size_t k = 0; k < b.seq_len; ++k) {
      uint32_t id = b.ids[i * b.seq_len + k], mask = b.attention_mask[i * b.seq_len + k];
      if (k < want.size()) {
        ASSERT_EQ(id, want[k]) << "row " << i << " position " << k;
        ASSERT_EQ(mask, 1u);
      } else {
        ASSERT_EQ(id, tok_->pad_id());
        ASSERT_EQ(mask, 0u);
      }
    }
  }
  EXPECT_EQ(b.seq_len, longest);
  EXPECT_EQ(b.seq_len, max_len);  // the corpus has lines past 128 tokens among the first 200

  wick::BatchEncoding whole = tok_->encode_batch(texts, false);
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(whole.lengths[i], ref_->plain[i].size());
  EXPECT_THROW(tok_->encode_batch(texts, true, 1), wick::TokenizerError);
}

class SmolLM2 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string text = read_gz(kData + "/smollm2.json.gz");
    json_ = new Json(Json::parse(text));
    tok_ = new Tokenizer(Tokenizer::from_json(text));
    ref_ = new Reference(read_reference("smollm2"));
  }
  static void TearDownTestSuite() {
    delete json_;
    delete tok_;
    delete ref_;
  }
  // The vocabulary as GGUF stores it, taken from the tokenizer.json that was built from the GGUF.
  static wick::GgufVocab gguf_vocab(const Json& j, const std::string& pre) {
    wick::GgufVocab v;
    v.pre = pre;
    const Json& vocab = j["model"]["vocab"];
    v.tokens.resize(vocab.size());
    for (const auto& [token, id] : vocab.items()) v.tokens[id.get<size_t>()] = token;
    for (const Json& m : j["model"]["merges"]) {
      v.merges.push_back(m.is_array() ? m[0].get<std::string>() + " " + m[1].get<std::string>()
                                      : m.get<std::string>());
    }
    v.token_types.assign(v.tokens.size(), 1);
    for (const Json& t : j["added_tokens"]) v.token_types[t["id"].get<size_t>()] = 3;
    v.bos_id = 1;
    v.eos_id = 2;
    v.unk_id = 0;
    v.pad_id = 2;
    return v;
  }
  static Json* json_;
  static Tokenizer* tok_;
  static Reference* ref_;
};
Json* SmolLM2::json_ = nullptr;
Tokenizer* SmolLM2::tok_ = nullptr;
Reference* SmolLM2::ref_ = nullptr;

TEST_F(SmolLM2, IdsEqualHuggingFace) {
  expect_reference_ids(*tok_, *ref_);
}

TEST_F(SmolLM2, DecodeRoundTrips) {
  expect_round_trip(*tok_);
}

TEST_F(SmolLM2, DecodeStreamPrintsWholeCharacters) {
  size_t split_chars = 0;
  for (const auto& line : corpus()) {
    Ids ids = tok_->encode(line, false);
    wick::DecodeStream stream(*tok_, false);
    std::string text;
    for (uint32_t id : ids) {
      std::string piece = stream.step(id);
      split_chars += piece.empty() && !tok_->id_to_bytes(id).empty();
      text += piece;
    }
    text += stream.flush();
    ASSERT_EQ(text, without_missing_bytes(line));
  }
  EXPECT_GT(split_chars, 100u);  // the corpus has characters spread over several tokens
  // An unfinished character left at the end becomes U+FFFD.
  auto e2 = tok_->token_to_id("\u00e2");  // byte 0xE2: the lead byte of a 3-byte character
  ASSERT_TRUE(e2.has_value());
  wick::DecodeStream stream(*tok_);
  EXPECT_EQ(stream.step(*e2), "");
  EXPECT_EQ(stream.step(tok_->encode("a", false)[0]),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(stream.step(*e2), "");
  EXPECT_EQ(stream.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.step(2), "");  // <|im_end|> is skipped
}

TEST_F(SmolLM2, FromGgufVocabEqualsHuggingFace) {
  Tokenizer gguf = Tokenizer::from_gguf_vocab(gguf_vocab(*json_, "smollm"));
  expect_reference_ids(gguf, *ref_);
  EXPECT_EQ(gguf.bos_id(), 1u);
  EXPECT_EQ(gguf.eos_id(), 2u);
  EXPECT_EQ(gguf.pad_id(), 2u);
  EXPECT_TRUE(gguf.is_special(2));
  EXPECT_EQ(gguf.decode(gguf.encode("<|im_start|>hi<|im_end|>"), true), "hi");
}

TEST_F(SmolLM2, ChatTemplate) {
  wick::GgufVocab v = gguf_vocab(*json_, "smollm");
  // SmolLM2-135M-Instruct's template, as its GGUF stores it.
  v.chat_template =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
      "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}";
  Tokenizer tok = Tokenizer::from_gguf_vocab(v);
  std::string chat = tok.apply_chat_template({{"user", "What is 2+2?"}}, true);
  EXPECT_EQ(chat,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tok.apply_chat_template({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  Ids ids = tok.encode(chat, false);
  EXPECT_EQ(ids.front(), 1u);  // <|im_start|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1u), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2u), 2);
  EXPECT_EQ(tok.decode(ids, false), chat);

  // A tokenizer.json without a config has no chat template (tests/test_chat_template.cpp has
  // the rest).
  EXPECT_THROW(tok_->apply_chat_template({{"user", "x"}}, true), wick::TokenizerError);
}

TEST_F(SmolLM2, FromModelFolderWithConfig) {
  // A model folder as the hub has it: tokenizer.json and tokenizer_config.json.
  auto dir = std::filesystem::temp_directory_path() /
             ("wick_tokenizer_test_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json_->dump();
  Json config = {{"bos_token", "<|im_start|>"},
                 {"eos_token", {{"content", "<|im_end|>"}, {"special", true}}},
                 {"pad_token", "<|im_end|>"},
                 {"unk_token", "<|endoftext|>"},
                 {"chat_template",
                  "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
                  "'system' %}{{ '<|im_start|>system\nYou are SmolLM.<|im_end|>\n' }}{% endif "
                  "%}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                  "'<|im_end|>' + '\n'}}{% endfor %}"}};
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
  Tokenizer tok = Tokenizer::from_file(dir.string());  // the folder: its tokenizer.json
  std::filesystem::remove_all(dir);
  EXPECT_EQ(tok.bos_id(), 1u);
  EXPECT_EQ(tok.eos_id(), 2u);
  EXPECT_EQ(tok.pad_id(), 2u);
  EXPECT_EQ(tok.unk_id(), 0u);
  // The template writes "\n" inside a Jinja string here: the default system prompt is still
  // found.
  EXPECT_EQ(tok.apply_chat_template({{"user", "hi"}}, false),
            "<|im_start|>system\nYou are SmolLM.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(tok.encode("hello world 123"), tok_->encode("hello world 123"));
}

TEST_F(SmolLM2, BatchMatchesSingleEncodes) {
  const auto& lines = corpus();
  std::vector<std::string> texts(lines.begin(), lines.begin() + 300);
  wick::BatchEncoding b = tok_->encode_batch(texts, false);
  for (size_t i = 0; i < texts.size(); ++i) {
    Ids row(b.ids.begin() + i * b.seq_len, b.ids.begin() + i * b.seq_len + b.lengths[i]);
    EXPECT_EQ(row, ref_->plain[i]) << "row " << i;
  }
}

TEST_F(SmolLM2, LongRunsRoundTrip) {
  // Pieces far longer than any line: one 100k-letter word, a 100k whitespace run, 20k emoji.
  std::string emoji;
  for (int i = 0; i < 20000; ++i) emoji += "\xF0\x9F\x98\x80";
  for (const std::string& text : {std::string(100000, 'a'), std::string(100000, ' ') + "x", emoji,
                                  std::string(50000, '7') + std::string(50000, '\n')}) {
    Ids ids = tok_->encode(text, false);
    EXPECT_LT(ids.size(), text.size());
    EXPECT_EQ(tok_->decode(ids), text);
  }
}

TEST_F(SmolLM2, InvalidUtf8IsReplaced) {
  EXPECT_EQ(tok_->encode("a\xff"
                         "b",
                         false),
            tok_->encode("a\xEF\xBF\xBD"
                         "b",
                         false));
  // A truncated 3-byte sequence is one replacement character, as Python's errors="replace".
  EXPECT_EQ(tok_->encode("x\xE2\x82y", false), tok_->encode("x\xEF\xBF\xBDy", false));
}

TEST_F(SmolLM2, Errors) {
  EXPECT_THROW(tok_->decode({49152}), wick::IndexOutOfRange);
  EXPECT_THROW(tok_->id_to_token(1u << 30), wick::IndexOutOfRange);
  wick::GgufVocab v = gguf_vocab(*json_, "no-such-pre");
  EXPECT_THROW(Tokenizer::from_gguf_vocab(v), wick::TokenizerError);
  v.pre = "smollm";
  v.model = "llama";
  EXPECT_THROW(Tokenizer::from_gguf_vocab(v), wick::TokenizerError);
  v.model = "gpt2";
  v.merges.push_back("nosuchtoken Ġt");
  EXPECT_THROW(Tokenizer::from_gguf_vocab(v), wick::TokenizerError);
  v.merges.pop_back();
  v.bos_id = 1u << 20;
  EXPECT_THROW(Tokenizer::from_gguf_vocab(v), wick::TokenizerError);
}

class Llama3Style : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string text = read_gz(kData + "/llama3_style.json.gz");
    json_ = new Json(Json::parse(text));
    tok_ = new Tokenizer(Tokenizer::from_json(text));
    ref_ = new Reference(read_reference("llama3_style"));
  }
  static void TearDownTestSuite() {
    delete json_;
    delete tok_;
    delete ref_;
  }
  static Json* json_;
  static Tokenizer* tok_;
  static Reference* ref_;
};
Json* Llama3Style::json_ = nullptr;
Tokenizer* Llama3Style::tok_ = nullptr;
Reference* Llama3Style::ref_ = nullptr;

TEST_F(Llama3Style, IdsEqualHuggingFace) {
  expect_reference_ids(*tok_, *ref_);
}

TEST_F(Llama3Style, DecodeRoundTrips) {
  expect_round_trip(*tok_);
}

class SmolLM2Access : public SmolLM2 {
 public:
  using SmolLM2::gguf_vocab;
};

TEST_F(Llama3Style, FromGgufVocabEqualsHuggingFace) {
  wick::GgufVocab v = SmolLM2Access::gguf_vocab(*json_, "llama-bpe");
  v.bos_id = 0;  // the reference's stand-in for <|begin_of_text|>
  v.add_bos = true;
  Tokenizer gguf = Tokenizer::from_gguf_vocab(v);
  expect_reference_ids(gguf, *ref_);
}

// Qwen2's and GPT-2's pre-tokenisation over the same vocabulary: the committed tokenizer.json
// lacks only the vocabulary and merges, taken from SmolLM2's.
void expect_overlay_equals_hf(const std::string& name, const std::string& gguf_pre) {
  Json j = Json::parse(read_text(kData + "/" + name + ".overlay.json"));
  Json smol = Json::parse(read_gz(kData + "/smollm2.json.gz"));
  j["model"]["vocab"] = smol["model"]["vocab"];
  j["model"]["merges"] = smol["model"]["merges"];
  Reference ref = read_reference(name);
  {
    SCOPED_TRACE(name + " tokenizer.json");
    expect_reference_ids(Tokenizer::from_json(j.dump()), ref);
  }
  {
    SCOPED_TRACE(name + " from_gguf_vocab pre=" + gguf_pre);
    expect_reference_ids(Tokenizer::from_gguf_vocab(SmolLM2Access::gguf_vocab(smol, gguf_pre)),
                         ref);
  }
}

TEST(OtherBpeStyles, Qwen2EqualsHuggingFace) {
  expect_overlay_equals_hf("qwen2_style", "qwen2");
}

TEST(OtherBpeStyles, Gpt2EqualsHuggingFace) {
  expect_overlay_equals_hf("gpt2_style", "gpt2");
}

TEST(Tokenizer, LoadErrors) {
  EXPECT_THROW(Tokenizer().encode("x"), wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_file(kData + "/no-such-file.json"), wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_json("{not json"), wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_json("{}"), wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "Unigram", "vocab": {}}})"),
               wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_json(
                   R"({"model": {"type": "WordPiece", "vocab": {"a": 0}, "unk_token": "[UNK]"}})"),
               wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0},
                                       "merges": ["a a"]}})"),
               wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_json(R"({"normalizer": {"type": "Precompiled"},
                                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
               wick::TokenizerError);
  EXPECT_THROW(Tokenizer::from_json(R"({"pre_tokenizer": {"type": "Split",
                                       "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"},
                                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"),
               wick::TokenizerError);
}

// Token ids that are not integers in [0, 2^22): a float past every integer type (the fuzzer's
// 7.8e130, undefined behaviour to convert), negative, fractional or huge ids are malformed files.
TEST(Tokenizer, IdsThatAreNotTokenIdsAreLoadErrors) {
  for (const char* id : {"7.7e130", "-1", "1.5", "4294967296", "4194304", "\"3\"", "null"}) {
    std::string vocab =
        std::string(R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": )") + id +
        R"(}, "unk_token": "[UNK]"}})";
    EXPECT_THROW(Tokenizer::from_json(vocab), wick::TokenizerError) << id;
    std::string added = std::string(R"({"added_tokens": [{"id": )") + id +
                        R"(, "content": "x"}], "model": {"type": "WordPiece", "vocab": {"[UNK]": 0},
           "unk_token": "[UNK]"}})";
    EXPECT_THROW(Tokenizer::from_json(added), wick::TokenizerError) << id;
    std::string post = std::string(R"({"post_processor": {"type": "BertProcessing",
           "cls": ["[UNK]", )") +
                       id + R"(], "sep": ["[UNK]", 0]},
           "model": {"type": "WordPiece", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"}})";
    // A post-processor's ids only need to be 32-bit ids (an id outside the vocabulary fails at
    // the embedding lookup); vocabulary and added-token ids are bounded by the entry count.
    if (std::string(id) != "4194304") {
      EXPECT_THROW(Tokenizer::from_json(post), wick::TokenizerError) << id;
    }
  }
  Tokenizer ok = Tokenizer::from_json(
      R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}})");
  EXPECT_EQ(ok.token_to_id("a"), 1u);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {"[UNK]": 0,
           "a": 70000}, "unk_token": "[UNK]"}})"),
               wick::TokenizerError);
}

TEST(Tokenizer, SmallWordPieceAndSplitBehaviours) {
  // A tiny WordPiece over a Split pre-tokenizer with each behaviour, to check the split rules
  // on a case that is easy to read.
  auto make = [](const std::string& behavior) {
    return Tokenizer::from_json(R"({"pre_tokenizer": {"type": "Split", "pattern": {"String": "-"},
      "behavior": ")" + behavior +
                                R"(", "invert": false},
      "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
      "max_input_chars_per_word": 5, "vocab": {"[UNK]": 0, "a": 1, "b": 2, "-": 3, "a-": 4,
      "-b": 5, "##b": 6, "##-": 7, "ab": 8}}})");
  };
  EXPECT_EQ(make("Isolated").encode("a-b", false), (Ids{1, 3, 2}));
  EXPECT_EQ(make("Removed").encode("a-b", false), (Ids{1, 2}));
  EXPECT_EQ(make("MergedWithPrevious").encode("a-b", false), (Ids{4, 2}));
  EXPECT_EQ(make("MergedWithNext").encode("a-b", false), (Ids{1, 5}));
  EXPECT_EQ(make("Contiguous").encode("a--b", false), (Ids{1, 3, 7, 2}));
  Tokenizer t = make("Removed");
  EXPECT_EQ(t.encode("abb", false), (Ids{8, 6}));
  EXPECT_EQ(t.encode("abc", false), (Ids{0}));     // one unknown piece makes the word [UNK]
  EXPECT_EQ(t.encode("ababab", false), (Ids{0}));  // longer than max_input_chars_per_word
  EXPECT_EQ(t.decode({8, 6, 1}), "ab ##b a");      // no decoder: tokens joined by spaces, as HF
}

}  // namespace
