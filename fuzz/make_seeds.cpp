// Writes the seed inputs of fuzz_gguf_model and fuzz_sharded_index that wick itself can make:
//   make_seeds <out-dir>
// <out-dir>/tiny_llama.gguf (a 1-layer Llama with a 300-token byte-level vocabulary, q/k rows
// permuted as llama.cpp writes them, one matrix Q8_0-free F32/F16 mix) and <out-dir>/index.json
// (the index of fuzz_sharded_index's folder). The committed corpora started from these.

#include <cstdio>
#include <fstream>
#include <map>
#include <string>

#include "wick/gguf.h"
#include "wick/wick.h"

using wick::gguf::Value;
using wick::gguf::ValueType;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <out-dir>\n");
    return 2;
  }
  std::string out = argv[1];
  auto t = [](wick::Shape s, wick::DType dt = wick::DType::F32) {
    std::vector<float> v(s.elem_count());
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i % 7) - 0.02f;
    return wick::Tensor::from_vec(v, s, wick::Device::cpu()).to_dtype(dt);
  };
  // Byte-level tokens: the 256 bytes as GPT-2 maps them, then a few merges.
  std::vector<Value> tokens, types, merges;
  auto byte_char = [](int b) {
    std::u32string s;
    char32_t c = static_cast<char32_t>(b);
    if (b < 33 || (b > 126 && b < 161) || b == 173) {
      int n = 0;
      for (int x = 0; x < b; ++x) n += (x < 33 || (x > 126 && x < 161) || x == 173);
      c = static_cast<char32_t>(256 + n);
    }
    std::string u8;
    if (c < 0x80) {
      u8 += static_cast<char>(c);
    } else {
      u8 += static_cast<char>(0xC0 | (c >> 6));
      u8 += static_cast<char>(0x80 | (c & 0x3F));
    }
    return u8;
  };
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(Value::string(byte_char(b)));
    types.push_back(Value::i64(6, ValueType::I32));
  }
  for (const char* m : {"H e", "l l", "o ,", "He ll", "Ġ w", "Ġw o"}) {
    std::string s(m);
    size_t sp = s.find(' ');
    tokens.push_back(Value::string(s.substr(0, sp) + s.substr(sp + 1)));
    types.push_back(Value::i64(1, ValueType::I32));
    merges.push_back(Value::string(s));
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(Value::string(special));
    types.push_back(Value::i64(3, ValueType::I32));
  }
  size_t vocab = tokens.size(), hidden = 16, heads = 2, kv = 1, hd = 8, ffn = 24;
  std::map<std::string, Value> md{
      {"general.architecture", Value::string("llama")},
      {"llama.embedding_length", Value::u64(hidden, ValueType::U32)},
      {"llama.feed_forward_length", Value::u64(ffn, ValueType::U32)},
      {"llama.block_count", Value::u64(1, ValueType::U32)},
      {"llama.attention.head_count", Value::u64(heads, ValueType::U32)},
      {"llama.attention.head_count_kv", Value::u64(kv, ValueType::U32)},
      {"llama.rope.dimension_count", Value::u64(hd, ValueType::U32)},
      {"llama.context_length", Value::u64(32, ValueType::U32)},
      {"llama.attention.layer_norm_rms_epsilon", Value::f64(1e-5, ValueType::F32)},
      {"llama.rope.freq_base", Value::f64(10000, ValueType::F32)},
      {"tokenizer.ggml.model", Value::string("gpt2")},
      {"tokenizer.ggml.pre", Value::string("smollm")},
      {"tokenizer.ggml.tokens", Value::array(ValueType::String, tokens)},
      {"tokenizer.ggml.token_type", Value::array(ValueType::I32, types)},
      {"tokenizer.ggml.merges", Value::array(ValueType::String, merges)},
      {"tokenizer.ggml.bos_token_id", Value::u64(vocab - 2, ValueType::U32)},
      {"tokenizer.ggml.eos_token_id", Value::u64(vocab - 1, ValueType::U32)},
      {"tokenizer.ggml.add_bos_token", Value::boolean(false)},
      {"tokenizer.chat_template", Value::string("{% for message in messages %}<|im_start|>")}};
  std::map<std::string, wick::Tensor> w{
      {"token_embd.weight", t({vocab, hidden}, wick::DType::F16)},
      {"output_norm.weight", t({hidden})},
      {"blk.0.attn_norm.weight", t({hidden})},
      {"blk.0.ffn_norm.weight", t({hidden})},
      {"blk.0.attn_q.weight", t({heads * hd, hidden})},
      {"blk.0.attn_k.weight", t({kv * hd, hidden})},
      {"blk.0.attn_v.weight", t({kv * hd, hidden}, wick::DType::F16)},
      {"blk.0.attn_output.weight", t({hidden, heads * hd})},
      {"blk.0.ffn_gate.weight", t({ffn, hidden})},
      {"blk.0.ffn_up.weight", t({ffn, hidden}, wick::DType::BF16)},
      {"blk.0.ffn_down.weight", t({hidden, ffn})}};
  wick::gguf::save(w, out + "/tiny_llama.gguf", md);
  std::ofstream(out + "/index.json") << R"({"metadata": {"total_size": 1000}, "weight_map": {
  "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
  "model.norm.weight": "model-00001-of-00002.safetensors",
  "lm_head.weight": "model-00001-of-00002.safetensors",
  "model.layers.0.input_layernorm.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.post_attention_layernorm.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.self_attn.q_proj.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.self_attn.k_proj.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.self_attn.v_proj.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.self_attn.o_proj.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.mlp.gate_proj.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
  "model.layers.0.mlp.down_proj.weight": "model-00002-of-00002.safetensors"}}
)";
  return 0;
}
