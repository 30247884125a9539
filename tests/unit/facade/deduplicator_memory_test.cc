// The facade with the in-memory guard only: its rules without any server.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "idem/clock.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"
#include "idem/metrics.h"

namespace idem {
namespace {

Request request(const std::string& id, const std::string& biz_key,
                const std::string& payload = "{\"a\":1}") {
  Request r;
  r.request_id = id;
  r.user = "u1";
  r.intent = "notify";
  r.biz_key = biz_key;
  r.payload = payload;
  return r;
}

class InMemoryFacade : public ::testing::Test {
 protected:
  std::shared_ptr<InMemoryGuard> guard_ = std::make_shared<InMemoryGuard>();
  Deduplicator dedup_{[this] {
    DeduplicatorOptions o;
    o.guard = guard_;
    return o;
  }()};
  int runs_ = 0;
  std::function<std::string()> handler_ = [this] { return "sent " + std::to_string(++runs_); };
};

TEST_F(InMemoryFacade, FirstRunsThenRepeatsReplayFromTheLocalCache) {
  EXPECT_EQ(dedup_.run(request("r1", "b1"), handler_).response, "sent 1");
  const Outcome again = dedup_.run(request("r2", "b1"), handler_);
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.layer, Layer::kRequestId);
  EXPECT_EQ(again.response, "sent 1");
  EXPECT_EQ(runs_, 1);
}

TEST_F(InMemoryFacade, ABusinessErrorReleasesAndACancellationKeeps) {
  EXPECT_THROW(
      (void)dedup_.run(request("r1", "b2"), []() -> std::string { throw std::logic_error("no"); }),
      std::logic_error);
  EXPECT_EQ(dedup_.run(request("r1", "b2"), handler_).kind, Outcome::Kind::kExecuted);
  EXPECT_THROW((void)dedup_.run(request("r1", "b3"), []() -> std::string { throw Cancelled(); }),
               Cancelled);
  const Outcome retry = dedup_.run(request("r1", "b3"), handler_);
  EXPECT_EQ(retry.kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(retry.layer, Layer::kRedisGuard);
}

TEST_F(InMemoryFacade, TheLocalCacheAlsoAnswersMismatchForAnotherPayload) {
  (void)dedup_.run(request("r1", "b5", R"({"amount":1})"), handler_);
  const Outcome other = dedup_.run(request("r2", "b5", R"({"amount":2})"), handler_);
  EXPECT_EQ(other.kind, Outcome::Kind::kMismatch);
  EXPECT_EQ(other.layer, Layer::kRequestId);
  const Outcome same = dedup_.run(request("r3", "b5", R"({ "amount" : 1 })"), handler_);
  EXPECT_EQ(same.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(same.response, "sent 1");
  EXPECT_EQ(runs_, 1);
}

TEST_F(InMemoryFacade, SameKeyOtherPayloadIsMismatch) {
  (void)dedup_.run(request("r1", "b4", R"({"amount":1})"), handler_);
  DeduplicatorOptions no_cache;
  no_cache.guard = guard_;
  no_cache.local_cache_capacity = 0;
  Deduplicator uncached(no_cache);
  const Outcome other = uncached.run(request("r2", "b4", R"({"amount":2})"), handler_);
  EXPECT_EQ(other.kind, Outcome::Kind::kMismatch);
  EXPECT_EQ(runs_, 1);
}

TEST(InMemoryFacadeFailure, AFailingGuardWithoutSinkFailsClosed) {
  InMemoryGuardOptions tiny;
  tiny.max_records = 1;
  auto guard = std::make_shared<InMemoryGuard>(tiny);
  DeduplicatorOptions o;
  o.guard = guard;
  Deduplicator dedup(o);
  ASSERT_EQ(dedup.run(request("r1", "b1"), [] { return std::string(); }).kind,
            Outcome::Kind::kExecuted);
  bool ran = false;
  const Outcome full = dedup.run(request("r2", "b2"), [&] {
    ran = true;
    return std::string();
  });
  EXPECT_EQ(full.kind, Outcome::Kind::kUnavailable);
  EXPECT_FALSE(ran);
}

TEST(InMemoryFacadeConfig, RunTransactionalWithoutSinkIsAConfigError) {
  Deduplicator dedup(DeduplicatorOptions{});
  EXPECT_THROW((void)dedup.run_transactional(request("r1", "b1"),
                                             [](pqxx::transaction_base&) { return std::string(); }),
               ConfigError);
}

// A deduplicator that can stop nothing (a null guard and sink from a wiring mistake, the local
// cache off) is refused, not run as one that silently lets every duplicate through.
TEST(InMemoryFacadeConfig, NoLayerAtAllIsAConfigError) {
  DeduplicatorOptions o;
  o.local_cache_capacity = 0;
  EXPECT_THROW(Deduplicator{o}, ConfigError);
  o.local_cache_capacity = 16;  // the local cache alone: layer 1, one process
  EXPECT_NO_THROW(Deduplicator{o});
}

// A renewal interval as long as the lease can never renew in time.
TEST(InMemoryFacadeConfig, AnAutoRenewIntervalAsLongAsTheLeaseIsAConfigError) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>(
      InMemoryGuardOptions{.lease = std::chrono::milliseconds(3000)});
  o.auto_renew_interval = std::chrono::milliseconds(3000);
  EXPECT_THROW(Deduplicator{o}, ConfigError);
  o.auto_renew_interval = std::chrono::milliseconds(1000);
  EXPECT_NO_THROW(Deduplicator{o});
}

// Destroying a deduplicator while another thread's call runs (the natural "shutdown, then
// destroy") requests the handler's stop and waits for the call to return: no use after free.
TEST(InMemoryFacadeShutdown, DestroyingItWaitsForTheCallsInFlight) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  auto dedup = std::make_unique<Deduplicator>(o);
  std::promise<void> started;
  std::atomic<bool> handler_ended{false};
  std::thread caller([&] {
    try {
      (void)dedup->run(request("r1", "b1"), [&](Context& context) -> std::string {
        started.set_value();
        while (!context.stop_token().stop_requested()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // still running after stop
        handler_ended = true;
        throw Cancelled();
      });
    } catch (const Cancelled&) {
    }
  });
  started.get_future().wait();
  dedup->shutdown();
  dedup.reset();  // returns once the call is over, the handler's end and the claim's keeping too
  EXPECT_TRUE(handler_ended);
  caller.join();
}

// Without a request ID or business key the payload is the key, request-ID members included: a
// payload that carries another request ID is another request, not a replay of the first.
TEST(InMemoryFacadeInput, AFallbackKeyKeepsTheRequestIdInThePayload) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  Deduplicator dedup(o);
  int runs = 0;
  const auto handler = [&] { return "ran " + std::to_string(++runs); };
  EXPECT_EQ(dedup.run(request("", "", R"({"requestId":"r-1","amount":5})"), handler).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(dedup.run(request("", "", R"({"requestId":"r-2","amount":5})"), handler).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(dedup.run(request("", "", R"({"amount":5,"requestId":"r-1"})"), handler).kind,
            Outcome::Kind::kDuplicate);
  // Under a business key the request ID stays out of the fingerprint: a resend is a duplicate.
  EXPECT_EQ(dedup.run(request("", "b1", R"({"requestId":"r-1","amount":5})"), handler).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(dedup.run(request("", "b1", R"({"requestId":"r-3","amount":5})"), handler).kind,
            Outcome::Kind::kDuplicate);
  EXPECT_EQ(runs, 3);
}

TEST(InMemoryFacadeInput, InvalidRequestIdIsRejectedBeforeAnyClaim) {
  auto guard = std::make_shared<InMemoryGuard>();
  DeduplicatorOptions o;
  o.guard = guard;
  Deduplicator dedup(o);
  EXPECT_THROW((void)dedup.run(request("bad\r\nid", "b1"), [] { return std::string(); }),
               InvalidRequestId);
  EXPECT_THROW((void)dedup.run(request("r1", "b1", "{not json"), [] { return std::string(); }),
               PayloadError);
  EXPECT_EQ(guard->size(), 0u);
}

TEST(InMemoryFacadeRetention, AFallbackKeyRecordLivesOnlyTheFallbackRetention) {
  auto clock = std::make_shared<ManualClock>(0);
  InMemoryGuardOptions guard_options;
  guard_options.clock = clock;
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>(guard_options);
  o.local_cache_capacity = 0;
  o.fallback_retention = std::chrono::seconds(30);
  Deduplicator dedup(o);
  Request by_payload;
  by_payload.user = "u1";
  by_payload.intent = "notify";
  by_payload.payload = R"({"text":"hello"})";
  Request by_id = by_payload;
  by_id.request_id = "r1";
  auto send = [] { return std::string("sent"); };
  ASSERT_EQ(dedup.run(by_payload, send).kind, Outcome::Kind::kExecuted);
  ASSERT_EQ(dedup.run(by_id, send).kind, Outcome::Kind::kExecuted);
  clock->advance_ms(29'999);
  EXPECT_EQ(dedup.run(by_payload, send).kind, Outcome::Kind::kDuplicate);
  clock->advance_ms(1);
  EXPECT_EQ(dedup.run(by_payload, send).kind, Outcome::Kind::kExecuted)
      << "30 s later it may repeat";
  EXPECT_EQ(dedup.run(by_id, send).kind, Outcome::Kind::kDuplicate)
      << "an ID keeps the guard's retention";
}

TEST(InMemoryFacadeWindow,
     FallbackKeyCatchesARepeatJustAcrossABucketBoundaryButNotTwoBucketsLater) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  o.local_cache_capacity = 0;
  o.fingerprint->time_bucket = std::chrono::seconds(1);
  Deduplicator dedup(o);
  Request r;
  r.user = "u1";
  r.intent = "notify";
  r.payload = R"({"text":"hello"})";
  auto send = [] { return std::string("sent"); };
  // Start just before a whole second, so the repeat lands in the next bucket.
  const auto now = std::chrono::system_clock::now();
  const auto next_second = std::chrono::ceil<std::chrono::seconds>(now);
  std::this_thread::sleep_until(next_second + std::chrono::milliseconds(900));
  ASSERT_EQ(dedup.run(r, send).kind, Outcome::Kind::kExecuted);
  std::this_thread::sleep_until(next_second + std::chrono::milliseconds(1200));  // next bucket
  const Outcome across = dedup.run(r, send);
  EXPECT_EQ(across.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(across.response, "sent");
  std::this_thread::sleep_until(next_second + std::chrono::milliseconds(3200));  // two buckets on
  EXPECT_EQ(dedup.run(r, send).kind, Outcome::Kind::kExecuted)
      << "the same content may repeat later";
}

TEST(InMemoryFacadeConfig, BadDurationsAndFingerprintOptionsAreConfigErrors) {
  DeduplicatorOptions negative_fallback;
  negative_fallback.fallback_retention = std::chrono::milliseconds(-1);
  EXPECT_THROW(Deduplicator{negative_fallback}, ConfigError);
  DeduplicatorOptions negative_bucket;
  negative_bucket.fingerprint->time_bucket = std::chrono::seconds(-1);
  EXPECT_THROW(Deduplicator{negative_bucket}, ConfigError);
}

TEST(InMemoryFacadeConfig, TheSeedCompatibleFingerprintWorksThroughTheFacade) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  o.local_cache_capacity = 0;
  o.fingerprint->form = CanonicalForm::kPythonJsonDumps;
  o.fingerprint->hash = HashAlgorithm::kMd5;
  o.fingerprint->domain_separated = false;
  Deduplicator dedup(o);
  std::string seen;
  (void)dedup.run(request("r1", "b1", R"({"b":1,"a":"x"})"), [&](Context& context) {
    seen = context.fingerprint();
    return std::string();
  });
  // md5 of Python's json.dumps({"a":"x","b":1}, sort_keys=True, separators=(",",":")), 32 hex
  // digits
  EXPECT_EQ(seen, "ee0d9126fa9a3ac9850bed8a722d2d11");
}

TEST(InMemoryFacadeEvents, AThrowingDecisionSinkDoesNotTurnAnExecutionIntoAnError) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  o.on_decision = [](const DecisionEvent&) { throw std::runtime_error("log sink down"); };
  Deduplicator dedup(o);
  int runs = 0;
  const Outcome outcome = dedup.run(request("r1", "b1"), [&] { return std::to_string(++runs); });
  EXPECT_EQ(outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 1);
}

// A handler that throws emits one failure event and is counted, so a failing consumer shows in
// the decision log and in /metrics.
TEST(InMemoryFacadeEvents, AThrowingHandlerEmitsOneFailureEventAndIsCountedApartFromDecisions) {
  struct Seen {
    bool handler_failed;
    std::string error, request_id, key;
    Layer layer;
  };
  std::vector<Seen> seen;
  const auto metrics = std::make_shared<InProcessMetrics>();
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  o.metrics = metrics;
  o.on_decision = [&](const DecisionEvent& e) {
    seen.push_back({e.handler_failed, std::string(e.error), std::string(e.request_id),
                    std::string(e.key), e.layer});
  };
  Deduplicator dedup(o);
  EXPECT_THROW((void)dedup.run(request("r1", "b1"),
                               []() -> std::string { throw std::runtime_error("card declined"); }),
               std::runtime_error);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].handler_failed);
  EXPECT_EQ(seen[0].error, "card declined");
  EXPECT_EQ(seen[0].request_id, "r1");
  EXPECT_EQ(seen[0].key, "u1:notify:b1");
  EXPECT_EQ(seen[0].layer, Layer::kHandler);
  EXPECT_EQ(metrics->handler_failures(), 1u);
  EXPECT_EQ(metrics->total_decisions(), 0u);
  EXPECT_NE(metrics->prometheus_text().find("\nidem_handler_failures_total 1\n"),
            std::string::npos);

  EXPECT_THROW((void)dedup.run(request("r2", "b2"), []() -> std::string { throw 42; }), int);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].error, "unknown exception");

  // Not handler failures: a cancellation, and input rejected before the handler.
  EXPECT_THROW((void)dedup.run(request("r3", "b3"), []() -> std::string { throw Cancelled(); }),
               Cancelled);
  EXPECT_THROW((void)dedup.run(request("r4", "b4", "{not json"), [] { return std::string(); }),
               PayloadError);
  EXPECT_EQ(seen.size(), 2u);

  // The retry after the business failure runs and is an ordinary decision.
  EXPECT_EQ(dedup.run(request("r1", "b1"), [] { return std::string("ok"); }).kind,
            Outcome::Kind::kExecuted);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_FALSE(seen[2].handler_failed);
  EXPECT_EQ(seen[2].error, "");
  EXPECT_EQ(metrics->handler_failures(), 2u);
  EXPECT_EQ(metrics->decisions(Layer::kHandler, Outcome::Kind::kExecuted), 1u);
}

