#include "facade/plan.h"

#include <algorithm>
#include <utility>

#include "facade/decision.h"
#include "idem/errors.h"
#include "idem/key.h"
#include "idem/request_id.h"

namespace idem::detail {
namespace {

// The local cache's entry of a completed key: "<fingerprint>\0<response>" (a fingerprint is hex:
// it holds no NUL).
std::string local_entry(std::string_view fingerprint, std::string_view response) {
  std::string entry;
  entry.reserve(fingerprint.size() + 1 + response.size());
  entry.append(fingerprint).push_back('\0');
  entry.append(response);
  return entry;
}

bool is_a(const std::exception_ptr& error, auto test) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return test(e);
  } catch (...) {
    return false;
  }
}

template <class E>
const E* as(const std::exception& e) {
  return dynamic_cast<const E*>(&e);
}

// True when `pointer` is `field` or a member below it.
bool at_or_below(const std::string& pointer, const std::string& field) {
  return pointer == field || pointer.starts_with(field + "/");
}

// `fingerprint` leaving out the members that carry the request ID (see
// DeduplicatorOptions::request_id_fields).
FingerprintOptions without_request_id_fields(FingerprintOptions fingerprint,
                                             const DeduplicatorOptions& options) {
  if (!fingerprint.domain_separated) return fingerprint;  // the seed's digest, byte for byte
  for (const std::string& field : options.request_id_fields) {
    const bool included = std::any_of(fingerprint.include.begin(), fingerprint.include.end(),
                                      [&](const std::string& p) { return at_or_below(p, field); });
    const bool excluded = std::any_of(fingerprint.exclude.begin(), fingerprint.exclude.end(),
                                      [&](const std::string& p) { return at_or_below(field, p); });
    if (!included && !excluded) fingerprint.exclude.push_back(field);
  }
  return fingerprint;
}

}  // namespace

PlanRules::PlanRules(const DeduplicatorOptions& options) : options_(options) {
  const DeduplicatorOptions& o = options_;
  if (o.wait_for_result.count() < 0 || o.wait_poll_interval.count() <= 0 ||
      o.auto_renew_interval.count() < 0) {
    throw ConfigError(
        "idem: wait_for_result and auto_renew_interval must be >= 0, wait_poll_interval > 0");
  }
  if (o.fallback_retention.count() <= 0) throw ConfigError("idem: fallback_retention must be > 0");
  if (o.fingerprint) {
    (void)Fingerprinter(*o.fingerprint);  // validates the options as given
    const FingerprintOptions options = without_request_id_fields(*o.fingerprint, o);
    if (options.time_bucket.count() > 0) bucketed_fingerprinter_.emplace(options);
    FingerprintOptions unbucketed = options;
    unbucketed.time_bucket = std::chrono::seconds(0);
    fingerprinter_.emplace(unbucketed);
  }
  redis_failure_ = o.on_redis_failure.value_or(o.sink ? RedisFailurePolicy::kFailOpen
                                                      : RedisFailurePolicy::kFailClosed);
  if (o.guard) {
    guard_lease_ = o.guard->lease();
    guard_retention_ = o.guard->retention();
  }
  transactional_records_ = o.transactional_claim == TransactionalClaim::kRecord;
}

CallPlan::CallPlan(const PlanRules& rules, const Request& request, CallMode mode, PlanTime now,
                   std::chrono::system_clock::time_point wall_now, std::string attempt_id,
                   std::stop_token shutdown)
    : rules_(rules),
      request_(request),
      mode_(mode),
      start_(now),
      wall_start_(wall_now),
      shutdown_(std::move(shutdown)),
      now_(now),
      sink_owner_(request.request_id.empty() ? attempt_id : request.request_id),
      attempt_id_(std::move(attempt_id)) {}

bool CallPlan::needs_attempt_id(const PlanRules& rules, const Request& request,
                                CallMode mode) noexcept {
  return request.request_id.empty() || (mode == CallMode::kRun && rules.options().sink != nullptr);
}

// ---- steps -----------------------------------------------------------------------------------

