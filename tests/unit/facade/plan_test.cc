// The call plan (src/facade/plan.h) without servers or threads: a scripted driver performs each
// step against in-memory backends (and, for run_transactional, a staged in-memory transaction),
// injects failures where a row of the outcome table (docs/semantics.md) needs one, and moves a
// manual clock. Every row and policy combination is a case here, with the steps it takes.
#include "facade/plan.h"

#include <gtest/gtest.h>

#include <asio/error.hpp>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "facade/in_process.h"
#include "guard/async_guard.h"
#include "idem/errors.h"
#include "idem/local_cache.h"
#include "idem/memory_guard.h"
#include "idem/memory_sink.h"
#include "idem/metrics.h"

namespace idem::detail {
namespace {

using std::chrono::milliseconds;
using K = StepKind;

std::string_view name(StepKind kind) { return step_name(kind); }

std::string trace_text(const std::vector<StepKind>& trace) {
  std::string text;
  for (const StepKind kind : trace) text.append(text.empty() ? "" : " ").append(name(kind));
  return text;
}

// A sink transaction of the scripted driver: claims and completions are staged and applied
// to `rows` (by key: the row's owner and state) at commit.
struct TxRow {
  std::string owner;
  RecordState state = RecordState::kInProgress;
  std::string response;
};

class ScriptedDriver {
 public:
  ScriptedDriver() {
    options.guard = guard;
    options.fingerprint = FingerprintOptions{};
  }

  DeduplicatorOptions options;
  // A sink that runs calls in transactions (staged in `rows` here) and names business
  // constraints, as a PgSink can.
  DriverTraits traits{.transactions = true, .business_constraints = true};
  std::shared_ptr<InMemoryGuard> guard = std::make_shared<InMemoryGuard>(
      InMemoryGuardOptions{.lease = milliseconds(1000), .retention = milliseconds(60000)});
  std::shared_ptr<InMemorySink> sink = std::make_shared<InMemorySink>();
  LocalCache cache{LocalCacheOptions{.max_entries = 16, .shards = 1}};
  std::map<std::string, TxRow> rows;  // the transactional sink's committed rows

  // The steps the driver was allowed to send with the next one (Step::with_next), and the
  // fingerprint each transactional completion carried.
  std::vector<StepKind> with_next;
  std::vector<std::string> completed_fingerprints;
  std::vector<std::string> claimed_fingerprints;
  // Failures to inject: the next step of this kind throws (once per entry).
  std::multimap<StepKind, std::exception_ptr> faults;
  // What the handler does (it may advance `now`), and what happened.
  std::function<std::string()> handler = [] { return std::string("ok"); };
  bool business_duplicate = false;               // transactional: a business constraint fires
  bool business_duplicate_at_commit = false;     // ... with COMMIT (deferred, or staged)
  std::function<void(const Step&)> before_step;  // called before each step is performed
  int handler_runs = 0;
  PlanTime now{std::chrono::hours(1)};
  std::vector<StepKind> trace;
  // The decision events seen, their texts copied (an event's views live only in the callback).
  struct Seen {
    std::string key;
    bool handler_failed = false;
    std::string error;
    std::chrono::microseconds latency{0};
  };
  std::vector<Seen> events;
  std::stop_source shutdown;
  const Request* current = nullptr;  // the request of the call under way

  void use_sink() { options.sink = sink; }

  // Runs one call to its end: the outcome, or the exception it throws.
  Outcome call(const Request& request, CallMode mode = CallMode::kRun) {
    trace.clear();
    if (!rules_ || rules_options_version_ != options_version_) rebuild();
    CallPlan plan(*rules_, request, mode, now, std::chrono::system_clock::time_point{},
                  "attempt-" + std::to_string(++attempts_));
    plan_ = &plan;
    current = &request;
    const InProcess in_process(*rules_, &cache);
    Input input{now, stopped(), Started{}};
    for (int guard_steps = 0; guard_steps < 1000; ++guard_steps) {
      const Step step = plan.resume(std::move(input));
      trace.push_back(step.kind);
      if (step.with_next) with_next.push_back(step.kind);
      if (before_step) before_step(step);
      if (step.kind == K::kReturn || step.kind == K::kThrow) {
        (void)in_process.perform(step);
        // The async driver tells the two ends apart by threw() alone.
        EXPECT_EQ(plan.threw(), step.kind == K::kThrow) << trace_text(trace);
      }
      if (step.kind == K::kReturn) return plan.outcome();
      if (step.kind == K::kThrow) std::rethrow_exception(plan.error());
      if (const auto fault = faults.find(step.kind); fault != faults.end()) {
        const std::exception_ptr error = fault->second;
        faults.erase(fault);
        if (step.kind == K::kCommit) staged_.clear();
        input = Input{now, stopped(), classify(error)};
        continue;
      }
      std::optional<StepResult> in_process_result = in_process.perform(step);
      StepResult result = in_process_result ? *std::move(in_process_result) : perform(plan, step);
      input = Input{now, stopped(), std::move(result)};
    }
    ADD_FAILURE() << "the plan never ended: " << trace_text(trace);
    return {};
  }

  // Options changed after a call: the next call builds its rules anew.
  void changed() { ++options_version_; }
  CallPlan* plan() { return plan_; }
  [[nodiscard]] bool stopped() const {
    return shutdown.stop_requested() || (current != nullptr && current->stop.stop_requested());
  }

 private:
  void rebuild() {
    if (!options.on_decision) {
      options.on_decision = [this](const DecisionEvent& event) {
        events.push_back({std::string(event.key), event.handler_failed, std::string(event.error),
                          event.latency});
      };
    }
    rules_ = std::make_unique<PlanRules>(options, traits);
    rules_options_version_ = options_version_;
  }

