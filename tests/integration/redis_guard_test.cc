// The Redis guard against a real redis-server (IDEM_TEST_REDIS_URL). Every test runs against
// both claim implementations (Lua script and SET NX GET) and uses its own key prefix.
#include "idem/redis_guard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "claim_methods.h"
#include "idem/errors.h"
#include "idem/key.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem {
namespace {

class RedisGuardTest : public ::testing::TestWithParam<ClaimMethod> {
 protected:
  // A guard on the shared server with a prefix unique to this test.
  RedisGuardOptions options(const std::string& url) const {
    RedisGuardOptions guard_options;
    guard_options.redis.url = url;
    guard_options.prefix = test::unique_name("guard");
    guard_options.claim_method = GetParam();
    return guard_options;
  }
};

bool is_owner_token(const std::string& token) {
  return token.size() == 32 && std::all_of(token.begin(), token.end(), [](char c) {
           return std::isxdigit(c) && !std::isupper(c);
         });
}

TEST_P(RedisGuardTest, FirstClaimOwnsTheKeyAndARetryIsRepeatSame) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  const ClaimResult first = guard.claim("u1:refund:o1", "req-1", "fp-a");
  EXPECT_EQ(first.status, ClaimStatus::kFirst);
  EXPECT_TRUE(is_owner_token(first.owner_token)) << first.owner_token;
  EXPECT_EQ(first.state, RecordState::kInProgress);

  const ClaimResult retry = guard.claim("u1:refund:o1", "req-1", "fp-a");
  EXPECT_EQ(retry.status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(retry.state, RecordState::kInProgress);
  EXPECT_TRUE(retry.owner_token.empty());
  EXPECT_TRUE(retry.fingerprint_matches);
  EXPECT_FALSE(retry.response.has_value());

  const ClaimResult other = guard.claim("u1:refund:o1", "req-2", "fp-a");
  EXPECT_EQ(other.status, ClaimStatus::kRepeatOther);
  EXPECT_EQ(other.state, RecordState::kInProgress);
}

TEST_P(RedisGuardTest, ClaimSetsTheLeaseAsTtl) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url);
  guard_options.lease = std::chrono::seconds(50);
  RedisGuard guard(guard_options);
  ASSERT_EQ(guard.claim("k", "req-1", "").status, ClaimStatus::kFirst);
  const long ttl = std::stol(test::redis_cli(url, {"PTTL", guard.redis_key("k")}));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 50000);
}

TEST_P(RedisGuardTest, EmptyRequestIdIsNeverRepeatSame) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  ASSERT_EQ(guard.claim("k", "", "fp").status, ClaimStatus::kFirst);
  EXPECT_EQ(guard.claim("k", "", "fp").status, ClaimStatus::kRepeatOther);
}

TEST_P(RedisGuardTest, SixteenThreadsClaimingOneKeyGetExactlyOneFirst) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  std::atomic<int> firsts{0};
  std::atomic<int> repeats{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      const ClaimResult result = guard.claim("u:pay:o-16", "req-" + std::to_string(t), "fp");
      (result.status == ClaimStatus::kFirst ? firsts : repeats)++;
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(firsts.load(), 1);
  EXPECT_EQ(repeats.load(), 15);
}

TEST_P(RedisGuardTest, SixtyFourThreadsRacingOverAThousandKeysGetOneFirstPerKey) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url);
  guard_options.redis.pool_size = 16;
  RedisGuard guard(guard_options);
  constexpr int kThreads = 64;
  constexpr int kKeys = 1000;
  std::vector<std::atomic<int>> firsts(kKeys);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int> order(kKeys);
      for (int k = 0; k < kKeys; ++k) order[k] = k;
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(t)));
      for (const int k : order) {
        if (guard.claim("k" + std::to_string(k), "req-" + std::to_string(t), "").status ==
            ClaimStatus::kFirst) {
          ++firsts[k];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int k = 0; k < kKeys; ++k) ASSERT_EQ(firsts[k].load(), 1) << "key " << k;
}

TEST_P(RedisGuardTest, ReleaseNeverDeletesAnotherOwnersClaim) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  const ClaimResult first = guard.claim("k", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  // Another attempt of the same request ID does not own it either.
  EXPECT_FALSE(guard.release("k", std::string(32, '0')));
  EXPECT_FALSE(guard.release("k", ""));
  EXPECT_EQ(guard.claim("k", "req-1", "fp").status, ClaimStatus::kRepeatSame);

  EXPECT_TRUE(guard.release("k", first.owner_token));
  EXPECT_FALSE(guard.release("k", first.owner_token));
  EXPECT_EQ(guard.claim("k", "req-2", "fp").status, ClaimStatus::kFirst);
}

