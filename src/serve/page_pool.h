#pragma once
// The bookkeeping of the paged KV cache's pages: which are free, how many sequences hold each,
// and the prefix cache (full pages found again by the tokens they hold and every token before
// them). The keys and values themselves live in models::PagedKvCache; the engine thread alone
// uses a PagePool.

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace wick::serve {

class PagePool {
 public:
  explicit PagePool(size_t pages, bool prefix_caching);

  /// The hash of a full page of `tokens` after the pages whose chain hash is `previous` (0 for the
  /// first page): equal chains mean equal tokens from position 0 on.
  static uint64_t chain_hash(uint64_t previous, const uint32_t* tokens, size_t count);

  /// A page for one holder, or none when every page is held. A free page first, else the least
  /// recently released page of the prefix cache (forgotten by it).
  std::optional<uint32_t> allocate();
  /// The cached page holding the chain `hash`, now held once more; none when not cached.
  std::optional<uint32_t> lookup(uint64_t hash);
  /// Makes a held, full page findable by `hash` (nothing when caching is off, or when another
  /// page holds that chain already).
  void publish(uint32_t page, uint64_t hash);
  /// One holder lets go; a page nobody holds becomes free (or stays cached, evictable).
  void release(uint32_t page);

  size_t total() const { return refs_.size(); }
  /// Pages some sequence holds.
  size_t used() const { return used_; }
  /// Pages allocate() can hand out (free and evictable cached ones).
  size_t available() const { return total() - used_; }
  /// Pages of the prefix cache (held or not).
  size_t cached() const { return by_hash_.size(); }
  uint32_t holders(uint32_t page) const { return refs_.at(page); }

 private:
  bool caching_;
  std::vector<uint32_t> refs_;
  std::vector<uint32_t> free_;
  size_t used_ = 0;
  std::unordered_map<uint64_t, uint32_t> by_hash_;
  std::vector<std::optional<uint64_t>> hash_of_;
  std::list<uint32_t> evictable_;  // cached pages nobody holds, least recently released first
  std::vector<std::list<uint32_t>::iterator> evictable_at_;
  std::vector<bool> is_evictable_;
};

}  // namespace wick::serve
