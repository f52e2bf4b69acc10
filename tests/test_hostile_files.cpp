// Hostile model folders, files and options (issue 48): every case runs its load in a forked child
// under an address-space limit and a timeout (tests/hostile_child.h) and must end in a typed
// wick::Error naming the file, not in a crash, a hang, an unbounded allocation or a silent load.
// Each family starts with a well-formed file that loads, so that each failure is the mutation's.
//
// Files are written here at test time. No wick call runs in this process itself (only in the
// children), so that fork() never copies a process whose thread pool is running.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#ifndef WICK_FORMAT_DATA_DIR
#define WICK_FORMAT_DATA_DIR WICK_TEST_DATA_DIR "/formats"
#endif

#include "bert_test_util.h"
#include "format_test_util.h"
#include "hostile_child.h"
#include "wick/formats.h"
#include "wick/models.h"
#include "wick/wick.h"

namespace wick {
namespace {

namespace fs = std::filesystem;
using testing::ChildLimits;
using testing::completes_bounded;
using testing::TempDir;
using testing::throws_bounded;

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  testing::write_file(path.string(), bytes);
}

// `levels` nested arrays: 2 bytes per level.
std::string deep_json(size_t levels) {
  return std::string(levels, '[') + std::string(levels, ']');
}

// A failure inside a child: thrown, reported by completes_bounded.
void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("check failed: " + what);
}

// ---- the bounded JSON path ----

constexpr size_t kDeep = 100000;  // the probe's 200 KB file

TEST(HostileJson, DeepConfigJsonIsAFormatErrorNamingTheFile) {
  TempDir dir;
  auto config = dir.path() / "config.json";
  write_text(config, "{\"hidden_size\": 8, \"x\": " + deep_json(kDeep) + "}");
  EXPECT_TRUE(
      throws_bounded<FormatError>([&] { models::BertConfig::from_file(config); },
                                  {config.string(), "nested deeper than the limit of 128"}));
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::LlamaConfig::from_file(config.string()); },
                                          {config.string(), "nested deeper"}));
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::Bert::load(dir.path(), Device::cpu()); },
                                          {config.string(), "nested deeper"}));
}

TEST(HostileJson, DeepValuesNamedInMessagesAreNotDumped) {
  // 100 levels is under the limit: parsed, then refused by type with a short message.
  TempDir dir;
  auto config = dir.path() / "config.json";
  write_text(config, "{\"vocab_size\": " + deep_json(100) + "}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::BertConfig::from_file(config); },
                                          {config.string(), "\"vocab_size\"", "an array"},
                                          ChildLimits{}, 300));
  std::string long_name(100000, 'x');
  write_text(config, "{\"model_type\": \"" + long_name + "\"}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::LlamaConfig::from_file(config.string()); },
                                          {config.string(), "model_type", "100000 bytes"},
                                          ChildLimits{}, 400));
}

TEST(HostileJson, DeepTokenizerFilesAreTokenizerErrorsNamingTheFile) {
  TempDir dir;
  auto tok = dir.path() / "tokenizer.json";
  write_text(tok,
             "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"[UNK]\": 0}}, \"normalizer\": " +
                 deep_json(kDeep) + "}");
  EXPECT_TRUE(throws_bounded<TokenizerError>([&] { Tokenizer::from_file(tok.string()); },
                                             {tok.string(), "nested deeper"}));
  write_text(tok, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"[UNK]\": 0}}}");
  EXPECT_TRUE(completes_bounded([&] { Tokenizer::from_file(tok.string()); }));
  write_text(dir.path() / "tokenizer_config.json", "{\"chat_template\": " + deep_json(kDeep) + "}");
  EXPECT_TRUE(throws_bounded<TokenizerError>([&] { Tokenizer::from_file(tok.string()); },
                                             {"tokenizer_config.json", "nested deeper"}));
}

TEST(HostileJson, DeepSentenceTransformerFilesAreFormatErrors) {
  TempDir dir;
  write_text(dir.path() / "modules.json", deep_json(kDeep));
  EXPECT_TRUE(
      throws_bounded<FormatError>([&] { SentenceEmbedder::load(dir.path(), Device::cpu()); },
                                  {(dir.path() / "modules.json").string(), "nested deeper"}));
}

TEST(HostileJson, DeepSafetensorsHeaderAndIndexAreFormatErrors) {
  TempDir dir;
  std::string header = "{\"__metadata__\": " + deep_json(kDeep) + "}";
  std::vector<uint8_t> bytes;
  testing::append_le(bytes, header.size(), 8);
  testing::append_str(bytes, header);
  auto file = dir.path() / "model.safetensors";
  write_bytes(file, bytes);
  EXPECT_TRUE(throws_bounded<FormatError>([&] { safetensors::File::open(file.string()); },
                                          {file.string(), "nested deeper"}));
  auto index = dir.path() / "model.safetensors.index.json";
  write_text(index, "{\"metadata\": " + deep_json(kDeep) + ", \"weight_map\": {}}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { safetensors::ShardedFile::open(index.string()); },
                                          {index.string(), "nested deeper"}));
}

