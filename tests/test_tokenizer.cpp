// wick::Tokenizer against Hugging Face `tokenizers`: ids on a 2,331-line corpus for MiniLM's
// WordPiece, SmolLM2's byte-level BPE, a Llama-3-style BPE and SentencePiece-style BPEs (and
// llama.cpp for a GGUF "llama" vocabulary; references made by scripts/make_tokenizer_refs.py and
// committed in tests/data/tokenizer/).

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "wick/llama.h"
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
  v.model = "t5";  // Unigram
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

// ---------------------------------------------------------------------------------------------
// SentencePiece-style BPE (Llama 2, Mistral, Gemma, Phi-3): a BPE with byte fallback trained by
// scripts/make_tokenizer_refs.py --spm, laid out as each family's tokenizer.json does, and the
// same vocabulary as a GGUF tokenizer.ggml.model "llama" against llama.cpp's ids.

std::string spm_json(const std::string& style) {
  std::string base = read_gz(kData + "/spm_llama2.json.gz");
  if (style == "llama2") return base;
  Json j = Json::parse(read_text(kData + "/spm_" + style + ".overlay.json"));
  Json b = Json::parse(base);
  j["model"]["vocab"] = b["model"]["vocab"];
  j["model"]["merges"] = b["model"]["merges"];
  return j.dump();
}

std::vector<std::string> read_decoded(const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(read_gz(kData + "/" + name + ".decoded.jsonl.gz"));
  for (std::string line; std::getline(in, line);) out.push_back(Json::parse(line));
  return out;
}

bool has_added_token(const std::string& line) {
  return line.find("<|im_start|>") != std::string::npos ||
         line.find("<|im_end|>") != std::string::npos || line.find("<s>") != std::string::npos ||
         line.find("</s>") != std::string::npos || line.find("<unk>") != std::string::npos;
}

// decode(ids with specials, skip_special_tokens = false) equals HF's for every corpus line.
void expect_reference_decode(const Tokenizer& tok, const Reference& ref,
                             const std::vector<std::string>& want) {
  ASSERT_EQ(want.size(), ref.special.size());
  size_t failures = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    std::string got = tok.decode(ref.special[i], false);
    if (got != want[i] && ++failures <= 5) {
      ADD_FAILURE() << "line " << i << ": wick " << Json(got).dump() << " HF "
                    << Json(want[i]).dump();
    }
  }
  EXPECT_EQ(failures, 0u);
}

// With a "▁" before the text (Llama 2's Prepend, GGUF's add_space_prefix): decode gives the text
// back, and the streamed bytes of the ids are that space and the text.
void expect_spm_round_trip(const Tokenizer& tok) {
  size_t failures = 0, checked = 0;
  for (const auto& line : corpus()) {
    if (has_added_token(line)) continue;
    Ids ids = tok.encode(line, false);
    std::string streamed, printed;
    wick::DecodeStream stream(tok);
    for (uint32_t id : ids) {
      streamed += tok.id_to_bytes(id);
      printed += stream.step(id);
    }
    printed += stream.flush();
    std::string spaced = line.empty() ? "" : " " + line;
    ++checked;
    if (tok.decode(ids) != line || streamed != spaced || printed != spaced) {
      if (++failures <= 5) ADD_FAILURE() << "no round trip for " << Json(line).dump();
    }
  }
  EXPECT_GT(checked, 2000u);
  EXPECT_EQ(failures, 0u);
}

TEST(SentencePieceBpe, IdsAndDecodeEqualHuggingFace) {
  for (const std::string style : {"llama2", "mistral", "gemma", "split"}) {
    SCOPED_TRACE(style);
    Tokenizer tok = Tokenizer::from_json(spm_json(style));
    Reference ref = read_reference("spm_" + style);
    expect_reference_ids(tok, ref);
    expect_reference_decode(tok, ref, read_decoded("spm_" + style));
  }
}

TEST(SentencePieceBpe, RoundTripAndStream) {
  expect_spm_round_trip(Tokenizer::from_json(spm_json("llama2")));
  // Gemma's layout has no prefix: the text comes back as it is, streamed too.
  Tokenizer gemma = Tokenizer::from_json(spm_json("gemma"));
  size_t failures = 0;
  for (const auto& line : corpus()) {
    if (has_added_token(line)) continue;
    Ids ids = gemma.encode(line, false);
    std::string streamed;
    for (uint32_t id : ids) streamed += gemma.id_to_bytes(id);
    if ((gemma.decode(ids) != line || streamed != line) && ++failures <= 5) {
      ADD_FAILURE() << "no round trip for " << Json(line).dump();
    }
  }
  EXPECT_EQ(failures, 0u);
}

