#include "models/tokenizer_models.h"

#include <algorithm>
#include <cstdio>

#include "models/tokenizer_pipeline.h"
#include "models/tokenizer_unicode.h"
#include "wick/tokenizer.h"

namespace wick::tok {

void Vocab::add(std::string token, uint32_t id) {
  if (id >= tokens.size()) tokens.resize(static_cast<size_t>(id) + 1);
  tokens[id] = token;
  ids.insert_or_assign(std::move(token), id);
}

// ---------------------------------------------------------------------------------------------
// WordPiece: greedy longest match from the left, "##" before pieces inside a word.

WordPiece::WordPiece(Vocab vocab, const std::string& unk_token, std::string prefix,
                     size_t max_chars)
    : prefix_(std::move(prefix)), max_chars_(max_chars) {
  vocab_ = std::move(vocab);
  auto unk = vocab_.find(unk_token);
  if (!unk) {
    throw TokenizerError("tokenizer.json: WordPiece unk_token '" + unk_token +
                         "' is not in the vocabulary");
  }
  unk_ = *unk;
  for (const auto& [token, id] : vocab_.ids)
    max_token_bytes_ = std::max(max_token_bytes_, token.size());
}

void WordPiece::tokenize(std::string_view piece, std::vector<uint32_t>& out) const {
  if (count_code_points(piece) > max_chars_) {
    out.push_back(unk_);
    return;
  }
  thread_local std::string candidate;
  size_t mark = out.size();
  for (size_t start = 0; start < piece.size();) {
    // Candidates start no longer than the longest token, at a code point boundary: a word of n
    // characters costs n times the longest token, not n^2.
    size_t room = max_token_bytes_ - std::min(max_token_bytes_, start > 0 ? prefix_.size() : 0);
    size_t end = piece.size() - start > room ? start + room : piece.size();
    while (end > start && end < piece.size() && (static_cast<uint8_t>(piece[end]) & 0xC0) == 0x80) {
      --end;
    }
    std::optional<uint32_t> found;
    while (start < end) {
      candidate.clear();
      if (start > 0) candidate += prefix_;
      candidate.append(piece.substr(start, end - start));
      found = vocab_.find(candidate);
      if (found) break;
      // Drop the last character.
      do {
        --end;
      } while (end > start && (static_cast<uint8_t>(piece[end]) & 0xC0) == 0x80);
    }
    if (!found) {
      out.resize(mark);
      out.push_back(unk_);
      return;
    }
    out.push_back(*found);
    start = end;
  }
}

// ---------------------------------------------------------------------------------------------
// BPE

namespace {

uint64_t pair_key(uint32_t left, uint32_t right) {
  return (static_cast<uint64_t>(left) << 32) | right;
}

// Pieces longer than this are not cached: they are rare and would fill the cache.
constexpr size_t kMaxCachedPiece = 64;
constexpr size_t kMaxCacheEntries = 200000;

}  // namespace

Bpe::Bpe(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
         BpeOptions options)
    : options_(std::move(options)) {
  vocab_ = std::move(vocab);
  if (options_.unk_token) {
    unk_ = vocab_.find(*options_.unk_token);
    if (!unk_) {
      throw TokenizerError("tokenizer.json: BPE unk_token '" + *options_.unk_token +
                           "' is not in the vocabulary");
    }
  }
  if (options_.byte_level) {
    byte_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      auto id = vocab_.find(byte_to_symbol(static_cast<uint8_t>(b)));
      if (id) byte_ids_[b] = *id;
    }
  }
  merges_.reserve(merges.size() * 2);
  const size_t prefix_len = options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto left_id = vocab_.find(left);
    auto right_id = vocab_.find(right);
    std::string merged = left + right.substr(std::min(prefix_len, right.size()));
    auto merged_id = vocab_.find(merged);
    if (!left_id || !right_id || !merged_id) {
      throw TokenizerError("tokenizer: BPE merge " + std::to_string(rank) + " ('" + left + "' '" +
                           right + "') uses a token missing from the vocabulary");
    }
    // A repeated pair keeps its last rank, as HF's map does when it is built.
    merges_.insert_or_assign(pair_key(*left_id, *right_id),
                             std::make_pair(static_cast<uint32_t>(rank), *merged_id));
  }
}

