// Values under idem keys that idem did not write, or damaged ones (IDEM_TEST_REDIS_URL, both
// claim methods): another service's plain request ID, a hash, a record truncated as by a
// partial restore. Each is an idem::ForeignRecord and a counted metric, never a crash, never
// kFirst, and idem leaves the value as it was.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "claim_methods.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/metrics.h"
#include "idem/redis_guard.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem {
namespace {

class RedisForeignRecordTest : public ::testing::TestWithParam<ClaimMethod> {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
    url_ = url;
    RedisGuardOptions options;
    options.redis.url = url_;
    options.prefix = test::unique_name("foreign");
    options.claim_method = GetParam();
    options.metrics = metrics_;
    guard_ = std::make_shared<RedisGuard>(options);
  }

  std::string cli(const std::vector<std::string>& args) const {
    return test::redis_cli(url_, args);
  }

  // The claim of `key` must throw ForeignRecord and leave `expected` under the key.
  void expect_foreign_claim(const std::string& key, const std::string& expected) {
    EXPECT_THROW((void)guard_->claim(key, "req-new", "fp"), ForeignRecord) << key;
    EXPECT_EQ(cli({"GET", guard_->redis_key(key)}), expected);
  }

  std::string url_;
  std::shared_ptr<InProcessMetrics> metrics_ = std::make_shared<InProcessMetrics>();
  std::shared_ptr<RedisGuard> guard_;
};