TEST(SentencePieceBpe, ByteFallbackAndSpecialTokens) {
  Tokenizer tok = Tokenizer::from_json(spm_json("llama2"));
  EXPECT_EQ(tok.vocab_size(), 958u);  // 956 in the model, 2 added
  EXPECT_EQ(tok.bos_id(), 1u);
  EXPECT_EQ(tok.eos_id(), 2u);
  EXPECT_EQ(tok.unk_id(), 0u);
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_EQ(tok.num_special_tokens_to_add(), 1u);
  // A character outside the vocabulary falls back to its UTF-8 bytes, <0xNN> ids 3 + byte.
  std::string snowman = "\u2603";  // E2 98 83
  ASSERT_FALSE(tok.token_to_id(snowman));
  Ids ids = tok.encode(snowman, false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(Ids(ids.end() - 3, ids.end()), (Ids{3 + 0xE2, 3 + 0x98, 3 + 0x83}));
  EXPECT_EQ(tok.id_to_bytes(3 + 0xE2), "\xE2");
  EXPECT_EQ(tok.decode(ids), snowman);
  // A run of byte tokens that is not UTF-8 decodes to one U+FFFD per byte, as HF's ByteFallback
  // (strings from HF tokenizers 0.23).
  EXPECT_EQ(tok.decode({3 + 0xE2, 3 + 0x98, 3 + 'a'}), "\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(tok.decode({3 + 0xE2, 3 + 0x98, *tok.token_to_id("a")}), "\uFFFD\uFFFDa");
  // Added tokens split the text; each piece after one gets Llama 2's "▁" again.
  Ids chat = tok.encode("<|im_start|>hi", true);
  ASSERT_GE(chat.size(), 3u);
  EXPECT_EQ(chat[0], 1u);
  EXPECT_EQ(chat[1], *tok.token_to_id("<|im_start|>"));
  EXPECT_EQ(tok.id_to_token(chat[2]).rfind("\u2581", 0), 0u);
  EXPECT_EQ(tok.decode(chat, true), "hi");
}

TEST(SentencePieceBpe, GgufLlamaEqualsLlamaCpp) {
  Tokenizer tok = wick::models::load_gguf_tokenizer(kData + "/spm_llama.gguf");
  expect_reference_ids(tok, read_reference("spm_gguf"));
  expect_spm_round_trip(tok);
  // Decoding as HF's converted GGUF tokenizer does (Llama 2's decoder chain).
  Reference hf = read_reference("spm_llama2");
  expect_reference_decode(tok, hf, read_decoded("spm_llama2"));
}

// Score order, not vocabulary order, picks the merge: "ab" scores above "bc", so "abc" is
// "ab" "c"; with the scores swapped it is "a" "bc" (the ids llama.cpp gives for this vocabulary,
// llama_cpp_python 0.3.36). A byte with neither a <0xNN> nor a 1-byte token is the unknown token
// (llama.cpp aborts there).
TEST(SentencePieceBpe, GgufMergesByScore) {
  wick::GgufVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>", "<0x61>", "\u2581", "a", "b", "c", "ab", "bc", "\u2581a"};
  v.token_types = {2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 1};
  v.scores = {0, 0, 0, 0, -1, -2, -3, -4, -5, -6, -7};
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_space_prefix = false;
  EXPECT_EQ(Tokenizer::from_gguf_vocab(v).encode("abc", false), (Ids{8, 7}));
  v.scores[8] = -10;
  EXPECT_EQ(Tokenizer::from_gguf_vocab(v).encode("abc", false), (Ids{5, 9}));
  v.add_space_prefix = true;
  v.add_bos = true;
  Tokenizer spaced = Tokenizer::from_gguf_vocab(v);
  EXPECT_EQ(spaced.encode("a bc", true), (Ids{1, 10, 4, 9}));
  EXPECT_EQ(spaced.decode({1, 10, 4, 9}), "a bc");
  EXPECT_EQ(spaced.encode("d", false), (Ids{4, 0}));  // no token and no <0x64>: unknown
  // A user-defined token (type 4) is matched in text, not special; each piece after it or a
  // control token gets its "▁" as at the start (llama.cpp: 10 11 4 9 and 10 1 4 9).
  v.tokens.push_back("<|u|>");
  v.token_types.push_back(4);
  v.scores.push_back(0);
  Tokenizer user = Tokenizer::from_gguf_vocab(v);
  EXPECT_EQ(user.encode("a<|u|>bc", false), (Ids{10, 11, 4, 9}));
  EXPECT_EQ(user.encode("a<s>bc", false), (Ids{10, 1, 4, 9}));
  EXPECT_FALSE(user.is_special(11));
  EXPECT_TRUE(user.is_special(1));
  EXPECT_EQ(user.decode({10, 11, 4, 9}), "a<|u|> bc");
  v.scores.pop_back();
  EXPECT_THROW(Tokenizer::from_gguf_vocab(v), wick::TokenizerError);
}

TEST(SentencePieceBpe, Errors) {
  Json j = Json::parse(spm_json("mistral"));
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  EXPECT_THROW(Tokenizer::from_json(j.dump()), wick::TokenizerError);
  j["pre_tokenizer"]["prepend_scheme"] = "first";
  j["pre_tokenizer"]["replacement"] = "ab";
  EXPECT_THROW(Tokenizer::from_json(j.dump()), wick::TokenizerError);
  j["pre_tokenizer"]["replacement"] = "\u2581";
  j["pre_tokenizer"]["split"] = "yes";
  EXPECT_THROW(Tokenizer::from_json(j.dump()), wick::TokenizerError);
  // Metaspace must come first in a Sequence.
  Json seq = Json::parse(spm_json("mistral"));
  seq["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", {{{"type", "WhitespaceSplit"}}, seq["pre_tokenizer"]}}};
  EXPECT_THROW(Tokenizer::from_json(seq.dump()), wick::TokenizerError);
  Json strip = Json::parse(spm_json("llama2"));
  strip["decoder"]["decoders"][3]["start"] = -1;
  EXPECT_THROW(Tokenizer::from_json(strip.dump()), wick::TokenizerError);
  Json replace = Json::parse(spm_json("llama2"));
  replace["normalizer"]["normalizers"][1].erase("content");
  EXPECT_THROW(Tokenizer::from_json(replace.dump()), wick::TokenizerError);
  EXPECT_THROW(wick::models::load_gguf_tokenizer(kData + "/no-such.gguf"), wick::Error);
}

}  // namespace
