// Operator reads and writes of the guard and the sink (RedisGuard/PgSink::inspect(),
// force_release(), PgSink::schema_version()) against the real servers (IDEM_TEST_REDIS_URL,
// IDEM_TEST_PG_URL), each test with its own key prefix or schema.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"
#include "pg_server.h"
#include "test_env.h"

namespace idem {
namespace {

using std::chrono::milliseconds;

RedisGuardOptions guard_options(const std::string& url) {
  RedisGuardOptions options;
  options.redis.url = url;
  options.prefix = test::unique_name("inspect");
  options.lease = std::chrono::seconds(30);
  options.retention = std::chrono::hours(1);
  options.max_response_bytes = 8;
  return options;
}

TEST(RedisGuardInspect, ShowsAClaimThenItsCompletionWithoutChangingIt) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(guard_options(url));
  EXPECT_FALSE(guard.inspect("u:pay:o1").has_value());

  const ClaimResult claim = guard.claim("u:pay:o1", "req-1", "fp-1");
  const std::optional<RecordInfo> claimed = guard.inspect("u:pay:o1");
  ASSERT_TRUE(claimed.has_value());
  EXPECT_EQ(claimed->state, RecordState::kInProgress);
  EXPECT_EQ(claimed->owner_token, claim.owner_token);
  EXPECT_EQ(claimed->request_id, "req-1");
  EXPECT_EQ(claimed->fingerprint, "fp-1");
  ASSERT_TRUE(claimed->ttl.has_value());
  EXPECT_GT(*claimed->ttl, milliseconds(0));
  EXPECT_LE(*claimed->ttl, milliseconds(30000));
  EXPECT_FALSE(claimed->response_bytes.has_value());
  EXPECT_FALSE(claimed->expires_at.has_value());
  // Reading did not claim: another request still finds the first one's claim.
  EXPECT_EQ(guard.claim("u:pay:o1", "req-2", "fp-1").status, ClaimStatus::kRepeatOther);

  ASSERT_TRUE(guard.complete("u:pay:o1", claim.owner_token, "{\"ok\":1}"));
  const std::optional<RecordInfo> done = guard.inspect("u:pay:o1");
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->state, RecordState::kCompleted);
  EXPECT_EQ(done->response_bytes, std::optional<std::size_t>(8));
  EXPECT_FALSE(done->response_sha256.has_value());
  EXPECT_GT(*done->ttl, milliseconds(30000));  // the retention, no longer the lease

  const ClaimResult big = guard.claim("u:pay:o2", "req-3", "");
  ASSERT_TRUE(guard.complete("u:pay:o2", big.owner_token, "a response over the cap"));
  const std::optional<RecordInfo> hashed = guard.inspect("u:pay:o2");
  ASSERT_TRUE(hashed.has_value());
  EXPECT_FALSE(hashed->response_bytes.has_value());
  ASSERT_TRUE(hashed->response_sha256.has_value());
  EXPECT_EQ(hashed->response_sha256->size(), 64U);
}

TEST(RedisGuardForceRelease, DeletesAnyOwnersClaimButKeepsCompletedUnlessAsked) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(guard_options(url));
  EXPECT_EQ(guard.force_release("u:pay:none", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kNotFound);

  (void)guard.claim("u:pay:o1", "req-1", "");
  EXPECT_EQ(guard.force_release("u:pay:o1", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kReleased);
  EXPECT_FALSE(guard.inspect("u:pay:o1").has_value());
  EXPECT_EQ(guard.claim("u:pay:o1", "req-2", "").status, ClaimStatus::kFirst);

  const ClaimResult done = guard.claim("u:pay:o3", "req-3", "");
  ASSERT_TRUE(guard.complete("u:pay:o3", done.owner_token, "r"));
  EXPECT_EQ(guard.force_release("u:pay:o3", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kCompleted);
  EXPECT_TRUE(guard.inspect("u:pay:o3").has_value());
  EXPECT_EQ(guard.force_release("u:pay:o3", ForceReleaseScope::kAnyState),
            ForceReleaseStatus::kReleased);
  EXPECT_FALSE(guard.inspect("u:pay:o3").has_value());
}

// Forcing out a COMPLETED record left its step journal: the next request "executed" again with
// its steps replayed from the journal, so the side effect the operator asked to run again did
// not run. kAnyState deletes the journal too; kInProgressOnly keeps it for the retry.
TEST(RedisGuardForceRelease, AnyStateDeletesTheStepJournalInProgressOnlyKeepsIt) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_REDIS_URL");
  RedisGuard guard(guard_options(url));
  JournaledStep charge;
  charge.result = "charged-at-1";
  const ClaimResult stuck = guard.claim("u:pay:j1", "req-1", "");
  ASSERT_TRUE(guard.put_step("u:pay:j1", stuck.owner_token, "charge", charge));
  EXPECT_EQ(guard.force_release("u:pay:j1", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kReleased);
  EXPECT_EQ(guard.steps("u:pay:j1").size(), 1U);  // the retry skips the charge

  const ClaimResult done = guard.claim("u:pay:j2", "req-2", "");
  ASSERT_TRUE(guard.put_step("u:pay:j2", done.owner_token, "charge", charge));
  ASSERT_TRUE(guard.complete("u:pay:j2", done.owner_token, "r"));
  EXPECT_EQ(guard.force_release("u:pay:j2", ForceReleaseScope::kAnyState),
            ForceReleaseStatus::kReleased);
  EXPECT_TRUE(guard.steps("u:pay:j2").empty());  // run again means the charge too
}

class PgSinkInspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
    schema_ = std::make_unique<test::ScratchSchema>(url, "inspect");
    PgSinkOptions options;
    options.conninfo = url;
    options.schema = schema_->name();
    options.ns = "orders";
    options.lease = milliseconds(30000);
    options.max_response_bytes = 8;
    sink_ = std::make_unique<PgSink>(options);
  }
  std::unique_ptr<test::ScratchSchema> schema_;
  std::unique_ptr<PgSink> sink_;
};

