#include "idem/local_cache.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "idem/errors.h"

namespace idem {

namespace {

// Not noexcept on purpose: libstdc++ then keeps each node's hash in the node, so a lookup
// compares stored hashes and an erase finds its bucket without hashing keys again.
struct KeyHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
};

}  // namespace

// One map node per entry: the key, the response and the entry's LRU links, so a hit touches
// one node (plus its two list neighbours when it moves to the front).
struct LocalCache::Shard {
  struct Entry {
    std::string response;
    std::int64_t expires_ms = 0;
    const std::string* key = nullptr;  // the map's key of this node (nodes never move)
    Entry* prev = nullptr;             // circular LRU list through `head`
    Entry* next = nullptr;
  };

  Shard() noexcept { head.prev = head.next = &head; }

  void unlink(Entry& e) noexcept {
    e.prev->next = e.next;
    e.next->prev = e.prev;
  }
  void push_front(Entry& e) noexcept {
    e.prev = &head;
    e.next = head.next;
    head.next->prev = &e;
    head.next = &e;
  }
  void touch(Entry& e) noexcept {
    if (head.next == &e) return;
    unlink(e);
    push_front(e);
  }
  void remove(Entry& e) {
    unlink(e);
    index.erase(index.find(*e.key));  // by iterator: the key lives in the node being freed
  }

  mutable std::mutex mu;
  std::size_t capacity = 0;
  Entry head;  // sentinel: head.next is the most recently used entry, head.prev the least
  std::unordered_map<std::string, Entry, KeyHash, std::equal_to<>> index;
};

LocalCache::LocalCache(LocalCacheOptions options)
    : capacity_(options.max_entries),
      ttl_(options.ttl),
      clock_(options.clock ? std::move(options.clock) : steady_clock()),
      shard_shift_(0),
      shard_count_(options.shards) {
  if (shard_count_ == 0 || shard_count_ > 256 || !std::has_single_bit(shard_count_)) {
    throw ConfigError("idem: LocalCache shards must be a power of two in 1..256");
  }
  if (capacity_ < shard_count_) {
    throw ConfigError("idem: LocalCache max_entries must be at least the shard count");
  }
  if (capacity_ > kMaxEntries) {
    throw ConfigError("idem: LocalCache max_entries must be at most " +
                      std::to_string(kMaxEntries) + " (local_cache_capacity)");
  }
  if (ttl_.count() <= 0) throw ConfigError("idem: LocalCache ttl must be positive");
  shard_shift_ = 64 - static_cast<std::size_t>(std::countr_zero(shard_count_));
  shards_ = std::make_unique<Shard[]>(shard_count_);
  for (std::size_t i = 0; i < shard_count_; ++i) {
    shards_[i].capacity = capacity_ / shard_count_ + (i < capacity_ % shard_count_ ? 1 : 0);
    shards_[i].index.reserve(shards_[i].capacity);
  }
}

LocalCache::~LocalCache() = default;

LocalCache::Shard& LocalCache::shard_for(std::string_view key) const noexcept {
  if (shard_count_ == 1) return shards_[0];
  // Fibonacci hashing on the top bits, so the shard does not follow the bucket index.
  const std::uint64_t h = std::hash<std::string_view>{}(key)*0x9e3779b97f4a7c15ULL;
  return shards_[h >> shard_shift_];
}

std::optional<std::string> LocalCache::get(std::string_view key) {
  Shard& shard = shard_for(key);
  const std::int64_t now = clock_->now_ms();
  std::lock_guard lock(shard.mu);
  const auto found = shard.index.find(key);
  if (found == shard.index.end()) return std::nullopt;
  Shard::Entry& entry = found->second;
  if (entry.expires_ms <= now) {
    shard.remove(entry);
    return std::nullopt;
  }
  shard.touch(entry);
  return entry.response;
}

void LocalCache::put(std::string_view key, std::string response) {
  put(key, std::move(response), ttl_);
}

void LocalCache::put(std::string_view key, std::string response, std::chrono::milliseconds ttl) {
  Shard& shard = shard_for(key);
  const std::int64_t expires =
      clock_->now_ms() + std::clamp(ttl, std::chrono::milliseconds(0), ttl_).count();
  std::lock_guard lock(shard.mu);
  if (const auto found = shard.index.find(key); found != shard.index.end()) {
    Shard::Entry& entry = found->second;
    entry.response = std::move(response);
    entry.expires_ms = expires;
    shard.touch(entry);
    return;
  }
  if (shard.index.size() >= shard.capacity) shard.remove(*shard.head.prev);
  auto& [stored_key, entry] = *shard.index.try_emplace(std::string(key)).first;
  entry.response = std::move(response);
  entry.expires_ms = expires;
  entry.key = &stored_key;
  shard.push_front(entry);
}

bool LocalCache::erase(std::string_view key) {
  Shard& shard = shard_for(key);
  std::lock_guard lock(shard.mu);
  const auto found = shard.index.find(key);
  if (found == shard.index.end()) return false;
  shard.remove(found->second);
  return true;
}

std::size_t LocalCache::size() const {
  std::size_t total = 0;
  for (std::size_t i = 0; i < shard_count_; ++i) {
    std::lock_guard lock(shards_[i].mu);
    total += shards_[i].index.size();
  }
  return total;
}

}  // namespace idem
