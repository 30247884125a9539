// The call plan: the whole procedure of one Deduplicator call as a state machine that does no
// I/O, no sleeping, starts no thread and reads no clock. A driver (the blocking Deduplicator, an
// asynchronous front, the simulator) asks it for the next step, performs that step against its
// backends, and reports the result; the plan owns every rule of the outcome table
// (docs/semantics.md) and every policy of DeduplicatorOptions. docs/call_plan.md lists the steps
// and what a driver does for each.
//
// Not thread-safe: one call's plan is driven by one thread at a time (a driver that renews a
// lease from another thread serializes its calls on the plan).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "idem/deduplicator.h"
#include "idem/errors.h"

namespace idem::detail {

/// SQLSTATE query_canceled: a statement cancelled (PQcancel) or past statement_timeout. Under a
/// stop of the call, a handler failure with it is a cancellation (CallPlan::fail()).
inline constexpr const char* kQueryCanceledSqlstate = "57014";

/// Time as the plan sees it: a driver passes the monotonic clock's reading in.
using PlanTime = std::chrono::steady_clock::time_point;

/// What the plan needs of a Deduplicator's options, prepared and validated once (ConfigError).
/// Immutable afterwards: shared by every call, from any thread.
class PlanRules {
 public:
  /// Throws idem::ConfigError on inconsistent options.
  explicit PlanRules(const DeduplicatorOptions& options);

  /// The options, as given.
  [[nodiscard]] const DeduplicatorOptions& options() const noexcept { return options_; }

 private:
  friend class CallPlan;
  DeduplicatorOptions options_;
  std::optional<Fingerprinter> fingerprinter_;           // no time bucket: mismatch detection
  std::optional<Fingerprinter> bucketed_fingerprinter_;  // fallback keys, when a bucket is set
  RedisFailurePolicy redis_failure_ = RedisFailurePolicy::kFailClosed;
  bool transactional_records_ = true;  // run_transactional() keeps idem's record in the sink
  std::chrono::milliseconds guard_lease_{0};
  std::chrono::milliseconds guard_retention_{0};  // 0: unknown
};

/// How the handler of a call runs.
enum class CallMode {
  kRun,            ///< On its own; the sink's row (if any) commits before and after it.
  kTransactional,  ///< Inside the sink's transaction, with the claim row and its completion.
};

/// What a driver must do next. Each step is reported back before the next is asked for:
/// with the result named here, or with fail(error) when it threw.
enum class StepKind {
  kLocalGet,       ///< LocalCache::get(key) → local_result().
  kLocalPut,       ///< LocalCache::put(key, value, ttl) → done().
  kGuardClaim,     ///< Guard::claim(key, request_id, fingerprint) → claim_result().
  kGuardComplete,  ///< Guard::complete(key, owner_token, value, ttl) → complete_result().
  kGuardRelease,   ///< Guard::release(key, owner_token) → done() (its answer does not matter).
  kSinkBegin,      ///< Transactional: open a transaction on the sink → done().
  kSinkClaim,      ///< Claim key for request_id with fingerprint, in the open transaction (its
                   ///< row kept for ttl) or on its own (kRun) → sink_claim_result().
  kRunHandler,     ///< Call the handler (in the open transaction when transactional) →
                   ///< handler_result(), or business_duplicate() when a business constraint
                   ///< of the sink said the effect exists (transactional only).
  kSinkComplete,   ///< Complete key with value, kept for ttl: in the open transaction, or on
                   ///< its own for request_id (kRun) → done().
  kCommit,         ///< Commit the open transaction → done().
  kRollback,       ///< Roll the open transaction back → done() (a failure is ignored).
  kSinkRelease,    ///< Sink::release(key, request_id) → done() (its answer does not matter).
  kWait,           ///< Wake at `at` (a timer, a sleep) → done().
  kEmit,           ///< Hand `event` to DeduplicatorOptions::on_decision → done().
  kReturn,         ///< The call ends with outcome().
  kThrow,          ///< The call ends by throwing error().
};

/// One step. The views point into the plan: valid until the next report.
struct Step {
  StepKind kind = StepKind::kReturn;
  std::string_view key{};            ///< The key text the step acts on.
  std::string_view request_id{};     ///< Guard claim: the request ID; sink steps: the row's owner.
  std::string_view fingerprint{};    ///< Claims: the fingerprint as records keep it,
                                     ///< `options_tag.hex` (may be empty).
  std::string_view owner_token{};    ///< Guard complete/release: the claim's owner token.
  std::string_view value{};          ///< Completions: the response; kLocalPut: the cache entry.
  std::chrono::milliseconds ttl{0};  ///< Retention (completions, transactional claim; 0: the
                                     ///< backend's own), or the local cache entry's TTL.
  PlanTime at{};                     ///< kWait: when to wake.
  /// kSinkBegin before a claim, and a transactional kSinkComplete: the step may go with the next
  /// one (kSinkClaim; kCommit) in one round trip. The driver may then report done() at once and
  /// perform it with the next step; a failure of either is reported at the next step, where
  /// the plan treats it alike (nothing ran yet; the commit did not happen).
  bool with_next = false;
  const DecisionEvent* event = nullptr;  ///< kEmit: the event (valid until done()).
};

/// A renewal a driver owes the plan while the handler runs (see CallPlan::renewal()).
struct RenewalStep {
  std::string_view key{};              ///< The claimed key.
  std::string_view owner_token{};      ///< The claim's owner token.
  std::chrono::milliseconds lease{0};  ///< Guard::renew(key, owner_token, lease).
  /// The owner of the sink's row of a run() call, renewed with it: Sink::renew(key, sink_owner,
  /// 0). Empty when the call holds no sink row.
  std::string_view sink_owner{};
};

/// One call. Built by the driver when the call starts; lives until it returns or throws.
class CallPlan {
 public:
  /// `request` must outlive the plan. `now` is the call's start (monotonic), `wall_now` the
  /// wall clock at the start (time buckets of fallback keys), `attempt_id` a fresh unique ID of
  /// this call (the sink's owner when the request has no request ID). `shutdown` is the
  /// deduplicator's stop token.
  /// Whether a call of `request` in `mode` needs an `attempt_id` from its driver: when the
  /// request has no request ID, and for run() with a sink (its row's fencing token). Otherwise
  /// the plan ignores it, and a driver may pass an empty one.
  [[nodiscard]] static bool needs_attempt_id(const PlanRules& rules, const Request& request,
                                             CallMode mode) noexcept;
  CallPlan(const PlanRules& rules, const Request& request, CallMode mode, PlanTime now,
           std::chrono::system_clock::time_point wall_now, std::string attempt_id,
           std::stop_token shutdown);

