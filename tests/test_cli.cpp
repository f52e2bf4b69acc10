// The command-line tools run as a user runs them (tools/cli.h's convention): stdout and stderr
// captured separately, exit codes, every validation message. The tiny Llama of tests/data/llama
// (transformers' greedy tokens as the reference) needs no download; the tests on the real
// models run with WICK_SMOLLM2_GGUF and WICK_MINILM_DIR (as the model tests do).

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bert_test_util.h"
#include "wick/cpu.h"
#include "wick/formats.h"
#include "wick/gguf.h"
#include "wick/safetensors.h"
#include "wick/wick.h"

#if defined(WICK_GENERATE_EXE) && defined(WICK_EMBED_EXE) && defined(WICK_INFO_EXE) && \
    defined(WICK_MM_EXE)
#define WICK_HAVE_TOOLS 1
#else
#define WICK_HAVE_TOOLS 0
#define WICK_GENERATE_EXE ""
#define WICK_EMBED_EXE ""
#define WICK_INFO_EXE ""
#define WICK_MM_EXE ""
#define WICK_TOOLS_VERSION ""
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// Single-quoted for bash.
std::string q(const std::string& s) {
  std::string r = "'";
  for (char c : s) {
    if (c == '\'') {
      r += "'\\''";
    } else {
      r += c;
    }
  }
  return r + "'";
}

struct Result {
  int rc = -1;
  std::string out, err;
};

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!WICK_HAVE_TOOLS) GTEST_SKIP() << "the tools are not built (WICK_BUILD_TOOLS=OFF)";
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("wick_cli_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Runs a bash script in the test's folder; the exit status of `script`'s last command
  // (bash reports a death by signal N as 128 + N).
  Result sh(const std::string& script, const std::string& input = "") {
    write_file(dir_ / "in.txt", input);
    write_file(dir_ / "run.sh", "cd " + q(dir_.string()) + "\n" + script + "\n");
    int status = std::system(("bash " + q((dir_ / "run.sh").string())).c_str());
    Result r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_file(dir_ / "out.txt");
    r.err = read_file(dir_ / "err.txt");
    return r;
  }
  // One tool with `args`, stdin from `input`, stdout and stderr captured apart.
  Result tool(const std::string& exe, const std::string& args, const std::string& input = "") {
    return sh(q(exe) + " " + args + " < in.txt > out.txt 2> err.txt", input);
  }
  Result generate(const std::string& args, const std::string& input = "") {
    return tool(WICK_GENERATE_EXE, args, input);
  }
  Result embed(const std::string& args, const std::string& input = "") {
    return tool(WICK_EMBED_EXE, args, input);
  }
  Result info(const std::string& args) { return tool(WICK_INFO_EXE, args); }

  // A usage error: exit 2, nothing on stdout, `message` on stderr.
  void expect_usage(const Result& r, const std::string& message) {
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(message), std::string::npos) << "stderr: " << r.err;
  }

  fs::path dir_;
};

std::string llama_dir() {
  return std::string(WICK_TEST_DATA_DIR) + "/llama/tiny_llama";
}

std::vector<uint32_t> npy_ids(const std::string& path) {
  std::vector<uint32_t> ids;
  for (double v : wick::npy::load(path, wick::Device::cpu()).to_vec_f64()) {
    ids.push_back(static_cast<uint32_t>(v));
  }
  return ids;
}

std::string join(const std::vector<uint32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += sep;
    s += std::to_string(ids[i]);
  }
  return s;
}

std::vector<uint32_t> split_ids(const std::string& line) {
  std::vector<uint32_t> ids;
  std::istringstream in(line);
  uint32_t v = 0;
  while (in >> v) ids.push_back(v);
  return ids;
}

// The tiny Llama's prompt and transformers' 16 greedy tokens after it.
struct TinyRef {
  std::vector<uint32_t> prompt = npy_ids(llama_dir() + "/prompt.npy");
  std::vector<uint32_t> greedy = npy_ids(llama_dir() + "/greedy.npy");
  std::string args() const {
    return q(llama_dir()) + " --prompt-ids " + join(prompt, ",") + " --max-new 16 --ignore-eos";
  }
};

// ---- wick-generate ----

TEST_F(Cli, GenerateVersionAndHelpOnStdout) {
  Result r = generate("--version");
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out, std::string("wick-generate ") + WICK_TOOLS_VERSION + "\n");
  EXPECT_EQ(r.err, "");
  r = generate("--help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("Exit codes"), std::string::npos);
}