TEST_F(PgSinkInspectTest, SchemaVersionIsZeroBeforeMigrateAndTheLatestAfter) {
  EXPECT_EQ(sink_->schema_version(), 0);
  sink_->migrate();
  EXPECT_EQ(sink_->schema_version(), 2);  // 2: the owner token (fencing per attempt)
  sink_->migrate();
  EXPECT_EQ(sink_->schema_version(), 2);
}

TEST_F(PgSinkInspectTest, ShowsARowThenItsCompletionAndExpiry) {
  sink_->migrate();
  EXPECT_FALSE(sink_->inspect("u:pay:o1").has_value());
  (void)sink_->claim("u:pay:o1", "req-1", "fp-1");
  const std::optional<RecordInfo> claimed = sink_->inspect("u:pay:o1");
  ASSERT_TRUE(claimed.has_value());
  EXPECT_EQ(claimed->state, RecordState::kInProgress);
  EXPECT_EQ(claimed->request_id, "req-1");
  EXPECT_EQ(claimed->owner_token, "req-1");  // claimed without an owner token: its request ID
  EXPECT_EQ(claimed->fingerprint, "fp-1");
  ASSERT_TRUE(claimed->ttl.has_value());
  EXPECT_GT(*claimed->ttl, milliseconds(0));
  EXPECT_LE(*claimed->ttl, milliseconds(30000));
  const std::int64_t expires_ms =
      schema_->count("SELECT floor(extract(epoch FROM expires_at) * 1000)::bigint FROM " +
                     schema_->name() + ".idem_records");
  ASSERT_TRUE(claimed->expires_at.has_value());
  EXPECT_EQ(
      std::chrono::duration_cast<milliseconds>(claimed->expires_at->time_since_epoch()).count(),
      expires_ms);
  EXPECT_FALSE(claimed->response_bytes.has_value());

  ASSERT_TRUE(sink_->complete("u:pay:o1", "req-1", "1234567"));
  const std::optional<RecordInfo> done = sink_->inspect("u:pay:o1");
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->state, RecordState::kCompleted);
  EXPECT_EQ(done->response_bytes, std::optional<std::size_t>(7));

  // Another namespace does not see the row; an expired row shows a negative TTL.
  PgSinkOptions other = sink_->options();
  other.ns = "refunds";
  EXPECT_FALSE(PgSink(other).inspect("u:pay:o1").has_value());
  schema_->exec("UPDATE " + schema_->name() +
                ".idem_records SET expires_at = now() - interval '5 seconds'");
  EXPECT_LT(*sink_->inspect("u:pay:o1")->ttl, milliseconds(-4000));
}

// RedisGuard's inspect and force_release throw InvalidKey for a text no claim could have made;
// PgSink's answered "not found" for it, hiding the caller's mistake.
TEST_F(PgSinkInspectTest, AKeyTextNoClaimCouldHaveMadeIsAnInvalidKeyNotNotFound) {
  sink_->migrate();
  for (const char* bad : {"u i", "u:pay:{o1}", ""}) {
    EXPECT_THROW((void)sink_->inspect(bad), InvalidKey) << bad;
    EXPECT_THROW((void)sink_->force_release(bad, ForceReleaseScope::kAnyState), InvalidKey) << bad;
  }
}

TEST_F(PgSinkInspectTest, ForceReleaseDeletesAnyRequestsRowButKeepsCompletedUnlessAsked) {
  sink_->migrate();
  EXPECT_EQ(sink_->force_release("u:pay:none", ForceReleaseScope::kAnyState),
            ForceReleaseStatus::kNotFound);
  (void)sink_->claim("u:pay:o1", "req-1", "");
  EXPECT_EQ(sink_->force_release("u:pay:o1", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kReleased);
  EXPECT_FALSE(sink_->inspect("u:pay:o1").has_value());

  (void)sink_->claim("u:pay:o2", "req-2", "");
  ASSERT_TRUE(sink_->complete("u:pay:o2", "req-2", "r"));
  EXPECT_EQ(sink_->force_release("u:pay:o2", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kCompleted);
  EXPECT_TRUE(sink_->inspect("u:pay:o2").has_value());
  EXPECT_EQ(sink_->force_release("u:pay:o2", ForceReleaseScope::kAnyState),
            ForceReleaseStatus::kReleased);
  EXPECT_EQ(schema_->count("SELECT count(*) FROM " + schema_->name() + ".idem_records"), 0);
}

}  // namespace
}  // namespace idem