Step CallPlan::next(PlanTime now) {
  now_ = now;
  if (state_ == State::kStart) start();
  if (state_ == State::kRunHandler && !handler_clock_started_) {
    // The handler starts now: its lease is renewed from here on.
    handler_clock_started_ = true;
    const auto interval = rules_.options_.auto_renew_interval;
    renewing_ = interval.count() > 0 && (holds_claim() || holds_sink_row_);
    next_renewal_ = now + interval;
  }
  if (state_ == State::kEmit) {
    if (!event_recorded_) {
      event_recorded_ = true;
      event_.latency = std::chrono::duration_cast<std::chrono::microseconds>(now - start_);
      if (Metrics* metrics = rules_.options_.metrics.get()) {
        if (event_.handler_failed) {
          metrics->record_handler_failure(event_);
        } else {
          metrics->record_decision(event_);
        }
      }
    }
    if (!rules_.options_.on_decision) go(after_emit_);
  }

  Step step;
  step.key = key_;
  switch (state_) {
    case State::kStart:
      break;  // start() always moves on
    case State::kLocalGet:
      step.kind = StepKind::kLocalGet;
      break;
    case State::kGuardClaim:
    case State::kProbeClaim:
      step.kind = StepKind::kGuardClaim;
      if (state_ == State::kProbeClaim) step.key = previous_bucket_key_;
      step.request_id = request_.request_id;
      step.fingerprint = record_fingerprint_;
      break;
    case State::kProbeRelease:
      step.kind = StepKind::kGuardRelease;
      step.key = previous_bucket_key_;
      step.owner_token = probe_token_;
      break;
    case State::kWait:
      step.kind = StepKind::kWait;
      step.at = wake_at_;
      break;
    case State::kSinkBegin:
    case State::kStoreBegin:
      step.kind = StepKind::kSinkBegin;
      step.with_next = state_ == State::kStoreBegin || sink_records();  // a claim follows
      break;
    case State::kSinkClaim:
    case State::kStoreClaim:
      step.kind = StepKind::kSinkClaim;
      step.request_id = sink_owner_;
      step.owner_token = sink_token();  // kRun: the row's fencing token
      step.fingerprint = record_fingerprint_;
      step.ttl = record_retention();
      break;
    case State::kRunHandler:
      step.kind = StepKind::kRunHandler;
      break;
    case State::kSinkComplete:
    case State::kStoreComplete:
      step.kind = StepKind::kSinkComplete;
      step.request_id = sink_owner_;
      step.owner_token = sink_token();
      step.fingerprint = record_fingerprint_;  // transactional: the whole record is written now
      step.value = response_;
      step.ttl = record_retention();
      step.with_next = transactional();  // the commit follows
      break;
    case State::kCommit:
    case State::kStoreCommit:
      step.kind = StepKind::kCommit;
      break;
    case State::kRollback:
    case State::kStoreRollback:
      step.kind = StepKind::kRollback;
      break;
    case State::kFailureSinkRelease:
      step.kind = StepKind::kSinkRelease;
      step.request_id = sink_owner_;
      step.owner_token = sink_token();
      break;
    case State::kLocalPut:
      step.kind = StepKind::kLocalPut;
      step.value = local_entry_;
      step.ttl = local_ttl();
      break;
    case State::kGuardComplete:
      step.kind = StepKind::kGuardComplete;
      step.owner_token = owner_token_;
      step.value = response_;
      step.ttl = record_retention();
      break;
    case State::kGuardRelease:
      step.kind = StepKind::kGuardRelease;
      step.owner_token = owner_token_;
      break;
    case State::kEmit:
      step.kind = StepKind::kEmit;
      step.event = &event_;
      break;
    case State::kReturn:
      step.kind = StepKind::kReturn;
      break;
    case State::kThrow:
      step.kind = StepKind::kThrow;
      break;
  }
  return step;
}

// ---- the start: input, keys, the fast layers --------------------------------------------------

void CallPlan::start() {
  const DeduplicatorOptions& o = rules_.options_;
  try {
    if (transactional() && !o.sink) {
      throw ConfigError("idem: run_transactional needs a sink (DeduplicatorOptions::sink)");
    }
    if (shutdown_.stop_requested()) throw Cancelled("idem: the deduplicator is shut down");
    if (request_.stop.stop_requested()) {
      throw Cancelled("idem: the request's stop was requested before it was claimed");
    }
    if (!prepare()) {
      if (o.on_missing_key == MissingKeyPolicy::kReject) {
        throw MissingKey(std::string("idem: the request has no idempotency key: ") +
                         missing_key_reason_);
      }
      claim_rows_ = false;
      enter_sink();
      return;
    }
  } catch (...) {
    error_ = std::current_exception();
    go(State::kThrow);  // bad input or configuration: nothing was claimed, no event
    return;
  }
  wait_deadline_ = start_ + o.wait_for_result;
  lookup();
}