TEST(HostileJson, OversizedConfigIsRefusedBeforeParsing) {
  TempDir dir;
  auto config = dir.path() / "config.json";
  write_text(config, "{\"pad\": \"" + std::string(17 << 20, ' ') + "\"}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::LlamaConfig::from_file(config.string()); },
                                          {config.string(), "over the limit"}));
}

// ---- Llama config.json ----

std::string llama_config(const std::string& extra) {
  return "{\"vocab_size\": 32, \"hidden_size\": 576, \"intermediate_size\": 64, "
         "\"num_hidden_layers\": 1, \"num_attention_heads\": 9, \"num_key_value_heads\": 3" +
         extra + "}";
}

TEST(HostileLlamaConfig, MistypedFieldsAreFormatErrorsNamingFileAndKey) {
  TempDir dir;
  auto config = dir.path() / "config.json";
  auto expect = [&](const std::string& extra, const std::vector<std::string>& needles) {
    write_text(config, llama_config(extra));
    std::vector<std::string> all = needles;
    all.push_back(config.string());
    EXPECT_TRUE(
        throws_bounded<FormatError>([&] { models::LlamaConfig::from_file(config.string()); }, all))
        << extra;
  };
  write_text(config, llama_config(""));
  EXPECT_TRUE(completes_bounded([&] {
    auto c = models::LlamaConfig::from_file(config.string());
    check(c.head_dim == 64, "head_dim 576 / 9");
  }));
  expect(", \"model_type\": 5", {"\"model_type\"", "a string", "5"});
  expect(", \"tie_word_embeddings\": \"yes\"", {"\"tie_word_embeddings\"", "\"yes\""});
  expect(", \"rope_scaling\": {\"rope_type\": 3}", {"\"rope_type\"", "a string"});
  expect(", \"rope_scaling\": {\"type\": [1, 2]}", {"\"type\"", "an array"});
  expect(", \"attention_bias\": 1", {"\"attention_bias\"", "true or false"});
  expect(", \"use_sliding_window\": \"no\"", {"\"use_sliding_window\""});
  expect(", \"rms_norm_eps\": \"small\"", {"\"rms_norm_eps\"", "a number"});
}

TEST(HostileLlamaConfig, InconsistentValuesAreFormatErrors) {
  TempDir dir;
  auto config = dir.path() / "config.json";
  auto expect = [&](const std::string& text, const std::vector<std::string>& needles) {
    write_text(config, text);
    std::vector<std::string> all = needles;
    all.push_back(config.string());
    EXPECT_TRUE(
        throws_bounded<FormatError>([&] { models::LlamaConfig::from_file(config.string()); }, all))
        << text;
  };
  // 7 heads do not split 576 (head_dim would be 82.3): refused unless head_dim is explicit.
  std::string seven =
      "{\"vocab_size\": 32, \"hidden_size\": 576, \"intermediate_size\": 64, "
      "\"num_hidden_layers\": 1, \"num_attention_heads\": 7";
  expect(seven + "}", {"hidden_size 576", "num_attention_heads 7"});
  write_text(config, seven + ", \"head_dim\": 64}");
  EXPECT_TRUE(completes_bounded([&] {
    auto c = models::LlamaConfig::from_file(config.string());
    check(c.head_dim == 64 && c.num_attention_heads == 7, "explicit head_dim kept");
  }));
  expect(llama_config(", \"eos_token_id\": -1"), {"\"eos_token_id\"", "-1"});
  expect(llama_config(", \"eos_token_id\": [2, 4294967298]"), {"\"eos_token_id\""});
  expect(llama_config(", \"eos_token_id\": 32"), {"eos_token_id 32", "outside the vocabulary"});
  expect(llama_config(", \"bos_token_id\": 99"), {"bos_token_id 99"});
  expect(llama_config(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 0}"),
         {"rope factor"});
  expect(llama_config(", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
                      "\"low_freq_factor\": 4, \"high_freq_factor\": 4}"),
         {"high_freq_factor"});
  expect(llama_config(", \"rope_theta\": 0"), {"rope_theta"});
  expect(llama_config(", \"rms_norm_eps\": -1e-6"), {"rms_norm_eps"});
  expect(llama_config(", \"rms_norm_eps\": 1e999"), {"1e999"});  // out of double's range
  expect(llama_config(", \"max_position_embeddings\": 0"), {"max positions 0"});
  expect(llama_config(", \"num_attention_heads\": 0"), {"heads 0"});
  expect(llama_config(", \"hidden_size\": 4611686018427387904, \"head_dim\": 64"), {"overflow"});
}

// ---- GGUF Llama files ----

struct GgufSpec {
  std::map<std::string, gguf::Value> metadata;
  std::map<std::string, Shape> shapes;
};