TEST_F(Cli, GenerateResultAloneOnStdoutStatsOnStderr) {
  TinyRef ref;
  ASSERT_EQ(ref.greedy.size(), 16u);
  Result r = generate(ref.args());
  ASSERT_EQ(r.rc, 0) << r.err;
  // No tokenizer: the new ids are the result, on one line.
  EXPECT_EQ(r.out, join(ref.greedy, " ") + "\n");
  EXPECT_NE(r.err.find("decode: 16 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("prompt: " + std::to_string(ref.prompt.size()) + " tokens"),
            std::string::npos);
  // -q: the same result, nothing on stderr.
  Result quiet = generate(ref.args() + " -q");
  EXPECT_EQ(quiet.rc, 0);
  EXPECT_EQ(quiet.out, r.out);
  EXPECT_EQ(quiet.err, "");
  // --threads 1 gives the same tokens.
  Result one = generate(ref.args() + " -q --threads 1");
  EXPECT_EQ(one.rc, 0) << one.err;
  EXPECT_EQ(one.out, r.out);
}

TEST_F(Cli, GenerateJsonCarriesIdsUsageAndTimings) {
  TinyRef ref;
  Result r = generate(ref.args() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  ASSERT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);
  json j = json::parse(r.out);
  EXPECT_EQ(j["ids"].get<std::vector<uint32_t>>(), ref.greedy);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], ref.prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);
  EXPECT_EQ(j["usage"]["total_tokens"], ref.prompt.size() + 16);
  EXPECT_GT(j["timings"]["prompt_seconds"].get<double>(), 0.0);
  EXPECT_GT(j["timings"]["decode_tokens_per_second"].get<double>(), 0.0);
}

TEST_F(Cli, GenerateUsageErrorsBeforeAnyWork) {
  const std::string m = q(llama_dir());
  expect_usage(generate(m + " --prompt-ids 1 --max-new -1"),
               "--max-new: must be a whole number from 0");
  expect_usage(generate(m + " --prompt-ids 1 --max-new 0x10"), "--max-new");
  expect_usage(generate(m + " --prompt-ids 1 --device cuda:abc"),
               "--device must be cpu, cuda or cuda:N (N the GPU's number), got 'cuda:abc'");
  expect_usage(generate(m + " --prompt-ids 1 --device cudax"), "got 'cudax'");
  expect_usage(generate(m + " --prompt-ids 1 --device gpu"), "got 'gpu'");
  expect_usage(generate(m + " --prompt-ids 504,4294967296"),
               "--prompt-ids: '4294967296' is not a token id");
  expect_usage(generate(m + " --prompt-ids 504,abc"), "--prompt-ids: 'abc' is not a token id");
  expect_usage(generate(m + " --prompt-ids 1,,2"), "--prompt-ids: '' is not a token id");
  expect_usage(generate(m + " --prompt-ids -1"), "--prompt-ids: '-1' is not a token id");
  expect_usage(generate(m + " --prompt-ids 96"),
               "id 96 is outside the model's vocabulary of 96 tokens");
  expect_usage(generate(m + " --prompt-ids 1 --top-p nan"), "--top-p: must be a number in (0");
  expect_usage(generate(m + " --prompt-ids 1 --top-p 2"), "--top-p");
  expect_usage(generate(m + " --prompt-ids 1 --top-p 0"), "--top-p");
  expect_usage(generate(m + " --prompt-ids 1 --temperature -1"), "--temperature");
  expect_usage(generate(m + " --prompt-ids 1 --temperature nan"), "--temperature");
  expect_usage(generate(m + " --prompt-ids 1 --temperature inf"), "--temperature");
  expect_usage(generate(m + " --prompt-ids 1 --min-p 1.5"), "--min-p");
  expect_usage(generate(m + " --prompt-ids 1 --repeat-penalty 0"), "--repeat-penalty");
  expect_usage(generate(m + " --prompt-ids 1 --presence-penalty nan"), "--presence-penalty");
  expect_usage(generate(m + " --prompt-ids 1 --top-k -3"), "--top-k");
  expect_usage(generate(m + " --prompt-ids 1 --threads 0"), "--threads");
  expect_usage(generate(m + " --prompt-ids 1 --dtype f8"), "--dtype");
  expect_usage(generate(m + " --prompt-ids 1 --no-such-option"), "no-such-option");
  expect_usage(generate(m + " --prompt-ids 1 --stop ''"), "--stop");
  expect_usage(generate(m + " --prompt-ids 1 --chat"), "--chat and --system need a text prompt");
  expect_usage(generate(m + " --prompt-file " + q(dir_.string())), "is a directory");
  expect_usage(generate(m + " --prompt-file /nonexistent/prompt.txt"), "/nonexistent/prompt.txt");
  expect_usage(generate(m + " --prompt x --prompt-ids 1"), "excludes");
  expect_usage(generate(m + " -i --prompt-file -"), "-i reads the turns from stdin");
  expect_usage(generate("/nonexistent/model.gguf"), "no such file or directory");
  expect_usage(generate(""), "model is required");
}