  StepResult perform(CallPlan& plan, const Step& step) {
    switch (step.kind) {
      case K::kGuardClaim:
        return guard->claim(step.key, step.request_id, step.fingerprint);
      case K::kGuardComplete:
        return Completed{guard->complete(step.key, step.owner_token, step.value, step.ttl)};
      case K::kGuardRelease:
        (void)guard->release(step.key, step.owner_token);
        return Done{};
      case K::kSinkBegin:
        staged_.clear();
        return Done{};
      case K::kSinkClaim:
        claimed_fingerprints.emplace_back(step.fingerprint);
        if (plan.mode() == CallMode::kRun) {
          return sink->claim(step.key, step.request_id, step.fingerprint, step.owner_token);
        }
        return tx_claim(step);
      case K::kRunHandler:
        ++handler_runs;
        try {
          std::string response = handler();
          if (business_duplicate && plan.mode() == CallMode::kTransactional) {
            return BusinessDuplicate{};
          }
          return Response{std::move(response)};
        } catch (...) {
          return classify_current();
        }
      case K::kSinkComplete:
        if (plan.mode() == CallMode::kRun) {
          return Completed{sink->complete(step.key, step.owner_token, step.value, step.ttl)};
        } else {
          completed_fingerprints.emplace_back(step.fingerprint);
          staged_[std::string(step.key)].state = RecordState::kCompleted;
          staged_[std::string(step.key)].response = step.value;
        }
        return Done{};
      case K::kCommit:
        if (business_duplicate_at_commit) {
          staged_.clear();  // the server rolled it back
          return BusinessDuplicate{};
        }
        for (auto& [key, row] : staged_) rows[key] = row;
        staged_.clear();
        return Done{};
      case K::kRollback:
        staged_.clear();
        return Done{};
      case K::kSinkRelease:
        (void)sink->release(step.key, step.owner_token);
        return Done{};
      case K::kWait:
        now = step.at;
        return Done{};
      default:
        ADD_FAILURE() << "the driver was asked to perform " << name(step.kind);
        return Done{};
    }
  }

  SinkClaim tx_claim(const Step& step) {
    SinkClaim answer;
    const auto found = rows.find(std::string(step.key));
    if (found == rows.end()) {
      staged_[std::string(step.key)] =
          TxRow{std::string(step.request_id), RecordState::kInProgress, {}};
      return answer;
    }
    answer.status = SinkStatus::kDuplicate;
    answer.state = found->second.state;
    answer.same_request = found->second.owner == step.request_id;
    if (answer.state == RecordState::kCompleted) answer.response = found->second.response;
    return answer;
  }

