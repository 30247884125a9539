#include "idem/local_cache.h"

#include <bit>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <unordered_map>

#include "idem/errors.h"

namespace idem {

struct LocalCache::Shard {
  struct Entry {
    std::string key;
    std::string response;
    std::int64_t expires_ms;
  };
  using List = std::list<Entry>;

  mutable std::mutex mu;
  std::size_t capacity = 0;
  List lru;                                                    // front: most recently used
  std::unordered_map<std::string_view, List::iterator> index;  // views into Entry::key

  void remove(List::iterator it) {
    index.erase(it->key);
    lru.erase(it);
  }
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
  const auto it = found->second;
  if (it->expires_ms <= now) {
    shard.remove(it);
    return std::nullopt;
  }
  shard.lru.splice(shard.lru.begin(), shard.lru, it);
  return it->response;
}

void LocalCache::put(std::string_view key, std::string response) {
  Shard& shard = shard_for(key);
  const std::int64_t expires = clock_->now_ms() + ttl_.count();
  std::lock_guard lock(shard.mu);
  if (const auto found = shard.index.find(key); found != shard.index.end()) {
    const auto it = found->second;
    it->response = std::move(response);
    it->expires_ms = expires;
    shard.lru.splice(shard.lru.begin(), shard.lru, it);
    return;
  }
  if (shard.lru.size() >= shard.capacity) shard.remove(std::prev(shard.lru.end()));
  shard.lru.push_front(Shard::Entry{std::string(key), std::move(response), expires});
  shard.index.emplace(shard.lru.front().key, shard.lru.begin());
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
    total += shards_[i].lru.size();
  }
  return total;
}

}  // namespace idem