bool CallPlan::prepare() {
  const Fingerprinter* fingerprinter = rules_.fingerprinter_ ? &*rules_.fingerprinter_ : nullptr;
  if (!request_.request_id.empty()) validate_request_id(request_.request_id);
  validate_key_name(request_.user, "user");
  validate_key_name(request_.intent, "intent");
  validate_key_name(request_.biz_key, "biz_key");
  const bool has_payload = fingerprinter != nullptr && !request_.payload.empty();
  // The mismatch fingerprint carries no time bucket: the same payload must match across one.
  // Scoped by user, except in the seed-compatible form, whose digest has no scope (the key
  // text still carries the user).
  const std::string_view scope =
      fingerprinter != nullptr && fingerprinter->options().domain_separated
          ? std::string_view(request_.user)
          : std::string_view();
  const bool fallback = request_.biz_key.empty() && request_.request_id.empty();
  if (!has_payload) {
    if (!fallback) return make_key();
    missing_key_reason_ = fingerprinter == nullptr && !request_.payload.empty()
                              ? "no request ID or business key, and the fingerprint layer is off"
                              : "no request ID, business key or payload";
    return false;
  }
  if (!fallback) {
    fingerprint_ = fingerprinter->fingerprint(request_.payload, scope);
  } else {
    // A fallback key needs something to key on: a selection of nothing (absent members, or
    // only null, "", [] and {}) would give every such payload one key.
    const Fingerprinter* keyer =
        rules_.bucketed_fingerprinter_ ? &*rules_.bucketed_fingerprinter_ : fingerprinter;
    const Fingerprinter::Window window =
        keyer->fingerprint_window(request_.payload, scope, wall_start_);
    if (window.selects_nothing) {
      missing_key_reason_ =
          "no request ID or business key, and the payload's fingerprint selection holds nothing "
          "to key on (absent members, or only null, \"\", [] and {})";
      return false;
    }
    fingerprint_ = keyer == fingerprinter ? window.current
                                          : fingerprinter->fingerprint(request_.payload, scope);
    key_ = fallback_key(request_.user, request_.intent, window.current);
    if (!window.previous.empty()) {
      previous_bucket_key_ = fallback_key(request_.user, request_.intent, window.previous);
    }
  }
  // Stored with its options' tag: a fingerprint made under other options is no mismatch.
  record_fingerprint_ = fingerprinter->options_tag() + '.' + fingerprint_;
  return fallback || make_key();
}

bool CallPlan::make_key() {
  if (!request_.biz_key.empty()) {
    key_ = KeyText{KeyForm::kBusiness, request_.user, request_.intent, request_.biz_key}.encode();
  } else {
    key_ =
        KeyText{KeyForm::kRequestId, request_.user, request_.intent, request_.request_id}.encode();
  }
  return true;
}

void CallPlan::lookup() {
  if (rules_.options_.local_cache_capacity > 0) {
    go(State::kLocalGet);
  } else {
    claim_guard();
  }
}

void CallPlan::local_result(std::optional<std::string> entry) {
  if (!entry) {
    claim_guard();
    return;
  }
  const std::size_t split = entry->find('\0');
  const std::string_view stored_fingerprint = std::string_view(*entry).substr(0, split);
  const bool matches =
      stored_fingerprint.empty() || fingerprint_.empty() || stored_fingerprint == fingerprint_;
  finish(decide_repeat(Layer::kRequestId, RecordState::kCompleted, matches,
                       split == std::string::npos ? std::string() : entry->substr(split + 1)));
}

void CallPlan::claim_guard() {
  if (rules_.options_.guard) {
    go(State::kGuardClaim);
  } else {
    enter_sink();
  }
}