// A tiny F32 Llama GGUF: hidden 8, 2 heads of 4, ffn 16, vocab 16, one layer, tied head.
GgufSpec tiny_gguf() {
  using gguf::Value;
  using gguf::ValueType;
  GgufSpec s;
  s.metadata = {
      {"general.architecture", Value::string("llama")},
      {"llama.embedding_length", Value::u64(8, ValueType::U32)},
      {"llama.feed_forward_length", Value::u64(16, ValueType::U32)},
      {"llama.block_count", Value::u64(1, ValueType::U32)},
      {"llama.attention.head_count", Value::u64(2, ValueType::U32)},
      {"llama.attention.head_count_kv", Value::u64(2, ValueType::U32)},
      {"llama.attention.layer_norm_rms_epsilon", Value::f64(1e-5, ValueType::F32)},
      {"llama.context_length", Value::u64(32, ValueType::U32)},
      {"llama.rope.freq_base", Value::f64(10000, ValueType::F32)},
      {"tokenizer.ggml.eos_token_id", Value::u64(2, ValueType::U32)},
  };
  s.shapes = {
      {"token_embd.weight", Shape({16, 8})},     {"output_norm.weight", Shape({8})},
      {"blk.0.attn_norm.weight", Shape({8})},    {"blk.0.ffn_norm.weight", Shape({8})},
      {"blk.0.attn_q.weight", Shape({8, 8})},    {"blk.0.attn_k.weight", Shape({8, 8})},
      {"blk.0.attn_v.weight", Shape({8, 8})},    {"blk.0.attn_output.weight", Shape({8, 8})},
      {"blk.0.ffn_gate.weight", Shape({16, 8})}, {"blk.0.ffn_up.weight", Shape({16, 8})},
      {"blk.0.ffn_down.weight", Shape({8, 16})},
  };
  return s;
}

// Writes the spec (in the child: it makes tensors).
void save_gguf(const GgufSpec& s, const std::string& path) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, shape] : s.shapes) {
    tensors[name] = Tensor::randn(0.f, 0.1f, shape, Device::cpu());
  }
  gguf::save(tensors, path, s.metadata);
}

TEST(HostileGguf, BadLlamaMetadataIsAFormatErrorOnBothLoadPaths) {
  TempDir dir;
  std::string path = dir.file("m.gguf");
  EXPECT_TRUE(completes_bounded([&] {
    save_gguf(tiny_gguf(), path);
    for (bool keep : {false, true}) {
      auto m = models::Llama::load(path, Device::cpu(), DType::F32, keep);
      check(m.config().vocab_size == 16 && m.config().head_dim == 4, "tiny config");
    }
  }));
  using gguf::Value;
  using gguf::ValueType;
  auto expect = [&](const std::function<void(GgufSpec&)>& mutate,
                    const std::vector<std::string>& needles) {
    for (bool keep : {false, true}) {
      std::vector<std::string> all = needles;
      all.push_back(path);
      EXPECT_TRUE(throws_bounded<FormatError>(
          [&] {
            GgufSpec s = tiny_gguf();
            mutate(s);
            save_gguf(s, path);
            models::Llama::load(path, Device::cpu(), DType::F32, keep);
          },
          all))
          << needles[0] << (keep ? " (kept quantized)" : "");
    }
  };
  // head_count 0 without rope.dimension_count divided hidden by 0 before validation.
  expect([](GgufSpec& s) { s.metadata["llama.attention.head_count"] = Value::u64(0); },
         {"heads 0"});
  expect([](GgufSpec& s) { s.metadata["llama.attention.head_count"] = Value::u64(3); },
         {"not a multiple of llama.attention.head_count 3"});
  expect([](GgufSpec& s) { s.metadata["llama.embedding_length"] = Value::u64(16); },
         {"token_embd.weight", "[16, 8]", "[16, 16]"});
  expect([](GgufSpec& s) { s.metadata["llama.vocab_size"] = Value::u64(20); },
         {"token_embd.weight", "[20, 8]"});
  expect([](GgufSpec& s) { s.metadata["llama.feed_forward_length"] = Value::u64(12); },
         {"blk.0.ffn_gate.weight"});
  expect(
      [](GgufSpec& s) {
        s.shapes["blk.0.attn_k.weight"] = Shape({4, 8});
      },
      {"blk.0.attn_k.weight", "[4, 8]"});
  expect([](GgufSpec& s) { s.shapes.erase("blk.0.ffn_down.weight"); }, {"blk.0.ffn_down.weight"});
  expect([](GgufSpec& s) { s.metadata["llama.rope.freq_base"] = Value::f64(0, ValueType::F32); },
         {"rope_theta 0"});
  expect(
      [](GgufSpec& s) {
        s.metadata["llama.attention.layer_norm_rms_epsilon"] = Value::f64(NAN, ValueType::F32);
      },
      {"rms_norm_eps"});
  expect(
      [](GgufSpec& s) { s.metadata["tokenizer.ggml.eos_token_id"] = Value::u64((1ull << 32) + 2); },
      {"tokenizer.ggml.eos_token_id", "4294967298", "32-bit"});
  expect([](GgufSpec& s) { s.metadata["tokenizer.ggml.eos_token_id"] = Value::u64(16); },
         {"eos_token_id 16", "outside the vocabulary"});
  expect([](GgufSpec& s) { s.metadata.erase("llama.block_count"); }, {"llama.block_count"});
  expect([](GgufSpec& s) { s.metadata["llama.block_count"] = Value::string("one"); },
         {"llama.block_count", "not an integer"});
}

