// The facade's decision rules, exhaustively, without servers.
#include "facade/decision.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>

namespace idem::detail {
namespace {

TEST(Decision, GuardFirstGoesOn) {
  ClaimResult claim;
  claim.status = ClaimStatus::kFirst;
  claim.owner_token = "t";
  EXPECT_FALSE(decide_on_guard(claim).has_value());
}

TEST(Decision, SinkClaimedGoesOn) { EXPECT_FALSE(decide_on_sink(SinkClaim{}).has_value()); }

struct RepeatCase {
  RecordState state;
  bool fingerprint_matches;
  std::optional<std::string> response;
  Outcome::Kind expected_kind;
  std::optional<std::string> expected_response;
};

// The case's name (also in ctest's test names, which would otherwise show the bytes of the
// struct, heap addresses included).
std::string case_name(const RepeatCase& c) {
  return std::string(c.state == RecordState::kCompleted ? "Completed" : "InProgress") +
         (c.fingerprint_matches ? "SameFingerprint" : "OtherFingerprint") +
         (c.response ? "WithResponse" : "NoResponse");
}

void PrintTo(const RepeatCase& c, std::ostream* out) { *out << case_name(c); }

class DecisionRepeat : public ::testing::TestWithParam<RepeatCase> {};

TEST_P(DecisionRepeat, GuardAndSinkAgreeOnEveryRepeat) {
  const RepeatCase& c = GetParam();
  for (const ClaimStatus status : {ClaimStatus::kRepeatSame, ClaimStatus::kRepeatOther}) {
    ClaimResult claim;
    claim.status = status;
    claim.state = c.state;
    claim.fingerprint_matches = c.fingerprint_matches;
    claim.response = c.response;
    const auto outcome = decide_on_guard(claim);
    ASSERT_TRUE(outcome.has_value());
    EXPECT_EQ(outcome->kind, c.expected_kind);
    EXPECT_EQ(outcome->layer, Layer::kRedisGuard);
    EXPECT_EQ(outcome->response, c.expected_response);
  }
  SinkClaim sink;
  sink.status = SinkStatus::kDuplicate;
  sink.state = c.state;
  sink.fingerprint_matches = c.fingerprint_matches;
  sink.response = c.response;
  const auto outcome = decide_on_sink(sink);
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->kind, c.expected_kind);
  EXPECT_EQ(outcome->layer, Layer::kPgSink);
  EXPECT_EQ(outcome->response, c.expected_response);
}

INSTANTIATE_TEST_SUITE_P(AllStates, DecisionRepeat,
                         ::testing::Values(RepeatCase{RecordState::kCompleted, true, "r",
                                                      Outcome::Kind::kDuplicate, "r"},
                                           RepeatCase{RecordState::kCompleted, true, std::nullopt,
                                                      Outcome::Kind::kDuplicate, std::nullopt},
                                           RepeatCase{RecordState::kCompleted, false, "r",
                                                      Outcome::Kind::kMismatch, std::nullopt},
                                           RepeatCase{RecordState::kInProgress, true, std::nullopt,
                                                      Outcome::Kind::kInProgress, std::nullopt},
                                           RepeatCase{RecordState::kInProgress, false, std::nullopt,
                                                      Outcome::Kind::kMismatch, std::nullopt}),
                         [](const ::testing::TestParamInfo<RepeatCase>& info) {
                           return case_name(info.param);
                         });

TEST(Decision, SinkLockTimeoutIsInProgressWhateverTheFingerprint) {
  SinkClaim sink;
  sink.status = SinkStatus::kInProgress;
  sink.fingerprint_matches = false;  // an uncommitted competitor's fingerprint is not visible
  const auto outcome = decide_on_sink(sink);
  ASSERT_TRUE(outcome.has_value());
  EXPECT_EQ(outcome->kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(outcome->layer, Layer::kPgSink);
}

TEST(Decision, ReplayedOnlyForDuplicateWithResponse) {
  EXPECT_TRUE(decide_repeat(Layer::kPgSink, RecordState::kCompleted, true, "r").replayed());
  EXPECT_FALSE(
      decide_repeat(Layer::kPgSink, RecordState::kCompleted, true, std::nullopt).replayed());
  EXPECT_FALSE(decide_repeat(Layer::kPgSink, RecordState::kCompleted, false, "r").replayed());
}

}  // namespace
}  // namespace idem::detail