TEST_P(RedisForeignRecordTest, AnotherServicesPlainValueIsForeignNotFirst) {
  ASSERT_EQ(cli({"SET", guard_->redis_key("u:refund:o-1"), "req-123"}), "OK");
  expect_foreign_claim("u:refund:o-1", "req-123");
  EXPECT_THROW((void)guard_->inspect("u:refund:o-1"), ForeignRecord);
  EXPECT_EQ(metrics_->foreign_records(), 2U);
  // An operator can remove it; then the key is claimable again.
  EXPECT_EQ(guard_->force_release("u:refund:o-1", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kReleased);
  EXPECT_EQ(guard_->claim("u:refund:o-1", "req-new", "fp").status, ClaimStatus::kFirst);
}

TEST_P(RedisForeignRecordTest, ATruncatedRecordIsForeign) {
  const ClaimResult first = guard_->claim("u:refund:o-2", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard_->complete("u:refund:o-2", first.owner_token, "a response"));
  const std::string key = guard_->redis_key("u:refund:o-2");
  const std::string whole = cli({"GET", key});
  for (const std::size_t size : {std::size_t{1}, std::size_t{20}, std::size_t{36}}) {
    const std::string cut = whole.substr(0, size);
    ASSERT_EQ(cli({"SET", key, cut}), "OK");
    expect_foreign_claim("u:refund:o-2", cut);
  }
  EXPECT_EQ(metrics_->foreign_records(), 3U);
}

TEST_P(RedisForeignRecordTest, CompletingADamagedOwnRecordIsForeignAndChangesNothing) {
  const ClaimResult first = guard_->claim("u:refund:o-3", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  const std::string key = guard_->redis_key("u:refund:o-3");
  const std::string cut = cli({"GET", key}).substr(0, 38);  // the owner kept, a field cut
  ASSERT_EQ(cli({"SET", key, cut}), "OK");
  EXPECT_THROW((void)guard_->complete("u:refund:o-3", first.owner_token, "r"), ForeignRecord);
  EXPECT_EQ(cli({"GET", key}), cut);
  EXPECT_EQ(metrics_->foreign_records(), 1U);
}

// complete.lua checked the version byte together with the owner, so the owner's record with a
// damaged version answered "not the owner" (false) instead of ForeignRecord.
TEST_P(RedisForeignRecordTest, CompletingTheOwnersRecordWithAnUnknownVersionIsForeign) {
  const ClaimResult first = guard_->claim("u:refund:o-6", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  const std::string key = guard_->redis_key("u:refund:o-6");
  const std::string damaged = "2" + cli({"GET", key}).substr(1);
  ASSERT_EQ(cli({"SET", key, damaged}), "OK");
  EXPECT_THROW((void)guard_->complete("u:refund:o-6", first.owner_token, "r"), ForeignRecord);
  EXPECT_EQ(cli({"GET", key}), damaged);
}

// evict.lua kept any string starting "1C" as a COMPLETED record: force_release(kInProgressOnly)
// answered kCompleted for garbage that every claim refuses as foreign.
TEST_P(RedisForeignRecordTest, ForceReleaseDeletesAStringThatOnlyStartsLikeACompletedRecord) {
  const std::string key = guard_->redis_key("u:refund:o-7");
  ASSERT_EQ(cli({"SET", key, "1Cgarbage"}), "OK");
  EXPECT_EQ(guard_->force_release("u:refund:o-7", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kReleased);
  EXPECT_EQ(cli({"EXISTS", key}), "0");
  // A well-formed COMPLETED record is still kept.
  const ClaimResult first = guard_->claim("u:refund:o-7", "req-1", "fp");
  ASSERT_TRUE(guard_->complete("u:refund:o-7", first.owner_token, "done"));
  EXPECT_EQ(guard_->force_release("u:refund:o-7", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kCompleted);
}

TEST_P(RedisForeignRecordTest, AValueOfAnotherTypeIsForeign) {
  const std::string key = guard_->redis_key("u:refund:o-4");
  ASSERT_EQ(cli({"HSET", key, "field", "value"}), "1");
  EXPECT_THROW((void)guard_->claim("u:refund:o-4", "req-1", ""), ForeignRecord);
  EXPECT_THROW((void)guard_->complete("u:refund:o-4", std::string(32, 'a'), "r"), ForeignRecord);
  EXPECT_THROW((void)guard_->release("u:refund:o-4", std::string(32, 'a')), ForeignRecord);
  EXPECT_EQ(cli({"HGET", key, "field"}), "value");
  EXPECT_EQ(metrics_->foreign_records(), 3U);
  EXPECT_EQ(guard_->force_release("u:refund:o-4", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kReleased);
}

TEST_P(RedisForeignRecordTest, ABatchWithOneForeignKeyFailsAndHoldsNoKey) {
  ASSERT_EQ(cli({"SET", guard_->redis_key("u:refund:b-2"), "not-idem"}), "OK");
  const std::vector<ClaimRequest> batch = {{.key = "u:refund:b-1", .request_id = "req-1"},
                                           {.key = "u:refund:b-2", .request_id = "req-1"},
                                           {.key = "u:refund:b-3", .request_id = "req-1"}};
  EXPECT_THROW((void)guard_->claim_batch(batch), ForeignRecord);
  EXPECT_EQ(cli({"EXISTS", guard_->redis_key("u:refund:b-1")}), "0");
  EXPECT_EQ(cli({"EXISTS", guard_->redis_key("u:refund:b-3")}), "0");
  EXPECT_EQ(cli({"GET", guard_->redis_key("u:refund:b-2")}), "not-idem");
  EXPECT_EQ(metrics_->foreign_records(), 1U);
}

// complete.lua acts only on an IN_PROGRESS record: a second completion by the same owner (a
// resend after a lost reply) answers true and keeps the first response; after a release, or
// on a record another attempt completed, it answers false.
TEST_P(RedisForeignRecordTest, CompleteActsOnlyOnTheOwnersInProgressRecord) {
  const ClaimResult first = guard_->claim("u:refund:c-1", "req-1", "");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard_->complete("u:refund:c-1", first.owner_token, "first"));
  EXPECT_TRUE(guard_->complete("u:refund:c-1", first.owner_token, "second"));
  EXPECT_EQ(guard_->claim("u:refund:c-1", "req-2", "").response, "first");
  EXPECT_FALSE(guard_->release("u:refund:c-1", first.owner_token));  // completed: kept

  const ClaimResult released = guard_->claim("u:refund:c-2", "req-1", "");
  ASSERT_TRUE(guard_->release("u:refund:c-2", released.owner_token));
  EXPECT_FALSE(guard_->complete("u:refund:c-2", released.owner_token, "late"));
  EXPECT_EQ(cli({"EXISTS", guard_->redis_key("u:refund:c-2")}), "0");
  EXPECT_EQ(metrics_->foreign_records(), 0U);
}

// Through the facade: the foreign value is a backend error of the guard, so fail-closed answers
// Unavailable and the handler does not run.
TEST_P(RedisForeignRecordTest, TheFacadeNeverRunsTheHandlerOverAForeignValue) {
  ASSERT_EQ(cli({"SET", guard_->redis_key("u:refund:o-9"), "req-123"}), "OK");
  DeduplicatorOptions options;
  options.guard = guard_;
  options.metrics = metrics_;
  options.local_cache_capacity = 0;
  options.fingerprint.reset();
  options.on_redis_failure = RedisFailurePolicy::kFailClosed;
  Deduplicator dedup(options);
  Request request;
  request.request_id = "req-9";
  request.user = "u";
  request.intent = "refund";
  request.biz_key = "o-9";
  bool ran = false;
  const Outcome outcome = dedup.run(request, [&] {
    ran = true;
    return std::string("done");
  });
  EXPECT_FALSE(ran);
  EXPECT_EQ(outcome.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(metrics_->foreign_records(), 1U);
  EXPECT_EQ(metrics_->backend_errors(Layer::kRedisGuard), 1U);
}

INSTANTIATE_TEST_SUITE_P(ClaimMethods, RedisForeignRecordTest, test::all_claim_methods(),
                         test::claim_method_name);

}  // namespace
}  // namespace idem