TEST(InMemoryFacadeLease, AHandlerThatOutlivesItsLeaseIsToldAndAHandlerThatDoesNotIsNot) {
  const auto clock = std::make_shared<ManualClock>(1'000'000);
  DeduplicatorOptions options;
  options.guard = std::make_shared<InMemoryGuard>(
      InMemoryGuardOptions{.lease = std::chrono::milliseconds(1000), .clock = clock});
  Deduplicator dedup(std::move(options));
  Outcome redelivery;
  const Outcome first = dedup.run(request("r1", "b9"), [&] {
    clock->advance_ms(1500);  // past the lease: the redelivery claims the key and runs
    redelivery = dedup.run(request("r2", "b9"), [] { return std::string("second"); });
    return std::string("first");
  });
  EXPECT_EQ(redelivery.kind, Outcome::Kind::kExecuted);
  EXPECT_FALSE(redelivery.lease_lost);
  EXPECT_EQ(first.kind, Outcome::Kind::kExecuted);
  EXPECT_TRUE(first.lease_lost);
  const Outcome within = dedup.run(request("r3", "b10"), [&] {
    clock->advance_ms(900);
    return std::string("in time");
  });
  EXPECT_FALSE(within.lease_lost);
}

// The facade with an in-memory sink: the sink paths of run() without PostgreSQL.
class InMemorySinkFacade : public ::testing::Test {
 protected:
  std::shared_ptr<InMemoryGuard> guard_ = std::make_shared<InMemoryGuard>();
  std::shared_ptr<InMemorySink> sink_ = std::make_shared<InMemorySink>();
  DeduplicatorOptions options() const {
    DeduplicatorOptions o;
    o.guard = guard_;
    o.sink = sink_;
    o.local_cache_capacity = 0;
    return o;
  }
};