void CallPlan::claim_result(ClaimResult claim) {
  if (state_ == State::kProbeClaim) {
    // Sliding window of a bucketed fallback key: the current bucket's key is ours; a record
    // under the previous bucket's key makes this a repeat across the boundary. The probe claims
    // that key when absent, so it is released at once.
    if (claim.status == ClaimStatus::kFirst) {
      probe_token_ = std::move(claim.owner_token);
      go(State::kProbeRelease);
      return;
    }
    repeat(*decide_on_guard(std::move(claim)));
    return;
  }
  owner_token_ = std::move(claim.owner_token);
  // From when the claim was sent: Redis' TTL ran from a moment no earlier than that.
  if (holds_claim()) {
    had_claim_ = true;
    lease_deadline_ = now_ + rules_.guard_lease_;
  }
  const bool reentrant_retry =
      claim.status == ClaimStatus::kRepeatSame && claim.state == RecordState::kInProgress &&
      claim.fingerprint_matches && rules_.options_.reentrant_intents.contains(request_.intent);
  if (reentrant_retry) {
    claim_rows_ = false;  // a naturally idempotent intent runs again, unclaimed
    enter_sink();
    return;
  }
  if (claim.status == ClaimStatus::kFirst && !claim.replicated) {
    // Written on the primary only: a failover may lose it. Fail closed, it goes and nothing
    // runs; fail open, the call goes on under it, as it would without the guard.
    record_backend_error(Layer::kRedisGuard);
    if (rules_.redis_failure_ == RedisFailurePolicy::kFailClosed) {
      unavailable(Layer::kRedisGuard,
                  RedisError("idem: the claim was not acknowledged by the replicas the guard "
                             "waits for; released",
                             true));
      return;
    }
  }
  if (claim.status == ClaimStatus::kFirst && !previous_bucket_key_.empty()) {
    go(State::kProbeClaim);
    return;
  }
  if (std::optional<Outcome> stopped = decide_on_guard(std::move(claim))) {
    repeat(*std::move(stopped));
  } else {
    enter_sink();
  }
}

void CallPlan::repeat(Outcome outcome) {
  const DeduplicatorOptions& o = rules_.options_;
  if (outcome.kind == Outcome::Kind::kInProgress &&
      o.on_concurrent_duplicate == ConcurrentDuplicatePolicy::kWaitForResult &&
      now_ + o.wait_poll_interval <= wait_deadline_) {
    wake_at_ = now_ + o.wait_poll_interval;
    release_or(State::kWait);  // then ask the layers again
    return;
  }
  finish(std::move(outcome));
}

void CallPlan::guard_failed(const BackendError& error) {
  record_backend_error(Layer::kRedisGuard);
  if (rules_.redis_failure_ == RedisFailurePolicy::kFailClosed) {
    unavailable(Layer::kRedisGuard, error);  // releases the claim held when only the probe failed
  } else {
    enter_sink();  // fail open: on to the sink, or unguarded when there is none
  }
}

// ---- the sink and the handler -----------------------------------------------------------------

void CallPlan::enter_sink() {
  if (stop_requested()) {
    stop_before_handler(false);
    return;
  }
  if (transactional()) {
    go(State::kSinkBegin);
  } else if (sink_records()) {
    go(State::kSinkClaim);
  } else {
    enter_handler();
  }
}

void CallPlan::enter_handler() {
  if (stop_requested()) {
    stop_before_handler(transactional());
    return;
  }
  handler_started_ = true;
  go(State::kRunHandler);
}

void CallPlan::stop_before_handler(bool transaction_open) {
  // Claimed but not started: nothing of the handler can have happened, so every claim of this
  // call goes (the transaction's with its rollback), whichever step the stop came in.
  error_ = std::make_exception_ptr(
      Cancelled("idem: the request's stop was requested before its handler ran"));
  cancelled_ = true;
  if (transaction_open) {
    go(State::kRollback);  // then after_failure() releases the guard's claim
  } else if (holds_sink_row_) {
    release_or(State::kFailureSinkRelease);
  } else {
    release_or(State::kThrow);
  }
}

void CallPlan::sink_claim_result(SinkClaim claim) {
  if (state_ == State::kStoreClaim) {
    go(claim.status == SinkStatus::kClaimed ? State::kStoreComplete : State::kStoreRollback);
    return;
  }
  std::optional<Outcome> stopped = decide_on_sink(std::move(claim));
  if (!stopped) {
    holds_sink_row_ = !transactional() && claim_rows_;
    enter_handler();
  } else if (transactional()) {
    outcome_ = *std::move(stopped);
    go(State::kRollback);
  } else {
    conclude(*std::move(stopped));
  }
}