TEST_P(RedisGuardTest, CompleteThenClaimReplaysTheResponse) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url);
  guard_options.retention = std::chrono::hours(2);
  RedisGuard guard(guard_options);
  const ClaimResult first = guard.claim("k", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  const std::string response = std::string("{\"refund\":\"ok\"}\0\r\n:5:x", 22);
  EXPECT_TRUE(guard.complete("k", first.owner_token, response));

  const ClaimResult repeat = guard.claim("k", "req-2", "fp");
  EXPECT_EQ(repeat.status, ClaimStatus::kRepeatOther);
  EXPECT_EQ(repeat.state, RecordState::kCompleted);
  EXPECT_TRUE(repeat.fingerprint_matches);
  ASSERT_TRUE(repeat.response.has_value());
  EXPECT_EQ(*repeat.response, response);
  EXPECT_FALSE(repeat.response_sha256.has_value());

  const ClaimResult retry = guard.claim("k", "req-1", "fp");
  EXPECT_EQ(retry.status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(retry.state, RecordState::kCompleted);

  const long ttl = std::stol(test::redis_cli(url, {"PTTL", guard.redis_key("k")}));
  EXPECT_GT(ttl, 3600 * 1000);  // the retention replaced the 30 s lease
}

TEST_P(RedisGuardTest, OnlyTheOwnerCompletesAndACompletedRecordIsNeverReleased) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  const ClaimResult first = guard.claim("k", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  EXPECT_FALSE(guard.complete("k", std::string(32, 'a'), "forged"));
  EXPECT_FALSE(guard.complete("absent", first.owner_token, "x"));
  EXPECT_EQ(guard.claim("k", "req-2", "fp").state, RecordState::kInProgress);

  ASSERT_TRUE(guard.complete("k", first.owner_token, "done"));
  EXPECT_FALSE(guard.release("k", first.owner_token));
  EXPECT_FALSE(guard.renew("k", first.owner_token));
  const ClaimResult repeat = guard.claim("k", "req-2", "fp");
  EXPECT_EQ(repeat.state, RecordState::kCompleted);
  EXPECT_EQ(repeat.response, "done");
}

TEST_P(RedisGuardTest, FingerprintMismatchIsFlagged) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  ASSERT_EQ(guard.claim("k", "req-1", "fp-a").status, ClaimStatus::kFirst);
  const ClaimResult changed = guard.claim("k", "req-1", "fp-b");
  EXPECT_EQ(changed.status, ClaimStatus::kRepeatSame);
  EXPECT_FALSE(changed.fingerprint_matches);
  EXPECT_TRUE(guard.claim("k", "req-2", "fp-a").fingerprint_matches);
  EXPECT_TRUE(guard.claim("k", "req-2", "").fingerprint_matches);  // no fingerprint: no verdict
}

TEST_P(RedisGuardTest, ResponseOverTheCapIsStoredAsItsSha256Only) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url);
  guard_options.max_response_bytes = 9;
  RedisGuard guard(guard_options);
  const ClaimResult small = guard.claim("small", "req-1", "");
  const ClaimResult large = guard.claim("large", "req-1", "");
  ASSERT_TRUE(guard.complete("small", small.owner_token, "012345678"));
  ASSERT_TRUE(guard.complete("large", large.owner_token, "0123456789"));

  EXPECT_EQ(guard.claim("small", "req-2", "").response, "012345678");
  const ClaimResult repeat = guard.claim("large", "req-2", "");
  EXPECT_EQ(repeat.state, RecordState::kCompleted);
  EXPECT_FALSE(repeat.response.has_value());
  EXPECT_EQ(repeat.response_sha256,
            "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882");
}

TEST_P(RedisGuardTest, RenewExtendsOnlyTheOwnersLease) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url);
  guard_options.lease = std::chrono::seconds(10);
  RedisGuard guard(guard_options);
  const ClaimResult first = guard.claim("k", "req-1", "");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  EXPECT_FALSE(guard.renew("k", std::string(32, 'b'), std::chrono::hours(1)));
  EXPECT_LE(std::stol(test::redis_cli(url, {"PTTL", guard.redis_key("k")})), 10000);
  EXPECT_TRUE(guard.renew("k", first.owner_token, std::chrono::hours(1)));
  EXPECT_GT(std::stol(test::redis_cli(url, {"PTTL", guard.redis_key("k")})), 10000);
  EXPECT_FALSE(guard.renew("absent", first.owner_token));
  EXPECT_THROW((void)guard.renew("k", first.owner_token, std::chrono::milliseconds(0)),
               ConfigError);
}