TEST_F(Cli, GenerateChatNeedsATokenizer) {
  Result r = generate(q(llama_dir()) + " -i", "hello\n");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("--chat, --system and -i need one"), std::string::npos) << r.err;
}

TEST_F(Cli, GenerateMissingDeviceIsExit3) {
  if (wick::cuda_is_available()) GTEST_SKIP() << "a GPU is present";
  Result r = generate(q(llama_dir()) + " --prompt-ids 1 --device cuda");
  EXPECT_EQ(r.rc, 3);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("no CUDA GPU is available"), std::string::npos) << r.err;
  EXPECT_EQ(generate(q(llama_dir()) + " --prompt-ids 1 --device cuda:7").rc, 3);
  EXPECT_EQ(tool(WICK_MM_EXE, "walk cuda").rc, 3);
  EXPECT_EQ(embed("/nonexistent --device cuda:1").rc, 3);
}

TEST_F(Cli, GenerateContextLengthNamesBothLengths) {
  // The tiny model's context is 64 positions.
  expect_usage(generate(q(llama_dir()) + " --prompt-ids 1,2,3 --max-new 62"),
               "the prompt's 3 tokens + --max-new 62 exceed the model's context length of 64");
  Result fits = generate(q(llama_dir()) + " --prompt-ids 1,2,3 --max-new 61 --ignore-eos -q");
  EXPECT_EQ(fits.rc, 0) << fits.err;
  EXPECT_EQ(split_ids(fits.out).size(), 61u);
  expect_usage(generate(q(llama_dir()) + " --prompt-ids 1,2,3 --max-new 8 --max-len 10"),
               "--max-len 10 is shorter than the 3 prompt tokens + --max-new 8");
  // --context-shift keeps the prompt's last tokens that fit: the same answer as that tail alone.
  Result shifted = generate(q(llama_dir()) +
                            " --prompt-ids 1,2,3,4,5 --max-new 61 --ignore-eos -q --context-shift");
  EXPECT_EQ(shifted.rc, 0) << shifted.err;
  EXPECT_NE(shifted.err.find("first 2 of 5 tokens dropped"), std::string::npos) << shifted.err;
  Result tail = generate(q(llama_dir()) + " --prompt-ids 3,4,5 --max-new 61 --ignore-eos -q");
  EXPECT_EQ(tail.rc, 0) << tail.err;
  EXPECT_EQ(shifted.out, tail.out);
  EXPECT_EQ(split_ids(shifted.out).size(), 61u);
}

TEST_F(Cli, GenerateWriteFailuresAreExit1) {
  TinyRef ref;
  Result full = sh(q(WICK_GENERATE_EXE) + " " + ref.args() + " > /dev/full 2> err.txt");
  EXPECT_EQ(full.rc, 1);
  EXPECT_NE(full.err.find("cannot write standard output: No space left on device"),
            std::string::npos)
      << full.err;
  // A reader that is gone: EPIPE, not death by SIGPIPE (141).
  Result pipe = sh("set -o pipefail; " + q(WICK_GENERATE_EXE) + " " + ref.args() +
                   " 2> err.txt | true; echo \"${PIPESTATUS[0]}\" > out.txt");
  EXPECT_EQ(pipe.out, "1\n");
  EXPECT_NE(pipe.err.find("Broken pipe"), std::string::npos) << pipe.err;
  // Closed stdout.
  Result closed = sh(q(WICK_GENERATE_EXE) + " " + ref.args() + " >&- 2> err.txt");
  EXPECT_EQ(closed.rc, 1);
  // --logits-out into a folder that does not exist: exit 1, no file left.
  Result bad = generate(ref.args() + " --logits-out " + q((dir_ / "no/such/l.bin").string()));
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find("cannot write"), std::string::npos);
}

TEST_F(Cli, GenerateLogitsOutMatchesTransformers) {
  TinyRef ref;
  fs::path out = dir_ / "logits.bin";
  Result r = generate(ref.args() + " -q --logits-out " + q(out.string()));
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string bytes = read_file(out);
  std::vector<double> expected =
      wick::npy::load(llama_dir() + "/logits.npy", wick::Device::cpu()).to_vec_f64();
  ASSERT_EQ(bytes.size(), expected.size() * sizeof(float));
  std::vector<float> got(expected.size());
  std::memcpy(got.data(), bytes.data(), bytes.size());
  double worst = 0, range = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - expected[i]));
    range = std::max(range, std::abs(expected[i]));
  }
  EXPECT_GT(range, 1.0);
  EXPECT_LE(worst, 1e-5 * range);
}

