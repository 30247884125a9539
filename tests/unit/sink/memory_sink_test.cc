// The in-memory sink keeps the Sink contract (sink.h) as PgSink's non-transactional form does.
#include "idem/memory_sink.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "idem/errors.h"

namespace idem {
namespace {

using std::chrono::milliseconds;

class InMemorySinkTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(1'000'000);
  InMemorySink sink_{InMemorySinkOptions{.lease = std::chrono::milliseconds(1000),
                                         .retention = std::chrono::milliseconds(5000),
                                         .max_response_bytes = 8,
                                         .clock = clock_}};
};

TEST_F(InMemorySinkTest, AClaimIsFirstThenADuplicateThatKnowsItsOwnerAndFingerprint) {
  EXPECT_EQ(sink_.claim("k", "r1", "fp").status, SinkStatus::kClaimed);
  const SinkClaim same = sink_.claim("k", "r1", "fp");
  EXPECT_EQ(same.status, SinkStatus::kDuplicate);
  EXPECT_EQ(same.state, RecordState::kInProgress);
  EXPECT_TRUE(same.same_request);
  const SinkClaim other = sink_.claim("k", "r2", "other");
  EXPECT_FALSE(other.same_request);
  EXPECT_FALSE(other.fingerprint_matches);
  EXPECT_TRUE(sink_.claim("k", "r2", "").fingerprint_matches);  // no fingerprint: no verdict
}

TEST_F(InMemorySinkTest, CompleteAndReleaseActOnlyForTheOwnerOfAnInProgressRow) {
  ASSERT_EQ(sink_.claim("k", "r1", "").status, SinkStatus::kClaimed);
  EXPECT_FALSE(sink_.release("k", "r2"));
  EXPECT_FALSE(sink_.complete("k", "r2", "x", std::chrono::milliseconds(0)));
  EXPECT_TRUE(sink_.complete("k", "r1", "ok", std::chrono::milliseconds(0)));
  EXPECT_FALSE(sink_.release("k", "r1"));  // completed rows are never released
  const SinkClaim repeat = sink_.claim("k", "r2", "");
  EXPECT_EQ(repeat.state, RecordState::kCompleted);
  EXPECT_EQ(repeat.response, "ok");
  ASSERT_EQ(sink_.claim("j", "r1", "").status, SinkStatus::kClaimed);
  EXPECT_TRUE(sink_.release("j", "r1"));
  EXPECT_EQ(sink_.claim("j", "r3", "").status, SinkStatus::kClaimed);
}

TEST_F(InMemorySinkTest, LeaseAndRetentionEndOnTheSinksClockAndAnExpiredRowIsTakenOver) {
  ASSERT_EQ(sink_.claim("k", "r1", "").status, SinkStatus::kClaimed);
  clock_->advance_ms(1000);  // the lease ended: the owner crashed
  EXPECT_EQ(sink_.claim("k", "r2", "").status, SinkStatus::kClaimed);
  EXPECT_FALSE(sink_.complete("k", "r1", "late", std::chrono::milliseconds(0)));
  EXPECT_TRUE(sink_.complete("k", "r2", "ok", std::chrono::milliseconds(200)));
  EXPECT_EQ(sink_.inspect("k")->ttl, std::chrono::milliseconds(200));
  clock_->advance_ms(200);
  EXPECT_FALSE(sink_.inspect("k").has_value());
  EXPECT_EQ(sink_.claim("k", "r3", "").status, SinkStatus::kClaimed);
}

TEST_F(InMemorySinkTest, AResponseOverTheCapKeepsOnlyItsSha256) {
  ASSERT_EQ(sink_.claim("k", "r1", "").status, SinkStatus::kClaimed);
  ASSERT_TRUE(sink_.complete("k", "r1", "0123456789", std::chrono::milliseconds(0)));
  const SinkClaim repeat = sink_.claim("k", "r2", "");
  EXPECT_FALSE(repeat.response.has_value());
  EXPECT_EQ(repeat.response_sha256,
            "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882");
}

// InMemorySink stored owner tokens of any length, which PgSink's column refuses: a test against the
// in-memory sink passed where production would throw.
TEST_F(InMemorySinkTest, AnOwnerTokenOver64BytesIsRefusedAsPgSinkRefusesIt) {
  EXPECT_THROW((void)sink_.claim("k", "r", "", std::string(65, 'o')), InvalidKey);
  EXPECT_EQ(sink_.claim("k", "r", "", std::string(64, 'o')).status, SinkStatus::kClaimed);
}

TEST_F(InMemorySinkTest, BadInputIsTypedAndAFullSinkIsRetryable) {
  EXPECT_THROW((void)sink_.claim("k", std::string(65, 'r'), ""), InvalidRequestId);
  EXPECT_THROW((void)sink_.complete("k", "r", "", std::chrono::milliseconds(-1)), ConfigError);
  EXPECT_THROW(InMemorySink(InMemorySinkOptions{.max_records = 0}), ConfigError);
  InMemorySink tiny(InMemorySinkOptions{.max_records = 1});
  ASSERT_EQ(tiny.claim("a", "r", "").status, SinkStatus::kClaimed);
  try {
    (void)tiny.claim("b", "r", "");
    FAIL() << "a full sink claimed";
  } catch (const BackendError& error) {
    EXPECT_TRUE(error.retryable());
  }
}

TEST_F(InMemorySinkTest, AnOwnerTokenFencesCompleteReleaseAndRenewPerAttempt) {
  ASSERT_EQ(sink_.claim("k", "r1", "", "attempt-1").status, SinkStatus::kClaimed);
  EXPECT_TRUE(sink_.renew("k", "attempt-1", milliseconds(0)));
  EXPECT_FALSE(sink_.renew("k", "r1", milliseconds(0)));  // the request ID owns nothing now
  clock_->advance_ms(1000);
  ASSERT_EQ(sink_.claim("k", "r1", "", "attempt-2").status, SinkStatus::kClaimed);  // takeover
  EXPECT_FALSE(sink_.complete("k", "attempt-1", "late", milliseconds(0)));
  EXPECT_FALSE(sink_.release("k", "attempt-1"));
  EXPECT_FALSE(sink_.renew("k", "attempt-1", milliseconds(0)));
  EXPECT_TRUE(sink_.complete("k", "attempt-2", "ok", milliseconds(0)));
  EXPECT_FALSE(sink_.renew("k", "attempt-2", milliseconds(0)));  // completed rows are not leases
}

}  // namespace
}  // namespace idem