TEST(HostileGguf, TokenizerIdsAreCheckedNamingTheFile) {
  using gguf::Value;
  using gguf::ValueType;
  TempDir dir;
  std::string path = dir.file("tok.gguf");
  auto vocab = [](uint64_t eos) {
    return std::map<std::string, Value>{
        {"tokenizer.ggml.model", Value::string("gpt2")},
        {"tokenizer.ggml.tokens",
         Value::array(ValueType::String, {Value::string("a"), Value::string("b")})},
        {"tokenizer.ggml.eos_token_id", Value::u64(eos)},
    };
  };
  EXPECT_TRUE(completes_bounded([&] {
    gguf::save({}, path, vocab(1));
    check(models::load_gguf_tokenizer(path).encode("ab", false).size() == 2, "two tokens");
  }));
  EXPECT_TRUE(throws_bounded<FormatError>(
      [&] {
        gguf::save({}, path, vocab((1ull << 32) + 1));
        models::load_gguf_tokenizer(path);
      },
      {path, "tokenizer.ggml.eos_token_id", "32-bit"}));
  EXPECT_TRUE(throws_bounded<TokenizerError>(
      [&] {
        gguf::save({}, path, vocab(2));
        models::load_gguf_tokenizer(path);
      },
      {path, "eos id 2", "2-token vocabulary"}));
}

TEST(HostileGguf, MetadataArraysAreStoredCompactly) {
  // 32 MB of u8 array elements and 4 Mi empty strings (32 MB): 45 bytes of memory per byte of
  // file would need over 1 GB; the child has 512 MB beyond what it maps at the start.
  TempDir dir;
  std::string path = dir.file("arrays.gguf");
  const size_t n = size_t{32} << 20, strings = size_t{4} << 20;
  std::vector<uint8_t> b;
  testing::append_le(b, 0x46554747u, 4);
  testing::append_le(b, 3, 4);
  testing::append_le(b, 0, 8);  // tensors
  testing::append_le(b, 2, 8);  // metadata
  auto key = [&](const std::string& k) {
    testing::append_le(b, k.size(), 8);
    testing::append_str(b, k);
  };
  key("t.bytes");
  testing::append_le(b, 9, 4);  // array
  testing::append_le(b, 0, 4);  // of u8
  testing::append_le(b, n, 8);
  for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i * 7));
  key("t.strings");
  testing::append_le(b, 9, 4);
  testing::append_le(b, 8, 4);  // of strings
  testing::append_le(b, strings, 8);
  b.resize(b.size() + strings * 8, 0);
  write_bytes(path, b);
  ChildLimits limits;
  limits.extra_address_space = size_t{512} << 20;
  EXPECT_TRUE(completes_bounded(
      [&] {
        auto f = gguf::File::open(path);
        const auto& bytes = f.value("t.bytes");
        check(bytes.array_size() == n, "u8 array size");
        for (size_t i : {size_t{0}, size_t{1}, n / 3, n - 1}) {
          check(bytes.at(i).as_uint() == static_cast<uint8_t>(i * 7), "u8 element");
        }
        const auto& s = f.value("t.strings");
        check(s.array_size() == strings && s.at(strings - 1).as_string().empty(), "strings");
      },
      limits));
}

// ---- safetensors ----

std::vector<uint8_t> safetensors_bytes(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> b;
  testing::append_le(b, header.size(), 8);
  testing::append_str(b, header);
  b.resize(b.size() + data_bytes, 0);
  return b;
}

TEST(HostileSafetensors, HugeRankIsAFormatError) {
  TempDir dir;
  auto file = dir.path() / "rank.safetensors";
  std::string shape = "1";
  for (int i = 1; i < 30000; ++i) shape += ",1";
  write_bytes(file, safetensors_bytes("{\"t\": {\"dtype\": \"F32\", \"shape\": [" + shape +
                                          "], \"data_offsets\": [0, 4]}}",
                                      4));
  EXPECT_TRUE(throws_bounded<FormatError>([&] { safetensors::File::open(file.string()); },
                                          {file.string(), "tensor 't'", "30000 dims"}));
  std::string ok = "1";
  for (int i = 1; i < 64; ++i) ok += ",1";
  write_bytes(file, safetensors_bytes("{\"t\": {\"dtype\": \"F32\", \"shape\": [" + ok +
                                          "], \"data_offsets\": [0, 4]}}",
                                      4));
  EXPECT_TRUE(completes_bounded([&] {
    check(safetensors::File::open(file.string()).info("t").shape.rank() == 64, "rank 64 loads");
  }));
}

