// Layer 1 (the request-ID layer)'s in-process cache of recently completed keys and their stored
// responses, so a repeat that reaches the same process is answered without a network hop.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/export.h"

namespace idem {

/// Options of a LocalCache; validated by its constructor (idem::ConfigError).
struct LocalCacheOptions {
  /// Most entries held at once, >= `shards` and <= LocalCache::kMaxEntries. Split evenly
  /// across the shards: each shard evicts its least recently used entry when full. Default
  /// 10 000.
  std::size_t max_entries = 10000;
  /// How long an entry is answered after its put(), in ms (a get() does not extend it); > 0.
  /// Default 60 s. Keep it shorter than the Redis retention so this layer never replays what
  /// the shared layers have forgotten.
  std::chrono::milliseconds ttl{60000};
  /// Independently locked shards: a power of two, 1–256. Default 16.
  std::size_t shards = 16;
  /// Time source for expiry; null means steady_clock() (monotonic, immune to wall-clock steps).
  std::shared_ptr<Clock> clock{};
};

/// A bounded, expiring, sharded LRU map from request ID (or idempotency key) to the stored
/// response of its completed execution. Thread-safe: each shard has its own mutex, so
/// lookups of keys in different shards do not contend.
///
/// Memory: the hash buckets cost 8 bytes x max_entries from construction; each entry then
/// costs at most kEntryOverheadBytes, plus, for a key or response longer than 15 bytes, its
/// length + kLongStringOverheadBytes (std::string keeps up to 15 bytes inline).
class IDEM_EXPORT LocalCache {
 public:
  /// Upper bound of the heap bytes of one entry beyond its key and response: one hash-map
  /// node holding the key, the response, the expiry and the LRU links (allocator rounding
  /// included).
  static constexpr std::size_t kEntryOverheadBytes = 128;
  /// Upper bound of the extra heap bytes of a key or response longer than 15 bytes, beyond
  /// its length (terminating NUL and allocator rounding).
  static constexpr std::size_t kLongStringOverheadBytes = 24;
  /// The largest max_entries: 2^27 entries, whose hash buckets alone take 1 GiB.
  static constexpr std::size_t kMaxEntries = std::size_t{1} << 27;

  /// Throws idem::ConfigError for max_entries < shards or > kMaxEntries, ttl <= 0 or a bad
  /// shard count.
  explicit LocalCache(LocalCacheOptions options = {});
  ~LocalCache();
  LocalCache(const LocalCache&) = delete;
  LocalCache& operator=(const LocalCache&) = delete;

  /// The stored response for `key` if it was put less than `ttl` ago and not evicted; marks
  /// it most recently used. An expired entry is removed and std::nullopt returned.
  [[nodiscard]] std::optional<std::string> get(std::string_view key);

  /// Stores (or replaces) the response for `key`, expiring `ttl` from now, as the most
  /// recently used entry of its shard; evicts that shard's least recently used entry when
  /// the shard is full.
  void put(std::string_view key, std::string response);

  /// As put(key, response), expiring after `ttl` (ms) instead, but never later than the cache's
  /// own ttl (a `ttl` ≤ 0 stores an entry that is already expired): for an entry whose record
  /// is kept shorter than the cache's ttl, such as a fallback key's.
  void put(std::string_view key, std::string response, std::chrono::milliseconds ttl);

  /// Removes `key`; returns whether it was present (expired or not).
  bool erase(std::string_view key);

  /// Entries held, expired ones not yet removed included.
  [[nodiscard]] std::size_t size() const;

  /// The max_entries it was built with.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

 private:
  struct Shard;
  Shard& shard_for(std::string_view key) const noexcept;

  std::size_t capacity_;
  std::chrono::milliseconds ttl_;
  std::shared_ptr<Clock> clock_;
  std::size_t shard_shift_;
  std::unique_ptr<Shard[]> shards_;
  std::size_t shard_count_;
};

}  // namespace idem
