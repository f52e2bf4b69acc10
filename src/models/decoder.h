#pragma once
// The shared pieces of the composed decoder families (qwen3.cpp, mistral.cpp, phi3.cpp,
// gemma2.cpp, gemma3.cpp): the configuration every family reads, rotary tables (default, linear,
// Llama 3 and long-rope frequencies), weights read by name from a model folder or a GGUF file,
// the attention of one layer (optional per-head q/k RMS norms, rope, the KV-cache write, grouped-
// query attention with an optional sliding window and score soft-cap), and a CausalLM base that
// runs the layers a family states and its output head, over one cache or (decoder_paged.cpp) a
// ragged batch over a paged cache. Each family file states its layer math.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/json_file.h"
#include "nn/qlinear.h"
#include "wick/causal_lm.h"

namespace wick {
class DecodePlan;
enum class GatedActivation;
}  // namespace wick
namespace wick::gguf {
class File;
}

namespace wick::models::decoder {

using nn::QLinear;

/// Rotary position embedding of one kind of layer (rotate-half form), over the first
/// rotated_dims(head_dim) dims of each q/k head (all of them but for partial rotary); the other
/// dims pass through.
struct Rope {
  std::string type = "default";  // default, linear, llama3, longrope
  double theta = 10000.0;
  double factor = 1.0;                 // linear: frequencies / factor; llama3 and longrope too
  double low_freq_factor = 1.0;        // llama3
  double high_freq_factor = 4.0;       // llama3
  double original_max_position = 0;    // llama3 and longrope
  double attention_factor = 1.0;       // multiplies cos and sin (longrope)
  std::vector<double> short_factor;    // longrope: per frequency, divides it
  std::vector<double> long_factor;     // longrope: when the cache exceeds original_max_position
  double partial_rotary_factor = 1.0;  // config.json: int(head_dim * f) dims rotate
  size_t rotary_dim = 0;               // > 0: the dims that rotate (GGUF's rope.dimension_count)

  /// The rotated dims of a head: rotary_dim when set, else int(head_dim * partial_rotary_factor)
  /// (as transformers truncates it).
  size_t rotated_dims(size_t head_dim) const;
  /// 1 / theta^(2i / r) for i < r / 2, r = rotated_dims(head_dim), with the type's scaling;
  /// longrope picks the long factors when `context` (the cache's max_len) exceeds
  /// original_max_position, as llama.cpp does for its context size (transformers does the same
  /// per forward call from the sequence length).
  std::vector<double> inverse_frequencies(size_t head_dim, size_t context) const;
  /// (cos, sin) of positions [start, start + n): each (n, rotated_dims(head_dim) / 2), `dtype` on
  /// `device`; angles formed in f32 as transformers forms them, times attention_factor.
  std::pair<Tensor, Tensor> tables(size_t head_dim, size_t context, size_t start, size_t n,
                                   DType dtype, const Device& device) const;
  /// FormatError naming `origin` for a non-positive or non-finite parameter, a
  /// partial_rotary_factor outside (0, 1], rotated dims that are zero, odd or above head_dim, or
  /// longrope factors other than one per rotated pair.
  void validate(size_t head_dim, const std::string& origin) const;
};

/// Rope over the first 2 * cos.dims()[1] dims of x (b, h, s, d) (x.rope when that is all of d),
/// the rest of each head passing through.
Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin);

/// A config.json rope object (transformers 5 `rope_parameters`, or 4's `rope_scaling`) over the
/// defaults in `base`: rope_type/type, rope_theta, factor, partial_rotary_factor, the llama3 and
/// longrope fields.
Rope parse_rope(const json_file::Json& params, Rope base, const std::string& origin);
/// The rope of a config without per-layer-type parameters: `rope_parameters`, else `rope_theta`
/// and `rope_scaling` at the top level (longrope's original_max_position_embeddings and
/// partial_rotary_factor may be there; the rope object's own partial_rotary_factor wins).
Rope parse_config_rope(const json_file::Json& j, double default_theta, size_t max_position,
                       const std::string& origin);

/// What the families share, from config.json or GGUF metadata.
struct DecoderConfig : CausalLMConfig {
  size_t intermediate_size = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  double final_softcap = 0;  // logits = cap tanh(logits / cap) when > 0

  /// The common config.json fields (FormatError naming the key when missing or mistyped);
  /// head_dim defaults to hidden / heads.
  static DecoderConfig from_json(const json_file::Json& j, const std::string& origin);
  /// The common GGUF metadata of `arch` (<arch>.embedding_length, ...).
  static DecoderConfig from_gguf(const gguf::File& f, const std::string& arch);
  /// FormatError when sizes are zero or inconsistent (heads, head_dim even, token ids in range).
  void validate(const std::string& origin) const;
};