void CallPlan::handler_result(std::string response) {
  renewing_ = false;
  response_ = std::move(response);
  if (sink_records()) {
    go(State::kSinkComplete);
  } else if (transactional()) {
    go(State::kCommit);
  } else {
    finish_executed();
  }
}

void CallPlan::business_duplicate() {
  // A UNIQUE constraint of the caller's own tables says the effect already exists (C11): a
  // duplicate, with no response to replay; nothing of this call commits.
  renewing_ = false;
  outcome_ = decide_repeat(Layer::kPgSink, RecordState::kCompleted, true, std::nullopt);
  go(State::kRollback);
}

void CallPlan::done() {
  switch (state_) {
    case State::kProbeRelease:
      probe_token_.clear();
      enter_sink();
      return;
    case State::kWait:
      if (stop_requested()) {
        stop_before_handler(false);  // stopped while it waited for the first execution
      } else {
        lookup();
      }
      return;
    case State::kSinkBegin:
      if (sink_records()) {
        go(State::kSinkClaim);
      } else {
        enter_handler();
      }
      return;
    case State::kSinkComplete:
      holds_sink_row_ = false;
      if (transactional()) {
        go(State::kCommit);
      } else {
        finish_executed();
      }
      return;
    case State::kCommit:
      finish_executed();
      return;
    case State::kRollback:
      // Whatever ended the transaction was recorded before it: a failure, or an outcome.
      if (error_) {
        after_failure();
      } else {
        conclude(std::move(outcome_));
      }
      return;
    case State::kFailureSinkRelease:
      holds_sink_row_ = false;
      if (cancelled_) {
        release_or(State::kThrow);  // stopped before the handler: the guard's claim goes too
      } else {
        emit_or_end();
      }
      return;
    case State::kStoreBegin:
      go(State::kStoreClaim);
      return;
    case State::kStoreComplete:
      if (transactional()) {
        go(State::kStoreCommit);
      } else {
        after_store();
      }
      return;
    case State::kStoreCommit:
    case State::kStoreRollback:
      after_store();
      return;
    case State::kLocalPut:
      if (holds_claim()) {
        go(State::kGuardComplete);
      } else {
        end_completion();
      }
      return;
    case State::kGuardRelease:
      owner_token_.clear();
      proceed(after_release_);
      return;
    case State::kEmit:
      go(after_emit_);
      return;
    default:
      return;  // a report for no step: ignored
  }
}

void CallPlan::complete_result(bool owned) {
  owned_ = owned;
  owner_token_.clear();
  end_completion();
}

// ---- failures -----------------------------------------------------------------------------------

void CallPlan::fail(std::exception_ptr error) {
  const bool backend =
      is_a(error, [](const std::exception& e) { return as<BackendError>(e) != nullptr; });
  const bool before_handler = state_ == State::kGuardClaim || state_ == State::kProbeClaim ||
                              state_ == State::kSinkBegin || state_ == State::kSinkClaim;
  if (before_handler && is_cancellation(error)) {
    // A claim the stop cut short (a statement cancelled on the server, an aborted wait): the
    // stop's doing, not a backend's failure.
    stop_before_handler(transactional() && state_ == State::kSinkClaim);
    return;
  }
  switch (state_) {
    case State::kGuardClaim:
    case State::kProbeClaim:
      if (!backend) break;  // bad input (InvalidKey, ...): thrown as is
      is_a(error, [this](const std::exception& e) {
        guard_failed(*as<BackendError>(e));
        return true;
      });
      return;
    case State::kProbeRelease:
      record_backend_error(Layer::kRedisGuard);  // best effort: the probe's lease ends it
      probe_token_.clear();
      enter_sink();
      return;
    case State::kGuardRelease:
      // The claim stays until its lease ends: told with the key, in the event.
      record_backend_error(Layer::kRedisGuard);
      note_failure(release_error_, Layer::kRedisGuard, error);
      done();
      return;
    case State::kGuardComplete:
      // The response is the handler's, but the record stays IN_PROGRESS until its lease ends:
      // told in the outcome (save_error) and the event.
      record_backend_error(Layer::kRedisGuard);
      note_failure(save_error_, Layer::kRedisGuard, error);
      complete_result(true);
      return;
    case State::kLocalGet:
      local_result(std::nullopt);  // an in-process cache that failed knows nothing
      return;
    case State::kLocalPut:
      done();
      return;
    case State::kWait:
    case State::kEmit:
      done();  // an interrupted wait asks again; a failing log sink changes no outcome
      return;
    case State::kRollback:
    case State::kStoreRollback:
      done();  // the connection is gone with its transaction
      return;
    case State::kFailureSinkRelease:
      record_backend_error(Layer::kPgSink);  // the row's lease ends it
      note_failure(release_error_, Layer::kPgSink, error);
      holds_sink_row_ = false;
      if (cancelled_) {
        release_or(State::kThrow);
      } else {
        emit_or_end();
      }
      return;
    case State::kStoreBegin:
    case State::kStoreClaim:
    case State::kStoreComplete:
    case State::kStoreCommit:
      record_backend_error(Layer::kPgSink);
      if (transactional() && (state_ == State::kStoreClaim || state_ == State::kStoreComplete)) {
        go(State::kStoreRollback);
      } else {
        after_store();
      }
      return;
    case State::kSinkComplete:
      if (!transactional()) {
        // The effect happened; the row stays IN_PROGRESS until its lease ends.
        record_backend_error(Layer::kPgSink);
        note_failure(save_error_, Layer::kPgSink, error);
        holds_sink_row_ = false;
        finish_executed();
        return;
      }
      break;
    case State::kRunHandler:
      handler_failed(std::move(error));
      return;
    default:
      break;
  }
  if (state_ == State::kSinkBegin || state_ == State::kSinkClaim ||
      state_ == State::kSinkComplete || state_ == State::kCommit) {
    sink_failed(std::move(error), backend);
    return;
  }
  error_ = std::move(error);
  go(State::kThrow);
}