// A copy of the tiny Llama with a WordPiece tokenizer over its 96 ids: text prompts, stdin and
// stop strings without a download.
class CliText : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    if (IsSkipped()) return;
    model_ = dir_ / "model";
    fs::create_directories(model_);
    fs::copy_file(llama_dir() + "/config.json", model_ / "config.json");
    fs::copy_file(llama_dir() + "/model.safetensors", model_ / "model.safetensors");
    json vocab = json::object();
    vocab["[UNK]"] = 0;
    uint32_t id = 1;
    for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = id++;
    for (char c = 'a'; c <= 'z'; ++c) vocab["##" + std::string(1, c)] = id++;
    for (char c = '0'; c <= '9'; ++c) vocab[std::string(1, c)] = id++;
    for (const char* w : {"the", "capital", "of", "france", "is", "paris", "cat", "dog", "sat",
                          "on", "mat", "a", ".", ","}) {
      if (!vocab.contains(w)) vocab[w] = id++;
    }
    while (id < 96) vocab["w" + std::to_string(id)] = id, ++id;
    json tok = {{"version", "1.0"},
                {"truncation", nullptr},
                {"padding", nullptr},
                {"added_tokens",
                 {{{"id", 0},
                   {"content", "[UNK]"},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", true}}}},
                {"normalizer", nullptr},
                {"pre_tokenizer", {{"type", "Whitespace"}}},
                {"post_processor", nullptr},
                {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
                {"model",
                 {{"type", "WordPiece"},
                  {"unk_token", "[UNK]"},
                  {"continuing_subword_prefix", "##"},
                  {"max_input_chars_per_word", 100},
                  {"vocab", vocab}}}};
    write_file(model_ / "tokenizer.json", tok.dump());
  }
  std::string m() const { return q(model_.string()); }
  fs::path model_;
};

TEST_F(CliText, PromptFromStdinEqualsPromptOption) {
  Result direct = generate(m() + " --prompt 'the cat sat on' --max-new 12 --ignore-eos -q");
  ASSERT_EQ(direct.rc, 0) << direct.err;
  ASSERT_GT(direct.out.size(), 1u);
  EXPECT_EQ(direct.out.back(), '\n');
  EXPECT_EQ(direct.err, "");
  Result piped =
      generate(m() + " --prompt-file - --max-new 12 --ignore-eos -q", "the cat sat on\n");
  EXPECT_EQ(piped.rc, 0) << piped.err;
  EXPECT_EQ(piped.out, direct.out);
  write_file(dir_ / "prompt.txt", "the cat sat on\n");
  Result file = generate(m() + " --prompt-file prompt.txt --max-new 12 --ignore-eos -q");
  EXPECT_EQ(file.out, direct.out);
  // Without -q the prompt is echoed on stderr, never on stdout.
  Result echo = generate(m() + " --prompt 'the cat sat on' --max-new 12 --ignore-eos");
  EXPECT_EQ(echo.out, direct.out);
  EXPECT_EQ(echo.err.rfind("the cat sat on", 0), 0u) << echo.err;
  // --json: the same text.
  Result j = generate(m() + " --prompt 'the cat sat on' --max-new 12 --ignore-eos --json");
  ASSERT_EQ(j.rc, 0);
  std::string text = direct.out.substr(0, direct.out.size() - 1);
  EXPECT_EQ(json::parse(j.out)["text"], text);
}

TEST_F(CliText, StopStringEndsTheTextBeforeIt) {
  Result full = generate(m() + " --prompt 'the cat sat on' --max-new 40 --ignore-eos --json");
  ASSERT_EQ(full.rc, 0) << full.err;
  json j = json::parse(full.out);
  std::string text = j["text"];
  ASSERT_GT(text.size(), 12u) << text;
  // A piece from the middle of the unstopped text: the stopped text is what precedes its first
  // occurrence.
  std::string stop = text.substr(text.size() / 2, 3);
  size_t at = text.find(stop);
  Result stopped =
      generate(m() + " --prompt 'the cat sat on' --max-new 40 --ignore-eos -q --stop " + q(stop));
  ASSERT_EQ(stopped.rc, 0) << stopped.err;
  std::string expected = text.substr(0, at);
  if (expected.empty() || expected.back() != '\n') expected += "\n";
  EXPECT_EQ(stopped.out, expected) << "stop " << stop;
  Result sj = generate(m() + " --prompt 'the cat sat on' --max-new 40 --ignore-eos --json --stop " +
                       q(stop) + " --stop zzzzzz");
  json s = json::parse(sj.out);
  EXPECT_EQ(s["text"], text.substr(0, at));
  EXPECT_EQ(s["finish_reason"], "stop");
  // The ids kept are a prefix of the unstopped ones, fewer than those.
  auto all = j["ids"].get<std::vector<uint32_t>>();
  auto kept = s["ids"].get<std::vector<uint32_t>>();
  ASSERT_LT(kept.size(), all.size());
  EXPECT_TRUE(std::equal(kept.begin(), kept.end(), all.begin()));
}

TEST_F(CliText, PenaltiesChangeGreedyOutput) {
  // Plain greedy on the random model repeats tokens; strong penalties on the tokens already
  // there make the output use more distinct ones.
  Result plain = generate(m() + " --prompt 'the cat' --max-new 30 --ignore-eos --json");
  Result penal = generate(m() +
                          " --prompt 'the cat' --max-new 30 --ignore-eos --json "
                          "--repeat-penalty 100 --presence-penalty 2");
  ASSERT_EQ(plain.rc, 0);
  ASSERT_EQ(penal.rc, 0) << penal.err;
  auto a = json::parse(plain.out)["ids"].get<std::vector<uint32_t>>();
  auto b = json::parse(penal.out)["ids"].get<std::vector<uint32_t>>();
  std::set<uint32_t> distinct_a(a.begin(), a.end()), distinct_b(b.begin(), b.end());
  ASSERT_LT(distinct_a.size(), a.size()) << "plain greedy repeats no token";
  EXPECT_GT(distinct_b.size(), distinct_a.size());
}

// The chat template of a tokenizer_config.json beside the tiny model's tokenizer: "<|end|>" ends
// an assistant turn and only follows assistant turns, so a one-turn prompt holds no <|end|>.
const char* kTinyTemplate =
    "{% for m in messages %}{{ m.role }} {{ m.content }} {% if m.role == 'assistant' %}<|end|> "
    "{% endif %}{% endfor %}{% if add_generation_prompt %}assistant {% endif %}";

// Makes the tiny tokenizer's id `id` the special token `content`.
void make_special(const fs::path& tokenizer_json, uint32_t id, const std::string& content) {
  json tok = json::parse(read_file(tokenizer_json));
  json& vocab = tok["model"]["vocab"];
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (it.value() == id) {
      vocab.erase(it);
      break;
    }
  }
  vocab[content] = id;
  tok["added_tokens"].push_back(
      {{"id", id}, {"content", content}, {"special", true}, {"normalized", false}});
  write_file(tokenizer_json, tok.dump());
}

TEST_F(CliText, ChatWithoutTemplateNamesTheTokenizer) {
  Result r = generate(m() + " --chat --prompt 'the cat' --max-new 4");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("no chat template"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find((model_ / "tokenizer.json").string()), std::string::npos) << r.err;
  Result sys = generate(m() + " --system 'be brief' --prompt 'the cat' --max-new 4");
  EXPECT_EQ(sys.rc, 1);
  EXPECT_NE(sys.err.find("no chat template"), std::string::npos) << sys.err;
}

TEST_F(CliText, ChatStopsAtTheTemplatesTurnEnd) {
  write_file(model_ / "tokenizer_config.json", json{{"chat_template", kTinyTemplate}}.dump());
  const std::string args = m() + " --chat --prompt 'the cat sat on' --max-new 40 --json -q";
  Result free = generate(args + " --ignore-eos");
  ASSERT_EQ(free.rc, 0) << free.err;
  auto ids = json::parse(free.out)["ids"].get<std::vector<uint32_t>>();
  // A generated id from the fourth on that neither the prompt nor the answer before it uses, and
  // not the model's eos (2), becomes <|end|>: the answer must stop there.
  wick::Tokenizer tok = wick::Tokenizer::from_file(model_.string());
  std::vector<uint32_t> prompt = tok.encode("user the cat sat on assistant ", false);
  auto used = [&](size_t k) {
    return ids[k] == 2 || std::find(prompt.begin(), prompt.end(), ids[k]) != prompt.end() ||
           std::find(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k), ids[k]) !=
               ids.begin() + static_cast<ptrdiff_t>(k);
  };
  size_t k = 3;
  while (k < ids.size() && used(k)) ++k;
  ASSERT_LT(k, 16u) << "no new id among the first 16 generated";
  ASSERT_EQ(std::find(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k), 2u),
            ids.begin() + static_cast<ptrdiff_t>(k))
      << "the tiny model says eos first";
  make_special(model_ / "tokenizer.json", ids[k], "<|end|>");
  Result stopped = generate(args);
  ASSERT_EQ(stopped.rc, 0) << stopped.err;
  json j = json::parse(stopped.out);
  EXPECT_EQ(j["ids"].get<std::vector<uint32_t>>(),
            std::vector<uint32_t>(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k) + 1));
  EXPECT_EQ(j["finish_reason"], "stop");
  std::string text = j["text"];
  EXPECT_EQ(json::parse(free.out)["text"].get<std::string>().rfind(text, 0), 0u) << text;

  // -i: each answer ends at <|end|> too, and the next turn follows it.
  Result chat = generate(m() + " -i -q --max-new 20", "the cat sat on\nthe dog\n");
  ASSERT_EQ(chat.rc, 0) << chat.err;
  EXPECT_EQ(chat.out.rfind(text + "\n", 0), 0u) << chat.out;
  EXPECT_EQ(std::count(chat.out.begin(), chat.out.end(), '\n'), 2) << chat.out;

  // --stop strings cut a chat answer too.
  if (text.size() > 3) {
    std::string stop = text.substr(text.size() / 2, 2);
    Result cut = generate(args + " --stop " + q(stop));
    ASSERT_EQ(cut.rc, 0) << cut.err;
    EXPECT_EQ(json::parse(cut.out)["text"], text.substr(0, text.find(stop)));
    EXPECT_EQ(json::parse(cut.out)["finish_reason"], "stop");
  }
}

