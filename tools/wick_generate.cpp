// wick-generate: text generation with a Llama-family model (a GGUF file or a Hugging Face folder),
// streamed as it is made, then prompt and decode speed and the KV-cache size.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "teacher_forced.h"
#include "wick/generator.h"
#include "wick/llama.h"
#include "wick/tokenizer.h"
#include "wick/wick.h"

namespace {

std::vector<uint32_t> parse_ids(const std::string& text) {
  std::vector<uint32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) ids.push_back(static_cast<uint32_t>(std::stoul(item)));
  }
  return ids;
}

wick::DType parse_dtype(const std::string& s) {
  if (s == "f32") return wick::DType::F32;
  if (s == "f16") return wick::DType::F16;
  if (s == "bf16") return wick::DType::BF16;
  throw wick::Error("--dtype must be f32, f16 or bf16, got " + s);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wick-generate: generate text with a Llama-family model (GGUF file or HF folder)"};
  std::string model_path, prompt = "The capital of France is", prompt_ids_text, device_name = "cpu";
  std::string dtype_name = "f32";
  bool chat = false, print_ids = false, ignore_eos = false, no_graph = false, quiet = false;
  wick::GenerateOptions opt;
  opt.max_new_tokens = 64;
  app.add_option("model", model_path, "a .gguf file or a folder with config.json + safetensors")
      ->required();
  app.add_option("--prompt", prompt, "the prompt text");
  app.add_option("--prompt-ids", prompt_ids_text,
                 "comma-separated prompt ids instead of text (models without a tokenizer)");
  app.add_flag("--chat", chat, "wrap the prompt in the model's chat template (SmolLM2: ChatML)");
  app.add_option("--max-new", opt.max_new_tokens, "tokens to generate")->capture_default_str();
  app.add_option("--temperature", opt.temperature, "0 = greedy")->capture_default_str();
  app.add_option("--top-k", opt.top_k, "keep the k most likely tokens (0 = all)");
  app.add_option("--top-p", opt.top_p, "nucleus sampling threshold")->capture_default_str();
  app.add_option("--seed", opt.seed, "sampling seed")->capture_default_str();
  app.add_option("--max-len", opt.max_len, "KV-cache length (0 = prompt + max-new)");
  app.add_option("--device", device_name, "cpu or cuda[:N]")->capture_default_str();
  app.add_option("--dtype", dtype_name, "weights and compute: f32, f16 or bf16")
      ->capture_default_str();
  app.add_flag("--ignore-eos", ignore_eos, "do not stop at end-of-sequence tokens (benchmarks)");
  app.add_flag("--no-graph", no_graph, "CUDA: run the decode step op by op, not as a CUDA graph");
  app.add_flag("--print-ids", print_ids, "print the generated ids on one line (ids: ...)");
  app.add_flag("-q,--quiet", quiet, "do not stream the text");
  bool keep_quantized = true;
  app.add_flag("--keep-quantized,!--dequantize", keep_quantized,
               "GGUF: keep quantized matrices quantized (qmatmul; default) or dequantise at load");
  size_t teacher_forced = 0;
  app.add_option("--teacher-forced", teacher_forced,
                 "GGUF: run the first N prompt tokens through the quantized and the dequantised "
                 "model, print top-1 next-token agreement and both perplexities, and exit");
  std::string prompt_file;
  app.add_option("--prompt-file", prompt_file, "read the prompt text from this file");
  std::string logits_out;
  app.add_option("--logits-out", logits_out,
                 "write the prompt's logits (prompt_len x vocab, raw little-endian f32) here");
  CLI11_PARSE(app, argc, argv);

  try {
    wick::Device device = wick::Device::cpu();
    if (device_name.rfind("cuda", 0) == 0) {
      int ordinal = device_name.size() > 5 ? std::stoi(device_name.substr(5)) : 0;
      device = wick::Device::cuda(ordinal);
    } else if (device_name != "cpu") {
      throw wick::Error("--device must be cpu or cuda[:N], got " + device_name);
    }
    auto t_load = std::chrono::steady_clock::now();
    if (!prompt_file.empty()) {
      std::ifstream in(prompt_file, std::ios::binary);
      if (!in) throw wick::Error("cannot read " + prompt_file);
      std::stringstream ss;
      ss << in.rdbuf();
      prompt = ss.str();
    }
    wick::models::Llama model =
        wick::models::Llama::load(model_path, device, parse_dtype(dtype_name), keep_quantized);
    double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();

    std::optional<wick::Tokenizer> tok;
    namespace fs = std::filesystem;
    if (fs::is_directory(model_path)) {
      fs::path tj = fs::path(model_path) / "tokenizer.json";
      if (fs::exists(tj)) tok = wick::Tokenizer::from_file(tj.string());
    } else {
      tok = wick::models::load_gguf_tokenizer(model_path);
    }

    std::vector<uint32_t> prompt_ids;
    if (!prompt_ids_text.empty()) {
      prompt_ids = parse_ids(prompt_ids_text);
    } else {
      if (!tok) throw wick::Error("no tokenizer.json next to the model: use --prompt-ids");
      std::string text = prompt;
      if (chat) text = tok->apply_chat_template({{"user", prompt}}, true);
      prompt_ids = tok->encode(text, !chat);
    }
    if (chat && tok) {
      // ChatML ends a turn with <|im_end|>: stop there as well as at eos.
      if (auto end = tok->token_to_id("<|im_end|>")) opt.stop_tokens.push_back(*end);
      if (auto eos = tok->eos_id()) opt.stop_tokens.push_back(*eos);
      for (uint32_t e : model.config().eos_token_ids) opt.stop_tokens.push_back(e);
    }
    if (ignore_eos) opt.stop_tokens = {0xffffffffu};
    opt.cuda_graph = !no_graph;

    if (teacher_forced > 0) {
      if (prompt_ids.size() < teacher_forced) {
        throw wick::Error("--teacher-forced " + std::to_string(teacher_forced) +
                          ": the prompt has " + std::to_string(prompt_ids.size()) + " tokens");
      }
      prompt_ids.resize(teacher_forced);
      wick::models::Llama dense =
          wick::models::Llama::load(model_path, device, parse_dtype(dtype_name), false);
      wick::tools::TeacherForced r = wick::tools::teacher_forced(model, dense, prompt_ids);
      std::printf(
          "teacher-forced over %zu tokens: top-1 agreement %.2f%%, perplexity %.4f "
          "(%s) vs %.4f (dequantised), ratio %.4f\n",
          prompt_ids.size(), 100 * r.agreement, r.perplexity_a,
          keep_quantized ? "quantized" : "dequantised", r.perplexity_b,
          r.perplexity_a / r.perplexity_b);
      return 0;
    }
    if (!logits_out.empty()) {
      wick::models::KvCache cache = model.make_cache(1, prompt_ids.size());
      wick::Tensor ids = wick::Tensor::from_vec(prompt_ids, {1, prompt_ids.size()}, device);
      auto logits = model.forward(ids, cache).to_dtype(wick::DType::F32).flatten_all();
      std::vector<float> v = logits.to_vec1<float>();
      std::ofstream f(logits_out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(v.data()),
              static_cast<std::streamsize>(v.size() * sizeof(float)));
      if (!f) throw wick::Error("cannot write " + logits_out);
    }
    if (!quiet && tok && prompt_ids_text.empty()) std::cout << prompt << std::flush;
    wick::Generator gen(model, opt);
    auto out = gen.generate(prompt_ids, [&](uint32_t id) {
      if (!quiet && tok && !tok->is_special(id)) {
        std::string bytes = tok->id_to_bytes(id);
        std::fwrite(bytes.data(), 1, bytes.size(), stdout);
        std::fflush(stdout);
      }
      return true;
    });
    const wick::GenerateStats& s = gen.stats();
    std::printf("\n\n");
    if (print_ids) {
      std::printf("ids:");
      for (uint32_t id : out) std::printf(" %u", id);
      std::printf("\n");
    }
    std::printf("model: %s on %s (%s), %zu layers, weights %.1f MiB, loaded in %.2f s\n",
                model.config().model_type.c_str(), device_name.c_str(), dtype_name.c_str(),
                model.config().num_hidden_layers, model.weight_bytes() / 1048576.0, load_s);
    std::printf("prompt: %zu tokens, %.1f tok/s\n", s.prompt_tokens, s.prompt_tokens_per_second());
    std::printf("decode: %zu tokens, %.1f tok/s%s\n", s.new_tokens, s.decode_tokens_per_second(),
                s.used_cuda_graph ? " (decode step replayed as one CUDA graph)" : "");
    std::printf("kv cache: %zu bytes (%.2f MiB)\n", s.kv_cache_bytes, s.kv_cache_bytes / 1048576.0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "wick-generate: %s\n", e.what());
    return 1;
  }
  return 0;
}