void CallPlan::sink_failed(std::exception_ptr error, bool backend) {
  const bool transaction_open =
      transactional() && state_ != State::kSinkBegin && state_ != State::kCommit;
  if (backend) record_backend_error(Layer::kPgSink);
  if (backend && !handler_started_) {
    // The sink is unreachable before anything ran: nothing executed, nothing marked.
    is_a(error, [this](const std::exception& e) {
      outcome_ = unavailable_outcome(Layer::kPgSink, *as<BackendError>(e));
      return true;
    });
    if (transaction_open) {
      go(State::kRollback);
    } else {
      conclude(std::move(outcome_));
    }
    return;
  }
  // A commit whose connection was lost has an unknown outcome: the claim is kept. A commit the
  // server refused (a deferred constraint, a serialization failure) rolled back for sure.
  commit_unknown_ = state_ == State::kCommit && is_a(error, [](const std::exception& e) {
                      const auto* pg = as<PostgresError>(e);
                      return pg != nullptr && pg->commit_outcome_unknown();
                    });
  error_ = std::move(error);
  if (transaction_open) {
    go(State::kRollback);
  } else {
    after_failure();
  }
}

bool CallPlan::is_cancellation(const std::exception_ptr& error) const {
  // idem::Cancelled, or a statement that ended with SQLSTATE 57014 (query_canceled) while the
  // call was stopped: the drivers cancel the running statement on a stop.
  return is_a(error, [this](const std::exception& e) {
    if (as<Cancelled>(e) != nullptr) return true;
    const auto* pg = as<PostgresError>(e);
    return pg != nullptr && pg->sqlstate() == kQueryCanceledSqlstate && stop_requested();
  });
}

void CallPlan::handler_failed(std::exception_ptr error) {
  renewing_ = false;
  cancelled_ = is_a(error, [](const std::exception& e) { return as<Cancelled>(e) != nullptr; });
  // A statement of the handler's that the stop cancelled: the stop's doing, not a business
  // failure. Every driver's handler failure comes through here.
  if (!cancelled_ && is_cancellation(error)) {
    error = std::make_exception_ptr(
        Cancelled("idem: the handler's statement was cancelled (SQLSTATE 57014) because the "
                  "call was stopped; its claim is kept until its lease ends"));
    cancelled_ = true;
  }
  error_ = std::move(error);
  if (transactional()) {
    go(State::kRollback);
  } else {
    after_failure();
  }
}