// ---- wick-embed ----

TEST_F(Cli, EmbedRefusesWrongInputsBeforeLoading) {
  expect_usage(embed(q(std::string(WICK_TEST_DATA_DIR) + "/formats/py_quant.gguf")),
               "is a file (GGUF): wick-embed takes a sentence-transformers model folder");
  expect_usage(embed("/nonexistent/folder"), "no such directory");
  expect_usage(embed(q(llama_dir()) + " " + q(dir_.string())), "is a directory, not a file");
  expect_usage(embed(q(llama_dir()) + " --format xml"), "--format");
  expect_usage(embed(q(llama_dir()) + " --batch 0"), "--batch");
  expect_usage(embed(q(llama_dir()) + " --max-seq-length -5"), "--max-seq-length");
  expect_usage(embed(q(llama_dir()) + " --device cudax"), "got 'cudax'");
  Result v = embed("--version");
  EXPECT_EQ(v.rc, 0);
  EXPECT_EQ(v.out, std::string("wick-embed ") + WICK_TOOLS_VERSION + "\n");
}

class CliMiniLm : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    if (IsSkipped()) return;
    model_ = wick::testing::bert::minilm_dir();
    if (model_.empty()) GTEST_SKIP() << "set WICK_MINILM_DIR to the all-MiniLM-L6-v2 folder";
    auto all = wick::testing::bert::sentences();
    auto ref = wick::testing::bert::reference_embeddings(model_);
    for (size_t i = 0; i < 5; ++i) {
      texts_.push_back(all[i]);
      ref_.push_back(ref[i]);
      input_ += all[i] + "\n";
    }
  }
  void expect_rows(const std::vector<std::vector<float>>& rows, bool normalized = true) {
    ASSERT_EQ(rows.size(), ref_.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      double norm = 0;
      for (float v : rows[i]) norm += double(v) * v;
      norm = std::sqrt(norm);
      if (normalized) {
        EXPECT_NEAR(norm, 1.0, 1e-5);
      }
      EXPECT_GT(wick::testing::bert::cosine(rows[i], ref_[i]), 1 - 1e-6) << i;
    }
  }
  fs::path model_;
  std::vector<std::string> texts_;
  std::vector<std::vector<float>> ref_;
  std::string input_;
};

