#pragma once
// The paged key/value cache of a causal language model served to many sequences at once
// (wick/serve.h): one pool of fixed-size pages per layer, each sequence's positions spread over
// the pages its page table names, and the ragged batch a step runs over them.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "wick/tensor.h"

namespace wick::models {

/// Keys and values of every layer in `pages` pages of `page_size` positions. Made by
/// CausalLM::make_paged_cache; written by CausalLM::forward_paged at the positions the batch
/// names. Not for concurrent use by several threads.
class PagedKvCache {
 public:
  PagedKvCache() = default;
  /// Zero-filled pools of `layers` layers, each (pages, kv_heads, page_size, head_dim) in `dtype`
  /// on `device`; `cos` and `sin` (positions, r / 2) the rope tables of the positions a sequence
  /// may reach, for the first r dims of a head that rotate (r = head_dim but for partial rotary),
  /// or empty handles for a model that keeps its own. Throws Error when pages or page_size is 0.
  static PagedKvCache allocate(size_t layers, size_t pages, size_t page_size, size_t kv_heads,
                               size_t head_dim, DType dtype, const Device& device, Tensor cos = {},
                               Tensor sin = {});

  size_t layers() const { return k_.size(); }
  size_t pages() const { return pages_; }
  size_t page_size() const { return page_size_; }
  /// (pages, kv_heads, page_size, head_dim) of layer `i`.
  const Tensor& k(size_t layer) const { return k_.at(layer); }
  const Tensor& v(size_t layer) const { return v_.at(layer); }
  const Tensor& cos() const { return cos_; }
  const Tensor& sin() const { return sin_; }
  /// Bytes of one page over all layers (keys and values).
  size_t page_bytes() const;
  size_t bytes() const { return page_bytes() * pages_; }

 private:
  size_t pages_ = 0, page_size_ = 0;
  std::vector<Tensor> k_, v_;
  Tensor cos_, sin_;
};

/// One step over several sequences (a ragged batch): each sequence brings `tokens.size()` new
/// tokens (a prefill chunk, or one decode token) placed after `cached` positions whose keys and
/// values are already in the pages of `pages` (the sequence's page table: position p lives in
/// page pages[p / page_size] at row p % page_size). The table covers cached + tokens.size()
/// positions.
struct PagedSequence {
  std::vector<uint32_t> tokens;
  size_t cached = 0;
  std::vector<uint32_t> pages;
};

/// Bytes of one page of a pool for `layers` layers of `kv_heads` x `head_dim` in `dtype`.
size_t paged_page_bytes(size_t layers, size_t page_size, size_t kv_heads, size_t head_dim,
                        DType dtype);

}  // namespace wick::models