  std::unique_ptr<PlanRules> rules_;
  int options_version_ = 0;
  int rules_options_version_ = -1;
  int attempts_ = 0;
  std::map<std::string, TxRow> staged_;
  CallPlan* plan_ = nullptr;
};

Request request(const std::string& id, const std::string& biz_key = "b1",
                const std::string& payload = R"({"a":1})") {
  return Request{
      .request_id = id, .user = "u1", .intent = "refund", .biz_key = biz_key, .payload = payload};
}

std::exception_ptr backend_down(bool redis) {
  return redis ? std::make_exception_ptr(RedisError("idem: redis: connection refused", true))
               : std::make_exception_ptr(PostgresError("idem: postgres: gone", true, "08006"));
}

// ---- first time, repeats, mismatch --------------------------------------------------------------

TEST(CallPlan, FirstTimeClaimsRunsAndCompletesInOrder) {
  ScriptedDriver d;
  d.use_sink();
  const Outcome first = d.call(request("r1"));
  EXPECT_EQ(first.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(first.response, "ok");
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkClaim RunHandler SinkComplete LocalPut GuardComplete Emit "
            "Return");
  EXPECT_EQ(d.sink->inspect("u1:refund:b1")->state, RecordState::kCompleted);
}

TEST(CallPlan, TransactionalFirstTimeCommitsTheRowWithTheHandler) {
  ScriptedDriver d;
  d.use_sink();
  EXPECT_EQ(d.call(request("r1"), CallMode::kTransactional).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin SinkClaim RunHandler SinkComplete Commit LocalPut "
            "GuardComplete Emit Return");
  EXPECT_EQ(d.rows.at("u1:refund:b1").state, RecordState::kCompleted);
}

TEST(CallPlan, RepeatsReplayFromTheLayerThatRemembers) {
  ScriptedDriver d;
  ASSERT_EQ(d.call(request("r1")).kind, Outcome::Kind::kExecuted);
  const Outcome local = d.call(request("r2"));
  EXPECT_EQ(local.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(local.layer, Layer::kRequestId);
  EXPECT_EQ(local.response, "ok");
  EXPECT_EQ(trace_text(d.trace), "LocalGet Emit Return");

  d.options.local_cache_capacity = 0;
  d.changed();
  const Outcome guarded = d.call(request("r3"));
  EXPECT_EQ(guarded.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(guarded.layer, Layer::kRedisGuard);
  EXPECT_EQ(guarded.response, "ok");
  EXPECT_EQ(trace_text(d.trace), "GuardClaim Emit Return");
  EXPECT_EQ(d.handler_runs, 1);
}

TEST(CallPlan, TheSinkCatchesWhatTheGuardForgotAndTeachesTheGuardItsResponse) {
  ScriptedDriver d;
  d.use_sink();
  d.options.local_cache_capacity = 0;
  ASSERT_EQ(d.call(request("r1"), CallMode::kTransactional).kind, Outcome::Kind::kExecuted);
  d.guard = std::make_shared<InMemoryGuard>();  // Redis lost its data (restart, failover)
  d.options.guard = d.guard;
  d.changed();
  const Outcome late = d.call(request("r2"), CallMode::kTransactional);
  EXPECT_EQ(late.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(late.layer, Layer::kPgSink);
  EXPECT_EQ(late.response, "ok");
  EXPECT_EQ(trace_text(d.trace),
            "GuardClaim SinkBegin SinkClaim Rollback GuardComplete Emit Return");
  EXPECT_EQ(d.call(request("r3"), CallMode::kTransactional).layer, Layer::kRedisGuard);
  EXPECT_EQ(d.handler_runs, 1);
}

// Another process holds the key: a claim of its own, straight in the guard.
void held_elsewhere(ScriptedDriver& d, const std::string& key, const std::string& id,
                    const std::string& fingerprint = "") {
  ASSERT_EQ(d.guard->claim(key, id, fingerprint).status, ClaimStatus::kFirst);
}

TEST(CallPlan, SameKeyOtherPayloadIsAMismatchEvenWhileInProgress) {
  ScriptedDriver d;
  held_elsewhere(d, "u1:refund:b1", "r0", "another-fingerprint");
  const Outcome other = d.call(request("r1"));
  EXPECT_EQ(other.kind, Outcome::Kind::kMismatch);
  EXPECT_EQ(other.layer, Layer::kRedisGuard);
  EXPECT_EQ(d.handler_runs, 0);
}

TEST(CallPlan, ARepeatWhileTheFirstRunsIsInProgressOrRunsAgainWhenReentrant) {
  ScriptedDriver d;
  held_elsewhere(d, "u1:refund:b1", "r1");
  const Outcome busy = d.call(request("r1"));
  EXPECT_EQ(busy.kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(trace_text(d.trace), "LocalGet GuardClaim Emit Return");
  d.options.reentrant_intents = {"refund"};
  d.changed();
  // The same request ID again, reentrant: runs unclaimed and completes nothing.
  EXPECT_EQ(d.call(request("r1")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(trace_text(d.trace), "LocalGet GuardClaim RunHandler Emit Return");
  // Another request ID is the same operation asked again: not reentrant.
  EXPECT_EQ(d.call(request("r2")).kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(d.handler_runs, 1);
}

// ---- wait for the first execution's result ---------------------------------------------------

TEST(CallPlan, WaitForResultPollsUntilTheFirstCompletesThenReplays) {
  ScriptedDriver d;
  d.options.on_concurrent_duplicate = ConcurrentDuplicatePolicy::kWaitForResult;
  d.options.wait_poll_interval = milliseconds(20);
  d.options.wait_for_result = milliseconds(100);
  d.options.local_cache_capacity = 0;
  const ClaimResult first = d.guard->claim("u1:refund:b1", "r0", "");
  int waits = 0;
  d.before_step = [&](const Step& step) {
    const StepKind kind = step.kind;
    // The first execution completes during the second wait.
    if (kind == K::kWait && ++waits == 2) {
      ASSERT_TRUE(d.guard->complete("u1:refund:b1", first.owner_token, "first's", milliseconds(0)));
    }
  };
  const Outcome replay = d.call(request("r1"));
  EXPECT_EQ(replay.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(replay.response, "first's");
  EXPECT_EQ(trace_text(d.trace), "GuardClaim Wait GuardClaim Wait GuardClaim Emit Return");
  EXPECT_EQ(d.handler_runs, 0);
}

TEST(CallPlan, WaitForResultEndsInProgressAtItsDeadline) {
  ScriptedDriver d;
  d.options.on_concurrent_duplicate = ConcurrentDuplicatePolicy::kWaitForResult;
  d.options.wait_poll_interval = milliseconds(20);
  d.options.wait_for_result = milliseconds(100);
  d.options.local_cache_capacity = 0;
  held_elsewhere(d, "u1:refund:b1", "r0");
  const PlanTime start = d.now;
  const Outcome busy = d.call(request("r1"));
  EXPECT_EQ(busy.kind, Outcome::Kind::kInProgress);
  // Five polls of 20 ms fit in 100 ms: claim, then wait + claim five times.
  EXPECT_EQ(trace_text(d.trace),
            "GuardClaim Wait GuardClaim Wait GuardClaim Wait GuardClaim Wait GuardClaim Wait "
            "GuardClaim Emit Return");
  EXPECT_EQ(d.now - start, milliseconds(100));
}

// The wait policy was applied only when the guard found the repeat in progress: with the sink
// alone deciding (no guard, or Redis failing open) a repeat answered InProgress at once.
TEST(CallPlan, WaitForResultAlsoWaitsWhenTheSinkFindsTheFirstInProgress) {
  ScriptedDriver d;
  d.options.guard = nullptr;
  d.use_sink();
  d.options.on_concurrent_duplicate = ConcurrentDuplicatePolicy::kWaitForResult;
  d.options.wait_poll_interval = milliseconds(20);
  d.options.wait_for_result = milliseconds(100);
  d.options.local_cache_capacity = 0;
  ASSERT_EQ(d.sink->claim("u1:refund:b1", "r0", "", "owner-0").status, SinkStatus::kClaimed);
  int waits = 0;
  d.before_step = [&](const Step& step) {
    if (step.kind == K::kWait && ++waits == 2) {
      ASSERT_TRUE(d.sink->complete("u1:refund:b1", "owner-0", "first's", milliseconds(0)));
    }
  };
  const Outcome replay = d.call(request("r1"));
  EXPECT_EQ(replay.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(replay.response, "first's");
  EXPECT_EQ(trace_text(d.trace), "SinkClaim Wait SinkClaim Wait SinkClaim Emit Return");
  EXPECT_EQ(d.handler_runs, 0);
}

// ---- failures of the handler and the failure policy -------------------------------------------

TEST(CallPlan, ABusinessErrorReleasesBothClaimsInRunMode) {
  ScriptedDriver d;
  d.use_sink();
  d.handler = []() -> std::string { throw std::logic_error("refused"); };
  EXPECT_THROW((void)d.call(request("r1")), std::logic_error);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkClaim RunHandler GuardRelease SinkRelease Emit Throw");
  EXPECT_EQ(d.guard->size(), 0u);
  EXPECT_EQ(d.sink->size(), 0u);
  ASSERT_EQ(d.events.size(), 1u);
  EXPECT_TRUE(d.events[0].handler_failed);
  EXPECT_EQ(d.events[0].error, "refused");
}

TEST(CallPlan, ABusinessErrorInATransactionRollsBackAndReleasesTheGuard) {
  ScriptedDriver d;
  d.use_sink();
  d.handler = []() -> std::string { throw std::logic_error("refused"); };
  EXPECT_THROW((void)d.call(request("r1"), CallMode::kTransactional), std::logic_error);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin SinkClaim RunHandler Rollback GuardRelease Emit Throw");
  EXPECT_TRUE(d.rows.empty());
}

TEST(CallPlan, KeepUntilLeaseEndsKeepsTheClaims) {
  ScriptedDriver d;
  d.use_sink();
  d.options.on_handler_failure = [](std::exception_ptr) {
    return FailureDecision{FailureAction::kKeepUntilLeaseEnds, ""};
  };
  d.handler = []() -> std::string { throw std::runtime_error("flaky"); };
  EXPECT_THROW((void)d.call(request("r1")), std::runtime_error);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkClaim RunHandler DecideFailure Emit Throw");
  d.handler = [] { return std::string("ok"); };
  EXPECT_EQ(d.call(request("r1")).kind, Outcome::Kind::kInProgress);
}

TEST(CallPlan, StoreAsResponseInRunModeCompletesTheSinkRowAndTheGuard) {
  ScriptedDriver d;
  d.use_sink();
  d.options.on_handler_failure = [](std::exception_ptr) {
    return FailureDecision{FailureAction::kStoreAsResponse, R"({"error":"insufficient funds"})"};
  };
  d.handler = []() -> std::string { throw std::runtime_error("insufficient funds"); };
  EXPECT_THROW((void)d.call(request("r1")), std::runtime_error);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkClaim RunHandler DecideFailure SinkComplete LocalPut "
            "GuardComplete Emit Throw");
  EXPECT_EQ(d.sink->inspect("u1:refund:b1")->state, RecordState::kCompleted);
  d.options.local_cache_capacity = 0;
  d.changed();
  const Outcome replay = d.call(request("r2"));
  EXPECT_EQ(replay.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(replay.response, R"({"error":"insufficient funds"})");
}

TEST(CallPlan, StoreAsResponseInATransactionCommitsItInATransactionOfItsOwn) {
  ScriptedDriver d;
  d.use_sink();
  d.options.on_handler_failure = [](std::exception_ptr) {
    return FailureDecision{FailureAction::kStoreAsResponse, "declined"};
  };
  d.handler = []() -> std::string { throw std::runtime_error("declined"); };
  EXPECT_THROW((void)d.call(request("r1"), CallMode::kTransactional), std::runtime_error);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin SinkClaim RunHandler Rollback DecideFailure SinkBegin "
            "SinkClaim SinkComplete Commit LocalPut GuardComplete Emit Throw");
  EXPECT_EQ(d.rows.at("u1:refund:b1").response, "declined");
}

TEST(CallPlan, ACancelledHandlerKeepsItsClaimAndReportsNoDecision) {
  ScriptedDriver d;
  d.use_sink();
  d.handler = []() -> std::string { throw Cancelled(); };
  EXPECT_THROW((void)d.call(request("r1"), CallMode::kTransactional), Cancelled);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin SinkClaim RunHandler Rollback Throw");
  EXPECT_TRUE(d.events.empty());
  EXPECT_EQ(d.call(request("r1")).kind, Outcome::Kind::kInProgress);
}

TEST(CallPlan, AStopRequestedWhileTheHandlerRanKeepsTheClaimWhateverItThrew) {
  ScriptedDriver d;
  std::stop_source stop;
  Request r = request("r1");
  r.stop = stop.get_token();
  d.handler = [&]() -> std::string {
    stop.request_stop();
    throw std::runtime_error("interrupted");
  };
  EXPECT_THROW((void)d.call(r), std::runtime_error);
  EXPECT_EQ(trace_text(d.trace), "LocalGet GuardClaim RunHandler Emit Throw");
  EXPECT_EQ(d.guard->size(), 1u);
}

// A Request::stop already requested when the call starts: nothing is claimed, nothing runs.
TEST(CallPlan, ARequestStoppedBeforeItIsClaimedNeverRuns) {
  ScriptedDriver d;
  d.use_sink();
  std::stop_source stop;
  stop.request_stop();
  Request r = request("r1");
  r.stop = stop.get_token();
  EXPECT_THROW((void)d.call(r, CallMode::kTransactional), Cancelled);
  EXPECT_EQ(trace_text(d.trace), "Throw");
  EXPECT_EQ(d.handler_runs, 0);
  EXPECT_EQ(d.guard->size(), 0u);
}

TEST(CallPlan, AStopRequestedAfterTheClaimReleasesItUnrun) {
  ScriptedDriver d;
  std::stop_source stop;
  Request r = request("r1");
  r.stop = stop.get_token();
  d.before_step = [&](const Step& step) {
    const StepKind kind = step.kind;
    if (kind == K::kGuardClaim) stop.request_stop();  // while the claim is under way
  };
  EXPECT_THROW((void)d.call(r), Cancelled);
  EXPECT_EQ(trace_text(d.trace), "LocalGet GuardClaim GuardRelease Throw");
  EXPECT_EQ(d.guard->size(), 0u);  // nothing of the handler ran: the claim goes
  EXPECT_EQ(d.handler_runs, 0);
}

// A claim whose command a cancellation cut short may still have run on the server: the call
// released nothing, and the claim held until its lease ended. Released now, unawaited.
TEST(CallPlan, AClaimCutShortByACancellationIsReleasedWithItsToken) {
  ScriptedDriver d;
  d.faults.emplace(K::kGuardClaim, std::make_exception_ptr(ClaimCutShort("token-of-the-cut")));
  std::string released;
  bool unawaited = false;
  d.before_step = [&](const Step& step) {
    if (step.kind != K::kGuardRelease) return;
    released = step.owner_token;
    unawaited = step.unawaited;  // its answer would wait as long as the claim's
  };
  EXPECT_THROW((void)d.call(request("r1")), Cancelled);
  EXPECT_EQ(trace_text(d.trace), "LocalGet GuardClaim GuardRelease Throw");
  EXPECT_EQ(released, "token-of-the-cut");
  EXPECT_TRUE(unawaited);
  EXPECT_EQ(d.handler_runs, 0);
}

// The previous time bucket's probe, cut short the same way, held that key for its lease: every
// delivery of the payload answered kInProgress with nothing running. Released now, unawaited,
// before the call's own claim.
TEST(CallPlan, AProbeCutShortByACancellationIsReleasedWithItsToken) {
  ScriptedDriver d;
  d.options.local_cache_capacity = 0;
  d.options.fingerprint = FingerprintOptions{.time_bucket = std::chrono::seconds(60)};
  d.changed();
  int claims = 0;
  std::vector<std::pair<std::string, bool>> released;  // owner token, unawaited
  d.before_step = [&](const Step& step) {
    if (step.kind == K::kGuardClaim && ++claims == 2) {  // the probe
      d.faults.emplace(K::kGuardClaim,
                       std::make_exception_ptr(ClaimCutShort("token-of-the-probe")));
    }
    if (step.kind == K::kGuardRelease) released.emplace_back(step.owner_token, step.unawaited);
  };
  EXPECT_THROW((void)d.call(request("", "", R"({"n":1})")), Cancelled);
  EXPECT_EQ(trace_text(d.trace), "GuardClaim GuardClaim GuardRelease GuardRelease Throw");
  ASSERT_EQ(released.size(), 2u);
  EXPECT_EQ(released[0], std::make_pair(std::string("token-of-the-probe"), true));
  EXPECT_FALSE(released[1].second);  // the call's own claim, whose answer came
  EXPECT_EQ(d.guard->size(), 0u);
  EXPECT_EQ(d.handler_runs, 0);
}

// ---- commits --------------------------------------------------------------------------------

TEST(CallPlan, ACommitTheServerRefusedReleasesTheClaim) {
  ScriptedDriver d;
  d.use_sink();
  d.faults.emplace(K::kCommit, std::make_exception_ptr(PostgresError(
                                   "idem: postgres: deferred constraint", false, "23505")));
  EXPECT_THROW((void)d.call(request("r1"), CallMode::kTransactional), PostgresError);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin SinkClaim RunHandler SinkComplete Commit GuardRelease "
            "Emit Throw");
  EXPECT_EQ(d.guard->size(), 0u);
  ASSERT_EQ(d.events.size(), 1u);
  EXPECT_TRUE(d.events[0].handler_failed);
}

TEST(CallPlan, ACommitWhoseOutcomeIsUnknownKeepsTheClaim) {
  ScriptedDriver d;
  d.use_sink();
  d.faults.emplace(K::kCommit, std::make_exception_ptr(CommitOutcomeUnknown(
                                   "idem: postgres: lost (commit outcome unknown)")));
  EXPECT_THROW((void)d.call(request("r1"), CallMode::kTransactional), CommitOutcomeUnknown);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin SinkClaim RunHandler SinkComplete Commit Emit Throw");
  EXPECT_EQ(d.guard->size(), 1u);  // the committed row (or none) decides the next attempt
}

// A transactional call of `d` that a business constraint ends: a duplicate of the sink without
// response, after the steps `trace`.
void expect_business_duplicate(ScriptedDriver& d, std::string_view trace) {
  const Outcome dup = d.call(request("r1"), CallMode::kTransactional);
  EXPECT_EQ(dup.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(dup.layer, Layer::kPgSink);
  EXPECT_FALSE(dup.response.has_value());
  EXPECT_EQ(trace_text(d.trace), trace);
}

TEST(CallPlan, ABusinessConstraintIsADuplicateWithoutResponse) {
  ScriptedDriver d;
  d.use_sink();
  d.business_duplicate = true;
  expect_business_duplicate(
      d, "LocalGet GuardClaim SinkBegin SinkClaim RunHandler Rollback GuardRelease Emit Return");
}

TEST(CallPlan, ABusinessConstraintThatFiresWithTheCommitIsADuplicateWithoutResponse) {
  ScriptedDriver d;
  d.use_sink();
  d.business_duplicate_at_commit = true;
  // The transaction is over: no rollback of it, nothing of it committed, the claim released.
  expect_business_duplicate(d,
                            "LocalGet GuardClaim SinkBegin SinkClaim RunHandler SinkComplete "
                            "Commit GuardRelease Emit Return");
  EXPECT_TRUE(d.rows.empty());
  EXPECT_EQ(d.guard->size(), 0u);
  EXPECT_EQ(d.handler_runs, 1);
}

// ---- what the transactional steps may share ---------------------------------------------------

TEST(CallPlan, BeginGoesWithTheClaimAndTheRecordWithTheCommit) {
  ScriptedDriver d;
  d.use_sink();
  ASSERT_EQ(d.call(request("r1"), CallMode::kTransactional).kind, Outcome::Kind::kExecuted);
  // One round trip each for BEGIN + claim and record + COMMIT (docs/pg_sink.md).
  EXPECT_EQ(trace_text(d.with_next), "SinkBegin SinkComplete");
  // The completion writes the whole record at once: with the fingerprint of the claim.
  ASSERT_EQ(d.completed_fingerprints.size(), 1u);
  EXPECT_FALSE(d.completed_fingerprints[0].empty());
  EXPECT_EQ(d.completed_fingerprints, d.claimed_fingerprints);
  // Run mode sends nothing together: each sink call commits by itself.
  d.with_next.clear();
  (void)d.call(request("r2", "b2"));
  EXPECT_TRUE(d.with_next.empty());
}

TEST(CallPlan, AFailureOfABeginSentWithTheClaimIsUnavailableAsABeginOfItsOwn) {
  ScriptedDriver d;
  d.use_sink();
  d.faults.emplace(K::kSinkClaim, backend_down(false));  // BEGIN + claim: the connection is gone
  const Outcome down = d.call(request("r1"), CallMode::kTransactional);
  EXPECT_EQ(down.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(down.layer, Layer::kPgSink);
  EXPECT_EQ(d.handler_runs, 0);
  EXPECT_EQ(d.guard->size(), 0u);
}

TEST(CallPlan, TheBusinessKeyAsTheClaimAddsNoSinkStepToTheTransaction) {
  ScriptedDriver d;
  d.use_sink();
  d.options.transactional_claim = TransactionalClaim::kBusinessKey;
  d.changed();
  ASSERT_EQ(d.call(request("r1"), CallMode::kTransactional).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin RunHandler Commit LocalPut GuardComplete Emit Return");
  EXPECT_TRUE(d.with_next.empty());  // BEGIN goes at once: the handler's statements follow
  EXPECT_TRUE(d.rows.empty());
  // A repeat that got past the guard is stopped by the business constraint: no response.
  d.guard = std::make_shared<InMemoryGuard>();
  d.options.guard = d.guard;
  d.options.local_cache_capacity = 0;
  d.changed();
  d.business_duplicate = true;
  const Outcome dup = d.call(request("r2"), CallMode::kTransactional);
  EXPECT_EQ(dup.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(dup.layer, Layer::kPgSink);
  EXPECT_FALSE(dup.response.has_value());
  EXPECT_EQ(trace_text(d.trace),
            "GuardClaim SinkBegin RunHandler Rollback GuardRelease Emit Return");
  // Run mode keeps its rows: the mode is run_transactional()'s only.
  d.business_duplicate = false;
  EXPECT_EQ(d.call(request("r3", "b3")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(trace_text(d.trace),
            "GuardClaim SinkClaim RunHandler SinkComplete GuardComplete Emit Return");
}

TEST(CallPlan, WithTheBusinessKeyAStoredFailureGoesToTheGuardOnly) {
  ScriptedDriver d;
  d.use_sink();
  d.options.transactional_claim = TransactionalClaim::kBusinessKey;
  d.options.on_handler_failure = [](std::exception_ptr) {
    return FailureDecision{FailureAction::kStoreAsResponse, "declined"};
  };
  d.handler = []() -> std::string { throw std::runtime_error("declined"); };
  EXPECT_THROW((void)d.call(request("r1"), CallMode::kTransactional), std::runtime_error);
  EXPECT_EQ(
      trace_text(d.trace),
      "LocalGet GuardClaim SinkBegin RunHandler Rollback DecideFailure LocalPut GuardComplete "
      "Emit Throw");
  EXPECT_TRUE(d.rows.empty());
  d.options.local_cache_capacity = 0;
  d.changed();
  const Outcome replay = d.call(request("r2"), CallMode::kTransactional);
  EXPECT_EQ(replay.layer, Layer::kRedisGuard);
  EXPECT_EQ(replay.response, "declined");
}

// ---- backends down ------------------------------------------------------------------------------

TEST(CallPlan, RedisDownFailsOpenToTheSinkByDefaultAndClosedWithoutOne) {
  ScriptedDriver d;
  d.use_sink();
  auto metrics = std::make_shared<InProcessMetrics>();
  d.options.metrics = metrics;
  d.changed();
  d.faults.emplace(K::kGuardClaim, backend_down(true));
  EXPECT_EQ(d.call(request("r1")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkClaim RunHandler SinkComplete LocalPut Emit Return");
  EXPECT_EQ(metrics->backend_errors(Layer::kRedisGuard), 1u);

  ScriptedDriver closed;
  closed.faults.emplace(K::kGuardClaim, backend_down(true));
  const Outcome down = closed.call(request("r1"));
  EXPECT_EQ(down.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(down.layer, Layer::kRedisGuard);
  EXPECT_EQ(closed.handler_runs, 0);

  ScriptedDriver forced;
  forced.use_sink();
  forced.options.on_redis_failure = RedisFailurePolicy::kFailClosed;
  forced.faults.emplace(K::kGuardClaim, backend_down(true));
  EXPECT_EQ(forced.call(request("r1")).kind, Outcome::Kind::kUnavailable);
}

TEST(CallPlan, PostgresDownIsUnavailableAndReleasesTheGuardsClaim) {
  for (const CallMode mode : {CallMode::kRun, CallMode::kTransactional}) {
    ScriptedDriver d;
    d.use_sink();
    d.faults.emplace(mode == CallMode::kRun ? K::kSinkClaim : K::kSinkBegin, backend_down(false));
    const Outcome down = d.call(request("r1"), mode);
    EXPECT_EQ(down.kind, Outcome::Kind::kUnavailable);
    EXPECT_EQ(down.layer, Layer::kPgSink);
    EXPECT_EQ(d.handler_runs, 0);
    EXPECT_EQ(d.guard->size(), 0u);
    EXPECT_EQ(d.trace.back(), K::kReturn);
  }
  ScriptedDriver d;
  d.use_sink();
  d.faults.emplace(K::kSinkClaim, backend_down(false));  // inside the open transaction
  EXPECT_EQ(d.call(request("r1"), CallMode::kTransactional).kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(trace_text(d.trace),
            "LocalGet GuardClaim SinkBegin SinkClaim Rollback GuardRelease Emit Return");
}

TEST(CallPlan, RunModeSinkCompletionFailingAfterTheEffectStillAnswersExecuted) {
  ScriptedDriver d;
  d.use_sink();
  d.faults.emplace(K::kSinkComplete, backend_down(false));
  EXPECT_EQ(d.call(request("r1")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(d.handler_runs, 1);
}

// ---- keys --------------------------------------------------------------------------------------

TEST(CallPlan, MissingKeyIsRejectedOrPassedThroughUnguarded) {
  ScriptedDriver d;
  EXPECT_THROW((void)d.call(request("", "", "")), MissingKey);
  EXPECT_EQ(trace_text(d.trace), "Throw");
  d.options.on_missing_key = MissingKeyPolicy::kPassThrough;
  d.changed();
  EXPECT_EQ(d.call(request("", "", "")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(trace_text(d.trace), "RunHandler Emit Return");
}

TEST(CallPlan, BadInputThrowsBeforeAnyStep) {
  ScriptedDriver d;
  EXPECT_THROW((void)d.call(request("bad id\r\n")), InvalidRequestId);
  EXPECT_THROW((void)d.call(request("r1", "b1", "{not json")), PayloadError);
  EXPECT_EQ(trace_text(d.trace), "Throw");
  ScriptedDriver no_sink;
  EXPECT_THROW((void)no_sink.call(request("r1"), CallMode::kTransactional), ConfigError);
  no_sink.shutdown.request_stop();
  EXPECT_THROW((void)no_sink.call(request("r1")), Cancelled);
  EXPECT_EQ(d.guard->size(), 0u);
}

TEST(CallPlan, EachKeyFormComesFromOneGrammar) {
  ScriptedDriver d;
  d.options.local_cache_capacity = 0;
  ASSERT_EQ(d.call(request("r:1", "")).kind, Outcome::Kind::kExecuted);
  EXPECT_TRUE(d.guard->claim("id:u1:refund:r%3A1", "x", "").status != ClaimStatus::kFirst);
  ASSERT_EQ(d.call(request("", "", R"({"n":1})")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(d.guard->size(), 2u);
}

TEST(CallPlan, ABucketedFallbackKeyProbesThePreviousBucket) {
  ScriptedDriver d;
  d.options.local_cache_capacity = 0;
  d.options.fingerprint = FingerprintOptions{.time_bucket = std::chrono::seconds(60)};
  d.changed();
  EXPECT_EQ(d.call(request("", "", R"({"n":1})")).kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(trace_text(d.trace),
            "GuardClaim GuardClaim GuardRelease RunHandler GuardComplete Emit Return");
}

// ---- the lease ---------------------------------------------------------------------------------

TEST(CallPlan, RenewalIsDueAtIntervalsWhileTheHandlerRunsAndExtendsTheLease) {
  ScriptedDriver d;
  d.options.auto_renew_interval = milliseconds(300);
  d.changed();
  bool checked = false;
  d.handler = [&] {
    CallPlan& plan = *d.plan();
    const PlanTime started = d.now;
    EXPECT_EQ(plan.renewal_due(), started + milliseconds(300));
    EXPECT_EQ(plan.remaining_lease(started), milliseconds(1000));
    d.now += milliseconds(300);
    const RenewalStep step = *plan.renewal();
    RenewalAnswers answers;
    answers.guard = answers.of(d.guard->renew(step.key, step.owner_token, step.lease));
    plan.renewed(d.now, answers);
    EXPECT_EQ(plan.remaining_lease(d.now), milliseconds(1000));
    EXPECT_EQ(plan.renewal_due(), d.now + milliseconds(300));
    answers.guard = RenewalAnswer::kFailed;  // Redis did not answer this one
    plan.renewed(d.now + milliseconds(300), answers);
    EXPECT_TRUE(plan.lease_lost(d.now));
    EXPECT_TRUE(plan.renewal_due().has_value());  // it keeps trying
    checked = true;
    return std::string("ok");
  };
  EXPECT_EQ(d.call(request("r1")).lease_lost, true);
  EXPECT_TRUE(checked);
}

// A handler that outlives its lease without renewing is told while it runs (lease_lost() and
// remaining_lease() 0), not only by Outcome::lease_lost afterwards.
TEST(CallPlan, AHandlerPastItsLeaseIsToldWhileItRuns) {
  ScriptedDriver d;
  bool told = false;
  d.handler = [&] {
    EXPECT_FALSE(d.plan()->lease_lost(d.now));
    d.now += milliseconds(1000);  // the guard's lease
    told = d.plan()->lease_lost(d.now);
    EXPECT_EQ(d.plan()->remaining_lease(d.now), milliseconds(0));
    return std::string("ok");
  };
  EXPECT_TRUE(d.call(request("r1")).lease_lost);
  EXPECT_TRUE(told);
}

// A renewal's answers: the guard's part, and the sink's.
RenewalAnswers answered(RenewalAnswer guard, RenewalAnswer sink = RenewalAnswer::kNotAsked) {
  RenewalAnswers answers;
  answers.guard = guard;
  answers.sink = sink;
  return answers;
}

TEST(CallPlan, ARenewalThatFindsTheClaimGoneStopsRenewing) {
  ScriptedDriver d;
  d.options.auto_renew_interval = milliseconds(100);
  d.changed();
  d.handler = [&] {
    d.plan()->renewed(d.now, answered(RenewalAnswer::kLost));
    EXPECT_TRUE(d.plan()->lease_lost(d.now));
    EXPECT_FALSE(d.plan()->renewal_due().has_value());
    return std::string("ok");
  };
  EXPECT_TRUE(d.call(request("r1")).lease_lost);
}

// With a sink, a run() call holds a row of its own: a Redis claim found lost, or a Redis that
// fails, does not stop the row's renewal (the row is then all that stops a duplicate).
TEST(CallPlan, ARedisClaimFoundLostOrFailingKeepsTheSinkRowRenewed) {
  for (const RenewalAnswer redis : {RenewalAnswer::kLost, RenewalAnswer::kFailed}) {
    ScriptedDriver d;
    d.options.auto_renew_interval = milliseconds(100);
    d.use_sink();
    bool checked = false;
    d.handler = [&] {
      CallPlan& plan = *d.plan();
      EXPECT_FALSE(plan.renewal()->sink_owner.empty());
      plan.renewed(d.now, answered(redis, RenewalAnswer::kOwned));
      EXPECT_TRUE(plan.lease_lost(d.now));
      EXPECT_EQ(plan.renewal_due(), d.now + milliseconds(100));
      EXPECT_FALSE(plan.renewal()->sink_owner.empty());
      plan.renewed(d.now, answered(redis, RenewalAnswer::kLost));
      EXPECT_EQ(plan.renewal_due().has_value(), redis == RenewalAnswer::kFailed);
      checked = true;
      return std::string("ok");
    };
    (void)d.call(request("r1"));
    EXPECT_TRUE(checked);
  }
}

// The local cache never keeps a completed key longer than its record is kept (a fallback key's
// fallback_retention, a guard-only set-up's retention).
TEST(CallPlan, TheLocalCacheNeverOutlivesTheRecord) {
  std::vector<milliseconds> ttls;
  const auto record_ttls = [&](ScriptedDriver& d) {
    d.before_step = [&](const Step& step) {
      if (step.kind == K::kLocalPut) ttls.push_back(step.ttl);
    };
  };
  ScriptedDriver d;  // guard retention 60 s, local cache 30 s, fallback retention 30 s
  d.options.fallback_retention = milliseconds(2000);
  d.guard = std::make_shared<InMemoryGuard>(InMemoryGuardOptions{.retention = milliseconds(5000)});
  d.options.guard = d.guard;
  record_ttls(d);
  (void)d.call(request("r1"));                  // business key, guard only: the guard's 5 s
  (void)d.call(request("", "", R"({"n":1})"));  // fallback key: 2 s
  d.use_sink();
  d.changed();
  (void)d.call(request("r2", "b2"));  // a sink keeps the row far longer: the cache's own 30 s
  d.sink = std::make_shared<InMemorySink>(InMemorySinkOptions{.retention = milliseconds(3000)});
  d.use_sink();
  d.changed();
  (void)d.call(request("r3", "b3"));  // a sink that keeps it 3 s: the longer of 5 s and 3 s
  EXPECT_EQ(ttls, (std::vector<milliseconds>{milliseconds(5000), milliseconds(2000),
                                             milliseconds(30000), milliseconds(5000)}));
}

// ---- metrics and events ------------------------------------------------------------------------

TEST(CallPlan, EveryDecisionIsCountedOnceWithItsLayerAndLatency) {
  ScriptedDriver d;
  auto metrics = std::make_shared<InProcessMetrics>();
  d.options.metrics = metrics;
  d.changed();
  d.handler = [&] {
    d.now += milliseconds(7);
    return std::string("ok");
  };
  (void)d.call(request("r1"));
  (void)d.call(request("r2"));
  EXPECT_EQ(metrics->decisions(Layer::kHandler, Outcome::Kind::kExecuted), 1u);
  EXPECT_EQ(metrics->decisions(Layer::kRequestId, Outcome::Kind::kDuplicate), 1u);
  ASSERT_EQ(d.events.size(), 2u);
  EXPECT_EQ(d.events[0].latency, std::chrono::microseconds(7000));
  EXPECT_EQ(d.events[0].key, "u1:refund:b1");
}

// An operation the driver cancelled ends with Asio's operation_aborted, in Asio's own error
// category (an ECANCELED of std::system_category() is another error code): a stop's doing, never
// a business failure.
TEST(StepErrors, AsioOperationAbortedIsAStopsAbortNotABusinessFailure) {
  const StepError aborted = classify(std::make_exception_ptr(
      std::system_error(asio::error::make_error_code(asio::error::operation_aborted))));
  EXPECT_EQ(aborted.kind, ErrorKind::kAborted);
  const StepError other = classify(std::make_exception_ptr(std::runtime_error("boom")));
  EXPECT_EQ(other.kind, ErrorKind::kOther);
}

}  // namespace
}  // namespace idem::detail