  /// The step to perform now, at `now`. Asking again without a report returns the same step.
  [[nodiscard]] Step next(PlanTime now);

  // ---- reports of the step next() returned -------------------------------------------------
  /// kLocalGet: the entry found, if any.
  void local_result(std::optional<std::string> entry);
  /// kGuardClaim: the guard's answer.
  void claim_result(ClaimResult claim);
  /// kGuardComplete: whether this call still owned the claim.
  void complete_result(bool owned);
  /// kSinkClaim: the sink's answer.
  void sink_claim_result(SinkClaim claim);
  /// kRunHandler: the handler returned `response`.
  void handler_result(std::string response);
  /// kRunHandler (transactional): a business constraint said the effect already exists.
  void business_duplicate();
  /// Every other step: it was done.
  void done();
  /// Any step: it threw `error` (a handler's exception, a backend's idem::BackendError, ...).
  /// A handler's idem::PostgresError with kQueryCanceledSqlstate while the call's stop is
  /// requested counts as idem::Cancelled (the claim is kept).
  void fail(std::exception_ptr error);

  // ---- the end -----------------------------------------------------------------------------
  /// kReturn: the outcome (moved out).
  [[nodiscard]] Outcome outcome() noexcept { return std::move(outcome_); }
  /// kThrow: the exception to rethrow.
  [[nodiscard]] std::exception_ptr error() const noexcept { return error_; }

  // ---- the lease, while the handler runs ---------------------------------------------------
  /// When the next automatic renewal is due; nullopt when none is (no Redis claim, renewal off,
  /// the handler is not running, or the claim was found lost).
  [[nodiscard]] std::optional<PlanTime> renewal_due() const noexcept;
  /// The renewal to perform (the handler's Context::renew() asks for it too). Only while this
  /// call holds a Redis claim (holds_claim()).
  [[nodiscard]] RenewalStep renewal() const noexcept;
  /// A renewal at `now` answered `owned` (false: the claim is lost).
  void renewed(PlanTime now, bool owned) noexcept;
  /// A renewal at `now` threw: the claim may be lost; automatic renewal goes on trying.
  void renewal_failed(PlanTime now) noexcept;
  /// Whether this call holds a Redis claim now.
  [[nodiscard]] bool holds_claim() const noexcept { return !owner_token_.empty(); }
  /// Whether this call holds an IN_PROGRESS sink row of its own now (run() with a sink).
  [[nodiscard]] bool holds_sink_row() const noexcept { return holds_sink_row_; }
  /// Time left on the claim's lease at `now` (by the driver's clock: Redis' own TTL decides);
  /// zero without a claim.
  [[nodiscard]] std::chrono::milliseconds remaining_lease(PlanTime now) const noexcept;
  /// True once a renewal found the claim lost or failed, or `now` is past the lease's end.
  [[nodiscard]] bool lease_lost(PlanTime now) const noexcept;

  // ---- what the handler's Context shows ----------------------------------------------------
  [[nodiscard]] const Request& request() const noexcept { return request_; }
  [[nodiscard]] std::string_view key() const noexcept { return key_; }
  [[nodiscard]] std::string_view fingerprint() const noexcept { return fingerprint_; }
  [[nodiscard]] CallMode mode() const noexcept { return mode_; }

