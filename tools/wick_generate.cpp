// wick-generate: text generation with a decoder-only model that load_causal_lm reads (Llama,
// Qwen2/3, Mistral, Phi-3, Gemma 2/3: a GGUF file or a Hugging Face folder).
// The generated text alone goes to stdout, streamed as it is made (or one JSON object with
// --json); the prompt echo, statistics and progress go to stderr (tools/cli.h).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "teacher_forced.h"
#include "wick/causal_lm.h"
#include "wick/generator.h"
#include "wick/gguf.h"
#include "wick/llama.h"
#include "wick/tokenizer.h"
#include "wick/wick.h"

namespace {

namespace fs = std::filesystem;
namespace tools = wick::tools;

// Prompts from this many tokens up announce their prefill on stderr.
constexpr size_t kLongPrefill = 512;

wick::DType parse_dtype(const std::string& s) {
  return s == "f16" ? wick::DType::F16 : s == "bf16" ? wick::DType::BF16 : wick::DType::F32;
}

// Writes to a file; a failed write or close removes the file and throws.
void write_file(const std::string& path, const void* data, size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw wick::Error("cannot write " + path + ": " + std::strerror(errno));
  bool ok = std::fwrite(data, 1, n, f) == n;
  int err = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(path.c_str());
    throw wick::Error("cannot write " + path + ": " + std::strerror(err != 0 ? err : errno));
  }
}

// The earliest place in `text` at or after `from` where a stop string starts, or npos.
size_t find_stop(const std::string& text, const std::vector<std::string>& stops, size_t from) {
  size_t found = std::string::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    size_t start = from >= s.size() ? from - s.size() + 1 : 0;
    found = std::min(found, text.find(s, start));
  }
  return found;
}