TEST_F(CliMiniLm, JsonLinesCarryTextAndEmbedding) {
  Result r = embed(q(model_.string()) + " --format jsonl", input_);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");  // one batch: no progress line
  std::istringstream lines(r.out);
  std::string line;
  std::vector<std::vector<float>> rows;
  size_t i = 0;
  while (std::getline(lines, line)) {
    json j = json::parse(line);
    EXPECT_EQ(j["text"], texts_.at(i++));
    rows.push_back(j["embedding"].get<std::vector<float>>());
  }
  expect_rows(rows);
  // The default JSON: one array of arrays.
  Result a = embed(q(model_.string()), input_);
  ASSERT_EQ(a.rc, 0);
  expect_rows(json::parse(a.out).get<std::vector<std::vector<float>>>());
}

TEST_F(CliMiniLm, NpyToAPipeAndToAFile) {
  Result r = sh(q(WICK_EMBED_EXE) + " " + q(model_.string()) +
                    " --format npy < in.txt 2> err.txt | cat > out.npy",
                input_);
  ASSERT_EQ(r.rc, 0) << r.err;
  expect_rows(wick::npy::load((dir_ / "out.npy").string(), wick::Device::cpu()).to_vec2<float>());
  Result f = embed(q(model_.string()) + " --format npy -o file.npy", input_);
  ASSERT_EQ(f.rc, 0) << f.err;
  EXPECT_EQ(f.out, "");
  EXPECT_EQ(read_file(dir_ / "file.npy"), read_file(dir_ / "out.npy"));
  // A reader that leaves: exit 1, and nothing left in the temporary folder by this process.
  std::string many;
  for (int i = 0; i < 40; ++i) many += input_;
  Result p = sh("set -o pipefail; TMPDIR=" + q(dir_.string()) + " " + q(WICK_EMBED_EXE) + " " +
                    q(model_.string()) +
                    " --format npy -q < in.txt 2> err.txt | head -c 10 > /dev/null; echo "
                    "\"${PIPESTATUS[0]}\" > out.txt",
                many);
  EXPECT_EQ(p.out, "1\n") << p.err;
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find("wick-embed"), std::string::npos);
  }
  Result full = sh(q(WICK_EMBED_EXE) + " " + q(model_.string()) +
                       " --format jsonl < in.txt > /dev/full 2> err.txt",
                   input_);
  EXPECT_EQ(full.rc, 1);
  EXPECT_NE(full.err.find("No space left on device"), std::string::npos);
}