TEST_P(RedisGuardTest, ClaimBatchAnswersPerKeyInOrder) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  const ClaimResult done = guard.claim("done", "req-0", "fp");
  ASSERT_TRUE(guard.complete("done", done.owner_token, "stored"));

  const std::vector<ClaimResult> results = guard.claim_batch({
      {.key = "a", .request_id = "req-1", .fingerprint = "fp"},
      {.key = "b", .request_id = "req-2", .fingerprint = "fp"},
      {.key = "a", .request_id = "req-1", .fingerprint = "fp"},
      {.key = "done", .request_id = "req-3", .fingerprint = "other"},
  });
  ASSERT_EQ(results.size(), 4U);
  EXPECT_EQ(results[0].status, ClaimStatus::kFirst);
  EXPECT_EQ(results[1].status, ClaimStatus::kFirst);
  EXPECT_NE(results[0].owner_token, results[1].owner_token);
  EXPECT_EQ(results[2].status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(results[3].status, ClaimStatus::kRepeatOther);
  EXPECT_EQ(results[3].state, RecordState::kCompleted);
  EXPECT_EQ(results[3].response, "stored");
  EXPECT_FALSE(results[3].fingerprint_matches);
  EXPECT_TRUE(guard.release("a", results[0].owner_token));
  EXPECT_TRUE(guard.claim_batch({}).empty());
}

TEST_P(RedisGuardTest, OwnerTokensAreUniquePerAttempt) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  const ClaimResult a = guard.claim("k1", "req-1", "same payload");
  const ClaimResult b = guard.claim("k2", "req-1", "same payload");
  ASSERT_EQ(a.status, ClaimStatus::kFirst);
  ASSERT_EQ(b.status, ClaimStatus::kFirst);
  EXPECT_NE(a.owner_token, b.owner_token);
  EXPECT_FALSE(guard.release("k1", b.owner_token));
}

TEST_P(RedisGuardTest, KeysAreEscapedPrefixNamespaceAndKeyText) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url);
  guard_options.prefix = "app:{x}";
  guard_options.ns = "billing%";
  RedisGuard guard(guard_options);
  EXPECT_EQ(guard.redis_key("u1:refund:o1"), "app%3A%7Bx%7D:billing%25:u1:refund:o1");
  EXPECT_THROW((void)guard.redis_key(""), InvalidKey);
  EXPECT_THROW((void)guard.claim("", "req", ""), InvalidKey);
}

TEST_P(RedisGuardTest, DatabaseFromTheUrlIsSelected) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url.substr(0, url.rfind('/')) + "/3");
  RedisGuard guard(guard_options);
  ASSERT_EQ(guard.claim("k", "req", "").status, ClaimStatus::kFirst);
  EXPECT_EQ(test::redis_cli(url, {"-n", "3", "EXISTS", guard.redis_key("k")}), "1");
  EXPECT_EQ(test::redis_cli(url, {"EXISTS", guard.redis_key("k")}), "0");
}

TEST_P(RedisGuardTest, OnlyTheClaimsOwnerJournalsAStepAndTheJournalOutlivesARelease) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuardOptions guard_options = options(url);
  guard_options.retention = std::chrono::seconds(60);
  RedisGuard guard(guard_options);
  EXPECT_TRUE(guard.steps("u1:agent:run1").empty());
  const ClaimResult first = guard.claim("u1:agent:run1", "req-1", "");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  const JournaledStep llm{std::string(64, 'a'), "plan: book the 9:40 flight"};
  EXPECT_TRUE(guard.put_step("u1:agent:run1", first.owner_token, "llm", llm));
  EXPECT_FALSE(guard.put_step("u1:agent:run1", std::string(32, '0'), "tool", {"", "booked"}));

  ASSERT_TRUE(guard.release("u1:agent:run1", first.owner_token));
  EXPECT_FALSE(guard.put_step("u1:agent:run1", first.owner_token, "tool", {"", "booked"}))
      << "a released claim's owner is fenced out";
  const StepJournal journal = guard.steps("u1:agent:run1");
  ASSERT_EQ(journal.size(), 1U);
  EXPECT_EQ(journal.at("llm").input_fingerprint, llm.input_fingerprint);
  EXPECT_EQ(journal.at("llm").result, llm.result);
  const std::string journal_key = "{" + guard.redis_key("u1:agent:run1") + "}:steps";
  const long ttl = std::stol(test::redis_cli(url, {"PTTL", journal_key}));
  EXPECT_GT(ttl, 50000);
  EXPECT_LE(ttl, 60000);

  const ClaimResult retry = guard.claim("u1:agent:run1", "req-1", "");
  ASSERT_EQ(retry.status, ClaimStatus::kFirst);
  EXPECT_TRUE(guard.put_step("u1:agent:run1", retry.owner_token, "tool", {"", "booked"}));
  EXPECT_TRUE(guard.complete("u1:agent:run1", retry.owner_token, "done"));
  EXPECT_FALSE(guard.put_step("u1:agent:run1", retry.owner_token, "late", {"", "x"}))
      << "a COMPLETED record takes no more steps";
  EXPECT_EQ(guard.steps("u1:agent:run1").size(), 2U);
}