void CallPlan::after_failure() {
  // Cancellation keeps the claim until its lease ends, and so does a stop requested while the
  // handler ran (its effect may be partial); so does a commit whose outcome is unknown. An
  // unclaimed run (pass-through, reentrant retry) has nothing to release.
  if (cancelled_) {
    // No event: a cancelled call decided nothing. Stopped before its handler ran, its claim
    // goes; stopped while it ran, the claim is kept.
    if (handler_started_) {
      go(State::kThrow);
    } else {
      release_or(State::kThrow);
    }
    return;
  }
  if (commit_unknown_ || !claim_rows_ || stop_requested()) {
    emit_or_end();
    return;
  }
  const DeduplicatorOptions& o = rules_.options_;
  failure_ = o.on_handler_failure ? o.on_handler_failure(error_) : FailureDecision{};
  switch (failure_.action) {
    case FailureAction::kRelease:
      release_or(o.sink && !transactional() ? State::kFailureSinkRelease : State::kEmit);
      return;
    case FailureAction::kKeepUntilLeaseEnds:
      emit_or_end();
      return;
    case FailureAction::kStoreAsResponse:
      response_ = failure_.response;
      if (!sink_records()) {
        after_store();  // no sink, or no record of idem's there (TransactionalClaim::kBusinessKey)
      } else if (transactional()) {
        go(State::kStoreBegin);  // the failed transaction is gone: a new one stores the response
      } else {
        go(State::kStoreComplete);
      }
      return;
  }
}

void CallPlan::after_store() {
  // The stored business error is replayed like a response: the guard and the local cache learn
  // it too.
  completing_failure_ = true;
  begin_completion();
}

// ---- the end: completion, release, the decision event ----------------------------------------

void CallPlan::finish_executed() {
  outcome_ = Outcome{};
  outcome_.response = response_;
  if (!claim_rows_) {
    emit_or_end();  // unclaimed: nothing to complete
    return;
  }
  conclude(std::move(outcome_));
}

void CallPlan::conclude(Outcome outcome) {
  outcome_ = std::move(outcome);
  const bool replayable = outcome_.kind == Outcome::Kind::kExecuted ||
                          (outcome_.kind == Outcome::Kind::kDuplicate && outcome_.response);
  if (!replayable) {
    finish(std::move(outcome_));  // a later layer stopped it; the first owner's record stands
    return;
  }
  if (outcome_.kind == Outcome::Kind::kDuplicate) response_ = *outcome_.response;
  begin_completion();
}

void CallPlan::begin_completion() {
  if (rules_.options_.local_cache_capacity > 0) {
    local_entry_ = local_entry(fingerprint_, response_);
    go(State::kLocalPut);
  } else if (holds_claim()) {
    go(State::kGuardComplete);
  } else {
    end_completion();
  }
}

void CallPlan::end_completion() {
  // By the time the completion was sent (now_): a claim past its lease is lost by then.
  if (!completing_failure_ && outcome_.kind == Outcome::Kind::kExecuted) {
    outcome_.lease_lost = !owned_ || lease_lost_ || (had_claim_ && now_ >= lease_deadline_);
    outcome_.save_error = save_error_;
  }
  emit_or_end();
}

void CallPlan::finish(Outcome outcome) {
  outcome_ = std::move(outcome);
  release_or(State::kEmit);
}

void CallPlan::release_or(State next) {
  if (!holds_claim()) {
    proceed(next);
    return;
  }
  if (Metrics* metrics = rules_.options_.metrics.get()) metrics->record_release();
  after_release_ = next;
  go(State::kGuardRelease);
}

void CallPlan::proceed(State next) {
  if (next == State::kEmit) {
    emit_or_end();
  } else {
    go(next);
  }
}

void CallPlan::unavailable(Layer layer, const BackendError& error) {
  finish(unavailable_outcome(layer, error));
}

Outcome CallPlan::unavailable_outcome(Layer layer, const BackendError& error) {
  Outcome outcome;
  outcome.kind = Outcome::Kind::kUnavailable;
  outcome.layer = layer;
  outcome.error = error.what();
  return outcome;
}