TEST_F(CliMiniLm, NoNormalizeMaxSeqLengthAndProgress) {
  Result r = embed(q(model_.string()) + " --format jsonl --no-normalize", input_);
  ASSERT_EQ(r.rc, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  std::vector<std::vector<float>> rows;
  while (std::getline(lines, line)) rows.push_back(json::parse(line)["embedding"]);
  expect_rows(rows, false);  // the same directions
  double norm = 0;
  for (float v : rows[0]) norm += double(v) * v;
  EXPECT_GT(std::abs(std::sqrt(norm) - 1.0), 0.1);
  // --max-seq-length 4 truncates: a different embedding from the full sentence's.
  Result t = embed(q(model_.string()) + " --format jsonl --max-seq-length 4", input_);
  ASSERT_EQ(t.rc, 0) << t.err;
  std::string first;
  std::istringstream tl(t.out);
  std::getline(tl, first);
  auto truncated = json::parse(first)["embedding"].get<std::vector<float>>();
  EXPECT_LT(wick::testing::bert::cosine(truncated, ref_[0]), 0.99);
  expect_usage(embed(q(model_.string()) + " --max-seq-length 4096", input_),
               "--max-seq-length 4096: the model takes at most 512 tokens");
  // More texts than a batch: a progress line on stderr.
  Result p = embed(q(model_.string()) + " --batch 2 --format jsonl", input_);
  ASSERT_EQ(p.rc, 0);
  EXPECT_NE(p.err.find("wick-embed: 5 texts"), std::string::npos) << p.err;
  Result pq = embed(q(model_.string()) + " --batch 2 --format jsonl -q", input_);
  EXPECT_EQ(pq.err, "");
  EXPECT_EQ(pq.out, p.out);
}

// ---- wick-info ----

TEST_F(Cli, InfoListsAFolderAndItsTensors) {
  Result r = info(q(llama_dir()));
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_NE(r.out.find("format: folder"), std::string::npos);
  EXPECT_NE(r.out.find("architecture: llama"), std::string::npos);
  EXPECT_NE(r.out.find("  num_hidden_layers: 2\n"), std::string::npos);
  auto file = wick::safetensors::File::open(llama_dir() + "/model.safetensors");
  size_t params = 0;
  for (const std::string& name : file.names()) {
    const auto& t = file.info(name);
    std::string shape;
    size_t n = 1;
    for (size_t d : t.shape.dims()) {
      if (!shape.empty()) shape += ",";
      shape += std::to_string(d);
      n *= d;
    }
    params += n;
    EXPECT_NE(
        r.out.find("  " + name + "  F32  [" + shape + "]  " + std::to_string(n * 4) + " bytes\n"),
        std::string::npos)
        << name;
  }
  EXPECT_NE(r.out.find("parameters: " + std::to_string(params) + " "), std::string::npos);
  Result j = info(q(llama_dir()) + " --json --no-tensors");
  ASSERT_EQ(j.rc, 0);
  json parsed = json::parse(j.out);
  EXPECT_EQ(parsed["parameters"], params);
  EXPECT_EQ(parsed["tensor_count"], file.names().size());
  EXPECT_FALSE(parsed.contains("tensors"));
  // The kernels and threads this machine would run the model with.
  EXPECT_EQ(parsed["cpu"]["isa"], wick::cpu_isa());
  EXPECT_EQ(parsed["cpu"]["quantized_gemm"], wick::cpu_qmatmul_isa());
  Result three = info(q(llama_dir()) + " --json --no-tensors --threads 3");
  ASSERT_EQ(three.rc, 0) << three.err;
  EXPECT_EQ(json::parse(three.out)["cpu"]["threads"], 3);
  EXPECT_NE(info(q(llama_dir()) + " --no-tensors --threads 3").out.find("; threads 3\n"),
            std::string::npos);
}

TEST_F(Cli, InfoListsGgufTypesAndMetadata) {
  const std::string path = std::string(WICK_TEST_DATA_DIR) + "/formats/py_quant.gguf";
  Result r = info(q(path) + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["format"], "gguf");
  auto file = wick::gguf::File::open(path);
  ASSERT_EQ(j["tensors"].size(), file.tensor_names().size());
  for (const auto& t : j["tensors"]) {
    const auto& ti = file.info(t["name"]);
    EXPECT_EQ(t["type"], wick::ggml_type_name(ti.type));
    EXPECT_EQ(t["bytes"], ti.byte_size);
  }
  Result text = info(q(path));
  EXPECT_NE(text.out.find("  q.Q4_K  q4_k  [2,512]  576 bytes\n"), std::string::npos) << text.out;
}

TEST_F(Cli, InfoErrors) {
  expect_usage(info("/nonexistent.gguf"), "no such file or directory");
  write_file(dir_ / "notes.txt", "x");
  expect_usage(info(q((dir_ / "notes.txt").string())), "not a .gguf, .safetensors");
  write_file(dir_ / "broken.gguf", "GGUF garbage");
  Result broken = info(q((dir_ / "broken.gguf").string()));
  EXPECT_EQ(broken.rc, 1);
  EXPECT_EQ(broken.out, "");
  EXPECT_NE(broken.err.find("broken.gguf"), std::string::npos) << broken.err;
}

// ---- the real SmolLM2 (WICK_SMOLLM2_GGUF) ----

class CliSmolLm : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    if (IsSkipped()) return;
    const char* p = std::getenv("WICK_SMOLLM2_GGUF");
    if (p == nullptr) GTEST_SKIP() << "set WICK_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf";
    path_ = p;
  }
  std::string path_;
};