/// `layer_types` of config.json ("sliding_attention" / "full_attention" per layer): true where
/// the layer attends through the sliding window. nullopt when the key is absent.
std::optional<std::vector<bool>> sliding_layers(const json_file::Json& j, size_t layers,
                                                const std::string& origin);

/// Weights by their Hugging Face names, from a model folder or (translated by the family's
/// names) a GGUF file; converted to `dtype` on `device`, checked against the expected shapes.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool is_gguf() const = 0;
  virtual bool contains(const std::string& hf_name) const = 0;
  /// A vector or a table, dense in `as` (the model's dtype by default).
  virtual Tensor dense_as(const std::string& hf_name, const Shape& shape, DType as) const = 0;
  Tensor dense(const std::string& hf_name, const Shape& shape) const {
    return dense_as(hf_name, shape, dtype());
  }
  /// Matrices (out_i, in) stacked by rows: kept as GGML blocks where a GGUF file's types allow
  /// qmatmul, otherwise dense.
  virtual QLinear linear(const std::vector<std::pair<std::string, Shape>>& parts) const = 0;
  virtual const Device& device() const = 0;
  virtual DType dtype() const = 0;
};

/// The safetensors of a model folder (model.safetensors or its sharded index).
std::unique_ptr<WeightSource> folder_weights(const std::string& dir, const Device& device,
                                             DType dtype);
/// A GGUF file: "model.embed_tokens.weight" is token_embd.weight, "model.norm.weight"
/// output_norm.weight, "lm_head.weight" output.weight, and "model.layers.<i>.<x>.weight"
/// blk.<i>.<layer_names[x]>.weight; other names are looked up as they are. With
/// `rope_permuted_head_dim` > 0 (architecture llama, whose q and k rows llama.cpp's convert
/// script permutes for interleaved rope), self_attn.q_proj and k_proj rows are put back in
/// Hugging Face's order, heads of that size.
std::unique_ptr<WeightSource> gguf_weights(const std::string& path, const Device& device,
                                           DType dtype,
                                           std::map<std::string, std::string> layer_names,
                                           size_t rope_permuted_head_dim = 0);

/// How one layer attends.
struct AttentionSpec {
  double scale = 0;    // multiplies q k^T
  double softcap = 0;  // scores = cap tanh(scores / cap) when > 0
  size_t window = 0;   // > 0: query i sees keys j with i - window < j <= i
  size_t rope = 0;     // index into the model's ropes
};

/// One decoder layer's weights; a family leaves the norms it does not have undefined.
struct Layer {
  Tensor attn_norm, post_attn_norm, ffn_norm, post_ffn_norm;
  Tensor q_norm, k_norm;  // (head_dim), per head; f32 weights normalise in f32 (Gemma)
  QLinear wqkv;           // q, k and v rows
  QLinear wo;
  QLinear wgate_up;  // gate rows, then up rows
  QLinear wdown;
  AttentionSpec attention;
};

struct Weights {
  Tensor embed, norm;
  QLinear lm_head;
  std::vector<Layer> layers;
  std::vector<Rope> ropes;
};

/// The q/k/v, o, gate/up and down matrices of layer `i` under the usual Hugging Face names
/// (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj), fused as Layer holds them.
void read_projections(const WeightSource& src, const DecoderConfig& c, size_t i, Layer& l);
/// The embedding, final norm and output head (the embedding when tied or absent).
void read_embedding_and_head(const WeightSource& src, DecoderConfig& c, Weights& w);

/// One forward call's cache and positions: the first one and each rope's (cos, sin) tables for
/// them; for a decode step, the position in device memory, the cache rows read and the additive
/// masks; for a paged step (forward_paged), the pool and the batch, its T tokens one row of ids
/// (1, T) whose rope tables hold each token's own position.
struct Step {
  KvCache* cache = nullptr;  // forward and decode step
  size_t start = 0;
  std::vector<std::pair<Tensor, Tensor>> rope;  // per Weights::ropes entry, (s, rotated / 2)
  Tensor position;                              // defined: a decode step (one U32 on the device)
  size_t keys = 0;                              // decode step: cache rows [0, keys) are read
  Tensor mask_all, mask_window;                 // decode step: (1, keys), 0 or -inf
  PagedKvCache* pages = nullptr;                // set: a paged step
  const PagedBatchTensors* batch = nullptr;     // paged step
};

