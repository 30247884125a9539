// The table: one Scenario per rule, each run through every driver (conformance_test.cc). `row`
// names the row of docs/semantics.md's outcome table a scenario proves; the table there links
// back to the scenarios by name. Endings, states, events and metrics are written as the renderers
// of conformance.h write them.
#include <chrono>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "conformance.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"

namespace idem::conformance {
namespace {

using std::chrono::milliseconds;
using Act = test::Behaviour::Act;

// The rows of docs/semantics.md's outcome table.
constexpr const char* kFirstTime = "first time";
constexpr const char* kRepeatCompleted = "repeat, first completed";
constexpr const char* kOverCap = "repeat, first completed, response over the size cap";
constexpr const char* kInProgress = "repeat while the first is still running";
constexpr const char* kMismatch = "same key, different payload fingerprint";
constexpr const char* kBackendDown = "a required backend is down";
constexpr const char* kBusinessError = "handler throws a business error";
constexpr const char* kHandlerCancelled = "handler throws idem::Cancelled";
constexpr const char* kStopBefore = "the request's stop was requested before the call";
constexpr const char* kCommitLost = "the commit's connection was lost";
constexpr const char* kCommitRefused = "the server refused the commit";
constexpr const char* kNotSaved = "first time, but a layer failed to save the response";
constexpr const char* kMissingKey = "no request ID, no business key, and no payload";
constexpr const char* kEdgeWhiteSpace = "user, intent or biz_key with leading/trailing white space";
constexpr const char* kInvalidRequestId = "invalid request ID";

// The key most scenarios use: user "u", intent "refund", business key "order-7".
const std::string kKey = "u:refund:order-7";

Request order(const std::string& request_id, const std::string& payload = R"({"amount":10})") {
  return Request{.request_id = request_id,
                 .user = "u",
                 .intent = "refund",
                 .biz_key = "order-7",
                 .payload = payload};
}

Request unkeyed(const std::string& payload) {
  return Request{.user = "u", .intent = "refund", .payload = payload};
}

test::Behaviour returns(const std::string& response) { return {.response = response}; }
test::Behaviour fails(const std::string& error = "refused") {
  return {.act = Act::kThrowBusiness, .response = error};
}
test::Behaviour throws_cancelled() { return {.act = Act::kThrowCancelled}; }
test::Behaviour waits() { return {.act = Act::kWaitUntilStopped}; }

std::function<std::exception_ptr()> redis_down() {
  return
      [] { return std::make_exception_ptr(RedisError("idem: redis: connection refused", true)); };
}
std::function<std::exception_ptr()> redis_timeout() {
  return [] { return std::make_exception_ptr(RedisError("idem: redis: timeout", true)); };
}
std::function<std::exception_ptr()> pg_down() {
  return [] {
    return std::make_exception_ptr(
        PostgresError("idem: postgres: connection refused", true, "08006"));
  };
}
// PgSink's own response_timeout: no answer in time, the connection closed.
std::function<std::exception_ptr()> pg_timeout() {
  return [] {
    return std::make_exception_ptr(
        PostgresError("idem: postgres: no answer within response_timeout", true));
  };
}
// The server's statement_timeout: SQLSTATE 57014, retryable.
std::function<std::exception_ptr()> pg_statement_timeout() {
  return [] {
    return std::make_exception_ptr(
        PostgresError("ERROR: canceling statement due to statement timeout", true, "57014"));
  };
}

// A COMMIT of a transaction a failed statement aborted: SQLSTATE 25P02, not retryable.
std::function<std::exception_ptr()> pg_aborted_transaction() {
  return [] {
    return std::make_exception_ptr(PostgresError(
        "idem: postgres: the transaction was rolled back, not committed", false, "25P02"));
  };
}

Fault stop_at(Op op, int nth = 1) { return Fault{.op = op, .nth = nth, .stop = true}; }
Fault deadline_at(Op op, int nth = 1) { return Fault{.op = op, .nth = nth, .deadline = true}; }
Fault fail_at(Op op, std::function<std::exception_ptr()> error, int nth = 1) {
  return Fault{.op = op, .nth = nth, .error = std::move(error)};
}
// The backend applied the call, then its answer was lost (a timeout).
Fault lost_at(Op op, std::function<std::exception_ptr()> error = redis_timeout()) {
  return Fault{.op = op, .error = std::move(error), .after = true};
}

void no_cache(DeduplicatorOptions& o) { o.local_cache_capacity = 0; }

std::function<void(DeduplicatorOptions&)> wait_for_result(milliseconds longest, milliseconds poll,
                                                          bool cache = false) {
  return [=](DeduplicatorOptions& o) {
    o.on_concurrent_duplicate = ConcurrentDuplicatePolicy::kWaitForResult;
    o.wait_for_result = longest;
    o.wait_poll_interval = poll;
    if (!cache) o.local_cache_capacity = 0;
  };
}

std::function<void(DeduplicatorOptions&)> on_failure(FailureAction action,
                                                     const std::string& response = "") {
  return [=](DeduplicatorOptions& o) {
    o.on_handler_failure = [=](std::exception_ptr) { return FailureDecision{action, response}; };
  };
}

std::function<void(World&)> held_elsewhere(const std::string& request_id = "r0") {
  return [=](World& w) { w.claim_elsewhere(kKey, request_id); };
}

// Fallback keys in day-long time buckets (a boundary never falls inside a run); the local cache
// off, so every repeat reaches the guard.
constexpr auto kDay = std::chrono::hours(24);
const std::string kPayload = R"({"amount":10})";

std::function<void(DeduplicatorOptions&)> bucketed() {
  return [](DeduplicatorOptions& o) {
    o.fingerprint = FingerprintOptions{.time_bucket = kDay};
    o.request_id_fields = {};
    o.local_cache_capacity = 0;
  };
}

// The fallback key of kPayload in this bucket, or in the one before, as the facade makes it.
std::string bucket_key(bool previous) {
  const Fingerprinter fingerprinter(FingerprintOptions{.time_bucket = kDay});
  const Fingerprinter::Window window =
      fingerprinter.fingerprint_window(kPayload, "u", std::chrono::system_clock::now());
  return fallback_key("u", "refund", previous ? window.previous : window.current);
}
std::string current_bucket_key() { return bucket_key(false); }
std::string previous_bucket_key() { return bucket_key(true); }

constexpr const char* kNoSizeCap =
    "SimPostgres keeps every response verbatim: it has no response size cap";

// ---- the outcome table
// ---------------------------------------------------------------------------

void outcome_table(std::vector<Scenario>& t) {
  const char* area = "outcome table";
  t.push_back({.name = "FirstTimeExecutes",
               .area = area,
               .row = kFirstTime,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back(
      {.name = "FirstTimeWithASinkCompletesBothLayers",
       .area = area,
       .row = kFirstTime,
       .sink = true,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1"});
  t.push_back({.name = "FirstTimeWithOnlyASink",
               .area = area,
               .row = kFirstTime,
               .guard = false,
               .sink = true,
               .options = no_cache,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .held = {{.sink = "completed(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back({.name = "TheHandlerSeesItsCall",
               .area = area,
               .row = kFirstTime,
               .calls = {{.request =
                              [] {
                                Request r = order("r1");
                                r.attempt = 3;
                                return r;
                              }(),
                          .ending = "executed handler response=done",
                          .saw = "key=ok request_id=r1 fingerprint=yes attempt=3"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back({.name = "ARepeatIsReplayedByTheLocalCache",
               .area = area,
               .row = kRepeatCompleted,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                         {.request = order("r2"),
                          .handler = returns("again"),
                          .ending = "duplicate request_id replayed response=done"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler", "#1 duplicate request_id"},
               .metrics = "decisions=2"});
  t.push_back({.name = "ARepeatIsReplayedByTheGuard",
               .area = area,
               .row = kRepeatCompleted,
               .options = no_cache,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                         {.request = order("r2"),
                          .handler = returns("again"),
                          .ending = "duplicate redis_guard replayed response=done"}},
               .held = {{.guard = "completed(done)"}},
               .events = {"#0 executed handler", "#1 duplicate redis_guard"},
               .metrics = "decisions=2"});
  t.push_back({.name = "ARepeatIsReplayedByTheSink",
               .area = area,
               .row = kRepeatCompleted,
               .guard = false,
               .sink = true,
               .options = no_cache,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                         {.request = order("r2"),
                          .handler = returns("again"),
                          .ending = "duplicate pg_sink replayed response=done"}},
               .held = {{.sink = "completed(done)"}},
               .events = {"#0 executed handler", "#1 duplicate pg_sink"},
               .metrics = "decisions=2"});
  t.push_back({.name = "ARepeatTheGuardForgotIsReplayedByTheSinkAndTheGuardLearnsIt",
               .area = area,
               .row = kRepeatCompleted,
               .sink = true,
               .options = no_cache,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                         {.request = order("r2"),
                          .handler = returns("again"),
                          .before = [](World& w) { w.advance_guard(std::chrono::hours(25)); },
                          .ending = "duplicate pg_sink replayed response=done"}},
               .held = {{.guard = "completed(done)", .sink = "completed(done)"}},
               .events = {"#0 executed handler", "#1 duplicate pg_sink"},
               .metrics = "decisions=2"});
  t.push_back({.name = "AResponseOverTheSizeCapIsADuplicateWithoutABody",
               .area = area,
               .row = kOverCap,
               .guard = false,
               .sink = true,
               .options = no_cache,
               .sink_max_response_bytes = 8,
               .calls = {{.request = order("r1"),
                          .handler = returns("a response over the cap"),
                          .ending = "executed handler response=a response over the cap"},
                         {.request = order("r2"), .ending = "duplicate pg_sink no_response"}},
               .held = {{.sink = "completed(sha256)"}},
               .events = {"#0 executed handler", "#1 duplicate pg_sink"},
               .metrics = "decisions=2",
               .not_on = {{"sim", kNoSizeCap}}});
  // The local cache replayed a response over the cap in full, where the layers replay none.
  t.push_back({.name = "ARepeatOfAResponseOverTheSizeCapInTheSameProcessHasNoBodyEither",
               .area = area,
               .row = kOverCap,
               .guard = false,
               .sink = true,
               .sink_max_response_bytes = 8,
               .calls = {{.request = order("r1"),
                          .handler = returns("a response over the cap"),
                          .ending = "executed handler response=a response over the cap"},
                         {.request = order("r1"), .ending = "duplicate request_id no_response"}},
               .held = {{.sink = "completed(sha256)", .local = "hit()"}},
               .events = {"#0 executed handler", "#1 duplicate request_id"},
               .metrics = "decisions=2",
               .not_on = {{"sim", kNoSizeCap}}});
  t.push_back({.name = "ARepeatWhileTheFirstRunsIsInProgress",
               .area = area,
               .row = kInProgress,
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "in_progress redis_guard"}},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 in_progress redis_guard"},
               .metrics = "decisions=1"});
  t.push_back({.name = "ARepeatIsInProgressUntilTheLeaseOfACancelledFirstEnds",
               .area = area,
               .row = kInProgress,
               .calls = {{.request = order("r1"),
                          .handler = throws_cancelled(),
                          .ending = "throws Cancelled",
                          .runs = 1},
                         {.request = order("r2"), .ending = "in_progress redis_guard"},
                         {.request = order("r3"),
                          .before = [](World& w) { w.advance_guard(milliseconds(30'001)); },
                          .ending = "executed handler response=done"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#1 in_progress redis_guard", "#2 executed handler"},
               .metrics = "decisions=2"});
  t.push_back({.name = "ARepeatWhileTheFirstRunsIsInProgressInTheSink",
               .area = area,
               .row = kInProgress,
               .guard = false,
               .sink = true,
               .options = no_cache,
               .calls = {{.request = order("r1"),
                          .before = [](World& w) { w.sink_claim_elsewhere(kKey, "r0"); },
                          .ending = "in_progress pg_sink"}},
               .held = {{.sink = "in_progress"}},
               .events = {"#0 in_progress pg_sink"},
               .metrics = "decisions=1"});
  t.push_back({.name = "WaitForResultReplaysTheFirstOnceItCompletes",
               .area = area,
               .row = kInProgress,
               .options = wait_for_result(milliseconds(5000), milliseconds(2)),
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "duplicate redis_guard replayed response=first"}},
               .faults = {{.op = Op::kGuardClaim,
                           .nth = 2,
                           .act = [](World& w) { w.complete_elsewhere(kKey, "first"); }}},
               .held = {{.guard = "completed(first)"}},
               .events = {"#0 duplicate redis_guard"},
               .metrics = "decisions=1"});
  t.push_back({.name = "WaitForResultReplaysTheFirstOnceItCompletesInTheSink",
               .area = area,
               .row = kInProgress,
               .guard = false,
               .sink = true,
               .options = wait_for_result(milliseconds(5000), milliseconds(2)),
               .calls = {{.request = order("r1"),
                          .before = [](World& w) { w.sink_claim_elsewhere(kKey, "r0"); },
                          .ending = "duplicate pg_sink replayed response=first"}},
               .faults = {{.op = Op::kSinkClaim,
                           .nth = 2,
                           .act = [](World& w) { w.sink_complete_elsewhere(kKey, "first"); }}},
               .held = {{.sink = "completed(first)"}},
               .events = {"#0 duplicate pg_sink"},
               .metrics = "decisions=1"});
  t.push_back({.name = "WaitForResultRunsWhenTheFirstReleases",
               .area = area,
               .row = kInProgress,
               .options = wait_for_result(milliseconds(5000), milliseconds(2)),
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "executed handler response=done"}},
               .faults = {{.op = Op::kGuardClaim,
                           .nth = 2,
                           .act = [](World& w) { w.release_elsewhere(kKey); }}},
               .held = {{.guard = "completed(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back({.name = "WaitForResultAnswersInProgressWhenTheWaitEnds",
               .area = area,
               .row = kInProgress,
               .options = wait_for_result(milliseconds(6), milliseconds(2)),
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "in_progress redis_guard"}},
               .held = {{.guard = "in_progress"}},
               .events = {"#0 in_progress redis_guard"},
               .metrics = "decisions=1"});
  t.push_back(
      {.name = "AnotherPayloadUnderOneKeyIsAMismatch",
       .area = area,
       .row = kMismatch,
       .options = no_cache,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                 {.request = order("r2", R"({"amount":99})"), .ending = "mismatch redis_guard"}},
       .held = {{.guard = "completed(done)"}},
       .events = {"#0 executed handler", "#1 mismatch redis_guard"},
       .metrics = "decisions=2"});
  t.push_back(
      {.name = "AnotherPayloadIsAMismatchInTheLocalCache",
       .area = area,
       .row = kMismatch,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                 {.request = order("r2", R"({"amount":99})"), .ending = "mismatch request_id"}},
       .held = {{.guard = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler", "#1 mismatch request_id"},
       .metrics = "decisions=2"});
  t.push_back(
      {.name = "AnotherPayloadIsAMismatchWhileTheFirstRuns",
       .area = area,
       .row = kMismatch,
       .calls = {{.request = order("r1"),
                  .handler = throws_cancelled(),
                  .ending = "throws Cancelled",
                  .runs = 1},
                 {.request = order("r2", R"({"amount":99})"), .ending = "mismatch redis_guard"}},
       .held = {{.guard = "in_progress", .local = "miss"}},
       .events = {"#1 mismatch redis_guard"},
       .metrics = "decisions=1"});
  t.push_back(
      {.name = "AnotherPayloadIsAMismatchInTheSink",
       .area = area,
       .row = kMismatch,
       .guard = false,
       .sink = true,
       .options = no_cache,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                 {.request = order("r2", R"({"amount":99})"), .ending = "mismatch pg_sink"}},
       .held = {{.sink = "completed(done)"}},
       .events = {"#0 executed handler", "#1 mismatch pg_sink"},
       .metrics = "decisions=2"});
  t.push_back({.name = "TheRequestIdFieldIsNoPartOfTheFingerprint",
               .area = area,
               .row = kRepeatCompleted,
               .calls = {{.request = order("r1", R"({"requestId":"r1","amount":10})"),
                          .ending = "executed handler response=done"},
                         {.request = order("r2", R"({"requestId":"r2","amount":10})"),
                          .ending = "duplicate request_id replayed response=done"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler", "#1 duplicate request_id"},
               .metrics = "decisions=2"});
}

// ---- backends down --------------------------------------------------------------------------

void backends_down(std::vector<Scenario>& t) {
  const char* area = "backend down";
  t.push_back(
      {.name = "GuardDownFailsClosedWithoutASink",
       .area = area,
       .row = kBackendDown,
       .calls = {{.request = order("r1"),
                  .ending = "unavailable redis_guard error=idem: redis: connection refused"}},
       .faults = {fail_at(Op::kGuardClaim, redis_down())},
       .held = {{.guard = "absent", .local = "miss"}},
       .events = {"#0 unavailable redis_guard"},
       .metrics = "decisions=1 guard_errors=1"});
  t.push_back({.name = "GuardDownFailsOpenToTheSink",
               .area = area,
               .row = kBackendDown,
               .sink = true,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {fail_at(Op::kGuardClaim, redis_down())},
               .held = {{.guard = "absent", .sink = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1 guard_errors=1"});
  t.push_back(
      {.name = "GuardDownFailsOpenUnguardedWhenToldToWithoutASink",
       .area = area,
       .row = kBackendDown,
       .options =
           [](DeduplicatorOptions& o) { o.on_redis_failure = RedisFailurePolicy::kFailOpen; },
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
       .faults = {fail_at(Op::kGuardClaim, redis_down())},
       .held = {{.guard = "absent", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1 guard_errors=1"});
  t.push_back(
      {.name = "GuardDownFailsClosedWithASinkWhenToldTo",
       .area = area,
       .row = kBackendDown,
       .sink = true,
       .options =
           [](DeduplicatorOptions& o) { o.on_redis_failure = RedisFailurePolicy::kFailClosed; },
       .calls = {{.request = order("r1"),
                  .ending = "unavailable redis_guard error=idem: redis: connection refused"}},
       .faults = {fail_at(Op::kGuardClaim, redis_down())},
       .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
       .events = {"#0 unavailable redis_guard"},
       .metrics = "decisions=1 guard_errors=1"});
  t.push_back(
      {.name = "SinkDownIsUnavailableAndReleasesTheGuardClaim",
       .area = area,
       .row = kBackendDown,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .ending = "unavailable pg_sink error=idem: postgres: connection refused"}},
       .faults = {fail_at(Op::kSinkClaim, pg_down())},
       .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
       .events = {"#0 unavailable pg_sink"},
       .metrics = "decisions=1 sink_errors=1 releases=1"});
  t.push_back({.name = "AClaimTheReplicasDidNotAcknowledgeIsReleasedWhenFailingClosed",
               .area = area,
               .row = kBackendDown,
               .calls = {{.request = order("r1"),
                          .ending = "unavailable redis_guard error=idem: the claim was not "
                                    "acknowledged by the replicas the guard waits for; released"},
                         {.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {{.op = Op::kGuardClaim, .unreplicated = true}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 unavailable redis_guard", "#1 executed handler"},
               .metrics = "decisions=2 guard_errors=1 releases=1"});
  t.push_back(
      {.name = "AClaimTheReplicasDidNotAcknowledgeGoesOnWhenFailingOpen",
       .area = area,
       .row = kBackendDown,
       .sink = true,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
       .faults = {{.op = Op::kGuardClaim, .unreplicated = true}},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1 guard_errors=1"});
}

// ---- the handler fails -------------------------------------------------------------------------

void handler_failures(std::vector<Scenario>& t) {
  const char* area = "handler failure";
  t.push_back({.name = "AHandlerErrorPropagatesAndReleasesTheClaim",
               .area = area,
               .row = kBusinessError,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1},
                         {.request = order("r1"), .ending = "executed handler response=done"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 failed(refused)", "#1 executed handler"},
               .metrics = "decisions=1 handler_failures=1 releases=1"});
  t.push_back({.name = "AHandlerErrorReleasesTheGuardClaimAndTheSinkRow",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1"});
  t.push_back({.name = "FailureActionReleaseReleases",
               .area = area,
               .row = kBusinessError,
               .options = on_failure(FailureAction::kRelease),
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1"});
  t.push_back({.name = "FailureActionKeepUntilLeaseEndsKeepsTheClaim",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .options = on_failure(FailureAction::kKeepUntilLeaseEnds),
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1},
                         {.request = order("r2"), .ending = "in_progress redis_guard"}},
               .held = {{.guard = "in_progress", .sink = "in_progress", .local = "miss"}},
               .events = {"#0 failed(refused)", "#1 in_progress redis_guard"},
               .metrics = "decisions=1 handler_failures=1"});
  t.push_back({.name = "FailureActionStoreAsResponseIsReplayed",
               .area = area,
               .row = kBusinessError,
               .options = on_failure(FailureAction::kStoreAsResponse, "stored refusal"),
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1},
                         {.request = order("r2"),
                          .ending = "duplicate request_id replayed response=stored refusal"}},
               .held = {{.guard = "completed(stored refusal)", .local = "hit(stored refusal)"}},
               .events = {"#0 failed(refused)", "#1 duplicate request_id"},
               .metrics = "decisions=1 handler_failures=1"});
  t.push_back({.name = "FailureActionStoreAsResponseCompletesTheSinkRow",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .options = on_failure(FailureAction::kStoreAsResponse, "stored refusal"),
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .held = {{.guard = "completed(stored refusal)",
                         .sink = "completed(stored refusal)",
                         .local = "hit(stored refusal)"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1"});
  t.push_back({.name = "AFailureDecisionThatThrowsReleases",
               .area = area,
               .row = kBusinessError,
               .options =
                   [](DeduplicatorOptions& o) {
                     o.on_handler_failure = [](std::exception_ptr) -> FailureDecision {
                       throw std::logic_error("the decision failed");
                     };
                   },
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1"});
  t.push_back({.name = "AHandlerThatThrowsCancelledKeepsItsClaims",
               .area = area,
               .row = kHandlerCancelled,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = throws_cancelled(),
                          .ending = "throws Cancelled",
                          .runs = 1}},
               .held = {{.guard = "in_progress", .sink = "in_progress", .local = "miss"}},
               .events = {},
               .metrics = "none"});
  t.push_back({.name = "AStatementCancelledWithoutAStopIsABusinessError",
               .area = area,
               .row = kBusinessError,
               .calls = {{.request = order("r1"),
                          .handler = {.act = Act::kThrowQueryCancelled},
                          .ending = "throws PostgresError(57014)",
                          .runs = 1}},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 failed(ERROR: canceling statement due to user request)"},
               .metrics = "handler_failures=1 releases=1"});
  // The handler's own COMMIT (run(), its transaction of its own) in doubt: no layer can tell
  // whether its effect happened, so no claim is released, whatever on_handler_failure says.
  t.push_back({.name = "AHandlerWhoseOwnCommitIsInDoubtKeepsTheGuardClaim",
               .area = area,
               .row = kCommitLost,
               .options = on_failure(FailureAction::kRelease),
               .calls = {{.request = order("r1"),
                          .handler = {.act = Act::kThrowCommitInDoubt},
                          .ending = "throws std::exception(Lost connection to backend during "
                                    "commit)",
                          .runs = 1},
                         {.request = order("r2"), .ending = "in_progress redis_guard"}},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 failed(Lost connection to backend during commit)",
                          "#1 in_progress redis_guard"},
               .metrics = "decisions=1 handler_failures=1"});
  t.push_back({.name = "AHandlerWhoseOwnCommitIsInDoubtKeepsBothClaims",
               .area = area,
               .row = kCommitLost,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = {.act = Act::kThrowCommitInDoubt},
                          .ending = "throws std::exception(Lost connection to backend during "
                                    "commit)",
                          .runs = 1}},
               .held = {{.guard = "in_progress", .sink = "in_progress", .local = "miss"}},
               .events = {"#0 failed(Lost connection to backend during commit)"},
               .metrics = "handler_failures=1"});
}

// ---- stops -------------------------------------------------------------------------------------

void stops(std::vector<Scenario>& t) {
  const char* area = "stops";
  t.push_back(
      {.name = "AStopBeforeTheCallClaimsNothing",
       .area = area,
       .row = kStopBefore,
       .sink = true,
       .calls = {{.request = order("r1"), .stopped_before = true, .ending = "throws Cancelled"}},
       .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
       .events = {},
       .metrics = "none"});
  t.push_back(
      {.name = "AStopBeforeTheCallComesBeforeInputChecks",
       .area = area,
       .row = kStopBefore,
       .calls = {{.request = Request{.request_id = "bad id", .user = "u", .intent = "refund"},
                  .stopped_before = true,
                  .ending = "throws Cancelled"}},
       .events = {},
       .metrics = "none"});
  t.push_back({.name = "AStopDuringTheGuardClaimReleasesIt",
               .area = area,
               .row = kStopBefore,
               .calls = {{.request = order("r1"), .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kGuardClaim)},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {},
               .metrics = "releases=1"});
  t.push_back({.name = "AStopDuringTheSinkClaimReleasesBothClaims",
               .area = area,
               .row = kStopBefore,
               .sink = true,
               .calls = {{.request = order("r1"), .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kSinkClaim)},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {},
               .metrics = "releases=1"});
  t.push_back({.name = "AStopWhileWaitingForTheFirstIsCancelled",
               .area = area,
               .row = kStopBefore,
               .options = wait_for_result(milliseconds(5000), milliseconds(2)),
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kGuardClaim)},
               .held = {{.guard = "in_progress"}},
               .events = {},
               .metrics = "none"});
  t.push_back(
      {.name = "AStopWhileTheHandlerRunsKeepsTheClaims",
       .area = area,
       .row = kHandlerCancelled,
       .sink = true,
       .calls =
           {{.request = order("r1"), .handler = waits(), .ending = "throws Cancelled", .runs = 1}},
       .faults = {stop_at(Op::kHandler)},
       .held = {{.guard = "in_progress", .sink = "in_progress", .local = "miss"}},
       .events = {},
       .metrics = "none"});
  t.push_back({.name = "AHandlerThatReturnsDespiteItsStopIsExecuted",
               .area = area,
               .row = kHandlerCancelled,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {stop_at(Op::kHandler)},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back(
      {.name = "AStopAfterTheHandlerReturnedCutsNothingShort",
       .area = area,
       .row = kHandlerCancelled,
       .sink = true,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
       .faults = {stop_at(Op::kSinkComplete)},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1"});
  t.push_back({.name = "AStopDuringTheGuardCompletionCutsNothingShort",
               .area = area,
               .row = kHandlerCancelled,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {stop_at(Op::kGuardComplete)},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back({.name = "AStopFromAnotherThreadDuringTheGuardClaimReleasesIt",
               .area = area,
               .row = kStopBefore,
               .calls = {{.request = order("r1"), .ending = "throws Cancelled"}},
               .faults = {{.op = Op::kGuardClaim, .stop_from_thread = true}},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {},
               .metrics = "releases=1"});
  t.push_back({.name = "AStopDuringASecondPollForTheFirstIsCancelled",
               .area = area,
               .row = kStopBefore,
               .options = wait_for_result(milliseconds(5000), milliseconds(2)),
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kGuardClaim, 2)},
               .held = {{.guard = "in_progress"}},
               .events = {},
               .metrics = "none"});
  t.push_back({.name = "AStopDuringTheProbeOfThePreviousBucketReleasesTheClaim",
               .area = area,
               .row = kStopBefore,
               .options = bucketed(),
               .calls = {{.request = unkeyed(kPayload), .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kGuardClaim, 2)},
               .held = {{.key = current_bucket_key(), .guard = "absent"},
                        {.key = previous_bucket_key(), .guard = "absent"}},
               .events = {},
               .metrics = "releases=1"});
  t.push_back(
      {.name = "AStopFromAnotherThreadWhileTheHandlerWaitsKeepsTheClaims",
       .area = area,
       .row = kHandlerCancelled,
       .sink = true,
       .calls =
           {{.request = order("r1"), .handler = waits(), .ending = "throws Cancelled", .runs = 1}},
       .faults = {{.op = Op::kHandler, .stop_later = true}},
       .held = {{.guard = "in_progress", .sink = "in_progress", .local = "miss"}},
       .events = {},
       .metrics = "none",
       .not_on = {{"sim", "one thread: its handler cannot wait for another"}}});
  t.push_back(
      {.name = "AShutdownBeforeTheCallIsCancelled",
       .area = area,
       .row = kStopBefore,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                 {.request = order("r2"),
                  .before = [](World& w) { w.shutdown(); },
                  .ending = "throws Cancelled"},
                 {.request = order("r3", R"({"amount":99})"), .ending = "throws Cancelled"}},
       .held = {{.guard = "completed(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1"});
  t.push_back({.name = "AShutdownDuringTheGuardClaimReleasesIt",
               .area = area,
               .row = kStopBefore,
               .calls = {{.request = order("r1"), .ending = "throws Cancelled"}},
               .faults = {{.op = Op::kGuardClaim, .shutdown = true}},
               .held = {{.guard = "absent"}},
               .events = {},
               .metrics = "releases=1"});
  t.push_back(
      {.name = "AShutdownWhileTheHandlerWaitsKeepsTheClaim",
       .area = area,
       .row = kHandlerCancelled,
       .calls =
           {{.request = order("r1"), .handler = waits(), .ending = "throws Cancelled", .runs = 1}},
       .faults = {{.op = Op::kHandler, .shutdown = true}},
       .held = {{.guard = "in_progress"}},
       .events = {},
       .metrics = "none"});
  t.push_back({.name = "AStopDuringTheGuardLearningFromTheSinkCutsNothingShort",
               .area = area,
               .row = kRepeatCompleted,
               .sink = true,
               .options = no_cache,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"},
                         {.request = order("r2"),
                          .before = [](World& w) { w.advance_guard(std::chrono::hours(25)); },
                          .ending = "duplicate pg_sink replayed response=done"}},
               .faults = {{.call = 1, .op = Op::kGuardComplete, .stop = true}},
               .held = {{.guard = "completed(done)", .sink = "completed(done)"}},
               .events = {"#0 executed handler", "#1 duplicate pg_sink"},
               .metrics = "decisions=2"});
  t.push_back({.name = "AStopWhileAFailureIsStoredCutsNothingShort",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .options = on_failure(FailureAction::kStoreAsResponse, "stored refusal"),
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .faults = {stop_at(Op::kSinkComplete)},
               .held = {{.guard = "completed(stored refusal)",
                         .sink = "completed(stored refusal)",
                         .local = "hit(stored refusal)"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1"});
  t.push_back({.name = "AStopDuringTheSinkReleaseAfterAHandlerErrorCutsNothingShort",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .faults = {stop_at(Op::kSinkRelease)},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1"});
  t.push_back({.name = "AStopDuringTheReleaseOfTheProbeEndsTheCallBeforeTheHandler",
               .area = area,
               .row = kStopBefore,
               .options = bucketed(),
               .calls = {{.request = unkeyed(kPayload), .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kGuardRelease)},
               .held = {{.key = current_bucket_key(), .guard = "absent"},
                        {.key = previous_bucket_key(), .guard = "absent"}},
               .events = {},
               .metrics = "releases=1"});
  t.push_back({.name = "AStopWhileTheFailureIsDecidedCutsNothingShort",
               .area = area,
               .row = kBusinessError,
               .options = on_failure(FailureAction::kRelease),
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .faults = {stop_at(Op::kDecideFailure)},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1"});
  t.push_back({.name = "AStopWhileTheDecisionIsToldChangesNothing",
               .area = area,
               .row = kFirstTime,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {stop_at(Op::kEmit)},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back({.name = "AStopDuringTheReleaseAfterAHandlerErrorCutsNothingShort",
               .area = area,
               .row = kBusinessError,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .faults = {stop_at(Op::kGuardRelease)},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1"});
}

// ---- deadlines (drivers with one)
// ----------------------------------------------------------------

void deadlines(std::vector<Scenario>& t) {
  const char* area = "deadlines";
  t.push_back({.name = "ADeadlineDuringTheGuardClaimEndsTheCallBeforeTheHandler",
               .area = area,
               .row = kStopBefore,
               .calls = {{.request = order("r1"), .ending = "throws DeadlineExceeded"}},
               .faults = {deadline_at(Op::kGuardClaim)},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {},
               .metrics = "releases=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineThatCutsTheGuardClaimShortFailsClosed",
               .area = area,
               .row = kBackendDown,
               .calls = {{.request = order("r1"),
                          .ending = "unavailable redis_guard error=idem: the call's deadline "
                                    "passed (AsyncDeduplicatorOptions::deadline)"}},
               .faults = {{.op = Op::kGuardClaim, .deadline = true, .error = redis_timeout()}},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 unavailable redis_guard"},
               .metrics = "decisions=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineThatCutsTheGuardClaimShortFailsOpenToASinkPastItsDeadline",
               .area = area,
               .row = kBackendDown,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .ending = "unavailable pg_sink error=idem: the call's deadline passed "
                                    "(AsyncDeduplicatorOptions::deadline)"}},
               .faults = {{.op = Op::kGuardClaim, .deadline = true, .error = redis_timeout()}},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 unavailable pg_sink"},
               .metrics = "decisions=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineDuringTheSinkClaimEndsTheCallBeforeTheHandler",
               .area = area,
               .row = kStopBefore,
               .sink = true,
               .calls = {{.request = order("r1"), .ending = "throws DeadlineExceeded"}},
               .faults = {deadline_at(Op::kSinkClaim)},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {},
               .metrics = "releases=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineDuringAWaitAnswersInProgress",
               .area = area,
               .row = kInProgress,
               .options = wait_for_result(milliseconds(60'000), milliseconds(30'000)),
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "in_progress redis_guard"}},
               .held = {{.guard = "in_progress"}},
               .events = {"#0 in_progress redis_guard"},
               .metrics = "decisions=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineWhileTheHandlerRunsKeepsTheClaims",
               .area = area,
               .row = kHandlerCancelled,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = waits(),
                          .ending = "throws DeadlineExceeded",
                          .runs = 1}},
               .faults = {deadline_at(Op::kHandler)},
               .held = {{.guard = "in_progress", .sink = "in_progress", .local = "miss"}},
               .events = {},
               .metrics = "none",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineCutsAWaitingHandlerShortAndKeepsTheClaim",
               .area = area,
               .row = kHandlerCancelled,
               .calls = {{.request = order("r1"),
                          .handler = waits(),
                          .ending = "throws DeadlineExceeded",
                          .runs = 1}},
               .faults = {{.op = Op::kHandler, .deadline_later = true}},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {},
               .metrics = "none",
               .needs_deadline = true});
  t.push_back({.name = "AStopAndADeadlineAtOneStepAreAStop",
               .area = area,
               .row = kStopBefore,
               .calls = {{.request = order("r1"), .ending = "throws Cancelled"}},
               .faults = {{.op = Op::kGuardClaim, .stop = true, .deadline = true}},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {},
               .metrics = "releases=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineDuringASecondPollAnswersInProgress",
               .area = area,
               .row = kInProgress,
               .options = wait_for_result(milliseconds(5000), milliseconds(2)),
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere(),
                          .ending = "in_progress redis_guard"}},
               .faults = {deadline_at(Op::kGuardClaim, 2)},
               .held = {{.guard = "in_progress"}},
               .events = {"#0 in_progress redis_guard"},
               .metrics = "decisions=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineDuringTheProbeOfThePreviousBucketEndsTheCall",
               .area = area,
               .row = kStopBefore,
               .options = bucketed(),
               .calls = {{.request = unkeyed(kPayload), .ending = "throws DeadlineExceeded"}},
               .faults = {deadline_at(Op::kGuardClaim, 2)},
               .held = {{.key = current_bucket_key(), .guard = "absent"},
                        {.key = previous_bucket_key(), .guard = "absent"}},
               .events = {},
               .metrics = "releases=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineDuringTheReleaseOfTheProbeEndsTheCall",
               .area = area,
               .row = kStopBefore,
               .options = bucketed(),
               .calls = {{.request = unkeyed(kPayload), .ending = "throws DeadlineExceeded"}},
               .faults = {deadline_at(Op::kGuardRelease)},
               .held = {{.key = current_bucket_key(), .guard = "absent"},
                        {.key = previous_bucket_key(), .guard = "absent"}},
               .events = {},
               .metrics = "releases=1",
               .needs_deadline = true});
  t.push_back({.name = "AHandlerThatReturnsPastItsDeadlineIsExecuted",
               .area = area,
               .row = kFirstTime,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {deadline_at(Op::kHandler)},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineDuringTheGuardCompletionCutsNothingShort",
               .area = area,
               .row = kFirstTime,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {deadline_at(Op::kGuardComplete)},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1",
               .needs_deadline = true});
  t.push_back({.name = "ADeadlineDuringTheReleaseAfterAHandlerErrorCutsNothingShort",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .faults = {deadline_at(Op::kSinkRelease)},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1",
               .needs_deadline = true});
  t.push_back(
      {.name = "ADeadlineAfterTheHandlerReturnedCutsNothingShort",
       .area = area,
       .row = kFirstTime,
       .sink = true,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
       .faults = {deadline_at(Op::kSinkComplete)},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1",
       .needs_deadline = true});
}

// ---- failed completions and releases, timeouts --------------------------------------------------

void failed_writes(std::vector<Scenario>& t) {
  const char* area = "failed completions and releases";
  const auto no_resend = [](DeduplicatorOptions& o) { o.save_retry_for = milliseconds(0); };
  t.push_back({.name = "AGuardCompletionThatFailsIsSentAgainAndSaved",
               .area = area,
               .row = kNotSaved,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {fail_at(Op::kGuardComplete, redis_down())},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1 guard_errors=1"});
  t.push_back({.name = "AGuardCompletionThatKeepsFailingIsASaveErrorAfterItsResends",
               .area = area,
               .row = kNotSaved,
               .options = [](DeduplicatorOptions& o) { o.save_retry_for = milliseconds(350); },
               .calls = {{.request = order("r1"),
                          .ending = "executed handler response=done "
                                    "save_error=redis_guard: idem: redis: timeout"}},
               .faults = {fail_at(Op::kGuardComplete, redis_down()),
                          fail_at(Op::kGuardComplete, redis_down(), 2),
                          fail_at(Op::kGuardComplete, redis_timeout(), 3)},
               .held = {{.guard = "in_progress", .local = "hit(done)"}},
               .events = {"#0 executed handler save_error=redis_guard: idem: redis: timeout"},
               .metrics = "decisions=1 guard_errors=3 unsaved=1"});
  t.push_back({.name = "AStopCutsTheResendOfAFailedCompletionShort",
               .area = area,
               .row = kNotSaved,
               .calls = {{.request = order("r1"),
                          .ending = "executed handler response=done "
                                    "save_error=redis_guard: idem: redis: connection refused"}},
               .faults = {{.op = Op::kGuardComplete, .stop_later = true, .error = redis_down()}},
               .held = {{.guard = "in_progress", .local = "hit(done)"}},
               .events = {"#0 executed handler "
                          "save_error=redis_guard: idem: redis: connection refused"},
               .metrics = "decisions=1 guard_errors=1 unsaved=1",
               .not_on = {{"sim", "one thread: nothing stops the call while it waits"}}});
  t.push_back({.name = "AFailedCompletionIsNotSentAgainPastTheClaimsLease",
               .area = area,
               .row = kNotSaved,
               .guard_lease = milliseconds(250),
               .calls = {{.request = order("r1"),
                          .ending = "executed handler response=done "
                                    "save_error=redis_guard: idem: redis: timeout"}},
               .faults = {fail_at(Op::kGuardComplete, redis_down()),
                          fail_at(Op::kGuardComplete, redis_timeout(), 2)},
               .events = {"#0 executed handler save_error=redis_guard: idem: redis: timeout"},
               .metrics = "decisions=1 guard_errors=2 unsaved=1"});
  t.push_back({.name = "AGuardCompletionThatFailsWithResendsOffIsASaveError",
               .area = area,
               .row = kNotSaved,
               .options = no_resend,
               .calls = {{.request = order("r1"),
                          .ending = "executed handler response=done "
                                    "save_error=redis_guard: idem: redis: connection refused"}},
               .faults = {fail_at(Op::kGuardComplete, redis_down())},
               .held = {{.guard = "in_progress", .local = "hit(done)"}},
               .events = {"#0 executed handler "
                          "save_error=redis_guard: idem: redis: connection refused"},
               .metrics = "decisions=1 guard_errors=1 unsaved=1"});
  t.push_back({.name = "ASinkCompletionThatFailsInRunIsASaveError",
               .area = area,
               .row = kNotSaved,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .ending = "executed handler response=done "
                                    "save_error=pg_sink: idem: postgres: connection refused"}},
               .faults = {fail_at(Op::kSinkComplete, pg_down())},
               .held = {{.guard = "completed(done)", .sink = "in_progress", .local = "hit(done)"}},
               .events = {"#0 executed handler "
                          "save_error=pg_sink: idem: postgres: connection refused"},
               .metrics = "decisions=1 sink_errors=1 unsaved=1"});
  t.push_back(
      {.name = "BothCompletionsThatFailAreOneSaveError",
       .area = area,
       .row = kNotSaved,
       .sink = true,
       .options = no_resend,
       .calls = {{.request = order("r1"),
                  .ending = "executed handler response=done save_error=pg_sink: idem: "
                            "postgres: connection refused; redis_guard: idem: redis: "
                            "connection refused"}},
       .faults = {fail_at(Op::kSinkComplete, pg_down()), fail_at(Op::kGuardComplete, redis_down())},
       .held = {{.guard = "in_progress", .sink = "in_progress", .local = "hit(done)"}},
       .events = {"#0 executed handler save_error=pg_sink: idem: postgres: connection "
                  "refused; redis_guard: idem: redis: connection refused"},
       .metrics = "decisions=1 guard_errors=1 sink_errors=1 unsaved=1"});
  t.push_back({.name = "AGuardReleaseThatFailsAfterAHandlerErrorIsTold",
               .area = area,
               .row = kBusinessError,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1},
                         {.request = order("r1"), .ending = "in_progress redis_guard"}},
               .faults = {fail_at(Op::kGuardRelease, redis_timeout())},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 failed(refused) release_error=redis_guard: idem: redis: timeout",
                          "#1 in_progress redis_guard"},
               .metrics = "decisions=1 handler_failures=1 guard_errors=1 releases=1 "
                          "failed_releases=1"});
  t.push_back({.name = "ASinkReleaseThatFailsAfterAHandlerErrorIsTold",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .faults = {fail_at(Op::kSinkRelease, pg_down())},
               .held = {{.guard = "absent", .sink = "in_progress", .local = "miss"}},
               .events = {"#0 failed(refused) "
                          "release_error=pg_sink: idem: postgres: connection refused"},
               .metrics = "handler_failures=1 sink_errors=1 releases=1 failed_releases=1"});
  t.push_back({.name = "AReleaseThatFailsAfterAStopKeepsTheClaimUntilItsLeaseEnds",
               .area = area,
               .row = kStopBefore,
               .calls = {{.request = order("r1"), .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kGuardClaim), fail_at(Op::kGuardRelease, redis_timeout())},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 ended-before-handler "
                          "release_error=redis_guard: idem: redis: timeout"},
               .metrics = "guard_errors=1 releases=1 failed_releases=1"});
  t.push_back({.name = "ASinkReleaseThatFailsAfterAStopKeepsTheRowUntilItsLeaseEnds",
               .area = area,
               .row = kStopBefore,
               .sink = true,
               .calls = {{.request = order("r1"), .ending = "throws Cancelled"}},
               .faults = {stop_at(Op::kSinkClaim), fail_at(Op::kSinkRelease, pg_down())},
               .held = {{.guard = "absent", .sink = "in_progress", .local = "miss"}},
               .events = {"#0 ended-before-handler "
                          "release_error=pg_sink: idem: postgres: connection refused"},
               .metrics = "sink_errors=1 releases=1 failed_releases=1"});
  t.push_back(
      {.name = "ACompletionThatFindsTheLeaseEndedIsLeaseLost",
       .area = area,
       .row = kFirstTime,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done lease_lost"}},
       .faults = {{.op = Op::kGuardComplete,
                   .act =
                       [](World& w) {
                         w.advance_guard(milliseconds(30'001));
                         w.claim_elsewhere(kKey, "r9");
                       }}},
       .held = {{.guard = "in_progress", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1"});
  t.push_back(
      {.name = "AnAttemptWhoseSinkRowWasTakenOverLeavesItToItsNewOwner",
       .area = area,
       .row = kFirstTime,
       .sink = true,
       .calls = {{.request = order("r1"), .ending = "executed handler response=done lease_lost"}},
       .faults = {{.op = Op::kSinkComplete,
                   .act =
                       [](World& w) {
                         w.advance_sink(milliseconds(30'001));
                         w.sink_claim_elsewhere(kKey, "r9");
                       }}},
       .held = {{.guard = "completed(done)", .sink = "in_progress", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1"});
  t.push_back({.name = "AHandlerThatRenewsALostLeaseIsTold",
               .area = area,
               .row = kFirstTime,
               .calls = {{.request = order("r1"),
                          .handler = {.renew = true, .on_start = {}},
                          .ending = "executed handler response=done lease_lost",
                          .saw = "key=ok request_id=r1 fingerprint=yes attempt=1 renewed=false "
                                 "lease_lost"}},
               .faults = {{.op = Op::kHandler,
                           .act =
                               [](World& w) {
                                 w.advance_guard(milliseconds(30'001));
                                 w.claim_elsewhere(kKey, "r9");
                               }}},
               .held = {{.guard = "in_progress", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1 renewals_failed=1"});
  // The sink's row is all that stops a duplicate while Redis is down: its renewal must not
  // depend on the Redis claim's.
  t.push_back(
      {.name = "ARenewalRenewsTheSinkRowWhileRedisFails",
       .area = area,
       .row = kFirstTime,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .handler = {.renew = true, .survive_failed_renewal = true},
                  .ending = "executed handler response=done lease_lost",
                  .saw = "key=ok request_id=r1 fingerprint=yes attempt=1 renewal_failed "
                         "lease_lost"}},
       .faults = {{.op = Op::kGuardRenew,
                   .error = redis_timeout(),
                   .act = [](World& w) { w.advance_sink(milliseconds(20'000)); }},
                  {.op = Op::kSinkComplete,
                   .act = [](World& w) { w.advance_sink(milliseconds(20'000)); }}},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1 renewals_failed=1"});
  t.push_back({.name = "AHandlerThatRenewsItsLeaseKeepsIt",
               .area = area,
               .row = kFirstTime,
               .calls = {{.request = order("r1"),
                          .handler = {.renew = true},
                          .ending = "executed handler response=done",
                          .saw = "key=ok request_id=r1 fingerprint=yes attempt=1 renewed=true"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1 renewals_ok=1"});

  area = "timeouts";
  t.push_back({.name = "AGuardClaimTimeoutFailsClosed",
               .area = area,
               .row = kBackendDown,
               .calls = {{.request = order("r1"),
                          .ending = "unavailable redis_guard error=idem: redis: timeout"}},
               .faults = {fail_at(Op::kGuardClaim, redis_timeout())},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 unavailable redis_guard"},
               .metrics = "decisions=1 guard_errors=1"});
  t.push_back({.name = "AGuardClaimTimeoutAfterItWasAppliedLeavesTheClaimUntilItsLeaseEnds",
               .area = area,
               .row = kBackendDown,
               .calls = {{.request = order("r1"),
                          .ending = "unavailable redis_guard error=idem: redis: timeout"},
                         {.request = order("r1"), .ending = "in_progress redis_guard"}},
               .faults = {lost_at(Op::kGuardClaim)},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 unavailable redis_guard", "#1 in_progress redis_guard"},
               .metrics = "decisions=2 guard_errors=1"});
  t.push_back({.name = "AGuardCompletionTimeoutAfterItWasAppliedIsSentAgainAndFoundSaved",
               .area = area,
               .row = kNotSaved,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {lost_at(Op::kGuardComplete)},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1 guard_errors=1"});
  t.push_back({.name = "AGuardReleaseTimeoutAfterItWasAppliedIsToldThoughReleased",
               .area = area,
               .row = kBusinessError,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .faults = {lost_at(Op::kGuardRelease)},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 failed(refused) release_error=redis_guard: idem: redis: timeout"},
               .metrics = "handler_failures=1 guard_errors=1 releases=1 failed_releases=1"});
  t.push_back({.name = "AGuardClaimTimeoutFailsOpenToTheSink",
               .area = area,
               .row = kBackendDown,
               .sink = true,
               .calls = {{.request = order("r1"), .ending = "executed handler response=done"}},
               .faults = {fail_at(Op::kGuardClaim, redis_timeout())},
               .held = {{.guard = "absent", .sink = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1 guard_errors=1"});
  t.push_back({.name = "ARenewalThatTimesOutFailsTheHandlerThatLetsItThrough",
               .area = area,
               .row = kBusinessError,
               .calls = {{.request = order("r1"),
                          .handler = {.renew = true},
                          .ending = "throws RedisError",
                          .runs = 1}},
               .faults = {fail_at(Op::kGuardRenew, redis_timeout())},
               .held = {{.guard = "absent", .local = "miss"}},
               .events = {"#0 failed(idem: redis: timeout)"},
               .metrics = "handler_failures=1 releases=1 renewals_failed=1"});
  t.push_back({.name = "ASinkClaimTimeoutIsUnavailable",
               .area = area,
               .row = kBackendDown,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .ending = "unavailable pg_sink error=idem: postgres: no answer within "
                                    "response_timeout"}},
               .faults = {fail_at(Op::kSinkClaim, pg_timeout())},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 unavailable pg_sink"},
               .metrics = "decisions=1 sink_errors=1 releases=1"});
  t.push_back({.name = "ASinkClaimStatementTimeoutIsUnavailable",
               .area = area,
               .row = kBackendDown,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .ending = "unavailable pg_sink error=ERROR: canceling statement due to "
                                    "statement timeout"}},
               .faults = {fail_at(Op::kSinkClaim, pg_statement_timeout())},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 unavailable pg_sink"},
               .metrics = "decisions=1 sink_errors=1 releases=1"});
  t.push_back(
      {.name = "ASinkCompletionTimeoutAfterItWasAppliedIsASaveErrorThoughSaved",
       .area = area,
       .row = kNotSaved,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .ending = "executed handler response=done save_error=pg_sink: idem: "
                            "postgres: no answer within response_timeout"}},
       .faults = {lost_at(Op::kSinkComplete, pg_timeout())},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler save_error=pg_sink: idem: postgres: no answer "
                  "within response_timeout"},
       .metrics = "decisions=1 sink_errors=1 unsaved=1"});
}

// ---- keys: missing, invalid, fallback, reentrant
// --------------------------------------------------

void keys(std::vector<Scenario>& t) {
  const char* area = "keys";
  const auto include = [](std::vector<std::string> pointers, MissingKeyPolicy policy) {
    return [=](DeduplicatorOptions& o) {
      o.fingerprint = FingerprintOptions{.include = pointers};
      o.on_missing_key = policy;
    };
  };
  t.push_back({.name = "ARequestWithoutAKeyIsRejected",
               .area = area,
               .row = kMissingKey,
               .calls = {{.request = Request{.user = "u", .intent = "refund"},
                          .ending = "throws MissingKey"}},
               .events = {},
               .metrics = "none"});
  t.push_back(
      {.name = "ARequestWithoutAKeyPassesThroughWhenToldTo",
       .area = area,
       .row = kMissingKey,
       .options = [](DeduplicatorOptions& o) { o.on_missing_key = MissingKeyPolicy::kPassThrough; },
       .calls = {{.request = Request{.user = "u", .intent = "refund"},
                  .ending = "executed handler response=done"},
                 {.request = Request{.user = "u", .intent = "refund"},
                  .ending = "executed handler response=done"}},
       .events = {"#0 executed handler nokey unkeyed=no-payload",
                  "#1 executed handler nokey unkeyed=no-payload"},
       .metrics = "decisions=2"});
  t.push_back({.name = "AFingerprintSelectionOfNothingIsNoKey",
               .area = area,
               .row = kMissingKey,
               .options = include({"/id"}, MissingKeyPolicy::kReject),
               .calls = {{.request = unkeyed(R"({"refund":10})"), .ending = "throws MissingKey"},
                         {.request = unkeyed(R"({"refund":99})"), .ending = "throws MissingKey"}},
               .events = {},
               .metrics = "none"});
  {
    Scenario s{.name = "ASelectionOfOnlyEmptyValuesIsNoKey",
               .area = area,
               .row = kMissingKey,
               .options = include({"/foo/bar"}, MissingKeyPolicy::kReject),
               .events = {},
               .metrics = "none"};
    for (const char* empty : {"null", R"("")", "[]", "{}", R"({"baz":[null,{}]})"}) {
      const std::string body = std::string(R"({"foo":{"bar":)") + empty + R"(},"amount":)";
      s.calls.push_back({.request = unkeyed(body + "10}"), .ending = "throws MissingKey"});
      s.calls.push_back({.request = unkeyed(body + "99}"), .ending = "throws MissingKey"});
    }
    t.push_back(std::move(s));
  }
  t.push_back({.name = "AnEmptyWholePayloadIsNoKey",
               .area = area,
               .row = kMissingKey,
               .calls = {{.request = unkeyed("{}"), .ending = "throws MissingKey"},
                         {.request = unkeyed("[]"), .ending = "throws MissingKey"}},
               .events = {},
               .metrics = "none"});
  t.push_back({.name = "ASelectionOfNothingPassesThroughUnguardedWhenToldTo",
               .area = area,
               .row = kMissingKey,
               .options = include({"/id"}, MissingKeyPolicy::kPassThrough),
               .calls = {{.request = unkeyed(R"({"refund":10})"),
                          .ending = "executed handler response=done"},
                         {.request = unkeyed(R"({"refund":99})"),
                          .ending = "executed handler response=done"}},
               .events = {"#0 executed handler nokey unkeyed=empty-selection",
                          "#1 executed handler nokey unkeyed=empty-selection"},
               .metrics = "decisions=2"});
  t.push_back({.name = "ASelectedValueKeysZeroAndFalseAreValues",
               .area = area,
               .row = kRepeatCompleted,
               .options = include({"/id"}, MissingKeyPolicy::kReject),
               .calls = {{.request = unkeyed(R"({"id":0,"refund":10})"),
                          .ending = "executed handler response=done"},
                         {.request = unkeyed(R"({"id":0,"refund":99})"),
                          .ending = "duplicate request_id replayed response=done"},
                         {.request = unkeyed(R"({"id":false})"),
                          .ending = "executed handler response=done"}},
               .held = {{.call = 0, .guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler", "#1 duplicate request_id", "#2 executed handler"},
               .metrics = "decisions=3"});
  t.push_back({.name = "ARealKeyBesideASelectionOfNothingKeepsItsRules",
               .area = area,
               .row = kRepeatCompleted,
               .options = include({"/id"}, MissingKeyPolicy::kReject),
               .calls = {{.request = Request{.request_id = "r1",
                                             .user = "u",
                                             .intent = "refund",
                                             .payload = R"({"refund":10})"},
                          .ending = "executed handler response=done"},
                         {.request = Request{.request_id = "r1",
                                             .user = "u",
                                             .intent = "refund",
                                             .payload = R"({"refund":99})"},
                          .ending = "duplicate request_id replayed response=done"}},
               .held = {{.guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler", "#1 duplicate request_id"},
               .metrics = "decisions=2"});
  {
    const auto event = [](const std::string& body, bool base64, const std::string& trace) {
      return unkeyed(R"({"version":"v1","rawPath":"/refund","headers":{"X-Trace":")" + trace +
                     R"("},"body":")" + body + R"(","isBase64Encoded":)" +
                     (base64 ? "true" : "false") + "}");
    };
    t.push_back(
        {.name = "AFieldOfAnEmbeddedJsonBodyKeysAnHttpTriggerEvent",
         .area = area,
         .row = kRepeatCompleted,
         .options =
             [](DeduplicatorOptions& o) {
               o.fingerprint = FingerprintOptions{
                   .include = {"/body/orderId"},
                   .embedded_json = {{.pointer = "/body", .base64_flag = "/isBase64Encoded"}}};
             },
         .calls = {{.request = event(R"({\"orderId\":\"o-7\",\"amount\":10})", false, "t1"),
                    .ending = "executed handler response=done"},
                   // The same order, base64 ({"orderId":"o-7","amount":10}), another trace.
                   {.request = event("eyJvcmRlcklkIjoiby03IiwiYW1vdW50IjoxMH0=", true, "t2"),
                    .ending = "duplicate request_id replayed response=done"},
                   {.request = event(R"({\"orderId\":\"o-8\"})", false, "t3"),
                    .ending = "executed handler response=done"},
                   {.request = event("not json", false, "t4"), .ending = "throws PayloadError"},
                   {.request = event("***", true, "t5"), .ending = "throws PayloadError"}},
         .held = {{.call = 0, .guard = "completed(done)", .local = "hit(done)"}},
         .events = {"#0 executed handler", "#1 duplicate request_id", "#2 executed handler"},
         .metrics = "decisions=3"});
  }
  t.push_back(
      {.name = "AnInvalidRequestIdIsRefusedBeforeAnythingIsClaimed",
       .area = area,
       .row = kInvalidRequestId,
       .calls = {{.request = order("bad id!"), .ending = "throws InvalidRequestId"},
                 {.request = order(std::string(65, 'a')), .ending = "throws InvalidRequestId"}},
       .held = {{.guard = "absent"}},
       .events = {},
       .metrics = "none"});
  {
    const auto named = [](std::string user, std::string intent, std::string biz_key) {
      return Request{
          .user = std::move(user), .intent = std::move(intent), .biz_key = std::move(biz_key)};
    };
    t.push_back(
        {.name = "TwoSpellingsOfOneNameAreRefusedNotTwoKeys",
         .area = area,
         .row = kEdgeWhiteSpace,
         .calls = {{.request = named("u", " my-function ", "b"), .ending = "throws InvalidKey"},
                   {.request = named("u", "my-function\t", "b"), .ending = "throws InvalidKey"},
                   {.request = named("u\n1", "my-function", "b"), .ending = "throws InvalidKey"},
                   {.request = named("u", "my-function", "order-7 "),
                    .ending = "throws InvalidKey"},
                   {.request = named("\u00A0u", "my-function", "b"), .ending = "throws InvalidKey"},
                   {.request = named("u", "my function", "order 7"),
                    .ending = "executed handler response=done"}},
         .held = {{.call = 5, .guard = "completed(done)", .local = "hit(done)"}},
         .events = {"#5 executed handler"},
         .metrics = "decisions=1"});
  }
  t.push_back({.name = "ARepeatOfAPayloadWithoutIdsIsADuplicateByItsFallbackKey",
               .area = area,
               .row = kRepeatCompleted,
               .calls = {{.request = unkeyed(R"({"amount":10})"),
                          .ending = "executed handler response=done"},
                         {.request = unkeyed(R"({"amount":10})"),
                          .ending = "duplicate request_id replayed response=done"},
                         {.request = unkeyed(R"({"amount":11})"),
                          .ending = "executed handler response=done"}},
               .held = {{.call = 0, .guard = "completed(done)", .local = "hit(done)"}},
               .events = {"#0 executed handler", "#1 duplicate request_id", "#2 executed handler"},
               .metrics = "decisions=3"});

  area = "reentrant intents";
  const auto reentrant = [](DeduplicatorOptions& o) { o.reentrant_intents = {"refund"}; };
  t.push_back({.name = "AReentrantIntentRunsARetryOfTheSameRequestUnclaimed",
               .area = area,
               .row = kInProgress,
               .options = reentrant,
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere("r1"),
                          .ending = "executed handler response=done"}},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 executed handler"},
               .metrics = "decisions=1"});
  t.push_back({.name = "AnotherRequestOfAReentrantIntentIsInProgress",
               .area = area,
               .row = kInProgress,
               .options = reentrant,
               .calls = {{.request = order("r2"),
                          .before = held_elsewhere("r1"),
                          .ending = "in_progress redis_guard"}},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 in_progress redis_guard"},
               .metrics = "decisions=1"});
  t.push_back({.name = "ARetryOfAnIntentNotReentrantIsInProgress",
               .area = area,
               .row = kInProgress,
               .calls = {{.request = order("r1"),
                          .before = held_elsewhere("r1"),
                          .ending = "in_progress redis_guard"}},
               .held = {{.guard = "in_progress", .local = "miss"}},
               .events = {"#0 in_progress redis_guard"},
               .metrics = "decisions=1"});
  t.push_back(
      {.name = "AReentrantRetryWithAnotherPayloadIsAMismatch",
       .area = area,
       .row = kMismatch,
       .options = reentrant,
       .calls = {{.request = order("r1"),
                  .handler = throws_cancelled(),
                  .ending = "throws Cancelled",
                  .runs = 1},
                 {.request = order("r1", R"({"amount":99})"), .ending = "mismatch redis_guard"}},
       .held = {{.guard = "in_progress", .local = "miss"}},
       .events = {"#1 mismatch redis_guard"},
       .metrics = "decisions=1"});

  area = "fallback keys";
  t.push_back({.name = "AFallbackKeyIsKeptOnlyTheFallbackRetention",
               .area = area,
               .row = kRepeatCompleted,
               .options =
                   [](DeduplicatorOptions& o) {
                     o.fallback_retention = std::chrono::seconds(10);
                     o.local_cache_capacity = 0;
                   },
               .calls = {{.request = unkeyed(kPayload), .ending = "executed handler response=done"},
                         {.request = unkeyed(kPayload),
                          .before = [](World& w) { w.advance_guard(milliseconds(9'999)); },
                          .ending = "duplicate redis_guard replayed response=done"},
                         {.request = unkeyed(kPayload),
                          .handler = returns("again"),
                          .before = [](World& w) { w.advance_guard(milliseconds(2)); },
                          .ending = "executed handler response=again"}},
               .held = {{.call = 0, .guard = "completed(again)"}},
               .events = {"#0 executed handler", "#1 duplicate redis_guard", "#2 executed handler"},
               .metrics = "decisions=3"});
  t.push_back({.name = "AFallbackKeyInATimeBucketIsADuplicateInTheSameBucket",
               .area = area,
               .row = kRepeatCompleted,
               .options = bucketed(),
               .calls = {{.request = unkeyed(kPayload), .ending = "executed handler response=done"},
                         {.request = unkeyed(kPayload),
                          .ending = "duplicate redis_guard replayed response=done"}},
               .held = {{.call = 0, .guard = "completed(done)"}},
               .events = {"#0 executed handler", "#1 duplicate redis_guard"},
               .metrics = "decisions=2"});
  t.push_back(
      {.name = "ARepeatAcrossTheBucketBoundaryIsCaughtByTheSlidingWindow",
       .area = area,
       .row = kRepeatCompleted,
       .options = bucketed(),
       .calls = {{.request = unkeyed(kPayload),
                  .before =
                      [](World& w) { w.completed_elsewhere(previous_bucket_key(), "yesterday"); },
                  .ending = "duplicate redis_guard replayed response=yesterday"}},
       .held = {{.key = current_bucket_key(), .guard = "absent"},
                {.key = previous_bucket_key(), .guard = "completed(yesterday)"}},
       .events = {"#0 duplicate redis_guard"},
       .metrics = "decisions=1 releases=1"});
}

// ---- run_transactional (drivers that run transactions over their backends) ----------------------

void transactions(std::vector<Scenario>& t) {
  const char* area = "run_transactional";
  t.push_back(
      {.name = "RunTransactionalWithoutATransactionalSinkIsAConfigError",
       .area = area,
       .sink = true,
       .calls = {{.request = order("r1"), .transactional = true, .ending = "throws ConfigError"}},
       .held = {{.guard = "absent", .sink = "absent"}},
       .events = {},
       .metrics = "none",
       .not_on = {{"sim", "its sink runs transactions"}}});
  t.push_back(
      {.name = "TransactionalFirstTimeCommitsTheRowWithTheHandler",
       .area = area,
       .row = kFirstTime,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .transactional = true,
                  .ending = "executed handler response=done"}},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1",
       .needs_transactions = true});
  t.push_back({.name = "TransactionalRepeatTheGuardForgotIsReplayedByTheSink",
               .area = area,
               .row = kRepeatCompleted,
               .sink = true,
               .options = no_cache,
               .calls = {{.request = order("r1"),
                          .transactional = true,
                          .ending = "executed handler response=done"},
                         {.request = order("r2"),
                          .transactional = true,
                          .before = [](World& w) { w.advance_guard(std::chrono::hours(25)); },
                          .ending = "duplicate pg_sink replayed response=done"}},
               .held = {{.guard = "completed(done)", .sink = "completed(done)"}},
               .events = {"#0 executed handler", "#1 duplicate pg_sink"},
               .metrics = "decisions=2",
               .needs_transactions = true});
  t.push_back({.name = "TransactionalHandlerErrorRollsBackAndReleases",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .transactional = true,
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1 releases=1",
               .needs_transactions = true});
  t.push_back({.name = "TransactionalCancelledHandlerRollsBackAndKeepsTheGuardClaim",
               .area = area,
               .row = kHandlerCancelled,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .handler = throws_cancelled(),
                          .transactional = true,
                          .ending = "throws Cancelled",
                          .runs = 1}},
               .held = {{.guard = "in_progress", .sink = "absent", .local = "miss"}},
               .events = {},
               .metrics = "none",
               .needs_transactions = true});
  t.push_back(
      {.name = "TransactionalStopDuringTheSinkClaimRollsBackAndReleases",
       .area = area,
       .row = kStopBefore,
       .sink = true,
       .calls = {{.request = order("r1"), .transactional = true, .ending = "throws Cancelled"}},
       .faults = {stop_at(Op::kSinkClaim)},
       .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
       .events = {},
       .metrics = "releases=1",
       .needs_transactions = true});
  t.push_back(
      {.name = "TransactionalSinkClaimFailureIsUnavailable",
       .area = area,
       .row = kBackendDown,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .transactional = true,
                  .ending = "unavailable pg_sink error=idem: postgres: connection refused"}},
       .faults = {fail_at(Op::kSinkClaim, pg_down())},
       .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
       .events = {"#0 unavailable pg_sink"},
       .metrics = "decisions=1 sink_errors=1 releases=1",
       .needs_transactions = true});
  t.push_back(
      {.name = "TransactionalStopAtTheCommitCutsNothingShort",
       .area = area,
       .row = kFirstTime,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .transactional = true,
                  .ending = "executed handler response=done"}},
       .faults = {stop_at(Op::kCommit)},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1",
       .needs_transactions = true});
  t.push_back(
      {.name = "TransactionalDeadlineAtTheCommitCutsNothingShort",
       .area = area,
       .row = kFirstTime,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .transactional = true,
                  .ending = "executed handler response=done"}},
       .faults = {deadline_at(Op::kCommit)},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1",
       .needs_deadline = true,
       .needs_transactions = true});
  t.push_back({.name = "TransactionalDeadlineDuringTheSinkClaimRollsBackAndReleases",
               .area = area,
               .row = kStopBefore,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .transactional = true,
                          .ending = "throws DeadlineExceeded"}},
               .faults = {deadline_at(Op::kSinkClaim)},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {},
               .metrics = "releases=1",
               .needs_deadline = true,
               .needs_transactions = true});
  t.push_back(
      {.name = "TransactionalGuardCompletionThatFailsIsSentAgainAndSaved",
       .area = area,
       .row = kNotSaved,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .transactional = true,
                  .ending = "executed handler response=done"}},
       .faults = {fail_at(Op::kGuardComplete, redis_down())},
       .held = {{.guard = "completed(done)", .sink = "completed(done)", .local = "hit(done)"}},
       .events = {"#0 executed handler"},
       .metrics = "decisions=1 guard_errors=1",
       .needs_transactions = true});
  t.push_back({.name = "TransactionalStoreAsResponseCommitsTheStoredFailure",
               .area = area,
               .row = kBusinessError,
               .sink = true,
               .options = on_failure(FailureAction::kStoreAsResponse, "stored refusal"),
               .calls = {{.request = order("r1"),
                          .handler = fails(),
                          .transactional = true,
                          .ending = "throws BusinessError(refused)",
                          .runs = 1}},
               .held = {{.guard = "completed(stored refusal)",
                         .sink = "completed(stored refusal)",
                         .local = "hit(stored refusal)"}},
               .events = {"#0 failed(refused)"},
               .metrics = "handler_failures=1",
               .needs_transactions = true});
  t.push_back(
      {.name = "TransactionalStopAtBeginRollsBackAndReleases",
       .area = area,
       .row = kStopBefore,
       .sink = true,
       .calls = {{.request = order("r1"), .transactional = true, .ending = "throws Cancelled"}},
       .faults = {stop_at(Op::kSinkBegin)},
       .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
       .events = {},
       .metrics = "releases=1",
       .needs_transactions = true});
  // A statement the stop (or the deadline) cancelled aborted the transaction, the handler caught
  // that and returned, and the COMMIT failed: the call ended as a non-retryable PostgresError.
  t.push_back({.name = "ACommitThatFailsAfterAStopCutTheHandlerShortIsACancellation",
               .area = area,
               .row = kHandlerCancelled,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .transactional = true,
                          .ending = "throws Cancelled",
                          .runs = 1}},
               .faults = {stop_at(Op::kHandler), fail_at(Op::kCommit, pg_aborted_transaction())},
               .held = {{.guard = "in_progress", .sink = "absent", .local = "miss"}},
               .events = {},
               .metrics = "sink_errors=1",
               .needs_transactions = true});
  t.push_back(
      {.name = "ACommitThatFailsAfterTheDeadlineCutTheHandlerShortIsDeadlineExceeded",
       .area = area,
       .row = kHandlerCancelled,
       .sink = true,
       .calls = {{.request = order("r1"),
                  .transactional = true,
                  .ending = "throws DeadlineExceeded",
                  .runs = 1}},
       .faults = {deadline_at(Op::kHandler), fail_at(Op::kCommit, pg_aborted_transaction())},
       .held = {{.guard = "in_progress", .sink = "absent", .local = "miss"}},
       .events = {},
       .metrics = "sink_errors=1",
       .needs_deadline = true,
       .needs_transactions = true});
  t.push_back({.name = "TransactionalCommitRefusedRollsBackAndReleases",
               .area = area,
               .row = kCommitRefused,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .transactional = true,
                          .ending = "throws PostgresError(40001)",
                          .runs = 1}},
               .faults = {fail_at(Op::kCommit,
                                  [] {
                                    return std::make_exception_ptr(PostgresError(
                                        "could not serialize access", false, "40001"));
                                  })},
               .held = {{.guard = "absent", .sink = "absent", .local = "miss"}},
               .events = {"#0 failed(could not serialize access)"},
               .metrics = "handler_failures=1 sink_errors=1 releases=1",
               .needs_transactions = true});
  t.push_back({.name = "TransactionalCommitOutcomeUnknownKeepsTheClaim",
               .area = area,
               .row = kCommitLost,
               .sink = true,
               .calls = {{.request = order("r1"),
                          .transactional = true,
                          .ending = "throws CommitOutcomeUnknown",
                          .runs = 1}},
               .faults = {lost_at(Op::kCommit,
                                  [] {
                                    return std::make_exception_ptr(CommitOutcomeUnknown(
                                        "idem: postgres: connection lost (commit outcome "
                                        "unknown)"));
                                  })},
               .held = {{.guard = "in_progress", .sink = "completed(done)", .local = "miss"}},
               .events = {"#0 failed(idem: postgres: connection lost (commit outcome unknown))"},
               .metrics = "handler_failures=1 sink_errors=1",
               .needs_transactions = true});
}

}  // namespace

const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> table = [] {
    std::vector<Scenario> t;
    outcome_table(t);
    backends_down(t);
    handler_failures(t);
    stops(t);
    deadlines(t);
    failed_writes(t);
    keys(t);
    transactions(t);
    return t;
  }();
  return table;
}

}  // namespace idem::conformance