TEST_P(RedisGuardTest, AJournalEntryIdemDidNotWriteIsAForeignRecord) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(options(url));
  const std::string journal_key = "{" + guard.redis_key("k") + "}:steps";
  (void)test::redis_cli(url, {"HSET", journal_key, "tool", "not an entry"});
  EXPECT_THROW((void)guard.steps("k"), ForeignRecord);
}

INSTANTIATE_TEST_SUITE_P(ClaimMethods, RedisGuardTest, test::all_claim_methods(),
                         test::claim_method_name);

TEST(RedisGuardOptions, InvalidOptionsAreConfigErrors) {
  const auto make = [](auto change) {
    RedisGuardOptions options;
    change(options);
    return RedisGuard(options);
  };
  EXPECT_THROW(make([](RedisGuardOptions& o) { o.redis.pool_size = 0; }), ConfigError);
  EXPECT_THROW(
      make([](RedisGuardOptions& o) { o.redis.command_timeout = std::chrono::milliseconds(0); }),
      ConfigError);
  EXPECT_THROW(make([](RedisGuardOptions& o) { o.redis.url = "http://localhost"; }), ConfigError);
  // rediss:// with a CA file that cannot be loaded fails here, not at the first claim.
  EXPECT_THROW(make([](RedisGuardOptions& o) {
                 o.redis.url = "rediss://localhost:6380/0?ca_file=/nonexistent/ca.pem";
               }),
               ConfigError);
  EXPECT_THROW(make([](RedisGuardOptions& o) { o.lease = std::chrono::milliseconds(-1); }),
               ConfigError);
  EXPECT_THROW(make([](RedisGuardOptions& o) { o.retention = std::chrono::milliseconds(0); }),
               ConfigError);
  EXPECT_THROW(make([](RedisGuardOptions& o) { o.ns = ""; }), ConfigError);
  EXPECT_THROW(make([](RedisGuardOptions& o) { o.prefix = ""; }), ConfigError);
  // Values past what hiredis or Redis accept are refused here: taken, they would fail every call
  // (the timeouts as retryable errors, so a guard with a sink would fail open for good).
  constexpr auto kMax = std::chrono::milliseconds::max();
  EXPECT_THROW(make([&](RedisGuardOptions& o) { o.redis.connect_timeout = kMax; }), ConfigError);
  EXPECT_THROW(make([&](RedisGuardOptions& o) { o.redis.command_timeout = kMax; }), ConfigError);
  EXPECT_THROW(make([&](RedisGuardOptions& o) { o.lease = kMax; }), ConfigError);
  EXPECT_THROW(make([&](RedisGuardOptions& o) { o.retention = kMax; }), ConfigError);
  // A durable write's reply comes after its WAIT: within the command timeout, or the connection
  // is dropped as timed out.
  EXPECT_THROW(make([](RedisGuardOptions& o) {
                 o.min_replicas = 1;
                 o.replication_timeout = std::chrono::milliseconds(0);
               }),
               ConfigError);
  EXPECT_THROW(make([](RedisGuardOptions& o) {
                 o.min_replicas = 1;
                 o.replication_timeout = o.redis.command_timeout;
               }),
               ConfigError);
  EXPECT_NO_THROW(make([](RedisGuardOptions& o) { o.min_replicas = 1; }));
  EXPECT_NO_THROW(make([](RedisGuardOptions&) {}));
}

}  // namespace
}  // namespace idem