void CallPlan::emit_or_end() {
  const DeduplicatorOptions& o = rules_.options_;
  const State end = error_ ? State::kThrow : State::kReturn;
  // A failed call reports only a handler that ran (or was called): errors before it decided
  // nothing; a cancellation is no decision either.
  const bool report = error_ ? handler_started_ && !cancelled_ : true;
  if (!report || (!o.metrics && !o.on_decision)) {
    go(end);
    return;
  }
  event_ = DecisionEvent{};
  event_.request_id = request_.request_id;
  event_.key = key_;
  event_.fingerprint = fingerprint_;
  event_.attempt = request_.attempt;
  if (!claim_rows_ && missing_key_reason_ != nullptr) event_.unkeyed = missing_key_reason_;
  event_.save_error = completing_failure_ || error_ ? std::string_view() : save_error_;
  event_.release_error = release_error_;
  if (error_) {
    event_.handler_failed = true;
    error_text_ = "unknown exception";
    is_a(error_, [this](const std::exception& e) {
      error_text_ = e.what();
      return true;
    });
    event_.error = error_text_;
  } else {
    event_.layer = outcome_.layer;
    event_.outcome = outcome_.kind;
  }
  event_recorded_ = false;
  after_emit_ = end;
  go(State::kEmit);
}

// ---- the lease ------------------------------------------------------------------------------

std::optional<PlanTime> CallPlan::renewal_due() const noexcept {
  if (!renewing_ || (!holds_claim() && !holds_sink_row_)) return std::nullopt;
  return next_renewal_;
}

RenewalStep CallPlan::renewal() const noexcept {
  // The sink's row of a run() call is renewed with the Redis lease (the sink's own lease).
  const std::string_view sink_owner = holds_sink_row_ ? sink_token() : std::string_view();
  return RenewalStep{key_, owner_token_, rules_.guard_lease_, sink_owner};
}

void CallPlan::renewed(PlanTime now, bool owned) noexcept {
  if (Metrics* metrics = rules_.options_.metrics.get()) metrics->record_renewal(owned);
  if (owned) {
    lease_deadline_ = std::max(lease_deadline_, now + rules_.guard_lease_);
    next_renewal_ = now + rules_.options_.auto_renew_interval;
  } else {
    lease_lost_ = true;
    renewing_ = false;  // someone else holds the key: stop
  }
}

void CallPlan::renewal_failed(PlanTime now) noexcept {
  if (Metrics* metrics = rules_.options_.metrics.get()) metrics->record_renewal(false);
  lease_lost_ = true;  // keep trying: Redis may come back before the lease ends
  next_renewal_ = now + rules_.options_.auto_renew_interval;
}

std::chrono::milliseconds CallPlan::remaining_lease(PlanTime now) const noexcept {
  if (!holds_claim()) return std::chrono::milliseconds(0);
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(lease_deadline_ - now);
  return std::max(left, std::chrono::milliseconds(0));
}

bool CallPlan::lease_lost(PlanTime now) const noexcept {
  return lease_lost_ || (holds_claim() && now >= lease_deadline_);
}

// ---- helpers ----------------------------------------------------------------------------------

std::chrono::milliseconds CallPlan::local_ttl() const noexcept {
  // Never longer than the record itself is kept: a fallback key's only fallback_retention; with
  // the guard alone, the guard's retention (a sink keeps its rows far longer).
  const DeduplicatorOptions& o = rules_.options_;
  if (is_fallback_key()) return std::min(o.local_cache_ttl, o.fallback_retention);
  if (!o.sink && rules_.guard_retention_.count() > 0) {
    return std::min(o.local_cache_ttl, rules_.guard_retention_);
  }
  return o.local_cache_ttl;
}

bool CallPlan::is_fallback_key() const noexcept {
  return request_.biz_key.empty() && request_.request_id.empty();
}

std::chrono::milliseconds CallPlan::record_retention() const noexcept {
  // A payload-keyed request's fallback key is kept only fallback_retention (the same body later
  // is legitimately new); others the backend's retention (0).
  return is_fallback_key() ? rules_.options_.fallback_retention : std::chrono::milliseconds(0);
}

bool CallPlan::stop_requested() const noexcept {
  return request_.stop.stop_requested() || shutdown_.stop_requested();
}

void CallPlan::note_failure(std::string& text, Layer layer, const std::exception_ptr& error) {
  if (!text.empty()) text += "; ";
  text += to_string(layer);
  text += ": ";
  if (!is_a(error, [&](const std::exception& e) {
        text += e.what();
        return true;
      })) {
    text += "unknown exception";
  }
}

void CallPlan::record_backend_error(Layer layer) const noexcept {
  if (Metrics* metrics = rules_.options_.metrics.get()) metrics->record_backend_error(layer);
}

}  // namespace idem::detail
