#pragma once
// The serving engine's decode-only steps (every sequence of the step feeding one token) as CUDA
// graphs: one per batch-size bucket (a power of two) and page-table width (a power of two of
// pages), captured at first use and replayed after. A step's inputs are packed in one U32 device
// buffer per graph, padded to the bucket's rows: the padding rows feed token 0 at position 0 of
// a table naming only the scratch page (a page no sequence holds), so they write there alone and
// their logits are dropped. The model reads every length and page from that buffer
// (CausalLM::forward_paged_tensors), so a replay sees each step's batch.

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "token_mailbox.h"
#include "wick/causal_lm.h"
#include "wick/cuda.h"

namespace wick::serve {

/// The smallest power of two >= n (n >= 1).
size_t decode_bucket(size_t n);

/// The packed inputs of a decode step of `batch` (one token each) padded to `bucket` rows and
/// tables of `width` pages: ids, positions, token_seq, slots and last (`bucket` each), then the
/// page table (bucket x width). Error for a sequence with other than one token, more sequences
/// than `bucket`, or a table wider than `width`.
std::vector<uint32_t> decode_inputs(const std::vector<models::PagedSequence>& batch, size_t bucket,
                                    size_t width, size_t page_size, uint32_t scratch_page);

class DecodeGraphs {
 public:
  /// Steps of `model` over `cache`, whose page `scratch_page` no sequence holds, with up to
  /// `max_batch` sequences a step. The model must have has_paged_tensors().
  DecodeGraphs(std::shared_ptr<const models::CausalLM> model, models::PagedKvCache& cache,
               uint32_t scratch_page, size_t max_batch);
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  /// Whether run() takes this batch: one token per sequence, at most max_batch sequences.
  bool fits(const std::vector<models::PagedSequence>& batch) const;
  /// The logits (batch.size(), vocab) of a decode step that fits: its graph replayed (captured
  /// first when new) when `replay`, otherwise the same padded inputs run eagerly. Checked as
  /// forward_paged checks a batch. The rows are a view of the graph's output: read them before
  /// the next run.
  Tensor run(const std::vector<models::PagedSequence>& batch, bool replay);
  /// Greedy decode steps queued on the device, their tokens not yet read (queue_greedy).
  struct QueuedSteps {
    size_t steps = 0, n = 0, bucket = 0;
    Tensor last;    // (bucket) U32: the last step's tokens, which the steps queued after feed
    Tensor tokens;  // (steps x bucket) U32
    std::shared_ptr<detail::PendingTokens> copy;  // on CUDA: the tokens on their way to the host
  };
  /// Queues `steps` greedy decode steps of a batch that fits, without a round trip to the host
  /// between them: each step feeds the argmax of the step before (in the logits' dtype, as
  /// Tensor::argmax gives it) at the next position; the first feeds the batch's tokens, or with
  /// `after` (steps queued before these, for the same sequences) the tokens of after's last step,
  /// the batch's own tokens then being placeholders. Each sequence's pages must hold positions up
  /// to cached + steps; step j's keys and values are at position cached + j. With `replay`, each
  /// step is the graph's replay, otherwise run eagerly without padding rows. Checked as run().
  QueuedSteps queue_greedy(const std::vector<models::PagedSequence>& batch, size_t steps,
                           bool replay, const QueuedSteps* after = nullptr);
  /// The tokens of queued steps: steps rows of n, step by step. Waits for those steps alone, not
  /// for the steps queued after them.
  static std::vector<uint32_t> read_greedy(const QueuedSteps& queued);
  /// read_greedy(queue_greedy(batch, steps, replay)).
  std::vector<uint32_t> run_greedy(const std::vector<models::PagedSequence>& batch, size_t steps,
                                   bool replay);
  /// Graphs captured so far.
  size_t graphs() const;

 private:
  struct Graph {
    Tensor input;   // the packed U32 inputs
    Tensor logits;  // (bucket, vocab), written by each replay
    CudaGraph graph;
  };
  models::PagedBatchTensors views(const Tensor& input, size_t bucket, size_t width) const;
  /// Checks the batch (its pages holding positions_ahead positions from each one's cached),
  /// writes its packed inputs, padded to its bucket where `pad`, into its graph's (made at first
  /// use); the graph's key in *key.
  Graph& prepare(const std::vector<models::PagedSequence>& batch, size_t positions_ahead, bool pad,
                 std::pair<size_t, size_t>* key);
  /// The graph's step: its replay (captured first when new), or the same inputs run eagerly.
  Tensor forward(Graph& g, const std::pair<size_t, size_t>& key, bool replay);

  std::shared_ptr<const models::CausalLM> model_;
  models::PagedKvCache* cache_;
  uint32_t scratch_;
  size_t max_batch_, max_width_;
  std::map<std::pair<size_t, size_t>, Graph> graphs_;  // by (bucket, width)
};

}  // namespace wick::serve
