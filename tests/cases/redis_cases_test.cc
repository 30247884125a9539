// ../shared/cases/CASES.md, the Redis guard's part: C02 (guard), C03, C04, C13 (guard).
// Each case runs against both claim implementations where it applies. Leases are scaled down
// (C02: 5 s → 1.5 s, C03: 1 s) and the tests wait for Redis' own expiry instead of sleeping
// fixed times.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "idem/key.h"
#include "idem/redis_guard.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem {
namespace {

using std::chrono::milliseconds;

RedisGuardOptions guard_options(const std::string& url, ClaimMethod method, milliseconds lease) {
  RedisGuardOptions options;
  options.redis.url = url;
  options.prefix = test::unique_name("cases");
  options.claim_method = method;
  options.lease = lease;
  return options;
}

// Waits (bounded) until Redis itself has expired `redis_key`.
void wait_until_expired(const std::string& url, const std::string& redis_key) {
  for (int i = 0; i < 400 && test::redis_cli(url, {"EXISTS", redis_key}) != "0"; ++i) {
    std::this_thread::sleep_for(milliseconds(25));
  }
  ASSERT_EQ(test::redis_cli(url, {"EXISTS", redis_key}), "0") << "lease never ended";
}

// How often SCRIPT LOAD ran on the server since its start (INFO commandstats).
int script_loads(const test::RedisServer& server) {
  const std::string stats = server.cli({"INFO", "commandstats"});
  const std::string field = "cmdstat_script|load:calls=";
  const auto at = stats.find(field);
  return at == std::string::npos ? 0 : std::stoi(stats.substr(at + field.size()));
}

constexpr ClaimMethod kMethods[] = {ClaimMethod::kLuaScript, ClaimMethod::kSetNxGet};

TEST(Cases, C02_CrashLeavesTheClaimInProgress_Guard) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  for (const ClaimMethod method : kMethods) {
    RedisGuard guard(guard_options(url, method, milliseconds(1500)));
    const std::string key = IdempotencyKey{"u-1", "refund", "order-2"}.encode();
    ASSERT_EQ(guard.claim(key, "req-1", "fp").status, ClaimStatus::kFirst);
    // The worker is killed here: no complete, no release.

    const ClaimResult during_lease = guard.claim(key, "req-1", "fp");
    EXPECT_EQ(during_lease.status, ClaimStatus::kRepeatSame);
    EXPECT_EQ(during_lease.state, RecordState::kInProgress);  // never told it succeeded
    EXPECT_FALSE(during_lease.response.has_value());
    EXPECT_TRUE(during_lease.owner_token.empty());

    wait_until_expired(url, guard.redis_key(key));
    const ClaimResult after_lease = guard.claim(key, "req-1", "fp");
    EXPECT_EQ(after_lease.status, ClaimStatus::kFirst);
    EXPECT_FALSE(after_lease.owner_token.empty());
  }
}

TEST(Cases, C03_ReleaseNeverDeletesAnotherOwnersClaim) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  for (const ClaimMethod method : kMethods) {
    RedisGuard guard(guard_options(url, method, milliseconds(1000)));
    const std::string key = IdempotencyKey{"u-1", "pay", "order-3"}.encode();
    // A and B are two attempts of the same request with the same payload.
    const ClaimResult a = guard.claim(key, "req-1", "fp-same");
    ASSERT_EQ(a.status, ClaimStatus::kFirst);
    wait_until_expired(url, guard.redis_key(key));  // A's handler outlives its lease
    const ClaimResult b = guard.claim(key, "req-1", "fp-same");
    ASSERT_EQ(b.status, ClaimStatus::kFirst);
    EXPECT_NE(a.owner_token, b.owner_token);

    EXPECT_FALSE(guard.release(key, a.owner_token));  // A's handler throws: deletes nothing

    const ClaimResult c = guard.claim(key, "req-1", "fp-same");
    EXPECT_EQ(c.status, ClaimStatus::kRepeatSame);
    EXPECT_EQ(c.state, RecordState::kInProgress);
    EXPECT_TRUE(guard.release(key, b.owner_token));  // B still owns it
  }
}

TEST(Cases, C04_NoscriptAfterScriptFlushReloadsOnceAndRetries) {
  test::RedisServer server;
  RedisGuard guard(guard_options(server.url(), ClaimMethod::kLuaScript, milliseconds(30000)));
  ASSERT_EQ(guard.claim("u:i:k", "req-1", "fp").status, ClaimStatus::kFirst);
  ASSERT_EQ(script_loads(server), 1);  // the first EVALSHA found no script: loaded once

  server.cli({"SCRIPT", "FLUSH"});
  const ClaimResult again = guard.claim("u:i:k", "req-1", "fp");
  EXPECT_EQ(again.status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(again.state, RecordState::kInProgress);
  EXPECT_EQ(script_loads(server), 2);  // exactly one transparent reload

  server.cli({"SCRIPT", "FLUSH"});
  const std::vector<ClaimResult> batch = guard.claim_batch(
      {{.key = "u:i:k", .request_id = "req-1"}, {.key = "u:i:k2", .request_id = "req-1"}});
  EXPECT_EQ(batch[0].status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(batch[1].status, ClaimStatus::kFirst);
  EXPECT_EQ(script_loads(server), 3);
}

TEST(Cases, C04_NoscriptAfterRestartWithPersistenceReloadsOnceAndRetries) {
  test::RedisServer server(/*persistent=*/true);
  RedisGuard guard(guard_options(server.url(), ClaimMethod::kLuaScript, milliseconds(30000)));
  ASSERT_EQ(guard.claim("u:i:k", "req-1", "fp").status, ClaimStatus::kFirst);

  server.restart();  // the record survives (AOF), the script cache does not
  ASSERT_EQ(script_loads(server), 0);
  const ClaimResult again = guard.claim("u:i:k", "req-1", "fp");
  EXPECT_EQ(again.status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(again.state, RecordState::kInProgress);
  EXPECT_EQ(script_loads(server), 1);
}

TEST(Cases, C13_SeparatorsNeverLetDifferentKeysCollide_Guard) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  for (const ClaimMethod method : kMethods) {
    RedisGuard guard(guard_options(url, method, milliseconds(30000)));
    const std::string first = IdempotencyKey{"u1:pay", "x", "o1"}.encode();
    const std::string second = IdempotencyKey{"u1", "pay:x", "o1"}.encode();
    EXPECT_NE(guard.redis_key(first), guard.redis_key(second));
    EXPECT_EQ(guard.claim(first, "req-1", "fp").status, ClaimStatus::kFirst);
    EXPECT_EQ(guard.claim(second, "req-2", "fp").status, ClaimStatus::kFirst);

    // Each pair: a biz key with a special byte and the text its escape would produce.
    for (const std::string biz : {"o{1}", "o%7B1%7D", "o%1", "o%251", "o\n1", "o%0A1", "o}1"}) {
      const std::string redis_key = guard.redis_key(IdempotencyKey{"u1", "pay", biz}.encode());
      EXPECT_EQ(redis_key.find_first_of("{}\n"), std::string::npos) << redis_key;
      EXPECT_EQ(guard.claim(IdempotencyKey{"u1", "pay", biz}.encode(), "req-" + biz, "fp").status,
                ClaimStatus::kFirst)
          << biz;
    }
  }
}

}  // namespace
}  // namespace idem
