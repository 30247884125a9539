// Rules of the outcome table that each driver of the call plan must keep alike, run through the
// blocking and the async driver over in-memory backends (some made to fail at one step:
// tests/support/faulty_backends.h): a fallback key needs something to key on, names that differ
// only by white space are refused, failed saves and releases are told, a claim the replicas did
// not acknowledge is not trusted.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "drivers.h"
#include "faulty_backends.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/metrics.h"

namespace idem {
namespace {

using test::DriverKind;

// A decision event with its texts copied (an event's views live only in the callback).
struct SeenEvent {
  std::string key;
  Outcome::Kind outcome = Outcome::Kind::kExecuted;
  bool handler_failed = false;
  std::string save_error;
  std::string release_error;
  std::string unkeyed;
};

class CallRules : public ::testing::TestWithParam<DriverKind> {
 protected:
  CallRules() {
    options_.guard = guard_;
    options_.metrics = metrics_;
    options_.on_decision = [this](const DecisionEvent& e) {
      events_.push_back({std::string(e.key), e.outcome, e.handler_failed, std::string(e.save_error),
                         std::string(e.release_error), std::string(e.unkeyed)});
    };
  }

  test::TestDriver& driver() {
    if (!driver_) driver_ = test::make_driver(GetParam(), options_);
    return *driver_;
  }
  Outcome run(const Request& request) {
    return driver().run(request, [this] { return "done " + std::to_string(++runs_); });
  }

  std::shared_ptr<test::FaultyGuard> guard_ = std::make_shared<test::FaultyGuard>();
  std::shared_ptr<InProcessMetrics> metrics_ = std::make_shared<InProcessMetrics>();
  DeduplicatorOptions options_;
  std::vector<SeenEvent> events_;
  int runs_ = 0;

