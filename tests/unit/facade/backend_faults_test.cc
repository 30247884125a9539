// The facade (blocking driver) over in-memory backends made to fail at one step: a claim the
// replicas did not acknowledge, a completion or a release that throws. Each row of the outcome
// table these touch is a case here; the async driver's twins are in
// tests/integration/async_backend_faults_test.cc.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "faulty_backends.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"

namespace idem {
namespace {

Request refund(const std::string& id, const std::string& biz_key = "order-1") {
  return Request{.request_id = id, .user = "u1", .intent = "refund", .biz_key = biz_key,
                 .payload = R"({"amount":10})"};
}

TEST(BackendFaults, AClaimTheReplicasDidNotAcknowledgeIsReleasedAndUnavailableWhenFailingClosed) {
  auto guard = std::make_shared<test::FaultyGuard>();
  guard->on_claim = [](ClaimResult& claim) { claim.replicated = false; };
  DeduplicatorOptions options;
  options.guard = guard;
  Deduplicator dedup(options);
  int runs = 0;
  const Outcome outcome = dedup.run(refund("r1"), [&] { return std::to_string(++runs); });
  EXPECT_EQ(outcome.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(outcome.layer, Layer::kRedisGuard);
  EXPECT_EQ(runs, 0);
  // Released: once the replicas acknowledge again, the request runs.
  guard->on_claim = [](ClaimResult&) {};
  EXPECT_EQ(dedup.run(refund("r1"), [&] { return std::to_string(++runs); }).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 1);
}

TEST(BackendFaults, AClaimTheReplicasDidNotAcknowledgeGoesOnWhenFailingOpenToASink) {
  auto guard = std::make_shared<test::FaultyGuard>();
  guard->on_claim = [](ClaimResult& claim) { claim.replicated = false; };
  DeduplicatorOptions options;
  options.guard = guard;
  options.sink = std::make_shared<InMemorySink>();
  Deduplicator dedup(options);
  int runs = 0;
  EXPECT_EQ(dedup.run(refund("r1"), [&] { return std::to_string(++runs); }).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace idem