void Bpe::initial_symbols(std::string_view piece, std::vector<Symbol>& symbols) const {
  auto push = [&](uint32_t id, uint32_t bytes) {
    auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, bytes, n - 1, n + 1});
  };
  if (options_.byte_level && options_.continuing_subword_prefix.empty() &&
      options_.end_of_word_suffix.empty() && !options_.byte_fallback && !unk_) {
    // The common case: one symbol per byte; bytes the vocabulary lacks are dropped, as HF does.
    for (char c : piece) {
      int64_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) push(static_cast<uint32_t>(id), 1);
    }
  } else {
    // HF's merge_word: one symbol per character (per byte-level symbol), with the subword
    // prefix and word suffix, byte fallback, and (fused) unknown tokens.
    uint32_t pending_unk_bytes = 0;  // bytes of an unknown run not yet pushed (0: none)
    std::string s;
    for (size_t i = 0; i < piece.size();) {
      size_t start = i;
      if (options_.byte_level) {
        ++i;
      } else {
        next_code_point(piece, i);
      }
      auto byte_len = static_cast<uint32_t>(i - start);
      s.clear();
      if (start > 0) s += options_.continuing_subword_prefix;
      if (options_.byte_level) {
        s += byte_to_symbol(static_cast<uint8_t>(piece[start]));
      } else {
        s.append(piece.substr(start, i - start));
      }
      if (i == piece.size()) s += options_.end_of_word_suffix;
      if (auto id = vocab_.find(s)) {
        if (pending_unk_bytes) push(*unk_, pending_unk_bytes);
        pending_unk_bytes = 0;
        push(*id, byte_len);
        continue;
      }
      if (options_.byte_fallback) {
        std::vector<uint32_t> ids;
        for (char c : s) {
          char name[8];
          std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<uint8_t>(c));
          auto id = vocab_.find(name);
          if (!id) break;
          ids.push_back(*id);
        }
        if (ids.size() == s.size()) {
          for (uint32_t id : ids) push(id, 1);
          continue;
        }
      }
      if (unk_) {
        if (pending_unk_bytes && options_.fuse_unk) {
          pending_unk_bytes += byte_len;
        } else {
          if (pending_unk_bytes) push(*unk_, pending_unk_bytes);
          pending_unk_bytes = byte_len;
        }
      }
    }
    if (pending_unk_bytes) push(*unk_, pending_unk_bytes);
  }
  if (!symbols.empty()) symbols.back().next = -1;
}

void Bpe::merge(std::vector<Symbol>& symbols) const {
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    uint32_t merged;
    // Lowest rank first, then leftmost, as HF's heap orders them.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Candidate> heap;
  heap.clear();
  auto consider = [&](int32_t pos) {
    int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) {
      heap.push_back({it->second.first, pos, it->second.second});
      std::push_heap(heap.begin(), heap.end());
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.bytes == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.second != top.merged) continue;  // stale
    left.id = top.merged;
    left.bytes += right.bytes;
    right.bytes = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
}

void Bpe::tokenize(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.empty()) return;
  if (options_.ignore_merges) {
    std::optional<uint32_t> whole;
    if (options_.byte_level) {
      thread_local std::string symbols;
      symbols.clear();
      for (char c : piece) symbols += byte_to_symbol(static_cast<uint8_t>(c));
      whole = vocab_.find(symbols);
    } else {
      whole = vocab_.find(piece);
    }
    if (whole) {
      out.push_back(*whole);
      return;
    }
  }
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  initial_symbols(piece, symbols);
  merge(symbols);
  size_t mark = out.size();
  for (const Symbol& s : symbols) {
    if (s.bytes > 0) out.push_back(s.id);
  }
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<uint32_t>(out.begin() + mark, out.end()));
  }
}

}  // namespace wick::tok