TEST_F(CliSmolLm, ReadmeChatPrintsTheAnswerAlone) {
  const std::string args =
      q(path_) + " --chat --prompt 'What is the capital of France?' --max-new 64";
  Result r = generate(args);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "The capital of France is Paris.\n");
  EXPECT_NE(r.err.find("decode: "), std::string::npos);
  Result bf16 = generate(args + " --dtype bf16 -q");
  EXPECT_EQ(bf16.rc, 0) << bf16.err;
  EXPECT_EQ(bf16.out, r.out);
  EXPECT_EQ(bf16.err, "");
}

TEST_F(CliSmolLm, InteractiveAnswersEachLine) {
  Result r = generate(q(path_) + " -i -q --max-new 32",
                      "What is the capital of France?\n\nAnd of Germany?\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // The first turn answers as the one-shot chat does; the second sees the first.
  Result once = generate(q(path_) + " --chat -q --prompt 'What is the capital of France?'");
  ASSERT_EQ(once.rc, 0);
  ASSERT_EQ(r.out.rfind(once.out, 0), 0u) << r.out;
  std::string second = r.out.substr(once.out.size());
  EXPECT_NE(second.find("Berlin"), std::string::npos) << second;
  EXPECT_EQ(std::count(second.begin(), second.end(), '\n'), 1);
}

TEST_F(CliSmolLm, SystemAndStop) {
  Result r = generate(q(path_) +
                      " --system 'You are a pirate.' --prompt 'Say hello.' --max-new 40 -q "
                      "--json");
  ASSERT_EQ(r.rc, 0) << r.err;
  std::string text = json::parse(r.out)["text"];
  Result plain = generate(q(path_) + " --chat --prompt 'Say hello.' --max-new 40 --json -q");
  EXPECT_NE(json::parse(plain.out)["text"], text);  // the system turn changes the answer
  ASSERT_GT(text.size(), 4u);
  std::string stop = text.substr(2, 2);
  Result s = generate(q(path_) +
                      " --system 'You are a pirate.' --prompt 'Say hello.' --max-new 40 "
                      "-q --stop " +
                      q(stop));
  std::string expected = text.substr(0, text.find(stop));
  EXPECT_EQ(s.out, expected.empty() || expected.back() != '\n' ? expected + "\n" : expected);
}

}  // namespace