/// A decoder whose layers a family states in hidden(); the embedding, KV cache, checks, output
/// head and the device-side decode step are common. A one-token decode step runs through the
/// backend's decode plan (decode_plan.h) where the family asked for one and the plan takes the
/// step; otherwise it is composed from the family's ops (all on the device, so that a step can be
/// captured as a CUDA graph).
class Decoder : public CausalLM {
 public:
  Decoder(DecoderConfig config, Weights weights, const Device& device, DType dtype);
  ~Decoder() override;
  bool has_decode_step() const override { return true; }
  Tensor decode_step(const Tensor& token, const Tensor& position, KvCache& cache,
                     Tensor* logits = nullptr, size_t key_window = 0) const override;
  const CausalLMConfig& config() const override { return config_; }
  Device device() const override { return device_; }
  DType dtype() const override { return dtype_; }
  KvCache make_cache(size_t batch, size_t max_len) const override;
  Tensor forward(const Tensor& ids, KvCache& cache) const override;
  Tensor forward_last(const Tensor& ids, KvCache& cache) const override;
  /// The cache's rope tables are the first rope's over the model's context (decoder_paged.cpp):
  /// a paged step's context is max_position (long-rope: the long factors where it exceeds the
  /// original context, as llama.cpp picks them for a context of that size).
  PagedKvCache make_paged_cache(size_t pages, size_t page_size) const override;
  /// The ragged batch as one row of tokens through the family's hidden(): each projection one
  /// product over the batch (rows independent of the batch, nn/batch_linear.h), attention over
  /// the pages with the layer's window and soft-cap.
  Tensor forward_paged(const std::vector<PagedSequence>& batch, PagedKvCache& cache) const override;
  bool has_paged_tensors() const override { return true; }
  Tensor forward_paged_tensors(const PagedBatchTensors& batch, PagedKvCache& cache) const override;
  /// Whether the backend gave a decode plan for these weights (ask_for_plan).
  bool has_decode_plan() const { return plan_ != nullptr; }

 protected:
  /// The last norm's output (b, s, d) for ids at positions [at.start, at.start + s), writing
  /// their keys and values into the cache (a paged step: (1, T, d) for the batch's tokens).
  virtual Tensor hidden(const Tensor& ids, const Step& at) const = 0;
  /// Layer li's attention of `in` (b, s, d): q/k/v projection, the q/k norms when defined, rope,
  /// the cache write and attention; returns (b, s, heads * head_dim) before the output projection.
  Tensor attend(const Tensor& in, size_t li, const Step& at) const;
  /// Asks the backend for a decode plan (decode_plan.h) for these weights, the FFN's gate
  /// `activation` and the embedding times `embed_scale`, unless the ropes rotate different dims
  /// or a norm weight is of a dtype the plan does not take; plan_ stays null otherwise.
  void ask_for_plan(GatedActivation activation, double embed_scale);
  /// w x: in a paged step through batch_linear (a row's result does not depend on the batch).
  static Tensor linear(const QLinear& w, const Tensor& x, const Step& at);
  /// rms_norm(x) * w: in x's dtype, or for a weight of another dtype (Gemma's f32 1 + w) in the
  /// weight's, rounded to x's dtype once (as transformers' Gemma norms compute).
  static Tensor head_norm(const Tensor& x, const Tensor& w, double eps);

  DecoderConfig config_;
  Weights w_;
  Device device_;
  DType dtype_;
  std::unique_ptr<DecodePlan> plan_;  // the backend's, for the layouts it covers, or null

 private:
  Tensor run(const Tensor& ids, KvCache& cache, bool last_only, const char* op) const;
  Tensor head(const Tensor& normed, const Step& at) const;
  /// attend's decode step from the projection qkv (b, 1, n): the head norms, rope and the cache
  /// write at the device position in one op, attention bounded by the position (masked where a
  /// window or soft-cap needs it).
  Tensor attend_at_position(const Tensor& qkv, size_t li, const Step& at) const;
  /// attend's paged step: rope at each token's position, the write into its slot, paged attention.
  Tensor attend_paged(const Tensor& q, const Tensor& k, const Tensor& v, size_t li,
                      const Step& at) const;
  // The tables of ropes[1..] for positions [0, max_position): a decode step picks its row on the
  // device (ropes[0]'s are the cache's).
  std::vector<std::pair<Tensor, Tensor>> extra_rope_tables_;
};

/// The pre-norm decoder with a SiLU-gated FFN, Llama's layout, which Qwen3 (with q/k norms),
/// Mistral and Phi-3 (with windows and long-rope in their configs) share: per layer
/// x += o(attend(rms_norm(x))), x += down(silu(gate) * up of rms_norm(x)); then the last rms_norm.
class PreNormDecoder : public Decoder {
 public:
  /// With the backend's decode plan where it gives one (Decoder::ask_for_plan).
  PreNormDecoder(DecoderConfig config, Weights weights, const Device& device, DType dtype);

 protected:
  Tensor hidden(const Tensor& ids, const Step& at) const override;
};

}  // namespace wick::models::decoder