TEST(HostileSafetensors, ImpossibleShapeIsAFormatErrorNamingTheTensor) {
  // No elements, but strides that overflow: was a ShapeMismatch naming no file.
  TempDir dir;
  auto file = dir.path() / "shape.safetensors";
  write_bytes(file, safetensors_bytes("{\"t\": {\"dtype\": \"F32\", \"shape\": [0, "
                                      "9223372036854775808, 4], \"data_offsets\": [0, 0]}}",
                                      0));
  EXPECT_TRUE(throws_bounded<FormatError>([&] { safetensors::File::open(file.string()); },
                                          {file.string(), "tensor 't'", "overflows"}));
  auto npy = dir.path() / "shape.npy";
  std::string header =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 9223372036854775808, 4), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> b{0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  testing::append_le(b, header.size(), 2);
  testing::append_str(b, header);
  write_bytes(npy, b);
  EXPECT_TRUE(
      throws_bounded<FormatError>([&] { npy::load(npy.string()); }, {npy.string(), "overflows"}));
}

TEST(HostileSafetensors, HeaderParseIsLinearInTheTensorCount) {
  // 100,000 empty tensors: the quadratic parse took minutes at this size (41 s at 40,000).
  TempDir dir;
  auto file = dir.path() / "many.safetensors";
  const size_t n = 100000;
  std::string header = "{";
  for (size_t i = 0; i < n; ++i) {
    header += (i ? ",\"t" : "\"t") + std::to_string(i) +
              "\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}";
  }
  header += "}";
  write_bytes(file, safetensors_bytes(header, 0));
  ChildLimits limits;
  limits.seconds = 60;
  EXPECT_TRUE(completes_bounded(
      [&] { check(safetensors::File::open(file.string()).names().size() == n, "count"); }, limits));
}

TEST(HostileSafetensors, MissingOrEscapingShardsAreFormatErrorsNamingTheIndex) {
  TempDir dir;
  auto index = dir.path() / "model.safetensors.index.json";
  write_text(index, "{\"weight_map\": {\"a\": \"model-00001.safetensors\"}}");
  EXPECT_TRUE(
      throws_bounded<FormatError>([&] { safetensors::ShardedFile::open(index.string()); },
                                  {index.string(), "model-00001.safetensors", "No such file"}));
  write_text(index, "{\"weight_map\": {\"a\": \"../../etc/passwd\"}}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { safetensors::ShardedFile::open(index.string()); },
                                          {index.string(), "not a file beside the index"}));
  write_text(index, "{\"weight_map\": {\"a\": 5}}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { safetensors::ShardedFile::open(index.string()); },
                                          {index.string(), "'a'"}));
}

// ---- npz ----

// CRC-32 bit by bit (the loader uses a table).
uint32_t crc32_bitwise(const std::vector<uint8_t>& data) {
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t byte : data) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

std::vector<uint8_t> npy_f32(const std::vector<float>& values) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(values.size()) + ",), }";
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::vector<uint8_t> b{0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  testing::append_le(b, header.size(), 2);
  testing::append_str(b, header);
  for (float v : values) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    testing::append_le(b, u, 4);
  }
  return b;
}

struct ZipMember {
  std::string name;
  std::vector<uint8_t> data;  // stored
  uint32_t crc;
  uint64_t claimed_size;  // the directory's uncompressed size
  int local_of = -1;      // >= 0: the directory points at that member's local header
};

// A zip of stored members, written by hand so that the directory can lie.
std::vector<uint8_t> zip_bytes(const std::vector<ZipMember>& members) {
  std::vector<uint8_t> b;
  std::vector<uint64_t> offsets;
  for (const auto& m : members) {
    offsets.push_back(b.size());
    if (m.local_of >= 0) continue;
    testing::append_le(b, 0x04034b50u, 4);
    testing::append_le(b, 20, 2);
    testing::append_le(b, 0, 2);  // flags
    testing::append_le(b, 0, 2);  // stored
    testing::append_le(b, 0, 4);  // time, date
    testing::append_le(b, m.crc, 4);
    testing::append_le(b, m.data.size(), 4);
    testing::append_le(b, m.data.size(), 4);
    testing::append_le(b, m.name.size(), 2);
    testing::append_le(b, 0, 2);
    testing::append_str(b, m.name);
    b.insert(b.end(), m.data.begin(), m.data.end());
  }
  uint64_t cd = b.size();
  for (size_t i = 0; i < members.size(); ++i) {
    const auto& m = members[i];
    const auto& src = m.local_of >= 0 ? members[m.local_of] : m;
    testing::append_le(b, 0x02014b50u, 4);
    testing::append_le(b, 20, 2);
    testing::append_le(b, 20, 2);
    testing::append_le(b, 0, 2);
    testing::append_le(b, 0, 2);
    testing::append_le(b, 0, 4);
    testing::append_le(b, src.crc, 4);
    testing::append_le(b, src.data.size(), 4);
    testing::append_le(b, m.claimed_size, 4);
    testing::append_le(b, m.name.size(), 2);
    testing::append_le(b, 0, 2);  // extra
    testing::append_le(b, 0, 2);  // comment
    testing::append_le(b, 0, 2);  // disk
    testing::append_le(b, 0, 2);
    testing::append_le(b, 0, 4);
    testing::append_le(b, offsets[m.local_of >= 0 ? m.local_of : i], 4);
    testing::append_str(b, m.name);
  }
  uint64_t cd_size = b.size() - cd;
  testing::append_le(b, 0x06054b50u, 4);
  testing::append_le(b, 0, 4);
  testing::append_le(b, members.size(), 2);
  testing::append_le(b, members.size(), 2);
  testing::append_le(b, cd_size, 4);
  testing::append_le(b, cd, 4);
  testing::append_le(b, 0, 2);
  return b;
}

