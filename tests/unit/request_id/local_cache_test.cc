#include "idem/local_cache.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/errors.h"

// Live heap bytes of this process (allocator chunks, header included), so the memory-per-entry
// test measures what the cache really costs, rounding included. Every form that a library of this
// binary may pair with the replaced operator delete is replaced too: simdjson allocates with the
// nothrow form, and a nothrow new from the sanitizer's allocator freed here was an ASan
// alloc-dealloc mismatch (and a live-byte count that went below zero).
namespace {
std::atomic<long long> g_live_bytes{0};
std::size_t chunk_size(void* p) { return malloc_usable_size(p) + sizeof(std::size_t); }
}  // namespace

void* operator new(std::size_t size) {
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  g_live_bytes += static_cast<long long>(chunk_size(p));
  return p;
}
void operator delete(void* p) noexcept {
  if (p == nullptr) return;
  g_live_bytes -= static_cast<long long>(chunk_size(p));
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  try {
    return operator new(size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}
void operator delete(void* p, const std::nothrow_t&) noexcept { operator delete(p); }

namespace idem {
namespace {

std::shared_ptr<ManualClock> clock_at(std::int64_t ms) { return std::make_shared<ManualClock>(ms); }

LocalCacheOptions options(std::size_t max_entries, std::size_t shards,
                          std::shared_ptr<Clock> clock = nullptr,
                          std::chrono::milliseconds ttl = std::chrono::milliseconds(60000)) {
  LocalCacheOptions o;
  o.max_entries = max_entries;
  o.shards = shards;
  o.clock = std::move(clock);
  o.ttl = ttl;
  return o;
}

TEST(LocalCache, ReturnsStoredResponseUntilTtlThenForgets) {
  auto clock = clock_at(1000);
  LocalCache cache(options(16, 4, clock, std::chrono::milliseconds(50)));
  cache.put("req-1", "response-1");
  EXPECT_EQ(cache.get("req-1"), "response-1");
  EXPECT_EQ(cache.get("req-2"), std::nullopt);
  clock->set_ms(1049);
  EXPECT_EQ(cache.get("req-1"), "response-1");  // a get does not extend the TTL
  clock->set_ms(1050);
  EXPECT_EQ(cache.get("req-1"), std::nullopt);
  EXPECT_EQ(cache.size(), 0U);  // the expired entry was removed
}

TEST(LocalCache, PutReplacesAndRestartsTtl) {
  auto clock = clock_at(0);
  LocalCache cache(options(4, 1, clock, std::chrono::milliseconds(10)));
  cache.put("k", "old");
  clock->set_ms(8);
  cache.put("k", "new");
  clock->set_ms(15);
  EXPECT_EQ(cache.get("k"), "new");
  EXPECT_EQ(cache.size(), 1U);
}

TEST(LocalCache, EvictsLeastRecentlyUsedWhenFull) {
  LocalCache cache(options(3, 1, clock_at(0)));
  cache.put("a", "1");
  cache.put("b", "2");
  cache.put("c", "3");
  ASSERT_EQ(cache.get("a"), "1");  // a is now the most recent; b the least
  cache.put("d", "4");
  EXPECT_EQ(cache.get("b"), std::nullopt);
  EXPECT_EQ(cache.get("a"), "1");
  EXPECT_EQ(cache.get("c"), "3");
  EXPECT_EQ(cache.get("d"), "4");
  EXPECT_EQ(cache.size(), 3U);
}

TEST(LocalCache, PutOfAnExistingKeyMakesItMostRecent) {
  LocalCache cache(options(3, 1, clock_at(0)));
  cache.put("a", "1");
  cache.put("b", "2");
  cache.put("c", "3");
  cache.put("a", "1b");
  cache.put("d", "4");  // evicts b, now the least recently used
  EXPECT_EQ(cache.get("b"), std::nullopt);
  EXPECT_EQ(cache.get("a"), "1b");
  cache.put("e", "5");  // evicts c
  EXPECT_EQ(cache.get("c"), std::nullopt);
  EXPECT_EQ(cache.get("d"), "4");
  EXPECT_EQ(cache.size(), 3U);
}

TEST(LocalCache, NeverHoldsMoreThanMaxEntries) {
  LocalCache cache(options(100, 8, clock_at(0)));
  for (int i = 0; i < 10000; ++i) cache.put("key-" + std::to_string(i), "r");
  EXPECT_LE(cache.size(), 100U);
  EXPECT_GT(cache.size(), 50U);  // the shards share the load
  EXPECT_EQ(cache.capacity(), 100U);
  EXPECT_EQ(cache.get("key-9999"), "r");  // the newest entry is always kept
}

TEST(LocalCache, EraseRemoves) {
  LocalCache cache(options(8, 2, clock_at(0)));
  cache.put("k", "v");
  EXPECT_TRUE(cache.erase("k"));
  EXPECT_FALSE(cache.erase("k"));
  EXPECT_EQ(cache.get("k"), std::nullopt);
}

TEST(LocalCache, RejectsBadOptions) {
  EXPECT_THROW(LocalCache(options(4, 8)), ConfigError);
  EXPECT_THROW(LocalCache(options(64, 3)), ConfigError);
  EXPECT_THROW(LocalCache(options(64, 0)), ConfigError);
  EXPECT_THROW(LocalCache(options(1024, 512)), ConfigError);
  EXPECT_THROW(LocalCache(options(64, 1, nullptr, std::chrono::milliseconds(0))), ConfigError);
  // A capacity no machine can hold is a ConfigError, not std::bad_alloc from the constructor.
  EXPECT_THROW(LocalCache(options(LocalCache::kMaxEntries + 1, 16)), ConfigError);
  EXPECT_THROW(LocalCache(options(SIZE_MAX, 16)), ConfigError);
}

TEST(LocalCache, MemoryPerEntryStaysWithinTheDocumentedBound) {
  constexpr std::size_t kEntries = 10000;
  // Room to spare, so the uneven spread over the shards evicts nothing.
  LocalCache cache(options(2 * kEntries, 16, clock_at(0)));
  // Keys of UUID length (36 bytes, on the heap) and short responses (inline).
  std::vector<std::string> keys;
  keys.reserve(kEntries);
  for (std::size_t i = 0; i < kEntries; ++i) {
    keys.push_back("0190b6a4-6c3e-7d2a-8f00-" + std::to_string(100000000000 + i));
  }
  const long long before = g_live_bytes.load();
  for (const auto& key : keys) cache.put(key, "ok");
  const long long used = g_live_bytes.load() - before;
  ASSERT_EQ(cache.size(), kEntries);
  RecordProperty("heap_bytes_per_entry", static_cast<int>(used / static_cast<long long>(kEntries)));
  const std::size_t bound =
      kEntries * (LocalCache::kEntryOverheadBytes + 36 + LocalCache::kLongStringOverheadBytes);
  EXPECT_GT(used, 0);
  EXPECT_LE(static_cast<std::size_t>(used), bound);
  // And a long response costs its length plus the documented overhead, no more.
  const long long before_long = g_live_bytes.load();
  cache.put(keys[0], std::string(1000, 'r'));
  EXPECT_LE(g_live_bytes.load() - before_long,
            static_cast<long long>(1000 + LocalCache::kLongStringOverheadBytes));
}

TEST(LocalCache, ConcurrentPutsAndGetsKeepEveryAnswerRight) {
  LocalCache cache(options(1024, 8, clock_at(0)));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; ++i) {
        const std::string key = std::to_string(t) + ":" + std::to_string(i % 300);
        cache.put(key, key + "=r");
        const auto got = cache.get(key);
        if (got && *got != key + "=r") ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(cache.size(), 1024U);
}

}  // namespace
}  // namespace idem