 private:
  std::unique_ptr<test::TestDriver> driver_;
};

INSTANTIATE_TEST_SUITE_P(Drivers, CallRules,
                         ::testing::Values(DriverKind::kBlocking, DriverKind::kAsync),
                         [](const auto& info) { return test::driver_name(info.param); });

Request unkeyed(const std::string& payload) {
  return Request{.user = "u", .intent = "refund", .payload = payload};
}

// ---- a fallback key needs something to key on ---------------------------------------------

TEST_P(CallRules, AFallbackKeyOfASelectionOfNothingIsNoKeyTwoRefundsAreNotOneRequest) {
  options_.fingerprint = FingerprintOptions{.include = {"/id"}};
  EXPECT_THROW((void)run(unkeyed(R"({"refund":10})")), MissingKey);
  EXPECT_THROW((void)run(unkeyed(R"({"refund":99})")), MissingKey);
  EXPECT_EQ(runs_, 0);
}

TEST_P(CallRules, ASelectionOfOnlyEmptyValuesIsNoKey) {
  options_.fingerprint = FingerprintOptions{.include = {"/foo/bar"}};
  for (const char* empty : {"null", R"("")", "[]", "{}", R"({"baz":[null,{}]})"}) {
    const std::string body = std::string(R"({"foo":{"bar":)") + empty + R"(},"amount":)";
    EXPECT_THROW((void)run(unkeyed(body + "10}")), MissingKey) << empty;
    EXPECT_THROW((void)run(unkeyed(body + "99}")), MissingKey) << empty;
  }
  EXPECT_EQ(runs_, 0);
}

TEST_P(CallRules, AnEmptyWholePayloadIsNoKey) {
  EXPECT_THROW((void)run(unkeyed("{}")), MissingKey);
  EXPECT_THROW((void)run(unkeyed("[]")), MissingKey);
  EXPECT_EQ(runs_, 0);
}

TEST_P(CallRules, PassThroughRunsASelectionOfNothingUnguardedAndTheEventSaysWhy) {
  options_.fingerprint = FingerprintOptions{.include = {"/id"}};
  options_.on_missing_key = MissingKeyPolicy::kPassThrough;
  EXPECT_EQ(run(unkeyed(R"({"refund":10})")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(run(unkeyed(R"({"refund":99})")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs_, 2);
  ASSERT_EQ(events_.size(), 2u);
  EXPECT_NE(events_[0].unkeyed.find("selection holds nothing"), std::string::npos)
      << events_[0].unkeyed;
}

TEST_P(CallRules, ASelectedValueStillKeysZeroAndFalseAreValues) {
  options_.fingerprint = FingerprintOptions{.include = {"/id"}};
  EXPECT_EQ(run(unkeyed(R"({"id":0,"refund":10})")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(run(unkeyed(R"({"id":0,"refund":99})")).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(run(unkeyed(R"({"id":false})")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs_, 2);
}

TEST_P(CallRules, ARealKeyBesideASelectionOfNothingKeepsItsRules) {
  options_.fingerprint = FingerprintOptions{.include = {"/id"}};
  Request request = unkeyed(R"({"refund":10})");
  request.request_id = "req-1";
  EXPECT_EQ(run(request).kind, Outcome::Kind::kExecuted);
  request.payload = R"({"refund":99})";  // both select nothing: no verdict, a duplicate
  EXPECT_EQ(run(request).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(runs_, 1);
}

TEST_P(CallRules, AFieldOfAnEmbeddedJsonBodyKeysAnHttpTriggerEvent) {
  options_.fingerprint = FingerprintOptions{
      .include = {"/body/orderId"},
      .embedded_json = {{.pointer = "/body", .base64_flag = "/isBase64Encoded"}}};
  const auto event = [](const std::string& body, bool base64, const std::string& trace) {
    return unkeyed(R"({"version":"v1","rawPath":"/refund","headers":{"X-Trace":")" + trace +
                   R"("},"body":")" + body + R"(","isBase64Encoded":)" +
                   (base64 ? "true" : "false") + "}");
  };
  EXPECT_EQ(run(event(R"({\"orderId\":\"o-7\",\"amount\":10})", false, "t1")).kind,
            Outcome::Kind::kExecuted);
  // The same order, base64 ({"orderId":"o-7","amount":10}), another trace: a duplicate.
  EXPECT_EQ(run(event("eyJvcmRlcklkIjoiby03IiwiYW1vdW50IjoxMH0=", true, "t2")).kind,
            Outcome::Kind::kDuplicate);
  EXPECT_EQ(run(event(R"({\"orderId\":\"o-8\"})", false, "t3")).kind, Outcome::Kind::kExecuted);
  EXPECT_THROW((void)run(event("not json", false, "t4")), PayloadError);
  EXPECT_THROW((void)run(event("***", true, "t5")), PayloadError);
  EXPECT_EQ(runs_, 2);
}

// ---- names are taken as given, so two spellings are refused --------------------------------

TEST_P(CallRules, TwoSpellingsOfOneNameAreRefusedNotTwoKeys) {
  const auto named = [](std::string user, std::string intent, std::string biz_key) {
    return Request{
        .user = std::move(user), .intent = std::move(intent), .biz_key = std::move(biz_key)};
  };
  EXPECT_THROW((void)run(named("u", " my-function ", "b")), InvalidKey);
  EXPECT_THROW((void)run(named("u", "my-function\t", "b")), InvalidKey);
  EXPECT_THROW((void)run(named("u\n1", "my-function", "b")), InvalidKey);
  EXPECT_THROW((void)run(named("u", "my-function", "order-7 ")), InvalidKey);
  EXPECT_THROW((void)run(named("\u00A0u", "my-function", "b")), InvalidKey);
  EXPECT_EQ(runs_, 0);
  EXPECT_EQ(run(named("u", "my function", "order 7")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs_, 1);
}

// ---- failed saves and releases are told ----------------------------------------------------

TEST_P(CallRules, AGuardCompletionThatFailsIsToldInTheOutcomeTheEventAndTheMetrics) {
  guard_->before_complete = [] { throw RedisError("idem: redis: connection refused", true); };
  const Outcome outcome = run(Request{.request_id = "r1", .user = "u", .intent = "refund"});
  EXPECT_EQ(outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(outcome.response, "done 1");
  EXPECT_FALSE(outcome.saved());
  EXPECT_EQ(outcome.save_error, "redis_guard: idem: redis: connection refused");
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_EQ(events_[0].save_error, outcome.save_error);
  EXPECT_FALSE(events_[0].key.empty());
  EXPECT_EQ(metrics_->unsaved_results(), 1u);
  EXPECT_NE(metrics_->prometheus_text().find("idem_unsaved_results_total 1"), std::string::npos);
}

TEST_P(CallRules, ASinkCompletionThatFailsInRunIsToldInTheOutcome) {
  auto sink = std::make_shared<test::FaultySink>();
  sink->before_complete = [] { throw PostgresError("idem: postgres: gone", true, "08006"); };
  options_.sink = sink;
  const Outcome outcome = run(Request{.request_id = "r1", .user = "u", .intent = "refund"});
  EXPECT_EQ(outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(outcome.save_error, "pg_sink: idem: postgres: gone");
}

TEST_P(CallRules, ASavedResponseSaysSaved) {
  const Outcome outcome = run(Request{.request_id = "r1", .user = "u", .intent = "refund"});
  EXPECT_TRUE(outcome.saved());
  EXPECT_TRUE(events_.at(0).save_error.empty());
}

TEST_P(CallRules, AReleaseThatFailsAfterAHandlerErrorIsToldWithTheKeyAndTheErrorStillPropagates) {
  guard_->before_release = [] { throw RedisError("idem: redis: timeout", true); };
  const Request request{.request_id = "r1", .user = "u", .intent = "refund"};
  EXPECT_THROW((void)driver().run(request, []() -> std::string { throw std::logic_error("no"); }),
               std::logic_error);
  ASSERT_EQ(events_.size(), 1u);
  EXPECT_TRUE(events_[0].handler_failed);
  EXPECT_EQ(events_[0].release_error, "redis_guard: idem: redis: timeout");
  EXPECT_FALSE(events_[0].key.empty());
  EXPECT_EQ(metrics_->failed_releases(), 1u);
  // The claim stays until its lease ends: a retry meanwhile is in progress.
  guard_->before_release = [] {};
  EXPECT_EQ(run(request).kind, Outcome::Kind::kInProgress);
}

// ---- a claim the replicas did not acknowledge ----------------------------------------------

TEST_P(CallRules, AClaimTheReplicasDidNotAcknowledgeIsReleasedAndUnavailableWhenFailingClosed) {
  guard_->on_claim = [](ClaimResult& claim) { claim.replicated = false; };
  const Request request{.request_id = "r1", .user = "u", .intent = "refund"};
  const Outcome outcome = run(request);
  EXPECT_EQ(outcome.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(outcome.layer, Layer::kRedisGuard);
  EXPECT_EQ(runs_, 0);
  guard_->on_claim = [](ClaimResult&) {};  // released: once acknowledged again, it runs
  EXPECT_EQ(run(request).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs_, 1);
}

TEST_P(CallRules, AClaimTheReplicasDidNotAcknowledgeGoesOnWhenFailingOpenToASink) {
  guard_->on_claim = [](ClaimResult& claim) { claim.replicated = false; };
  options_.sink = std::make_shared<InMemorySink>();
  EXPECT_EQ(run(Request{.request_id = "r1", .user = "u", .intent = "refund"}).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(runs_, 1);
}

}  // namespace
}  // namespace idem
