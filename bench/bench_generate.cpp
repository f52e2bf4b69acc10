// Decode speed of a wick causal LM (batch 1; Llama and Qwen2 as --shape or --model, the other
// families of load_causal_lm as --model): prefill tok/s and decode tok/s, op by op and (CUDA)
// with the decode step replayed as one CUDA graph, beside the peer's figures measured in the same
// run (bench/cuda/generate_peer.py writes them to a JSON file given with --peer).
//
//   bench_generate --model PATH|--shape smollm2|llama1b|qwen05b [--device cpu|cuda] [--dtype f32]
//                  [--prompt-len 32] [--new 128] [--repeats 3] [--peer peer.json]

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda/tuning_env.h"
#include "wick/causal_lm.h"
#include "wick/generator.h"
#include "wick/gguf.h"
#include "wick/llama.h"
#include "wick/wick.h"

namespace {

using wick::models::LlamaConfig;

LlamaConfig shape_config(const std::string& shape) {
  LlamaConfig c;
  if (shape == "smollm2") {
    c.vocab_size = 49152, c.hidden_size = 576, c.intermediate_size = 1536;
    c.num_hidden_layers = 30, c.num_attention_heads = 9, c.num_key_value_heads = 3;
    c.rope_theta = 100000, c.rms_norm_eps = 1e-5, c.tie_word_embeddings = true;
  } else if (shape == "llama1b") {
    c.vocab_size = 128256, c.hidden_size = 2048, c.intermediate_size = 8192;
    c.num_hidden_layers = 16, c.num_attention_heads = 32, c.num_key_value_heads = 8;
    c.rope_theta = 500000, c.rms_norm_eps = 1e-5, c.tie_word_embeddings = true;
    c.rope_scaling = wick::models::Llama3RopeScaling{32.0, 1.0, 4.0, 8192};
  } else if (shape == "qwen05b") {
    c.model_type = "qwen2", c.vocab_size = 151936, c.hidden_size = 896;
    c.intermediate_size = 4864, c.num_hidden_layers = 24, c.num_attention_heads = 14;
    c.num_key_value_heads = 2, c.rope_theta = 1000000, c.rms_norm_eps = 1e-6;
    c.tie_word_embeddings = true, c.qkv_bias = true;
  } else {
    throw wick::Error("--shape must be smollm2, llama1b or qwen05b, got " + shape);
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  return c;
}

// Random weights N(0, 0.02) (norms 1), made on the device in f32 and converted by from_weights.
wick::models::Llama random_model(const LlamaConfig& c, const wick::Device& dev, wick::DType dt) {
  dev.set_seed(0);
  std::map<std::string, wick::Tensor> w;
  size_t d = c.hidden_size, qo = c.num_attention_heads * c.head_dim;
  size_t kvo = c.num_key_value_heads * c.head_dim, in = c.intermediate_size;
  auto r = [&](wick::Shape s) { return wick::Tensor::randn(0.0f, 0.02f, s, dev).to_dtype(dt); };
  auto one = [&](size_t n) { return wick::Tensor::ones({n}, dt, dev); };
  w["model.embed_tokens.weight"] = r({c.vocab_size, d});
  w["model.norm.weight"] = one(d);
  for (size_t i = 0; i < c.num_hidden_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    w[p + "input_layernorm.weight"] = one(d);
    w[p + "post_attention_layernorm.weight"] = one(d);
    w[p + "self_attn.q_proj.weight"] = r({qo, d});
    w[p + "self_attn.k_proj.weight"] = r({kvo, d});
    w[p + "self_attn.v_proj.weight"] = r({kvo, d});
    w[p + "self_attn.o_proj.weight"] = r({d, qo});
    if (c.qkv_bias) {
      w[p + "self_attn.q_proj.bias"] = r({qo});
      w[p + "self_attn.k_proj.bias"] = r({kvo});
      w[p + "self_attn.v_proj.bias"] = r({kvo});
    }
    w[p + "mlp.gate_proj.weight"] = r({in, d});
    w[p + "mlp.up_proj.weight"] = r({in, d});
    w[p + "mlp.down_proj.weight"] = r({d, in});
  }
  return wick::models::Llama::from_weights(c, w, dev, dt);
}

struct Figures {
  double prompt_tps = 0, decode_tps = 0;
  size_t kv_bytes = 0, graph_nodes = 0;
};

// Best of `repeats` (after one warm-up run that also captures the graph).
Figures measure(const wick::models::CausalLM& m, const std::vector<uint32_t>& prompt, size_t n,
                bool graph, int repeats) {
  wick::GenerateOptions opt;
  opt.max_new_tokens = n;
  opt.stop_tokens = {0xffffffffu};
  opt.cuda_graph = graph;
  wick::Generator gen(m, opt);
  gen.generate(prompt);
  Figures f;
  for (int i = 0; i < repeats; ++i) {
    gen.generate(prompt);
    f.prompt_tps = std::max(f.prompt_tps, gen.stats().prompt_tokens_per_second());
    f.decode_tps = std::max(f.decode_tps, gen.stats().decode_tokens_per_second());
    f.kv_bytes = gen.stats().kv_cache_bytes;
    f.graph_nodes = gen.stats().graph_nodes;
  }
  return f;
}

// Whether Llama::load reads `path` (a GGUF architecture or config.json model_type of Llama or
// Qwen2), so that --keep-quantized applies; the other families load through load_causal_lm.
bool llama_family(const std::string& path) {
  std::string arch;
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0) {
    arch = wick::gguf::File::open(path).architecture();
  } else {
    std::ifstream in(path + "/config.json");
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_object()) arch = j.value("model_type", "");
  }
  return arch == "llama" || arch == "qwen2";
}

}  // namespace