ZipMember member(const std::string& name, const std::vector<uint8_t>& data) {
  return {name, data, crc32_bitwise(data), data.size(), -1};
}

TEST(HostileNpz, WellFormedHandWrittenArchiveLoads) {
  TempDir dir;
  auto file = dir.path() / "ok.npz";
  write_bytes(file,
              zip_bytes({member("a.npy", npy_f32({1.5f, -2.f})), member("b.npy", npy_f32({3.f}))}));
  EXPECT_TRUE(completes_bounded([&] {
    auto t = npz::load(file.string());
    check(t.size() == 2 && t.at("a").to_vec1<float>() == std::vector<float>{1.5f, -2.f} &&
              t.at("b").to_vec1<float>() == std::vector<float>{3.f},
          "values");
  }));
}

TEST(HostileNpz, MembersSharingBytesAreRefused) {
  // Twenty directory entries naming one member's bytes (the probe's 5.7 GB from 205 KB).
  TempDir dir;
  auto file = dir.path() / "shared.npz";
  std::vector<ZipMember> members{member("m0.npy", npy_f32(std::vector<float>(1000, 1.f)))};
  for (int i = 1; i < 20; ++i) {
    ZipMember m = members[0];
    m.name = testing::str_of("m", i, ".npy");
    m.local_of = 0;
    members.push_back(m);
  }
  write_bytes(file, zip_bytes(members));
  EXPECT_TRUE(
      throws_bounded<FormatError>([&] { npz::load(file.string()); },
                                  {file.string(), "overlaps member", "bytes from offset 0"}));
}

TEST(HostileNpz, TotalExpansionIsBounded) {
  TempDir dir;
  auto file = dir.path() / "claims.npz";
  // Each member alone claims under 1100x the archive; the two together claim more.
  std::vector<ZipMember> members{member("a.npy", npy_f32({1.f})), member("b.npy", npy_f32({2.f}))};
  size_t archive = zip_bytes(members).size();
  members[0].claimed_size = members[1].claimed_size = archive * 600;
  write_bytes(file, zip_bytes(members));
  EXPECT_TRUE(throws_bounded<FormatError>([&] { npz::load(file.string()); },
                                          {file.string(), "in all", "'b.npy'"}));
}

TEST(HostileNpz, WrongCrcIsAFormatError) {
  TempDir dir;
  auto file = dir.path() / "crc.npz";
  ZipMember m = member("a.npy", npy_f32({1.5f, -2.f}));
  m.crc ^= 0x10;
  write_bytes(file, zip_bytes({m}));
  EXPECT_TRUE(throws_bounded<FormatError>([&] { npz::load(file.string()); },
                                          {file.string(), "'a.npy'", "CRC"}));
}

// ---- named pipes and other non-regular files ----

TEST(HostileFiles, NamedPipesAreRefusedWithoutBlocking) {
  TempDir dir;
  auto fifo = [&](const fs::path& p) {
    fs::create_directories(p.parent_path());
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0) << p;
  };
  ChildLimits limits;
  limits.seconds = 20;
  auto refused = [&](const fs::path& p, const std::function<void()>& load) {
    EXPECT_TRUE(throws_bounded<FormatError>(load, {p.string(), "not a regular file"}, limits)) << p;
  };
  for (const char* name : {"x.safetensors", "x.gguf", "x.npy", "x.npz", "config.json",
                           "model.safetensors.index.json"}) {
    fifo(dir.path() / name);
  }
  refused(dir.path() / "x.safetensors",
          [&] { safetensors::File::open((dir.path() / "x.safetensors").string()); });
  refused(dir.path() / "x.gguf", [&] { gguf::File::open((dir.path() / "x.gguf").string()); });
  refused(dir.path() / "x.gguf",
          [&] { models::Llama::load((dir.path() / "x.gguf").string(), Device::cpu()); });
  refused(dir.path() / "x.npy", [&] { npy::load((dir.path() / "x.npy").string()); });
  refused(dir.path() / "x.npz", [&] { npz::load((dir.path() / "x.npz").string()); });
  refused(dir.path() / "config.json",
          [&] { models::LlamaConfig::from_file((dir.path() / "config.json").string()); });
  refused(dir.path() / "config.json", [&] { models::Llama::load(dir.path(), Device::cpu()); });
  refused(dir.path() / "config.json", [&] { models::Bert::load(dir.path(), Device::cpu()); });
  refused(dir.path() / "model.safetensors.index.json", [&] {
    safetensors::ShardedFile::open((dir.path() / "model.safetensors.index.json").string());
  });
  fifo(dir.path() / "st" / "modules.json");
  refused(dir.path() / "st" / "modules.json",
          [&] { SentenceEmbedder::load(dir.path() / "st", Device::cpu()); });
  fifo(dir.path() / "tok" / "tokenizer.json");
  EXPECT_TRUE(throws_bounded<TokenizerError>(
      [&] { Tokenizer::from_file((dir.path() / "tok").string()); },
      {(dir.path() / "tok" / "tokenizer.json").string(), "not a regular file"}, limits));
  // A folder where a file is expected.
  fs::create_directories(dir.path() / "d.safetensors");
  refused(dir.path() / "d.safetensors",
          [&] { safetensors::File::open((dir.path() / "d.safetensors").string()); });
}

