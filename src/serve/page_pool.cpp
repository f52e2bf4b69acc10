#include "serve/page_pool.h"

#include "util.h"
#include "wick/error.h"

namespace wick::serve {

PagePool::PagePool(size_t pages, bool prefix_caching)
    : caching_(prefix_caching),
      refs_(pages, 0),
      hash_of_(pages),
      evictable_at_(pages),
      is_evictable_(pages, false) {
  free_.reserve(pages);
  // Handed out from the back: page 0 first.
  for (size_t i = pages; i-- > 0;) free_.push_back(static_cast<uint32_t>(i));
}

uint64_t PagePool::chain_hash(uint64_t previous, const uint32_t* tokens, size_t count) {
  // FNV-1a over the previous hash and the tokens, then a final mix.
  uint64_t h = 14695981039346656037ull ^ previous;
  h *= 1099511628211ull;
  for (size_t i = 0; i < count; ++i) {
    h ^= tokens[i];
    h *= 1099511628211ull;
  }
  h ^= h >> 31;
  h *= 0x7fb5d329728ea185ull;
  h ^= h >> 27;
  return h;
}

std::optional<uint32_t> PagePool::allocate() {
  uint32_t page;
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
  } else if (!evictable_.empty()) {
    page = evictable_.front();
    evictable_.pop_front();
    is_evictable_[page] = false;
    by_hash_.erase(*hash_of_[page]);
    hash_of_[page].reset();
  } else {
    return std::nullopt;
  }
  refs_[page] = 1;
  ++used_;
  return page;
}

std::optional<uint32_t> PagePool::lookup(uint64_t hash) {
  if (!caching_) return std::nullopt;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  const uint32_t page = it->second;
  if (refs_[page] == 0) {
    evictable_.erase(evictable_at_[page]);
    is_evictable_[page] = false;
    ++used_;
  }
  ++refs_[page];
  return page;
}

void PagePool::publish(uint32_t page, uint64_t hash) {
  if (!caching_ || hash_of_.at(page) || by_hash_.count(hash) != 0) return;
  by_hash_[hash] = page;
  hash_of_[page] = hash;
}

void PagePool::release(uint32_t page) {
  if (refs_.at(page) == 0) throw Error(str("PagePool::release: page ", page, " is not held"));
  if (--refs_[page] > 0) return;
  --used_;
  if (hash_of_[page]) {
    evictable_.push_back(page);
    evictable_at_[page] = std::prev(evictable_.end());
    is_evictable_[page] = true;
  } else {
    free_.push_back(page);
  }
}

}  // namespace wick::serve
