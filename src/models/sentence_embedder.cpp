// Sentence embeddings as sentence-transformers computes them: Transformer -> Pooling
// (-> Normalize), configured by the model folder's modules.json and 1_Pooling/config.json.

#include <algorithm>
#include <exception>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "formats/json_util.h"
#include "json_file.h"
#include "util.h"
#include "wick/bert.h"
#include "wick/cpu.h"
#include "wick/error.h"
#include "wick/tokenizer.h"

namespace wick {

namespace fs = std::filesystem;

struct SentenceEmbedder::Impl {
  models::Bert bert;
  Tokenizer tokenizer;
  Pooling pooling = Pooling::Mean;
  bool normalize = false;
  size_t max_seq_length = 0;
  size_t batch_size = 32;
  size_t max_batch_tokens = 0;  // 0: no limit
  size_t dim = 0;
};

namespace {

// Whether `file` exists; FormatError naming it when the answer is unknown (a folder that cannot
// be searched, a symlink loop), where std::filesystem::exists would throw filesystem_error.
bool file_exists(const fs::path& file) {
  std::error_code ec;
  bool found = fs::exists(file, ec);
  if (ec) throw FormatError(file.string() + ": cannot be checked: " + ec.message());
  return found;
}

// The folder's module list: where the Transformer and Pooling modules live, and whether the
// pipeline ends with Normalize. Without modules.json sentence-transformers uses Transformer + mean.
struct Modules {
  fs::path transformer;
  fs::path pooling;  // empty: mean pooling by default
  bool normalize = false;
};

Modules read_modules(const fs::path& dir) {
  Modules mods{dir, {}, false};
  auto file = dir / "modules.json";
  if (!file_exists(file)) return mods;
  auto j = json_file::read(file);
  if (!j.is_array()) throw FormatError(file.string() + ": expected a JSON array of modules");
  bool have_transformer = false;
  for (const auto& m : j) {
    if (!m.is_object()) throw FormatError(file.string() + ": each module must be an object");
    auto type = json_file::get_string(m, "type", file, "");
    auto rel = fs::path(json_file::get_string(m, "path", file, ""));
    for (const auto& part : rel) {
      if (rel.is_absolute() || part == "..") {
        throw FormatError(file.string() + ": module path " + formats::quote_prefix(rel.string()) +
                          " leaves the model folder");
      }
    }
    auto path = dir / rel;
    auto short_type = type.substr(type.rfind('.') == std::string::npos ? 0 : type.rfind('.') + 1);
    if (short_type == "Transformer") {
      mods.transformer = path;
      have_transformer = true;
    } else if (short_type == "Pooling") {
      mods.pooling = path;
    } else if (short_type == "Normalize") {
      mods.normalize = true;
    } else {
      throw FormatError(file.string() + ": module type " + formats::quote_prefix(type) +
                        " is not supported (Transformer, Pooling and Normalize are)");
    }
  }
  if (!have_transformer) throw FormatError(file.string() + ": no Transformer module");
  return mods;
}

Pooling read_pooling(const fs::path& pooling_dir, size_t hidden) {
  if (pooling_dir.empty()) return Pooling::Mean;
  auto file = pooling_dir / "config.json";
  auto j = json_file::read(file);
  if (!j.is_object()) throw FormatError(file.string() + ": expected a JSON object");
  size_t dim = json_file::get_size(j, "word_embedding_dimension", file, &hidden);
  if (dim != hidden) {
    throw FormatError(file.string() + ": word_embedding_dimension " + std::to_string(dim) +
                      " differs from the model's hidden_size " + std::to_string(hidden));
  }
  std::vector<Pooling> modes;
  if (json_file::get_bool(j, "pooling_mode_cls_token", file, false)) modes.push_back(Pooling::Cls);
  if (json_file::get_bool(j, "pooling_mode_mean_tokens", file, false))
    modes.push_back(Pooling::Mean);
  if (json_file::get_bool(j, "pooling_mode_max_tokens", file, false)) modes.push_back(Pooling::Max);
  if (json_file::get_bool(j, "pooling_mode_mean_sqrt_len_tokens", file, false)) {
    modes.push_back(Pooling::MeanSqrtLen);
  }
  for (const char* other : {"pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken"}) {
    if (json_file::get_bool(j, other, file, false)) {
      throw FormatError(file.string() + ": " + other + " is not supported");
    }
  }
  if (modes.size() != 1) {
    throw FormatError(file.string() +
                      ": exactly one pooling mode must be true (cls, mean, max, "
                      "mean_sqrt_len), found " +
                      std::to_string(modes.size()));
  }
  return modes[0];
}

// Pools hidden (b, s, h) f32 with the 0/1 mask (b, s) f32 into (b, h).
Tensor pool(const Tensor& hidden, const Tensor& mask, Pooling mode) {
  size_t b = hidden.dim(0), s = hidden.dim(1);
  switch (mode) {
    case Pooling::Cls:
      return hidden.narrow(1, 0, 1).squeeze(1);
    case Pooling::Max: {
      // Padded positions get -1e9 first, as sentence-transformers does.
      auto masked = mask.reshape({b, s, 1}).broadcast_as(hidden.shape());
      auto floor = Tensor::full(-1e9f, hidden.shape(), hidden.device());
      return masked.gt(Tensor::scalar(0.5f, hidden.device())).where_cond(hidden, floor).max(1);
    }
    case Pooling::Mean:
    case Pooling::MeanSqrtLen: {
      // The masked sum over tokens as one batched product: (b, 1, s) x (b, s, h).
      auto sum = mask.reshape({b, 1, s}).matmul(hidden).squeeze(1);
      auto count = mask.sum_keepdim({1}).clamp(1e-9, 1e300);
      return sum.broadcast_div(mode == Pooling::Mean ? count : count.sqrt());
    }
  }
  throw Error("SentenceEmbedder: unknown pooling mode");
}

}  // namespace

SentenceEmbedder SentenceEmbedder::load(const fs::path& model_dir, const Device& device,
                                        const SentenceEmbedderOptions& options) {
  json_file::require_model_folder(model_dir);
  if (options.batch_size == 0) throw Error("SentenceEmbedder::load: batch_size must be positive");
  auto mods = read_modules(model_dir);
  auto tokenizer_file = mods.transformer / "tokenizer.json";
  if (!file_exists(tokenizer_file)) {
    throw FormatError(tokenizer_file.string() + ": missing (vocab.txt alone is not read)");
  }
  // bf16 on the CPU: bf16 products with f32 activations (the AMX tile GEMM where the CPU has
  // it); the CPU's own bf16 elementwise and attention kernels gain nothing over f32.
  auto bert = device.is_cpu() && options.dtype == DType::BF16
                  ? models::Bert::load(mods.transformer, device, DType::F32, DType::BF16)
                  : models::Bert::load(mods.transformer, device, options.dtype);
  const auto& c = bert.config();
  auto impl = std::make_shared<Impl>(Impl{bert, Tokenizer::from_file(tokenizer_file.string())});
  impl->pooling = read_pooling(mods.pooling, c.hidden_size);
  impl->normalize = mods.normalize && options.normalize;
  impl->batch_size = options.batch_size;
  impl->max_batch_tokens = options.max_batch_tokens ? options.max_batch_tokens
                           : device.is_cpu()        ? 2048
                                                    : 0;
  impl->dim = c.hidden_size;

  size_t max_len = c.max_position_embeddings;
  auto st_config = mods.transformer / "sentence_bert_config.json";
  if (file_exists(st_config)) {
    auto j = json_file::read(st_config);
    if (!j.is_object()) throw FormatError(st_config.string() + ": expected a JSON object");
    auto it = j.find("max_seq_length");
    if (it != j.end() && !it->is_null()) {
      max_len = json_file::as_uint(*it, "max_seq_length", st_config.string());
      if (max_len == 0) {
        throw FormatError(st_config.string() + ": field \"max_seq_length\" must be positive");
      }
    }
  }
  if (options.max_seq_length) max_len = options.max_seq_length;
  impl->max_seq_length = std::min(max_len, c.max_position_embeddings);
  return SentenceEmbedder(std::move(impl));
}

std::vector<uint32_t> SentenceEmbedder::tokenize(const std::string& text) const {
  auto ids = impl_->tokenizer.encode(text, true);
  // Truncation keeps the leading tokens and the closing special token ([SEP]).
  if (ids.size() > impl_->max_seq_length) {
    uint32_t last = ids.back();
    ids.resize(impl_->max_seq_length - 1);
    ids.push_back(last);
  }
  return ids;
}

Tensor SentenceEmbedder::embed(const std::vector<std::string>& texts,
                               const Progress& progress) const {
  const auto& m = *impl_;
  const Device device = m.bert.device();
  const size_t n = texts.size();
  if (n == 0) return Tensor::zeros({0, m.dim}, DType::F32, device);

  // Tokenizing 10,000 sentences takes about as long as a GPU needs to embed them: spread it
  // over the cores (the tokenizer may be used from several threads).
  std::vector<std::vector<uint32_t>> ids(n);
  size_t workers = std::min<size_t>(cpu_threads(), (n + 255) / 256);
  std::vector<std::exception_ptr> errors(workers);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) {
    auto work = [&, w] {
      try {
        for (size_t i = w * n / workers; i < (w + 1) * n / workers; ++i)
          ids[i] = tokenize(texts[i]);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    };
    if (w + 1 < workers) {
      threads.emplace_back(work);
    } else {
      work();
    }
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  // Longest first, so each batch pads to nearly its own length and the first batch shows the
  // peak memory at once.
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return ids[a].size() > ids[b].size(); });

