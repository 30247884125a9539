#include "facade/plan.h"

#include <algorithm>
#include <array>
#include <utility>

#include "facade/decision.h"
#include "idem/errors.h"

namespace idem::detail {
namespace {

constexpr std::string_view kDeadlineText =
    "idem: the call's deadline passed (AsyncDeduplicatorOptions::deadline)";

// The local cache's entry of a completed key: "<fingerprint>\0<response>", or "<fingerprint>"
// alone when the response is not kept (a fingerprint is hex: it holds no NUL).
std::string local_entry(std::string_view fingerprint, const std::string* response) {
  std::string entry;
  entry.reserve(fingerprint.size() + 1 + (response != nullptr ? response->size() : 0));
  entry.append(fingerprint);
  if (response != nullptr) entry.append(1, '\0').append(*response);
  return entry;
}

// Appends "layer: what" to `text` ("; " between two).
void append_failure(std::string& text, Layer layer, std::string_view what) {
  if (!text.empty()) text += "; ";
  text.append(to_string(layer)).append(": ").append(what);
}

}  // namespace

bool CallPlan::needs_attempt_id(const PlanRules& rules, const Request& request,
                                CallMode mode) noexcept {
  return request.request_id.empty() || (mode == CallMode::kRun && rules.sink_);
}

CallPlan::CallPlan(const PlanRules& rules, const Request& request, CallMode mode, PlanTime now,
                   std::chrono::system_clock::time_point wall_now, std::string attempt_id)
    : rules_(rules),
      request_(request),
      mode_(mode),
      start_(now),
      wall_start_(wall_now),
      deadline_(rules.traits_.deadline.count() > 0 ? now + rules.traits_.deadline
                                                   : PlanTime::max()),
      now_(now),
      sink_owner_(request.request_id.empty() ? attempt_id : request.request_id),
      attempt_id_(std::move(attempt_id)) {}

Step CallPlan::resume(Input&& input) {
  now_ = input.now;
  stopped_ = input.stopped;
  notes_ = StepNotes{};
  std::visit([this](auto& result) { take(std::move(result)); }, input.result);
  settle();
  return step();
}

// ---- results ----------------------------------------------------------------------------------

void CallPlan::take(Started) {
  if (state_ != State::kStart) return internal_error("Started reported twice");
  const DeduplicatorOptions& o = rules_.options_;
  try {
    if (transactional() && (!rules_.traits_.transactions || !rules_.sink_)) {
      throw ConfigError(
          "idem: run_transactional needs a sink that runs the call in its PostgreSQL "
          "transaction: a PgSink (DeduplicatorOptions::sink) or AsyncDeduplicatorOptions::"
          "postgres; use run() with another sink");
    }
    if (stopped_) {
      throw Cancelled("idem: the call was stopped (Request::stop, shutdown()) before it started");
    }
    key_ = CallKey::of(rules_, request_, wall_start_);
    if (key_.key.empty() && o.on_missing_key == MissingKeyPolicy::kReject) {
      throw MissingKey(std::string("idem: the request has no idempotency key: ") +
                       key_.missing_reason);
    }
  } catch (...) {
    error_ = std::current_exception();
    go(State::kThrow);  // bad input or configuration: nothing was claimed, no event
    return;
  }
  if (key_.key.empty()) {
    claim_rows_ = false;  // pass-through: unguarded
    enter_sink();
    return;
  }
  wait_deadline_ = start_ + o.wait_for_result;
  lookup();
}

void CallPlan::take(Done) {
  switch (state_) {
    case State::kProbeRelease:
      probe_token_.clear();
      if (probe_in_doubt_) {  // the call is ending: on to its own claim's release
        probe_in_doubt_ = false;
        return release_or(after_release_);
      }
      return enter_sink();
    case State::kWait:
      if (!stopped_ && !past_deadline()) lookup();  // else settle() ends the wait
      return;
    case State::kSinkBegin:
      return sink_records() ? go(State::kSinkClaim) : enter_handler();
    case State::kSinkComplete:
      holds_sink_row_ = false;
      return transactional() ? go(State::kCommit) : finish_executed();
    case State::kCommit:
      return finish_executed();
    case State::kRollback:
      // Whatever ended the transaction was recorded before it: a failure, or an outcome.
      return error_ ? after_failure() : conclude(std::move(outcome_));
    case State::kFailureSinkRelease:
      holds_sink_row_ = false;
      return emit_or_end();
    case State::kStoreBegin:
      return go(State::kStoreClaim);
    case State::kStoreComplete:
      return transactional() ? go(State::kStoreCommit) : store_failed();
    case State::kStoreCommit:
    case State::kStoreRollback:
      return store_failed();
    case State::kLocalPut:
      return holds_claim() ? go(State::kGuardComplete) : end_completion();
    case State::kCompleteWait:
      if (stopped_ || past_deadline()) return completion_unsaved(resend_error_);
      return go(State::kGuardComplete);
    case State::kGuardRelease:
      owner_token_.clear();
      claim_in_doubt_ = false;
      return proceed(after_release_);
    case State::kEmit:
      return go(after_emit_);
    default:
      return internal_error("Done reported for a step that answers otherwise");
  }
}

void CallPlan::take(CacheEntry&& found) {
  if (state_ != State::kLocalGet) return internal_error("a cache entry out of kLocalGet");
  if (!found.entry) return claim_guard();
  const std::string& entry = *found.entry;
  const std::size_t split = entry.find('\0');
  const std::string_view stored_fingerprint = std::string_view(entry).substr(0, split);
  const bool matches = stored_fingerprint.empty() || key_.fingerprint.empty() ||
                       stored_fingerprint == key_.fingerprint;
  finish(decide_repeat(
      Layer::kRequestId, RecordState::kCompleted, matches,
      split == std::string::npos ? std::optional<std::string>() : entry.substr(split + 1)));
}

void CallPlan::take(ClaimResult&& claim) {
  if (state_ != State::kGuardClaim && state_ != State::kProbeClaim) {
    return internal_error("a claim out of kGuardClaim");
  }
  guard_claimed(std::move(claim));
}

void CallPlan::take(Completed completed) {
  if ((state_ == State::kSinkComplete || state_ == State::kStoreComplete) && !transactional()) {
    // run(): the row was no longer this attempt's (its lease ran out and another took it over).
    if (!completed.owned && state_ == State::kSinkComplete) sink_row_lost_ = true;
    return take(Done{});
  }
  if (state_ != State::kGuardComplete) return internal_error("a completion out of kGuardComplete");
  // A resend that finds the claim gone (its lease ran out; a failover lost it) saved nothing.
  if (!completed.owned && !resend_error_.empty()) {
    append_failure(save_error_, Layer::kRedisGuard, resend_error_);
  }
  owned_ = completed.owned;
  owner_token_.clear();
  end_completion();
}

void CallPlan::take(SinkClaim&& claim) {
  if (state_ == State::kStoreClaim) {
    return go(claim.status == SinkStatus::kClaimed ? State::kStoreComplete : State::kStoreRollback);
  }
  if (state_ != State::kSinkClaim) return internal_error("a sink claim out of kSinkClaim");
  sink_claimed(std::move(claim));
}

void CallPlan::take(Response&& response) {
  if (state_ != State::kRunHandler) return internal_error("a response out of kRunHandler");
  handler_returned_ = true;
  renewing_ = false;
  response_ = std::move(response.text);
  if (sink_records()) return go(State::kSinkComplete);
  return transactional() ? go(State::kCommit) : finish_executed();
}

void CallPlan::take(BusinessDuplicate) {
  const bool at_commit = state_ == State::kCommit;
  if ((state_ != State::kRunHandler && !at_commit) || !transactional()) {
    return internal_error("a business duplicate out of a transactional kRunHandler or kCommit");
  }
  // A UNIQUE constraint of the caller's own tables says the effect already exists: a
  // duplicate, with no response to replay; nothing of this call commits. Raised by a handler's
  // statement, the transaction is rolled back; with COMMIT, it is over already.
  handler_returned_ = true;
  renewing_ = false;
  outcome_ = decide_repeat(Layer::kPgSink, RecordState::kCompleted, true, std::nullopt);
  if (at_commit) return conclude(std::move(outcome_));
  go(State::kRollback);
}

void CallPlan::take(FailureDecision&& decision) {
  if (state_ != State::kDecideFailure) return internal_error("a decision out of kDecideFailure");
  apply(std::move(decision));
}

void CallPlan::take(StepError&& error) {
  // A claim cut short may hold: released like one that does, the probe's too.
  if (state_ == State::kGuardClaim && !error.claim_in_doubt.empty()) {
    owner_token_ = std::move(error.claim_in_doubt);
    claim_in_doubt_ = true;
  } else if (state_ == State::kProbeClaim && !error.claim_in_doubt.empty()) {
    probe_token_ = std::move(error.claim_in_doubt);
    probe_in_doubt_ = true;
  }
  const bool interrupted = stopped_ || past_deadline() || error.kind == ErrorKind::kCancelled ||
                           error.kind == ErrorKind::kAborted;
  if (before_handler() && interrupted) {
    // A step the stop or the deadline cut short: settle() applies it at this step.
    if (!stopped_ && !past_deadline()) stop_before_handler();  // a cancellation of its own
    return;
  }
  switch (state_) {
    case State::kGuardClaim:
    case State::kProbeClaim:
    case State::kSinkBegin:
    case State::kSinkClaim:
      return claim_failed(std::move(error));
    case State::kRunHandler:
      return handler_failed(std::move(error));
    case State::kSinkComplete:
    case State::kCommit:
      return failed_after_handler(std::move(error));
    default:
      return cleanup_failed(error);
  }
}

void CallPlan::claim_failed(StepError error) {
  const bool guard = state_ == State::kGuardClaim || state_ == State::kProbeClaim;
  if (is_backend(error.kind)) {
    // Nothing ran, nothing is marked: the layer's failure policy.
    ++(guard ? notes_.guard_errors : notes_.sink_errors);
    return guard ? guard_failed(error.what) : sink_unavailable(error.what);
  }
  // Bad input (InvalidKey, ...): thrown as is, claims released.
  handler_error_.what = std::move(error.what);
  error_ = std::move(error.error);
  if (transaction_open()) return go(State::kRollback);
  after_failure();
}

void CallPlan::cleanup_failed(const StepError& error) {
  switch (state_) {
    case State::kProbeRelease:
      ++notes_.guard_errors;  // best effort: the probe's lease ends it
      return take(Done{});
    case State::kGuardRelease:
      // The claim stays until its lease ends: told with the key, in the event.
      ++notes_.guard_errors;
      append_failure(release_error_, Layer::kRedisGuard, error.what);
      return take(Done{});
    case State::kGuardComplete:
      ++notes_.guard_errors;
      if (is_backend(error.kind) && resend_completion(error.what)) return;
      return completion_unsaved(error.what);
    case State::kFailureSinkRelease:
      ++notes_.sink_errors;  // the row's lease ends it
      append_failure(release_error_, Layer::kPgSink, error.what);
      return take(Done{});
    case State::kRollback:
    case State::kStoreRollback:
      return take(Done{});  // the connection is gone with its transaction
    case State::kStoreBegin:
    case State::kStoreClaim:
    case State::kStoreComplete:
    case State::kStoreCommit:
      ++notes_.sink_errors;
      if (transactional() && (state_ == State::kStoreClaim || state_ == State::kStoreComplete)) {
        return go(State::kStoreRollback);
      }
      return store_failed();
    default:
      return internal_error("a failure reported for a step that cannot fail");
  }
}

// A completion the guard failed to save goes again (DeduplicatorOptions::save_retry_for): after
// 100 ms, then at doubling pauses up to 1 s, while the claim's lease holds (a resend after it
// could only find the claim lost), before the deadline and until a stop (which cuts the pause
// short).
bool CallPlan::resend_completion(std::string_view what) {
  constexpr std::chrono::milliseconds kFirst{100};
  constexpr std::chrono::milliseconds kLongest{1000};
  const std::chrono::milliseconds window = rules_.options_.save_retry_for;
  if (window.count() == 0 || stopped_ || lease_lost_) return false;
  if (resend_after_.count() == 0) {
    resend_after_ = kFirst;
    resend_until_ = now_ + window;
  } else {
    resend_after_ = std::min(resend_after_ * 2, kLongest);
  }
  const PlanTime at = now_ + resend_after_;
  if (at > resend_until_ || at >= lease_deadline_ || at >= deadline_) return false;
  resend_error_ = what;
  wake_at_ = at;
  go(State::kCompleteWait);
  return true;
}

void CallPlan::completion_unsaved(std::string_view what) {
  // The response is the handler's, but the record stays IN_PROGRESS until its lease ends.
  append_failure(save_error_, Layer::kRedisGuard, what);
  go(State::kGuardComplete);
  take(Completed{true});
}

// ---- interruptions: the stop and the deadline ---------------------------------------------------

bool CallPlan::before_handler() const noexcept {
  if (handler_started_) return false;
  switch (state_) {
    case State::kGuardClaim:
    case State::kProbeClaim:
    case State::kWait:
    case State::kSinkBegin:
    case State::kSinkClaim:
    case State::kRunHandler:
      return true;
    default:
      return false;
  }
}

void CallPlan::settle() {
  // Each rule moves the call off the step; a few moves at most (fail open to the sink, say).
  for (int moves = 0; moves < 8 && before_handler(); ++moves) {
    if (stopped_) {
      stop_before_handler();
    } else if (past_deadline()) {
      deadline_before_handler();
    } else {
      return;
    }
  }
}

void CallPlan::stop_before_handler() {
  // Claimed but not started: nothing of the handler can have happened, so every claim of this
  // call goes (the transaction's with its rollback), whichever step the stop came in.
  handler_error_.what =
      "idem: the call was stopped (Request::stop, shutdown(), a cancellation) before "
      "its handler ran; nothing ran, and the claims it took are released (a release "
      "that fails is told in the decision event)";
  error_ = std::make_exception_ptr(Cancelled(handler_error_.what));
  cancelled_ = true;
  if (transaction_open()) return go(State::kRollback);
  after_failure();
}

void CallPlan::deadline_before_handler() {
  switch (state_) {
    case State::kGuardClaim:
    case State::kProbeClaim:
      return guard_failed(kDeadlineText);  // the guard's failure policy
    case State::kWait:
      return finish(std::move(waiting_));  // still in progress, as far as it knows
    case State::kSinkBegin:
    case State::kSinkClaim:
      return sink_unavailable(kDeadlineText);
    default:  // the handler has not started: nothing ran, the claims go
      handler_error_.what =
          "idem: the call's deadline passed before its handler ran; nothing ran, and the claims "
          "it took are released (a release that fails is told in the decision event)";
      error_ = std::make_exception_ptr(DeadlineExceeded(handler_error_.what));
      cancelled_ = true;
      if (transaction_open()) return go(State::kRollback);
      return after_failure();
  }
}

// ---- the layers
// -----------------------------------------------------------------------------------

void CallPlan::lookup() {
  if (rules_.options_.local_cache_capacity > 0) return go(State::kLocalGet);
  claim_guard();
}

void CallPlan::claim_guard() {
  if (rules_.guard_) return go(State::kGuardClaim);
  enter_sink();
}

void CallPlan::guard_claimed(ClaimResult claim) {
  if (state_ == State::kProbeClaim) {
    // Sliding window of a bucketed fallback key: the current bucket's key is ours; a record
    // under the previous bucket's key makes this a repeat across the boundary. The probe claims
    // that key when absent, so it is released at once.
    if (claim.status != ClaimStatus::kFirst) return repeat(*decide_on_guard(std::move(claim)));
    probe_token_ = std::move(claim.owner_token);
    return go(State::kProbeRelease);
  }
  owner_token_ = std::move(claim.owner_token);
  if (holds_claim()) {
    // From when the claim was sent: Redis' TTL ran from a moment no earlier than that.
    had_claim_ = true;
    lease_deadline_ = now_ + rules_.guard_lease_;
  }
  if (claim.status == ClaimStatus::kFirst && !claim.replicated) {
    // Written on the primary only: a failover may lose it. Failing closed, it goes and nothing
    // runs; failing open, the call goes on under it, as it would without the guard.
    ++notes_.guard_errors;
    if (rules_.redis_failure_ == RedisFailurePolicy::kFailClosed) {
      return finish(unavailable(Layer::kRedisGuard,
                                "idem: the claim was not acknowledged by the replicas the guard "
                                "waits for; released"));
    }
  }
  if (claim.status == ClaimStatus::kRepeatSame && claim.state == RecordState::kInProgress &&
      claim.fingerprint_matches && rules_.options_.reentrant_intents.contains(request_.intent)) {
    claim_rows_ = false;  // a naturally idempotent intent runs again, unclaimed
    return enter_sink();
  }
  if (claim.status == ClaimStatus::kFirst && !key_.previous_bucket_key.empty()) {
    return go(State::kProbeClaim);
  }
  if (std::optional<Outcome> stopped = decide_on_guard(std::move(claim))) {
    return repeat(*std::move(stopped));
  }
  enter_sink();
}

void CallPlan::repeat(Outcome outcome) {
  const DeduplicatorOptions& o = rules_.options_;
  if (outcome.kind == Outcome::Kind::kInProgress &&
      o.on_concurrent_duplicate == ConcurrentDuplicatePolicy::kWaitForResult &&
      now_ + o.wait_poll_interval <= wait_deadline_) {
    waiting_ = std::move(outcome);
    wake_at_ = now_ + o.wait_poll_interval;
    return release_or(State::kWait);  // then ask the layers again
  }
  finish(std::move(outcome));
}

void CallPlan::guard_failed(std::string_view why) {
  if (rules_.redis_failure_ == RedisFailurePolicy::kFailClosed) {
    return finish(unavailable(Layer::kRedisGuard, why));  // releases a claim the probe's left
  }
  enter_sink();  // fail open: on to the sink, or unguarded when there is none
}

void CallPlan::enter_sink() {
  if (transactional()) return go(State::kSinkBegin);
  if (sink_records()) return go(State::kSinkClaim);
  enter_handler();
}

void CallPlan::enter_handler() { go(State::kRunHandler); }

void CallPlan::sink_claimed(SinkClaim claim) {
  std::optional<Outcome> stopped = decide_on_sink(std::move(claim));
  if (!stopped) {
    holds_sink_row_ = !transactional();
    return enter_handler();
  }
  if (!transactional()) return conclude(*std::move(stopped));
  outcome_ = *std::move(stopped);
  go(State::kRollback);
}

void CallPlan::sink_unavailable(std::string_view why) {
  outcome_ = unavailable(Layer::kPgSink, why);
  if (transaction_open()) return go(State::kRollback);
  conclude(std::move(outcome_));
}

// ---- failures
// -------------------------------------------------------------------------------------

void CallPlan::failed_after_handler(StepError error) {
  // A commit whose connection was lost has an unknown outcome: the claim is kept. A commit the
  // server refused (a deferred constraint, a serialization failure) rolled back for sure.
  if (is_backend(error.kind)) ++notes_.sink_errors;
  if (state_ == State::kSinkComplete && !transactional()) {
    // run(): the effect happened; the row stays IN_PROGRESS until its lease ends.
    append_failure(save_error_, Layer::kPgSink, error.what);
    holds_sink_row_ = false;
    return finish_executed();
  }
  commit_unknown_ = state_ == State::kCommit && error.kind == ErrorKind::kCommitUnknown;
  // A commit that failed because an earlier statement had aborted the transaction, after the
  // stop or the deadline interrupted the handler (the statement it cancelled, whose error the
  // handler swallowed before it returned): the call ends as that interruption, as a handler
  // that threw it does. Any other commit failure is the commit's own, stop or not.
  cancelled_ = state_ == State::kCommit && (stopped_ || past_deadline()) &&
               error.kind == ErrorKind::kAbortedTransaction;
  error_ = cancelled_ ? interruption_error("its transaction could not commit: " + error.what)
                      : error.error;
  handler_error_ = std::move(error);
  if (state_ == State::kSinkComplete) return go(State::kRollback);
  after_failure();
}

std::exception_ptr CallPlan::interruption_error(const std::string& what) const {
  if (past_deadline() && !stopped_) {
    return std::make_exception_ptr(DeadlineExceeded(
        "idem: the call's deadline passed while its handler ran; its claim is kept until its "
        "lease ends"));
  }
  return std::make_exception_ptr(Cancelled("idem: the handler was cancelled (" + what +
                                           "); its claim is kept until its lease ends"));
}

void CallPlan::handler_failed(StepError error) {
  handler_returned_ = true;
  renewing_ = false;
  const bool interrupted = stopped_ || past_deadline();
  // A stop's or the deadline's doing, not a business failure: the handler saw its stop, or its
  // statement or operation was cancelled by it.
  cancelled_ = error.kind == ErrorKind::kCancelled || error.kind == ErrorKind::kAborted ||
               (interrupted && error.kind == ErrorKind::kQueryCancelled);
  if (cancelled_ && (interrupted || error.kind != ErrorKind::kCancelled)) {
    error_ = interruption_error(error.what);
  } else {
    error_ = error.error;  // a business failure, or the handler's own idem::Cancelled
  }
  // A handler whose own COMMIT lost its answer may have had its effect: like a commit of idem's
  // whose outcome is unknown, its claims are kept until their leases end.
  commit_unknown_ = !cancelled_ && error.kind == ErrorKind::kCommitUnknown;
  handler_error_ = std::move(error);
  if (transactional()) return go(State::kRollback);
  after_failure();
}

void CallPlan::after_failure() {
  // Before the handler, nothing ran: the claims go. After it, a cancellation keeps them until
  // their leases end, and so do a stop or the deadline while it ran (its effect may be partial)
  // and a commit whose outcome is unknown. An unclaimed run has nothing to release.
  if (!handler_started_) {
    return release_or(holds_sink_row_ ? State::kFailureSinkRelease : State::kThrow);
  }
  if (cancelled_) return emit_or_end();  // no decision; an event only for a failed release
  if (commit_unknown_ || !claim_rows_ || stopped_ || past_deadline()) return emit_or_end();
  if (rules_.options_.on_handler_failure) return go(State::kDecideFailure);
  apply(FailureDecision{});
}

void CallPlan::apply(FailureDecision decision) {
  switch (decision.action) {
    case FailureAction::kRelease:
      return release_or(holds_sink_row_ ? State::kFailureSinkRelease : State::kEmit);
    case FailureAction::kKeepUntilLeaseEnds:
      return emit_or_end();
    case FailureAction::kStoreAsResponse:
      response_ = std::move(decision.response);
      if (!sink_records()) return store_failed();  // no record of idem's in the sink
      // Transactional: the failed transaction is gone, a new one stores the response.
      return go(transactional() ? State::kStoreBegin : State::kStoreComplete);
  }
}

void CallPlan::store_failed() {
  // The stored business error is replayed like a response: the guard and the local cache learn
  // it too.
  completing_failure_ = true;
  holds_sink_row_ = false;
  begin_completion();
}

// ---- the end: completion, release, the decision event
// ---------------------------------------------

void CallPlan::finish_executed() {
  outcome_ = Outcome{};
  outcome_.response = response_;
  if (!claim_rows_) return emit_or_end();  // unclaimed: nothing to complete
  conclude(std::move(outcome_));
}

void CallPlan::conclude(Outcome outcome) {
  outcome_ = std::move(outcome);
  const bool replayable = outcome_.kind == Outcome::Kind::kExecuted ||
                          (outcome_.kind == Outcome::Kind::kDuplicate && outcome_.response);
  // Not replayable: a later layer stopped it; the first owner's record stands. In progress
  // there (the sink deciding: no guard, or the guard failing open), the wait policy applies as
  // it does to the guard's answer.
  if (!replayable) {
    if (outcome_.kind == Outcome::Kind::kInProgress) return repeat(std::move(outcome_));
    return finish(std::move(outcome_));
  }
  if (outcome_.kind == Outcome::Kind::kDuplicate) response_ = *outcome_.response;
  begin_completion();
}

void CallPlan::begin_completion() {
  if (rules_.options_.local_cache_capacity > 0) {
    // A response over a layer's cap is replayed by none: the cache keeps it no more than they.
    const bool kept = response_.size() <= rules_.replay_cap_;
    local_entry_ = local_entry(key_.fingerprint, kept ? &response_ : nullptr);
    return go(State::kLocalPut);
  }
  if (holds_claim()) return go(State::kGuardComplete);
  end_completion();
}

void CallPlan::end_completion() {
  // By the time the completion was sent (now_): a claim past its lease is lost by then.
  if (!completing_failure_ && outcome_.kind == Outcome::Kind::kExecuted) {
    outcome_.lease_lost =
        !owned_ || lease_lost_ || sink_row_lost_ || (had_claim_ && now_ >= lease_deadline_);
    outcome_.save_error = save_error_;
  }
  emit_or_end();
}

void CallPlan::finish(Outcome outcome) {
  outcome_ = std::move(outcome);
  release_or(State::kEmit);
}

void CallPlan::release_or(State next) {
  if (probe_in_doubt_) {
    after_release_ = next;
    return go(State::kProbeRelease);
  }
  if (!holds_claim()) return proceed(next);
  ++notes_.releases;
  after_release_ = next;
  go(State::kGuardRelease);
}

void CallPlan::proceed(State next) {
  if (next == State::kEmit || next == State::kThrow) return emit_or_end();
  go(next);
}

void CallPlan::emit_or_end() {
  const DeduplicatorOptions& o = rules_.options_;
  const State end = error_ ? State::kThrow : State::kReturn;
  // A failed call reports only a handler that ran: errors before it decided nothing, and a
  // cancellation is no decision either; but such a call that failed to release a claim it took
  // (before its handler ran: a claim given up for a wait, or at its end) is told, so that the
  // claim left until its lease ends is seen.
  const bool undecided = error_ && (!handler_started_ || cancelled_);
  const bool before_handler_ended = undecided && !release_error_.empty();
  const bool report = !error_ || !undecided || before_handler_ended;
  if (!report || (!o.metrics && !o.on_decision)) return go(end);
  event_ = DecisionEvent{};
  event_.request_id = request_.request_id;
  event_.key = key_.key;
  event_.fingerprint = key_.fingerprint;
  event_.attempt = request_.attempt;
  event_.latency = std::chrono::duration_cast<std::chrono::microseconds>(now_ - start_);
  if (!claim_rows_ && key_.missing_reason != nullptr) event_.unkeyed = key_.missing_reason;
  event_.release_error = release_error_;
  if (before_handler_ended) {
    event_.ended_before_handler = true;
    event_.error = handler_error_.what;
  } else if (error_) {
    event_.handler_failed = true;
    event_.error = handler_error_.what;
  } else {
    event_.layer = outcome_.layer;
    event_.outcome = outcome_.kind;
    if (!completing_failure_) event_.save_error = save_error_;
  }
  after_emit_ = end;
  go(State::kEmit);
}

void CallPlan::internal_error(std::string_view what) {
  error_ = std::make_exception_ptr(Error("idem: internal: " + std::string(what)));
  go(State::kThrow);
}

Outcome CallPlan::unavailable(Layer layer, std::string_view why) {
  Outcome outcome;
  outcome.kind = Outcome::Kind::kUnavailable;
  outcome.layer = layer;
  outcome.error = why;
  return outcome;
}

// ---- the step of each state
// -------------------------------------------------------------------------

Step CallPlan::step() noexcept {
  if (state_ == State::kRunHandler && !handler_started_) start_handler();
  Step step;
  step.kind = kind_of(state_);
  step.key = key_.key;
  step.notes = notes_;
  step.interruptible = state_ == State::kCompleteWait ||
                       (!handler_returned_ && (before_handler() || state_ == State::kRunHandler));
  switch (step.kind) {
    case StepKind::kGuardClaim:
      if (state_ == State::kProbeClaim) step.key = key_.previous_bucket_key;
      step.request_id = request_.request_id;
      step.fingerprint = key_.record_fingerprint;
      return step;
    case StepKind::kGuardRelease:
    case StepKind::kGuardComplete:
      if (state_ == State::kProbeRelease) step.key = key_.previous_bucket_key;
      step.owner_token = state_ == State::kProbeRelease ? probe_token_ : owner_token_;
      step.unawaited = (state_ == State::kGuardRelease && claim_in_doubt_) ||
                       (state_ == State::kProbeRelease && probe_in_doubt_);
      step.value = response_;
      step.ttl = record_retention();
      return step;
    case StepKind::kSinkBegin:
    case StepKind::kSinkClaim:
    case StepKind::kSinkComplete:
    case StepKind::kSinkRelease:
      return sink_step(step);
    case StepKind::kWait:
      step.at = wake_at_;
      return step;
    case StepKind::kDecideFailure:
      step.error = handler_error_.error;
      return step;
    case StepKind::kLocalPut:
      step.value = local_entry_;
      step.ttl = local_ttl();
      return step;
    case StepKind::kEmit:
      step.event = &event_;
      return step;
    default:
      return step;
  }
}

StepKind CallPlan::kind_of(State state) noexcept {
  // By State: kStart is never a step (take(Started) always moves on).
  constexpr std::array<StepKind, static_cast<std::size_t>(State::kThrow) + 1> kKinds = {
      StepKind::kReturn,       StepKind::kLocalGet,      StepKind::kGuardClaim,
      StepKind::kGuardClaim,   StepKind::kGuardRelease,  StepKind::kWait,
      StepKind::kSinkBegin,    StepKind::kSinkClaim,     StepKind::kRunHandler,
      StepKind::kSinkComplete, StepKind::kCommit,        StepKind::kRollback,
      StepKind::kSinkRelease,  StepKind::kDecideFailure, StepKind::kSinkBegin,
      StepKind::kSinkClaim,    StepKind::kSinkComplete,  StepKind::kCommit,
      StepKind::kRollback,     StepKind::kLocalPut,      StepKind::kGuardComplete,
      StepKind::kWait,         StepKind::kGuardRelease,  StepKind::kEmit,
      StepKind::kReturn,       StepKind::kThrow};
  return kKinds[static_cast<std::size_t>(state)];
}

void CallPlan::start_handler() noexcept {
  // The handler starts now: its lease is renewed from here on.
  handler_started_ = true;
  const auto interval = rules_.options_.auto_renew_interval;
  renewing_ = interval.count() > 0 && (holds_claim() || holds_sink_row_);
  next_renewal_ = now_ + interval;
}

// The sink's steps.
Step CallPlan::sink_step(Step step) const noexcept {
  step.request_id = sink_owner_;
  step.owner_token = sink_token();  // kRun: the row's fencing token
  step.fingerprint = key_.record_fingerprint;
  step.ttl = record_retention();
  if (step.kind == StepKind::kSinkBegin) {
    step.with_next = state_ == State::kStoreBegin || sink_records();  // a claim follows
  } else if (step.kind == StepKind::kSinkComplete) {
    step.value = response_;
    step.with_next = transactional();  // the commit follows
  }
  return step;
}

// ---- the lease ----------------------------------------------------------------------------------

std::optional<PlanTime> CallPlan::renewal_due() const noexcept {
  if (!renewing_ || (!holds_claim() && !holds_sink_row_)) return std::nullopt;
  return next_renewal_;
}

std::optional<RenewalStep> CallPlan::renewal() const noexcept {
  if (!holds_claim() && !holds_sink_row_) return std::nullopt;
  // The sink's row of a run() call is renewed with the Redis lease (the sink's own lease).
  const std::string_view sink_owner = holds_sink_row_ ? sink_token() : std::string_view();
  return RenewalStep{key_.key, owner_token_, rules_.guard_lease_, sink_owner};
}

std::optional<JournalTarget> CallPlan::step_journal() const {
  if (!rules_.guard_) {
    throw ConfigError("idem: Context::step needs a guard: the journal lives beside its claim");
  }
  if (!holds_claim()) return std::nullopt;
  return JournalTarget{key_.key, owner_token_};
}

void CallPlan::renewed(PlanTime sent, const RenewalAnswers& answers) noexcept {
  if (answers.guard == RenewalAnswer::kOwned) {
    lease_deadline_ = std::max(lease_deadline_, sent + rules_.guard_lease_);
  }
  guard_claim_lost_ = guard_claim_lost_ || answers.guard == RenewalAnswer::kLost;
  sink_row_renewal_lost_ = sink_row_renewal_lost_ || answers.sink == RenewalAnswer::kLost;
  lease_lost_ = lease_lost_ || !answers.extended();
  // Each layer is renewed until it is found lost: the sink's row outlives a lost Redis claim.
  const bool guard_left = holds_claim() && !guard_claim_lost_;
  const bool sink_left = holds_sink_row_ && !sink_row_renewal_lost_;
  if (!guard_left && !sink_left) renewing_ = false;
  next_renewal_ = sent + rules_.options_.auto_renew_interval;
}

bool RenewalAnswers::extended() const noexcept {
  const auto fine = [](RenewalAnswer a) {
    return a == RenewalAnswer::kNotAsked || a == RenewalAnswer::kOwned;
  };
  return fine(guard) && fine(sink);
}

bool RenewalAnswers::answer() const {
  if (guard == RenewalAnswer::kLost || sink == RenewalAnswer::kLost) return false;
  if (failure) std::rethrow_exception(failure);
  return true;
}

std::chrono::milliseconds CallPlan::remaining_lease(PlanTime now) const noexcept {
  if (!holds_claim()) return std::chrono::milliseconds(0);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(lease_deadline_ - now);
  return std::max(left, std::chrono::milliseconds(0));
}

bool CallPlan::lease_lost(PlanTime now) const noexcept {
  return lease_lost_ || (holds_claim() && now >= lease_deadline_);
}

// ---- helpers
// ----------------------------------------------------------------------------------------

bool CallPlan::transaction_open() const noexcept {
  return transactional() && (state_ == State::kSinkClaim || state_ == State::kRunHandler ||
                             state_ == State::kSinkComplete);
}

bool CallPlan::sink_records() const noexcept {
  return rules_.sink_ && claim_rows_ &&
         (!transactional() || rules_.options_.transactional_claim == TransactionalClaim::kRecord);
}

std::chrono::milliseconds CallPlan::local_ttl() const noexcept {
  // Never longer than the record itself is kept: a fallback key's only fallback_retention;
  // another, the longest retention of the guard and the sink.
  const DeduplicatorOptions& o = rules_.options_;
  if (key_.fallback) return std::min(o.local_cache_ttl, o.fallback_retention);
  if (rules_.record_lifetime_.count() > 0) {
    return std::min(o.local_cache_ttl, rules_.record_lifetime_);
  }
  return o.local_cache_ttl;
}

std::chrono::milliseconds CallPlan::record_retention() const noexcept {
  // A payload-keyed request's fallback key is kept only fallback_retention (the same body later
  // is legitimately new); others the backend's retention (0).
  return key_.fallback ? rules_.options_.fallback_retention : std::chrono::milliseconds(0);
}

StepResult commit_failure(const std::exception_ptr& error, bool business_duplicate,
                          bool handlers_statement) {
  if (business_duplicate) return BusinessDuplicate{};
  StepError failure = classify(error);
  if (handlers_statement) failure.kind = ErrorKind::kOther;
  return failure;
}

}  // namespace idem::detail