int main(int argc, char** argv) {
  wick::cuda::apply_tuning_env();  // the benchmark variables of bench/README.md
  CLI::App app{"bench_generate: wick Llama decode speed (batch 1) beside the peer's"};
  std::string model_path, shape, device_name = "cpu", dtype_name = "f32", peer_path;
  size_t prompt_len = 32, new_tokens = 128;
  int repeats = 3;
  app.add_option("--model", model_path, "a .gguf file or HF folder");
  app.add_option("--shape", shape, "random weights of a real shape: smollm2, llama1b, qwen05b");
  app.add_option("--device", device_name, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", dtype_name, "f32, f16 or bf16")->capture_default_str();
  app.add_option("--prompt-len", prompt_len)->capture_default_str();
  app.add_option("--new", new_tokens, "tokens generated per run")->capture_default_str();
  app.add_option("--repeats", repeats)->capture_default_str();
  app.add_option("--peer", peer_path, "JSON from bench/cuda/generate_peer.py (same run)");
  bool keep_quantized = false;
  app.add_flag("--keep-quantized", keep_quantized, "GGUF: keep the matrices quantized (qmatmul)");
  CLI11_PARSE(app, argc, argv);
  try {
    wick::Device dev = device_name == "cuda" ? wick::Device::cuda(0) : wick::Device::cpu();
    wick::DType dt = dtype_name == "bf16"  ? wick::DType::BF16
                     : dtype_name == "f16" ? wick::DType::F16
                                           : wick::DType::F32;
    if (model_path.empty() && shape.empty()) throw wick::Error("give --model or --shape");
    std::unique_ptr<wick::models::CausalLM> model;
    if (model_path.empty()) {
      model = std::make_unique<wick::models::Llama>(random_model(shape_config(shape), dev, dt));
    } else if (llama_family(model_path)) {
      model = std::make_unique<wick::models::Llama>(
          wick::models::Llama::load(model_path, dev, dt, keep_quantized));
    } else {
      model = wick::models::load_causal_lm(model_path, dev, dt);
    }
    const wick::models::CausalLM& m = *model;
    std::vector<uint32_t> prompt(prompt_len);
    for (size_t i = 0; i < prompt_len; ++i)
      prompt[i] = static_cast<uint32_t>((i * 7919 + 11) % 1000);
    std::string what = model_path.empty()
                           ? shape + " (random)"
                           : model_path + (keep_quantized ? " (kept quantized)" : "");
    std::printf("bench_generate: %s, %s, %s, prompt %zu, %zu new tokens, best of %d\n",
                what.c_str(), device_name.c_str(), dtype_name.c_str(), prompt_len, new_tokens,
                repeats);
    std::printf("architecture: %s\n", m.config().architecture.c_str());
    if (const auto* llama = dynamic_cast<const wick::models::Llama*>(&m)) {
      std::printf("weights: %.1f MiB\n", llama->weight_bytes() / 1048576.0);
    }
    std::printf("%-34s %14s %14s %14s\n", "engine", "prefill tok/s", "decode tok/s", "kv MiB");
    Figures plain = measure(m, prompt, new_tokens, false, repeats);
    std::printf("%-34s %14.1f %14.1f %14.2f\n", "wick (op by op)", plain.prompt_tps,
                plain.decode_tps, plain.kv_bytes / 1048576.0);
    if (dev.is_cuda()) {
      Figures g = measure(m, prompt, new_tokens, true, repeats);
      std::printf("%-34s %14.1f %14.1f %14.2f\n", "wick (decode step as a CUDA graph)",
                  g.prompt_tps, g.decode_tps, g.kv_bytes / 1048576.0);
      std::printf("decode graph: %zu nodes (%zu layers)\n", g.graph_nodes, m.config().num_layers);
      std::printf("RESULT wick_graph_decode_tps %.1f\n", g.decode_tps);
    }
    std::printf("RESULT wick_decode_tps %.1f\n", plain.decode_tps);
    if (!peer_path.empty()) {
      std::ifstream in(peer_path);
      auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        std::printf("peer: %s unreadable\n", peer_path.c_str());
      } else {
        for (auto& [name, v] : j.items()) {
          if (v.is_object()) {
            std::printf("%-34s %14.1f %14.1f %14s\n", name.c_str(), v.value("prefill_tps", 0.0),
                        v.value("decode_tps", 0.0), "");
          }
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