// Length of the longest end of `text` that is a proper start of a stop string (held back until
// the next token says whether the stop string follows).
size_t stop_prefix_at_end(const std::string& text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& s : stops) {
    for (size_t n = std::min(s.size() - 1, text.size()); n > longest; --n) {
      if (text.compare(text.size() - n, n, s, 0, n) == 0) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "wick-generate: generate text with a decoder-only model (GGUF file or HF folder).\n"
      "The generated text alone goes to stdout (or one JSON object with --json); the prompt,\n"
      "statistics and progress go to stderr. Exit codes: 0 success, 1 runtime failure, 2 usage\n"
      "error, 3 the asked device is missing."};
  tools::CommonOptions common;
  tools::add_common_options(app, "wick-generate", common);
  std::string model_path, prompt = "The capital of France is", prompt_ids_text, prompt_file;
  std::string device_name = "cpu", dtype_name = "f32", system_prompt, logits_out;
  std::vector<std::string> stops;
  bool chat = false, print_ids = false, ignore_eos = false, no_graph = false, quiet = false;
  bool json = false, keep_quantized = true, interactive = false, context_shift = false;
  size_t teacher_forced = 0;
  wick::GenerateOptions opt;
  opt.max_new_tokens = 64;
  const uint64_t kMaxCount = 1ull << 40;
  app.add_option("model", model_path, "a .gguf file or a folder with config.json + safetensors")
      ->required();
  auto* o_prompt = app.add_option("--prompt", prompt, "the prompt text")->capture_default_str();
  auto* o_file =
      app.add_option("--prompt-file", prompt_file,
                     "read the prompt text from this file ('-': stdin), less one final newline");
  auto* o_ids = app.add_option("--prompt-ids", prompt_ids_text,
                               "comma-separated prompt ids instead of text (models without a "
                               "tokenizer)");
  o_prompt->excludes(o_file)->excludes(o_ids);
  o_file->excludes(o_ids);
  app.add_flag("--chat", chat,
               "wrap the prompt in the model's own chat template as a user turn, stopping at its "
               "end-of-turn token; defaults become "
               "--repeat-penalty 1.1 and, when sampling, --top-k 40 --top-p 0.95 --min-p 0.05");
  app.add_flag("-i,--interactive", interactive,
               "chat: each line of stdin is a user turn, answered in turn (implies --chat; "
               "--prompt or --prompt-file, if given, is the first turn)");
  app.add_option("--system", system_prompt, "a system message before the prompt (implies --chat)");
  app.add_flag("--context-shift", context_shift,
               "a prompt that leaves no room for --max-new in the model's context loses its first "
               "tokens instead of being refused");
  app.add_option("--stop", stops,
                 "stop when the generated text contains this string (not printed; repeatable)");
  app.add_option("--max-new", opt.max_new_tokens, "tokens to generate")
      ->check(tools::count_in(kMaxCount))
      ->capture_default_str();
  app.add_option("--temperature", opt.temperature, "0 = greedy")
      ->check(tools::number_in(0, 1e6))
      ->capture_default_str();
  auto* o_topk = app.add_option("--top-k", opt.top_k, "keep the k most likely tokens (0 = all)")
                     ->check(tools::count_in(kMaxCount));
  auto* o_topp = app.add_option("--top-p", opt.top_p, "nucleus sampling threshold, in (0, 1]")
                     ->check(tools::number_in(0, 1, true))
                     ->capture_default_str();
  auto* o_minp =
      app.add_option("--min-p", opt.min_p,
                     "keep tokens at least this fraction as likely as the top one, in [0, 1]")
          ->check(tools::number_in(0, 1));
  auto* o_rep = app.add_option("--repeat-penalty", opt.repeat_penalty,
                               "> 1 discourages the tokens of the last --repeat-last-n positions")
                    ->check(tools::number_in(0, 100, true));
  app.add_option("--repeat-last-n", opt.repeat_last_n,
                 "positions the penalties look back over (0 = all)")
      ->check(tools::count_in(kMaxCount))
      ->capture_default_str();
  app.add_option("--presence-penalty", opt.presence_penalty,
                 "subtracted from the logits of tokens already there, in [-2, 2]")
      ->check(tools::number_in(-2, 2));
  app.add_option("--frequency-penalty", opt.frequency_penalty,
                 "subtracted per occurrence, in [-2, 2]")
      ->check(tools::number_in(-2, 2));
  app.add_option("--seed", opt.seed, "sampling seed")
      ->check(tools::count_in(~uint64_t{0}))
      ->capture_default_str();
  app.add_option("--max-len", opt.max_len, "KV-cache length (0 = prompt + max-new)")
      ->check(tools::count_in(kMaxCount));
  app.add_option("--device", device_name, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_option("--dtype", dtype_name, "weights and compute: f32, f16 or bf16")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}))
      ->capture_default_str();
  app.add_flag("--ignore-eos", ignore_eos, "do not stop at end-of-sequence tokens (benchmarks)");
  app.add_flag("--no-graph", no_graph, "CUDA: run the decode step op by op, not as a CUDA graph");
  app.add_flag("--print-ids", print_ids, "print the generated ids on stderr (ids: ...)");
  app.add_flag("-q,--quiet", quiet, "no prompt echo, statistics or progress on stderr");
  app.add_flag("--json", json,
               "print one JSON object (text, ids, finish_reason, usage, timings) instead of "
               "streaming the text");
  app.add_flag("--keep-quantized,!--dequantize", keep_quantized,
               "GGUF: keep quantized matrices quantized (qmatmul; default) or dequantise at load");
  app.add_option("--teacher-forced", teacher_forced,
                 "GGUF: run the first N prompt tokens through the quantized and the dequantised "
                 "model, print top-1 next-token agreement and both perplexities, and exit")
      ->check(tools::count_in(kMaxCount));
  app.add_option("--logits-out", logits_out,
                 "write the prompt's logits (prompt_len x vocab, raw little-endian f32) here");

  return tools::run(app, argc, argv, "wick-generate", common, [&]() -> int {
    // Every argument is checked before the model is read.
    if (!system_prompt.empty() || interactive) chat = true;
    if (interactive && prompt_file == "-") {
      throw tools::UsageError("-i reads the turns from stdin: --prompt-file - cannot come with it");
    }
    const bool first_turn = o_prompt->count() > 0 || !prompt_file.empty();
    const wick::Device device = tools::parse_device(device_name);
    std::vector<uint32_t> prompt_ids;
    if (!prompt_ids_text.empty()) {
      if (chat) throw tools::UsageError("--chat and --system need a text prompt, not --prompt-ids");
      prompt_ids = tools::parse_ids("--prompt-ids", prompt_ids_text);
    }
    if (!prompt_file.empty()) tools::check_input_file("--prompt-file", prompt_file);
    if (!fs::exists(model_path)) {
      throw tools::UsageError("model " + model_path + ": no such file or directory");
    }
    if (opt.max_new_tokens == 0 && teacher_forced == 0 && logits_out.empty()) {
      throw tools::UsageError("--max-new must be at least 1");
    }
    for (const std::string& s : stops) {
      if (s.empty()) throw tools::UsageError("--stop: the empty string would stop at once");
    }
    if (chat) {  // defaults for chat, unless given
      if (o_topk->count() == 0) opt.top_k = 40;
      if (o_topp->count() == 0) opt.top_p = 0.95;
      if (o_minp->count() == 0) opt.min_p = 0.05;
      if (o_rep->count() == 0) opt.repeat_penalty = 1.1;
    }
    if (!prompt_file.empty()) {
      prompt = tools::read_all(prompt_file);
      if (!prompt.empty() && prompt.back() == '\n') prompt.pop_back();  // the file's last newline
    }

    auto t_load = std::chrono::steady_clock::now();
    // Every architecture through load_causal_lm; --dequantize (llama GGUF files) and
    // --teacher-forced read a Llama as such.
    const bool is_gguf = !fs::is_directory(model_path);
    const std::string gguf_arch =
        is_gguf ? wick::gguf::File::open(model_path).architecture() : std::string();
    std::shared_ptr<const wick::models::CausalLM> model;
    if (is_gguf && gguf_arch == "llama" && !keep_quantized) {
      model = std::make_shared<wick::models::Llama>(
          wick::models::Llama::load(model_path, device, parse_dtype(dtype_name), false));
    } else {
      model = wick::models::load_causal_lm(model_path, device, parse_dtype(dtype_name));
    }
    const auto* llama = dynamic_cast<const wick::models::Llama*>(model.get());
    double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    const wick::models::CausalLMConfig& config = model->config();

    std::optional<wick::Tokenizer> tok;
    if (fs::is_directory(model_path)) {
      fs::path tj = fs::path(model_path) / "tokenizer.json";
      if (fs::exists(tj)) tok = wick::Tokenizer::from_file(tj.string());
    } else if (wick::gguf::File::open(model_path).contains_key("tokenizer.ggml.tokens")) {
      tok = wick::models::load_gguf_tokenizer(model_path);
    }
    if (prompt_ids.empty()) {
      if (!tok) {
        throw wick::Error(std::string("no tokenizer.json next to the model: ") +
                          (chat ? "--chat, --system and -i need one" : "use --prompt-ids"));
      }
      std::string text = prompt;
      if (chat) {
        std::vector<wick::ChatMessage> messages;
        if (!system_prompt.empty()) messages.push_back({"system", system_prompt});
        messages.push_back({"user", prompt});
        text = tok->apply_chat_template(messages, true);
      }
      prompt_ids = tok->encode(text, !chat);
      if (prompt_ids.empty()) throw tools::UsageError("the prompt is empty");
    }
    for (uint32_t id : prompt_ids) {
      if (id >= config.vocab_size) {
        throw tools::UsageError("--prompt-ids: id " + std::to_string(id) +
                                " is outside the model's vocabulary of " +
                                std::to_string(config.vocab_size) + " tokens");
      }
    }
    // The model's context holds the prompt and the new tokens.
    const size_t context = config.max_position;
    if (context_shift && teacher_forced == 0 && opt.max_new_tokens < context &&
        prompt_ids.size() + opt.max_new_tokens > context) {
      const size_t keep = context - opt.max_new_tokens;
      std::fprintf(stderr,
                   "wick-generate: --context-shift: the prompt's first %zu of %zu tokens dropped "
                   "to leave --max-new %zu in the context of %zu\n",
                   prompt_ids.size() - keep, prompt_ids.size(), opt.max_new_tokens, context);
      prompt_ids.erase(prompt_ids.begin(), prompt_ids.end() - static_cast<std::ptrdiff_t>(keep));
    }
    if (teacher_forced == 0 && prompt_ids.size() + opt.max_new_tokens > context) {
      throw tools::UsageError(
          "the prompt's " + std::to_string(prompt_ids.size()) + " tokens + --max-new " +
          std::to_string(opt.max_new_tokens) + " exceed the model's context length of " +
          std::to_string(context) +
          " tokens: shorten the prompt, lower --max-new or pass --context-shift");
    }
    if (opt.max_len > 0 && opt.max_len < prompt_ids.size() + opt.max_new_tokens) {
      throw tools::UsageError("--max-len " + std::to_string(opt.max_len) + " is shorter than the " +
                              std::to_string(prompt_ids.size()) + " prompt tokens + --max-new " +
                              std::to_string(opt.max_new_tokens));
    }
    if (tok) {
      if (chat) {
        // An answer ends at the model's eos ids, the tokenizer's eos and the special token its
        // chat template ends an assistant turn with.
        opt.stop_tokens = tok->end_of_turn_ids();
        for (uint32_t e : config.eos_token_ids) {
          if (std::find(opt.stop_tokens.begin(), opt.stop_tokens.end(), e) ==
              opt.stop_tokens.end()) {
            opt.stop_tokens.push_back(e);
          }
        }
      }
      opt.token_text = [&tok](uint32_t id) {
        return tok->is_special(id) ? std::string() : tok->id_to_bytes(id);
      };
    } else if (!stops.empty()) {
      throw tools::UsageError("--stop needs the model's tokenizer (none next to the model)");
    }
    opt.stop_strings = stops;
    if (ignore_eos) opt.stop_tokens = {0xffffffffu};
    opt.cuda_graph = !no_graph;

    if (teacher_forced > 0) {
      if (prompt_ids.size() < teacher_forced) {
        throw tools::UsageError("--teacher-forced " + std::to_string(teacher_forced) +
                                ": the prompt has " + std::to_string(prompt_ids.size()) +
                                " tokens");
      }
      prompt_ids.resize(teacher_forced);
      if (llama == nullptr || !is_gguf) {
        throw tools::UsageError("--teacher-forced reads llama GGUF files, not " +
                                config.architecture);
      }
      wick::models::Llama dense =
          wick::models::Llama::load(model_path, device, parse_dtype(dtype_name), false);
      wick::tools::TeacherForced r = wick::tools::teacher_forced(*llama, dense, prompt_ids);
      std::printf(
          "teacher-forced over %zu tokens: top-1 agreement %.2f%%, perplexity %.4f "
          "(%s) vs %.4f (dequantised), ratio %.4f\n",
          prompt_ids.size(), 100 * r.agreement, r.perplexity_a,
          keep_quantized ? "quantized" : "dequantised", r.perplexity_b,
          r.perplexity_a / r.perplexity_b);
      return tools::kOk;
    }
    if (!logits_out.empty()) {
      wick::models::KvCache cache = model->make_cache(1, prompt_ids.size());
      wick::Tensor ids = wick::Tensor::from_vec(prompt_ids, {1, prompt_ids.size()}, device);
      std::vector<float> v =
          model->forward(ids, cache).to_dtype(wick::DType::F32).flatten_all().to_vec1<float>();
      write_file(logits_out, v.data(), v.size() * sizeof(float));
      if (opt.max_new_tokens == 0) return tools::kOk;
    }

    const bool stream = !json;
    if (!quiet && !chat && tok && prompt_ids_text.empty()) {
      std::fputs(prompt.c_str(), stderr);  // the continuation follows it on stdout
      std::fflush(stderr);
    }
    bool gen_progress = false;
    opt.on_prefill = [&](size_t done, size_t total) {
      if (gen_progress) {
        std::fprintf(stderr, "\rprefill: %zu / %zu tokens%s", done, total,
                     done == total ? "\n" : "");
      }
    };
    // A chat keeps one cache for the whole conversation, up to the model's context.
    if (interactive && opt.max_len == 0) opt.max_len = context;
    wick::Generator gen(*model, opt);
    char weights_buf[64] = "";
    if (llama != nullptr) {
      std::snprintf(weights_buf, sizeof weights_buf, "weights %.1f MiB, ",
                    llama->weight_bytes() / 1048576.0);
    }
    const std::string weights_text = weights_buf;
    // One answer to `ids`: streamed to stdout (or one JSON line), statistics on stderr.
    auto run_turn = [&](const std::vector<uint32_t>& ids) -> std::string {
      // A long prefill reports its progress on stderr, chunk by chunk.
      gen_progress = !quiet && ids.size() >= kLongPrefill;
      if (gen_progress) {
        std::fprintf(stderr, "%swick-generate: prefill of %zu prompt tokens...\n",
                     !chat && prompt_ids_text.empty() ? "\n" : "", ids.size());
      }
      // The text printed so far; bytes that may start a stop string wait for the next token.
      std::string text;
      size_t printed = 0;
      bool write_failed = false;
      auto print_upto = [&](size_t end) {
        if (stream && end > printed && !write_failed) {
          write_failed = !tools::write_stdout(text.data() + printed, end - printed) ||
                         std::fflush(stdout) != 0;
        }
        printed = std::max(printed, end);
      };
      size_t cut = std::string::npos;
      // A chat's next turn extends the sequence the generator holds: only the new part is
      // prefilled, the keys and values of the rest stay in its cache.
      const std::vector<uint32_t>& held = gen.history();
      const bool extends = interactive && !held.empty() && ids.size() > held.size() &&
                           std::equal(held.begin(), held.end(), ids.begin());
      auto on_token = [&](uint32_t id) {
        if (!opt.token_text) return true;
        size_t before = text.size();
        text += opt.token_text(id);
        cut = find_stop(text, stops, before);
        print_upto(cut != std::string::npos ? cut : text.size() - stop_prefix_at_end(text, stops));
        return cut == std::string::npos && !write_failed;
      };
      std::vector<uint32_t> out =
          extends ? gen.continue_generation(
                        std::vector<uint32_t>(ids.begin() + static_cast<ptrdiff_t>(held.size()),
                                              ids.end()),
                        on_token)
                  : gen.generate(ids, on_token);
      if (write_failed) tools::check_stdout();
      if (cut != std::string::npos) text.resize(cut);
      print_upto(text.size());
      const wick::GenerateStats& s = gen.stats();
      const std::vector<uint32_t>& stop_ids =
          opt.stop_tokens.empty() ? config.eos_token_ids : opt.stop_tokens;
      const bool stopped =
          cut != std::string::npos || (!out.empty() && std::find(stop_ids.begin(), stop_ids.end(),
                                                                 out.back()) != stop_ids.end());
      if (json) {
        nlohmann::json j;
        j["text"] = text;
        j["ids"] = out;
        j["finish_reason"] = stopped ? "stop" : "length";
        j["usage"] = {{"prompt_tokens", s.prompt_tokens},
                      {"completion_tokens", s.new_tokens},
                      {"total_tokens", s.prompt_tokens + s.new_tokens}};
        j["timings"] = {{"load_seconds", load_s},
                        {"prompt_seconds", s.prompt_seconds},
                        {"decode_seconds", s.decode_seconds},
                        {"prompt_tokens_per_second", s.prompt_tokens_per_second()},
                        {"decode_tokens_per_second", s.decode_tokens_per_second()}};
        j["model"] = {{"type", config.architecture},
                      {"device", device.to_string()},
                      {"dtype", dtype_name},
                      {"kv_cache_bytes", s.kv_cache_bytes}};
        std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
        if (!tools::write_stdout(line.data(), line.size())) tools::check_stdout();
      } else if (!tok) {
        // No tokenizer: the result is the new ids.
        std::string line;
        for (uint32_t id : out) line += (line.empty() ? "" : " ") + std::to_string(id);
        line += "\n";
        tools::write_stdout(line.data(), line.size());
      } else if (!text.empty() && text.back() != '\n') {
        tools::write_stdout("\n", 1);
      }
      tools::check_stdout();
      if (print_ids) {
        std::fprintf(stderr, "ids:");
        for (uint32_t id : out) std::fprintf(stderr, " %u", id);
        std::fprintf(stderr, "\n");
      }
      if (!quiet) {
        std::fprintf(stderr, "\nmodel: %s on %s (%s), %zu layers, %sloaded in %.2f s\n",
                     config.architecture.c_str(), device.to_string().c_str(), dtype_name.c_str(),
                     config.num_layers, weights_text.c_str(), load_s);
        std::fprintf(stderr, "prompt: %zu tokens, %.1f tok/s\n", s.prompt_tokens,
                     s.prompt_tokens_per_second());
        std::fprintf(stderr, "decode: %zu tokens, %.1f tok/s%s\n", s.new_tokens,
                     s.decode_tokens_per_second(),
                     s.used_cuda_graph ? " (decode step replayed as one CUDA graph)" : "");
        std::fprintf(stderr, "kv cache: %zu bytes (%.2f MiB)\n", s.kv_cache_bytes,
                     s.kv_cache_bytes / 1048576.0);
      }
      return text;
    };
    if (!interactive) {
      run_turn(prompt_ids);
      return tools::kOk;
    }
    // Interactive chat: each line of stdin is a user turn; the conversation so far is the prompt,
    // of which the generator prefills only what its cache does not hold.
    std::vector<wick::ChatMessage> messages;
    if (!system_prompt.empty()) messages.push_back({"system", system_prompt});
    std::string user = first_turn ? prompt : std::string();
    const bool tty = ::isatty(STDIN_FILENO) != 0 && ::isatty(STDERR_FILENO) != 0;
    for (;;) {
      if (user.empty()) {
        if (tty) std::fputs("> ", stderr);
        if (!std::getline(std::cin, user)) break;
        if (user.empty()) continue;
      }
      messages.push_back({"user", user});
      std::vector<uint32_t> ids = tok->encode(tok->apply_chat_template(messages, true), false);
      if (ids.size() + opt.max_new_tokens > context) {
        throw wick::Error("the conversation's " + std::to_string(ids.size()) +
                          " tokens + --max-new " + std::to_string(opt.max_new_tokens) +
                          " exceed the model's context length of " + std::to_string(context) +
                          " tokens");
      }
      messages.push_back({"assistant", run_turn(ids)});
      user.clear();
    }
    return tools::kOk;
  });
}