TEST_F(InMemorySinkFacade, AFailedHandlerReleasesTheSinkRowAndTheRetryRuns) {
  Deduplicator dedup(options());
  EXPECT_THROW(
      (void)dedup.run(request("r1", "b1"), []() -> std::string { throw std::logic_error("no"); }),
      std::logic_error);
  EXPECT_EQ(sink_->size(), 0u);
  EXPECT_EQ(dedup.run(request("r1", "b1"), [] { return std::string("yes"); }).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(sink_->inspect("u1:notify:b1")->state, RecordState::kCompleted);
}

TEST_F(InMemorySinkFacade, StoreAsResponseIsReplayedFromTheSinkAfterTheGuardForgets) {
  DeduplicatorOptions o = options();
  o.on_handler_failure = [](std::exception_ptr) {
    return FailureDecision{FailureAction::kStoreAsResponse, "declined"};
  };
  Deduplicator dedup(o);
  EXPECT_THROW(
      (void)dedup.run(request("r1", "b2"), []() -> std::string { throw std::runtime_error("x"); }),
      std::runtime_error);
  DeduplicatorOptions forgetful = options();
  forgetful.guard = std::make_shared<InMemoryGuard>();  // Redis lost its data
  Deduplicator after(forgetful);
  const Outcome replay = after.run(request("r2", "b2"), [] { return std::string("ran"); });
  EXPECT_EQ(replay.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(replay.layer, Layer::kPgSink);
  EXPECT_EQ(replay.response, "declined");
}

TEST_F(InMemorySinkFacade, RunTransactionalNeedsAPgSink) {
  Deduplicator dedup(options());
  EXPECT_THROW((void)dedup.run_transactional(request("r1", "b3"),
                                             [](pqxx::transaction_base&) { return std::string(); }),
               ConfigError);
  EXPECT_EQ(guard_->size(), 0u);
}

// A handler that outlived its lease without renewing is told while it runs, not only by
// Outcome::lease_lost after the fact.
TEST(InMemoryFacadeLease, ContextLeaseLostIsTrueInsideAHandlerPastItsLease) {
  DeduplicatorOptions o;
  o.guard =
      std::make_shared<InMemoryGuard>(InMemoryGuardOptions{.lease = std::chrono::milliseconds(30)});
  Deduplicator dedup(std::move(o));
  bool before = true;
  bool after = false;
  const Outcome outcome = dedup.run(request("r1", "b11"), [&](Context& context) {
    before = context.lease_lost();
    std::this_thread::sleep_for(std::chrono::milliseconds(60));  // past the 30 ms lease
    after = context.lease_lost();
    return std::string("late");
  });
  EXPECT_FALSE(before);
  EXPECT_TRUE(after);
  EXPECT_TRUE(outcome.lease_lost);
}

// 250 ms on a 100 ms lease: only renewals keep the claim, for the first call and for one after
// the renewer went idle. Its thread, idle once the first calls had ended, slept through the next
// calls' start: only the handlers running when it first ran were renewed.
TEST(InMemoryFacadeLease, AutomaticRenewalKeepsALongHandlersClaimAlsoAfterTheRenewerWentIdle) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>(
      InMemoryGuardOptions{.lease = std::chrono::milliseconds(100)});
  o.auto_renew_interval = std::chrono::milliseconds(20);
  Deduplicator dedup(std::move(o));
  const auto long_call = [&](const char* id) {
    return dedup.run(request(id, id), [&](Context& context) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      EXPECT_FALSE(context.lease_lost()) << id;
      return std::string("done");
    });
  };
  EXPECT_FALSE(long_call("b12").lease_lost);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the renewer has none due
  ASSERT_EQ(dedup.run(request("b13", "b13"), [] { return std::string("quick"); }).kind,
            Outcome::Kind::kExecuted);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(long_call("b14").lease_lost);
}