// ---- tokenizer.json ----

std::string wordpiece_json(const std::string& vocab, const std::string& extra = "") {
  return "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", "
         "\"continuing_subword_prefix\": \"##\", \"vocab\": {" +
         vocab + "}" + extra + "}}";
}

TEST(HostileTokenizer, VocabIdsAreBoundedByTheEntryCount) {
  TempDir dir;
  auto tok = dir.path() / "tokenizer.json";
  auto expect = [&](const std::string& text, const std::vector<std::string>& needles) {
    write_text(tok, text);
    std::vector<std::string> all = needles;
    all.push_back(tok.string());
    EXPECT_TRUE(throws_bounded<TokenizerError>([&] { Tokenizer::from_file(tok.string()); }, all))
        << text;
  };
  write_text(tok, wordpiece_json("\"[UNK]\": 0, \"a\": 1"));
  EXPECT_TRUE(completes_bounded([&] {
    check(Tokenizer::from_file(tok.string()).encode("a", false) == std::vector<uint32_t>{1}, "a");
  }));
  expect(wordpiece_json("\"[UNK]\": 0, \"a\": -1"), {"vocab entry \"a\"", "-1"});
  expect(wordpiece_json("\"[UNK]\": 0, \"a\": 200000000"), {"below 2", "200000000"});
  expect(wordpiece_json("\"[UNK]\": 0, \"a\": \"1\""), {"vocab entry \"a\""});
  expect("{\"added_tokens\": [{\"id\": 4000000000, \"content\": \"x\"}], " +
             wordpiece_json("\"[UNK]\": 0").substr(1),
         {"added token id", "4000000000"});
  expect("{\"padding\": {\"pad_id\": -1}, " + wordpiece_json("\"[UNK]\": 0").substr(1),
         {"padding.pad_id"});
  expect(
      "{\"post_processor\": {\"type\": \"BertProcessing\", \"cls\": [\"[CLS]\", -1], "
      "\"sep\": [\"[SEP]\", 1]}, " +
          wordpiece_json("\"[UNK]\": 0").substr(1),
      {"cls id"});
  expect("{\"normalizer\": {\"type\": " + deep_json(100) + "}, " +
             wordpiece_json("\"[UNK]\": 0").substr(1),
         {});
}

TEST(HostileTokenizer, WordPieceLimitsAreValidatedAndLongWordsStayLinear) {
  TempDir dir;
  auto tok = dir.path() / "tokenizer.json";
  write_text(tok, wordpiece_json("\"[UNK]\": 0, \"a\": 1", ", \"max_input_chars_per_word\": -1"));
  EXPECT_TRUE(throws_bounded<TokenizerError>([&] { Tokenizer::from_file(tok.string()); },
                                             {tok.string(), "max_input_chars_per_word", "-1"}));
  // A limit far above the word length: a 30,000-character word is matched greedily piece by
  // piece, each candidate no longer than the longest token.
  write_text(tok, wordpiece_json("\"[UNK]\": 0, \"a\": 1, \"##a\": 2, \"##aa\": 3",
                                 ", \"max_input_chars_per_word\": 1000000"));
  ChildLimits limits;
  limits.seconds = 20;
  EXPECT_TRUE(completes_bounded(
      [&] {
        auto t = Tokenizer::from_file(tok.string());
        auto ids = t.encode(std::string(30001, 'a'), false);
        // Greedy longest match: "a", then 15,000 "##aa".
        std::vector<uint32_t> want(15001, 3);
        want[0] = 1;
        check(ids == want, "greedy pieces of the long word");
      },
      limits));
}

// ---- BERT folders and sentence-transformers ----

void write_tiny_bert(const fs::path& dir) {
  using namespace testing::bert;
  TinyConfig c;
  write_tiny_model(dir, c, tiny_weights(c, 48));
  write_tiny_tokenizer(dir);
}