 private:
  // Where the call is. Each state has one step (see next()).
  enum class State {
    kStart,
    kLocalGet,
    kGuardClaim,
    kProbeClaim,    // the previous time bucket's key (sliding window)
    kProbeRelease,  // ... which the probe claimed: released at once
    kWait,          // kWaitForResult: before asking the layers again
    kSinkBegin,
    kSinkClaim,
    kRunHandler,
    kSinkComplete,
    kCommit,
    kRollback,
    kFailureSinkRelease,  // failure policy kRelease, kRun with a sink
    kStoreBegin,          // failure policy kStoreAsResponse (transactional: its own transaction)
    kStoreClaim,
    kStoreComplete,
    kStoreCommit,
    kStoreRollback,
    kLocalPut,
    kGuardComplete,
    kGuardRelease,
    kEmit,
    kReturn,
    kThrow,
  };

  void start();
  bool prepare();   // sets key_ and fingerprint_; false when the request has nothing to key on
  bool make_key();  // key_ of a request with a business key or a request ID
  void lookup();
  void claim_guard();
  void repeat(Outcome outcome);
  void guard_failed(const BackendError& error);
  void enter_sink();
  void enter_handler();
  void stop_before_handler(bool transaction_open);
  [[nodiscard]] bool is_cancellation(const std::exception_ptr& error) const;
  void sink_failed(std::exception_ptr error, bool backend);
  void handler_failed(std::exception_ptr error);
  void after_failure();
  void after_store();
  void finish_executed();
  void conclude(Outcome outcome);
  void begin_completion();
  void end_completion();
  void finish(Outcome outcome);
  void release_or(State next);
  void proceed(State next);
  void unavailable(Layer layer, const BackendError& error);
  void emit_or_end();
  void record_backend_error(Layer layer) const noexcept;
  // Appends "layer: what" of `error` to `text` ("; " between two).
  static void note_failure(std::string& text, Layer layer, const std::exception_ptr& error);
  void go(State state) noexcept { state_ = state; }
  [[nodiscard]] static Outcome unavailable_outcome(Layer layer, const BackendError& error);
  [[nodiscard]] std::chrono::milliseconds record_retention() const noexcept;
  [[nodiscard]] bool is_fallback_key() const noexcept;
  [[nodiscard]] std::chrono::milliseconds local_ttl() const noexcept;
  [[nodiscard]] bool stop_requested() const noexcept;
  [[nodiscard]] bool transactional() const noexcept { return mode_ == CallMode::kTransactional; }
  // The owner token of this call's sink row: its attempt ID, or its request ID without one.
  [[nodiscard]] const std::string& sink_token() const noexcept {
    return attempt_id_.empty() ? sink_owner_ : attempt_id_;
  }
  // Whether this call claims and completes a record in the sink.
  [[nodiscard]] bool sink_records() const noexcept {
    return rules_.options_.sink && claim_rows_ &&
           (!transactional() || rules_.transactional_records_);
  }

  const PlanRules& rules_;
  const Request& request_;
  const CallMode mode_;
  const PlanTime start_;
  const std::chrono::system_clock::time_point wall_start_;
  const std::stop_token shutdown_;
  PlanTime now_;            // as the driver last said
  std::string sink_owner_;  // request ID, or the attempt ID when the request has none
  std::string attempt_id_;  // this attempt's own ID: the fencing token of its run() sink row
  State state_ = State::kStart;

  std::string key_;
  std::string fingerprint_;          // hex, as Context and the events show it
  std::string record_fingerprint_;   // `options_tag.hex`, as the records keep it
  std::string previous_bucket_key_;  // fallback key of the previous time bucket, when bucketed
  std::string owner_token_;          // non-empty while this call owns a Redis claim
  std::string probe_token_;          // owner of the previous-bucket probe while it is held
  std::string response_;             // the handler's (or the stored failure's) response
  std::string local_entry_;          // kLocalPut's value
  const char* missing_key_reason_ = nullptr;  // why the request has no key, when it has none
  std::string save_error_;                    // completions of the handler's response that failed
  std::string release_error_;                 // releases of this call's claims that failed
  PlanTime wait_deadline_{};
  PlanTime wake_at_{};
  State after_release_ = State::kEmit;
  bool claim_rows_ = true;        // false: run unclaimed (pass-through, reentrant retry)
  bool had_claim_ = false;        // this call claimed the key in the guard
  bool handler_started_ = false;  // the handler was called
  bool handler_clock_started_ = false;
  bool owned_ = true;  // the guard's complete found the claim still ours

  // The lease while the handler runs.
  PlanTime lease_deadline_{};
  bool lease_lost_ = false;
  bool renewing_ = false;        // automatic renewal is on for this call
  bool holds_sink_row_ = false;  // run(): the sink's row claimed by this attempt, not finished
  PlanTime next_renewal_{};

  // The end.
  Outcome outcome_;
  std::exception_ptr error_;
  bool cancelled_ = false;           // error_ is a cancellation: the claim is kept, no event
  bool commit_unknown_ = false;      // error_ is a commit whose outcome is unknown
  bool completing_failure_ = false;  // the completion stores a failure's response
  FailureDecision failure_;
  DecisionEvent event_;
  std::string error_text_;  // event_.error's text
  bool event_recorded_ = false;
  State after_emit_ = State::kReturn;
};

}  // namespace idem::detail