// A message re-sent with a new request ID in its body's requestId field (where
// request_id_from_json() reads it) is a duplicate, not a mismatch: that field is left out of the
// fingerprint.
TEST(InMemoryFacadeFingerprint, AReSendWithANewRequestIdIsADuplicateNotAMismatch) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  o.local_cache_capacity = 0;
  Deduplicator dedup(o);
  const auto refund = [](const std::string& id) {
    return request(id, "order-7", R"({"requestId":")" + id + R"(","amount":5})");
  };
  ASSERT_EQ(dedup.run(refund("m-1"), [] { return std::string("refunded"); }).kind,
            Outcome::Kind::kExecuted);
  const Outcome resent = dedup.run(refund("m-2"), [] { return std::string("again"); });
  EXPECT_EQ(resent.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(resent.response, "refunded");
  // Another amount is still another payload.
  EXPECT_EQ(dedup
                .run(request("m-3", "order-7", R"({"requestId":"m-3","amount":6})"),
                     [] { return std::string(); })
                .kind,
            Outcome::Kind::kMismatch);
  // Opting out fingerprints the field again (on a guard of its own: the records above were made
  // under other options, which carry no verdict).
  o.request_id_fields = {};
  o.guard = std::make_shared<InMemoryGuard>();
  Deduplicator strict(o);
  ASSERT_EQ(strict.run(refund("m-1"), [] { return std::string(); }).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(strict.run(refund("m-4"), [] { return std::string(); }).kind, Outcome::Kind::kMismatch);
}

// Records whose fingerprints were made under other fingerprint options (e.g. before an exclude
// was added) carry no verdict: a repeat is a duplicate, never a mismatch.
TEST(InMemoryFacadeFingerprint, RecordsMadeUnderOtherFingerprintOptionsAreNoMismatch) {
  auto guard = std::make_shared<InMemoryGuard>();
  DeduplicatorOptions before;
  before.guard = guard;
  before.local_cache_capacity = 0;
  before.request_id_fields = {};
  Deduplicator old_service(before);
  ASSERT_EQ(old_service
                .run(request("r1", "o-1", R"({"traceId":"t-1","amount":5})"),
                     [] { return std::string("done"); })
                .kind,
            Outcome::Kind::kExecuted);
  DeduplicatorOptions after = before;
  after.fingerprint = FingerprintOptions{.exclude = {"/traceId"}};
  Deduplicator new_service(after);
  const Outcome repeat = new_service.run(request("r2", "o-1", R"({"traceId":"t-2","amount":5})"),
                                         [] { return std::string("twice"); });
  EXPECT_EQ(repeat.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(repeat.response, "done");
  // Under one set of options a changed payload is still a mismatch.
  ASSERT_EQ(
      new_service.run(request("r3", "o-2", R"({"amount":1})"), [] { return std::string(); }).kind,
      Outcome::Kind::kExecuted);
  EXPECT_EQ(
      new_service.run(request("r4", "o-2", R"({"amount":2})"), [] { return std::string(); }).kind,
      Outcome::Kind::kMismatch);
}

// Fencing per attempt: a sink row was owned by its request ID, so an earlier attempt of a
// request could complete the row of a later attempt (a redelivery) that had taken the key over
// after the first's lease ran out.
TEST(InMemorySinkFencing, AnEarlierAttemptCannotCompleteALaterAttemptsTakeover) {
  const auto clock = std::make_shared<ManualClock>(1'000'000);
  auto sink = std::make_shared<InMemorySink>(
      InMemorySinkOptions{.lease = std::chrono::milliseconds(1000), .clock = clock});
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>(
      InMemoryGuardOptions{.lease = std::chrono::milliseconds(1000), .clock = clock});
  o.sink = sink;
  o.local_cache_capacity = 0;
  Deduplicator dedup(o);
  std::promise<void> second_running;
  std::promise<void> first_done;
  Outcome second;
  std::thread redelivery;
  const Outcome first = dedup.run(request("r1", "b20"), [&] {
    clock->advance_ms(1500);  // both leases ran out: the redelivery takes the key over
    redelivery = std::thread([&] {
      second = dedup.run(request("r1", "b20"), [&] {
        second_running.set_value();
        first_done.get_future().wait();
        return std::string("second");
      });
    });
    second_running.get_future().wait();
    return std::string("first");
  });
  // The first attempt's completion found neither claim its own: the row is still the second's.
  EXPECT_TRUE(first.lease_lost);
  EXPECT_EQ(sink->inspect("u1:notify:b20")->state, RecordState::kInProgress);
  first_done.set_value();
  redelivery.join();
  EXPECT_EQ(second.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(sink->claim("u1:notify:b20", "r9", "").response, "second");
}

TEST(InMemorySinkFencing, RenewalKeepsTheSinkRowOfALongRunHandler) {
  auto sink =
      std::make_shared<InMemorySink>(InMemorySinkOptions{.lease = std::chrono::milliseconds(100)});
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>(
      InMemoryGuardOptions{.lease = std::chrono::milliseconds(100)});
  o.sink = sink;
  o.auto_renew_interval = std::chrono::milliseconds(20);
  Deduplicator dedup(o);
  const Outcome outcome = dedup.run(request("r1", "b21"), [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    // Without renewal the sink row's 100 ms lease would have run out: another claim took it.
    EXPECT_EQ(sink->claim("u1:notify:b21", "r2", "").status, SinkStatus::kDuplicate);
    return std::string("done");
  });
  EXPECT_FALSE(outcome.lease_lost);
  EXPECT_EQ(sink->inspect("u1:notify:b21")->state, RecordState::kCompleted);
}

}  // namespace
}  // namespace idem