  std::vector<Tensor> pooled;
  for (size_t start = 0, count = 0; start < n; start += count) {
    // The first sentence of a batch is its longest: it sets the padded length.
    size_t len = ids[order[start]].size();
    if (len == 0) {
      // The longest text has no tokens: every remaining one is empty, and BERT has no
      // embedding for an empty sequence.
      throw ShapeMismatch(
          str("SentenceEmbedder::embed: text ", order[start],
              " has no tokens (the tokenizer adds no special tokens), nothing to embed"));
    }
    count = std::min(m.batch_size, n - start);
    if (m.max_batch_tokens) count = std::clamp<size_t>(m.max_batch_tokens / len, 1, count);
    // On the CPU the batch goes to the encoder packed without padding (its hidden states then
    // spread into (count, len) rows for the pooling, padded places pointing at row 0 under a zero
    // mask); a GPU, and f16/bf16 activations (whose packed attention has no kernel), encode it
    // padded, with one fused attention call per layer.
    const bool packed = device.is_cpu() && m.bert.dtype() == DType::F32;
    std::vector<uint32_t> batch_ids(packed ? 0 : count * len, 0), rows(count * len, 0);
    std::vector<size_t> lengths(count);
    std::vector<float> batch_mask(count * len, 0.0f);
    for (size_t r = 0; r < count; ++r) {
      const auto& row = ids[order[start + r]];
      lengths[r] = row.size();
      if (packed) {
        for (size_t t = 0; t < row.size(); ++t) rows[r * len + t] = uint32_t(batch_ids.size() + t);
        batch_ids.insert(batch_ids.end(), row.begin(), row.end());
      } else {
        std::copy(row.begin(), row.end(), batch_ids.begin() + r * len);
      }
      std::fill_n(batch_mask.begin() + r * len, row.size(), 1.0f);
    }
    auto mask_t = Tensor::from_vec(batch_mask, {count, len}, Device::cpu()).to_device(device);
    Tensor hidden;
    if (packed) {
      auto id_t = Tensor::from_vec(batch_ids, {batch_ids.size()}, Device::cpu());
      auto rows_t = Tensor::from_vec(rows, {count * len}, Device::cpu());
      hidden = m.bert.encode_packed(id_t, lengths)
                   .to_dtype(DType::F32)
                   .index_select(rows_t, 0)
                   .reshape({count, len, m.dim});
    } else {
      auto id_t = Tensor::from_vec(batch_ids, {count, len}, Device::cpu()).to_device(device);
      hidden = m.bert.encode(id_t, mask_t).to_dtype(DType::F32);
    }
    auto emb = pool(hidden, mask_t, m.pooling);
    if (m.normalize) {
      emb = emb.broadcast_div(emb.sqr().sum_keepdim({1}).sqrt().clamp(1e-12, 1e300));
    }
    pooled.push_back(emb);
    if (progress) progress(start + count, n);
  }
  auto sorted = pooled.size() == 1 ? pooled[0] : Tensor::cat(pooled, 0);
  // Row order[k] of the result is row k of `sorted`.
  std::vector<uint32_t> inverse(n);
  for (size_t k = 0; k < n; ++k) inverse[order[k]] = static_cast<uint32_t>(k);
  return sorted.index_select(Tensor::from_vec(inverse, {n}, Device::cpu()).to_device(device), 0);
}

size_t SentenceEmbedder::dim() const {
  return impl_->dim;
}
size_t SentenceEmbedder::max_seq_length() const {
  return impl_->max_seq_length;
}
size_t SentenceEmbedder::batch_size() const {
  return impl_->batch_size;
}
size_t SentenceEmbedder::max_batch_tokens() const {
  return impl_->max_batch_tokens;
}
Pooling SentenceEmbedder::pooling() const {
  return impl_->pooling;
}
bool SentenceEmbedder::normalizes() const {
  return impl_->normalize;
}
const models::Bert& SentenceEmbedder::bert() const {
  return impl_->bert;
}

}  // namespace wick