TEST(HostileBert, WrongWeightsAndConfigValuesAreFormatErrorsNamingTheTensor) {
  TempDir dir;
  auto model = dir.path() / "bert";
  EXPECT_TRUE(completes_bounded([&] {
    write_tiny_bert(model);
    models::Bert::load(model, Device::cpu());
  }));
  // A U8 LayerNorm weight failed inside layer_norm without the tensor's name.
  EXPECT_TRUE(throws_bounded<FormatError>(
      [&] {
        write_tiny_bert(model);
        auto all = safetensors::load((model / "model.safetensors").string());
        all["embeddings.LayerNorm.weight"] = Tensor::zeros({16}, DType::U8, Device::cpu());
        safetensors::save(all, (model / "model.safetensors").string());
        models::Bert::load(model, Device::cpu());
      },
      {model.string(), "embeddings.LayerNorm.weight", "u8"}));
  // An impossible shape was a ShapeMismatch naming no file.
  EXPECT_TRUE(throws_bounded<FormatError>(
      [&] {
        write_tiny_bert(model);
        auto all = safetensors::load((model / "model.safetensors").string());
        all["encoder.layer.0.intermediate.dense.bias"] =
            Tensor::zeros({7}, DType::F32, Device::cpu());
        safetensors::save(all, (model / "model.safetensors").string());
        models::Bert::load(model, Device::cpu());
      },
      {model.string(), "encoder.layer.0.intermediate.dense.bias"}));
  auto config = model / "config.json";
  write_text(config,
             "{\"vocab_size\": 40, \"hidden_size\": 16, \"num_hidden_layers\": 2, "
             "\"num_attention_heads\": 4, \"intermediate_size\": 24, "
             "\"max_position_embeddings\": 20, \"layer_norm_eps\": 0}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::BertConfig::from_file(config); },
                                          {config.string(), "layer_norm_eps"}));
  write_text(config,
             "{\"vocab_size\": 40, \"hidden_size\": 16, \"num_hidden_layers\": 2, "
             "\"num_attention_heads\": 4, \"intermediate_size\": 24, "
             "\"max_position_embeddings\": 20, \"layer_norm_eps\": 1e999}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::BertConfig::from_file(config); },
                                          {config.string(), "1e999"}));
  write_text(config,
             "{\"vocab_size\": 4611686018427387904, \"hidden_size\": 16, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 24, "
             "\"max_position_embeddings\": 20}");
  EXPECT_TRUE(throws_bounded<FormatError>([&] { models::BertConfig::from_file(config); },
                                          {config.string(), "overflow"}));
}

TEST(HostileSentenceEmbedder, UnsearchableModulesFileIsAFormatError) {
  // A symlink loop: std::filesystem::exists threw filesystem_error (the probe's unsearchable
  // folder, which root cannot reproduce with permissions).
  TempDir dir;
  fs::create_symlink(dir.path() / "modules.json", dir.path() / "modules.json");
  EXPECT_TRUE(
      throws_bounded<FormatError>([&] { SentenceEmbedder::load(dir.path(), Device::cpu()); },
                                  {(dir.path() / "modules.json").string()}));
  fs::remove(dir.path() / "modules.json");
  write_text(dir.path() / "modules.json",
             "[{\"type\": \"sentence_transformers.models.Transformer\", \"path\": \"../..\"}]");
  EXPECT_TRUE(throws_bounded<FormatError>(
      [&] { SentenceEmbedder::load(dir.path(), Device::cpu()); },
      {(dir.path() / "modules.json").string(), "leaves the model folder"}));
}

TEST(HostileLlamaFolder, UncheckableWeightsFileIsAFormatError) {
  TempDir dir;
  write_text(dir.path() / "config.json", llama_config(""));
  fs::create_symlink(dir.path() / "model.safetensors.index.json",
                     dir.path() / "model.safetensors.index.json");
  EXPECT_TRUE(
      throws_bounded<FormatError>([&] { models::Llama::load(dir.path().string(), Device::cpu()); },
                                  {(dir.path() / "model.safetensors.index.json").string()}));
}

TEST(HostileSentenceEmbedder, ZeroMaxSeqLengthIsAFormatError) {
  TempDir dir;
  auto model = dir.path() / "st";
  auto st = model / "sentence_bert_config.json";
  EXPECT_TRUE(throws_bounded<FormatError>(
      [&] {
        write_tiny_bert(model);
        write_text(st, "{\"max_seq_length\": 0}");
        SentenceEmbedder::load(model, Device::cpu());
      },
      {st.string(), "max_seq_length"}));
}

TEST(HostileSentenceEmbedder, TextsWithoutTokensAreAnErrorNotADivisionByZero) {
  TempDir dir;
  auto model = dir.path() / "st";
  EXPECT_TRUE(throws_bounded<ShapeMismatch>(
      [&] {
        write_tiny_bert(model);
        // No post-processor: an empty text has no tokens at all.
        std::ifstream in(model / "tokenizer.json");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        size_t a = text.find("\"post_processor\": {"), b = text.find("\"decoder\"");
        check(a != std::string::npos && b != std::string::npos, "tokenizer layout");
        text = text.substr(0, a) + "\"post_processor\": null, " + text.substr(b);
        write_text(model / "tokenizer.json", text);
        auto e = SentenceEmbedder::load(model, Device::cpu());
        check(e.tokenize("").empty(), "no ids");
        e.embed({"", ""});
      },
      {"SentenceEmbedder::embed", "no tokens"}));
}

}  // namespace
}  // namespace wick
