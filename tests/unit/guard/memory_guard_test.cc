// InMemoryGuard keeps the guard contract without a server (TTL on an injected clock).
#include "idem/memory_guard.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "idem/errors.h"

namespace idem {
namespace {

class InMemoryGuardTest : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(1000);
  InMemoryGuard guard_{InMemoryGuardOptions{std::chrono::milliseconds(5000),
                                            std::chrono::milliseconds(60000), 4, clock_}};
};

TEST_F(InMemoryGuardTest, FirstClaimOwnsTheKeyAndRepeatsAreSameOrOther) {
  const ClaimResult first = guard_.claim("k", "r1", "fp");
  EXPECT_EQ(first.status, ClaimStatus::kFirst);
  EXPECT_EQ(first.owner_token.size(), 32u);
  const ClaimResult same = guard_.claim("k", "r1", "fp");
  EXPECT_EQ(same.status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(same.state, RecordState::kInProgress);
  EXPECT_TRUE(same.owner_token.empty());
  EXPECT_EQ(guard_.claim("k", "r2", "fp").status, ClaimStatus::kRepeatOther);
  EXPECT_FALSE(guard_.claim("k", "r2", "other").fingerprint_matches);
}

TEST_F(InMemoryGuardTest, EmptyRequestIdIsNeverTheSameRequest) {
  ASSERT_EQ(guard_.claim("k", "", "").status, ClaimStatus::kFirst);
  EXPECT_EQ(guard_.claim("k", "", "").status, ClaimStatus::kRepeatOther);
}

TEST_F(InMemoryGuardTest, CompleteStoresTheResponseForReplay) {
  const ClaimResult first = guard_.claim("k", "r1", "fp");
  EXPECT_FALSE(guard_.complete("k", "not-the-owner", "x"));
  EXPECT_TRUE(guard_.complete("k", first.owner_token, "resp"));
  const ClaimResult repeat = guard_.claim("k", "r2", "fp");
  EXPECT_EQ(repeat.state, RecordState::kCompleted);
  EXPECT_EQ(repeat.response, "resp");
}

TEST_F(InMemoryGuardTest, ReleaseNeverDeletesAnotherOwnersClaim) {
  const ClaimResult a = guard_.claim("k", "r1", "fp");
  clock_->advance_ms(5000);  // A's lease ends
  const ClaimResult b = guard_.claim("k", "r1", "fp");
  ASSERT_EQ(b.status, ClaimStatus::kFirst);
  EXPECT_FALSE(guard_.release("k", a.owner_token));
  EXPECT_EQ(guard_.claim("k", "r3", "fp").status, ClaimStatus::kRepeatOther);
  EXPECT_TRUE(guard_.release("k", b.owner_token));
  EXPECT_EQ(guard_.claim("k", "r3", "fp").status, ClaimStatus::kFirst);
}

TEST_F(InMemoryGuardTest, ReleaseDoesNotDeleteACompletedRecord) {
  const ClaimResult a = guard_.claim("k", "r1", "fp");
  ASSERT_TRUE(guard_.complete("k", a.owner_token, "resp"));
  EXPECT_FALSE(guard_.release("k", a.owner_token));
  EXPECT_EQ(guard_.claim("k", "r2", "fp").state, RecordState::kCompleted);
}

TEST_F(InMemoryGuardTest, LeaseAndRetentionAreTtls) {
  const ClaimResult a = guard_.claim("k", "r1", "fp");
  clock_->advance_ms(4999);
  EXPECT_EQ(guard_.claim("k", "r1", "fp").status, ClaimStatus::kRepeatSame);
  EXPECT_TRUE(guard_.renew("k", a.owner_token, std::chrono::milliseconds(5000)));
  clock_->advance_ms(4999);
  EXPECT_EQ(guard_.claim("k", "r1", "fp").status, ClaimStatus::kRepeatSame) << "renewed";
  ASSERT_TRUE(guard_.complete("k", a.owner_token, "resp"));
  EXPECT_FALSE(guard_.renew("k", a.owner_token, std::chrono::milliseconds(5000))) << "completed";
  clock_->advance_ms(59999);
  EXPECT_EQ(guard_.claim("k", "r2", "fp").state, RecordState::kCompleted);
  clock_->advance_ms(1);
  EXPECT_EQ(guard_.claim("k", "r2", "fp").status, ClaimStatus::kFirst) << "retention ended";
}

TEST_F(InMemoryGuardTest, CompleteMayShortenTheRetentionOfOneRecord) {
  const ClaimResult a = guard_.claim("k", "r1", "fp");
  ASSERT_TRUE(guard_.complete("k", a.owner_token, "resp", std::chrono::milliseconds(30)));
  clock_->advance_ms(29);
  EXPECT_EQ(guard_.claim("k", "r2", "fp").state, RecordState::kCompleted);
  clock_->advance_ms(1);
  EXPECT_EQ(guard_.claim("k", "r2", "fp").status, ClaimStatus::kFirst);
  EXPECT_THROW((void)guard_.complete("k", "t", "r", std::chrono::milliseconds(-1)), ConfigError);
}

TEST_F(InMemoryGuardTest, FullGuardDropsExpiredRecordsButNeverALiveOne) {
  for (const char* key : {"a", "b", "c", "d"})
    ASSERT_EQ(guard_.claim(key, "r", "").status, ClaimStatus::kFirst);
  EXPECT_THROW((void)guard_.claim("e", "r", ""), BackendError);
  clock_->advance_ms(5000);
  EXPECT_EQ(guard_.claim("e", "r", "").status, ClaimStatus::kFirst);
  EXPECT_EQ(guard_.size(), 1u);
}

TEST(InMemoryGuard, InvalidOptionsAreConfigErrors) {
  InMemoryGuardOptions no_lease;
  no_lease.lease = std::chrono::milliseconds(0);
  EXPECT_THROW(InMemoryGuard{no_lease}, ConfigError);
  InMemoryGuardOptions no_room;
  no_room.max_records = 0;
  EXPECT_THROW(InMemoryGuard{no_room}, ConfigError);
}

TEST(InMemoryGuard, SixteenThreadsClaimingOneKeyGetExactlyOneFirst) {
  InMemoryGuard guard;
  std::atomic<int> firsts{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      if (guard.claim("k", "r" + std::to_string(i), "").status == ClaimStatus::kFirst) ++firsts;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(firsts.load(), 1);
}

}  // namespace
}  // namespace idem
