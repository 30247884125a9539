// The call plan: the whole procedure of one call as a state machine that does no I/O, no
// sleeping, starts no thread, reads no clock and calls no user code. A driver (the blocking
// Deduplicator, the AsyncDeduplicator, the simulator) resumes it with one Input per step (the
// time, whether the call is stopped, and the result of the step it performed) and performs the
// Step it returns. Every rule of the outcome table (docs/semantics.md), every policy of
// DeduplicatorOptions, every ConfigError, the deadline and what a stop means at each step live
// here; a driver performs steps and reports results, it decides nothing. docs/call_plan.md
// describes the protocol and each driver.
//
// Not thread-safe: one call's plan is driven by one thread at a time (a driver that renews a
// lease from another thread serializes its calls on the plan).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "facade/call_key.h"
#include "facade/step_error.h"
#include "idem/deduplicator.h"

namespace idem::detail {

/// Time as the plan sees it: a driver passes the monotonic clock's reading in.
using PlanTime = std::chrono::steady_clock::time_point;

/// What a driver's backends can do, for the rules that depend on it.
struct DriverTraits {
  /// The sink can run a call in its transaction (run_transactional()): a PgSink, or the async
  /// driver's PostgreSQL sink.
  bool transactions = false;
  /// The sink names business constraints (PgSinkOptions::business_constraints).
  bool business_constraints = false;
  /// The driver performs steps on an event loop: a guard or sink whose calls block their thread
  /// (RedisGuard, PgSink) is refused.
  bool on_loop = false;
  /// Each call's deadline from its start; 0: none (AsyncDeduplicatorOptions::deadline).
  std::chrono::milliseconds deadline{0};
  /// A guard the driver reaches itself, not DeduplicatorOptions::guard (the async driver's
  /// Redis client), and its lease and retention.
  bool own_guard = false;
  std::chrono::milliseconds own_guard_lease{0};
  std::chrono::milliseconds own_guard_retention{0};
  std::size_t own_guard_max_response_bytes = SIZE_MAX;
  /// A sink the driver reaches itself, not DeduplicatorOptions::sink, its response cap and
  /// retention.
  bool own_sink = false;
  std::size_t own_sink_max_response_bytes = SIZE_MAX;
  std::chrono::milliseconds own_sink_retention{0};
};

/// What the plan needs of a deduplicator's options, validated once (every ConfigError of the
/// facade is thrown here). Immutable afterwards: shared by every call, from any thread.
class PlanRules {
 public:
  /// Throws idem::ConfigError on options the driver cannot run.
  PlanRules(const DeduplicatorOptions& options, DriverTraits traits);

  [[nodiscard]] const DeduplicatorOptions& options() const noexcept { return options_; }
  [[nodiscard]] const DriverTraits& traits() const noexcept { return traits_; }

 private:
  friend class CallPlan;
  friend struct CallKey;
  DeduplicatorOptions options_;
  DriverTraits traits_;
  std::optional<Fingerprinter> fingerprinter_;  // no time bucket: mismatch detection
  // Fallback keys, when they differ from fingerprinter_: a time bucket, or request-ID members
  // the mismatch fingerprint leaves out.
  std::optional<Fingerprinter> fallback_fingerprinter_;
  bool guard_ = false;  // a guard: DeduplicatorOptions::guard, or the driver's own
  bool sink_ = false;   // a sink: DeduplicatorOptions::sink, or the driver's own
  RedisFailurePolicy redis_failure_ = RedisFailurePolicy::kFailClosed;
  std::chrono::milliseconds guard_lease_{0};
  // The longest a layer keeps a completed record (Guard/Sink::retention()): the local cache
  // keeps an entry no longer. 0: unknown (a layer does not say).
  std::chrono::milliseconds record_lifetime_{0};
  // The largest response every layer keeps (Guard/Sink::max_response_bytes()): the local cache
  // replays no larger one.
  std::size_t replay_cap_ = SIZE_MAX;
};

/// How the handler of a call runs.
enum class CallMode {
  kRun,            ///< On its own; the sink's row (if any) commits before and after it.
  kTransactional,  ///< Inside the sink's transaction, with the claim row and its completion.
};

/// What a driver must do next, and the result it reports with the next Input.
enum class StepKind {
  kLocalGet,       ///< LocalCache::get(key) → CacheEntry.
  kLocalPut,       ///< LocalCache::put(key, value, ttl) → Done.
  kGuardClaim,     ///< Guard::claim(key, request_id, fingerprint) → ClaimResult.
  kGuardComplete,  ///< Guard::complete(key, owner_token, value, ttl) → Completed.
  kGuardRelease,   ///< Guard::release(key, owner_token) → Done.
  kSinkBegin,      ///< Transactional: open a transaction on the sink → Done.
  kSinkClaim,      ///< Claim key for request_id with fingerprint, in the open transaction (its
                   ///< row kept for ttl), or on its own (kRun; owner_token: the row's fencing
                   ///< token) → SinkClaim.
  kRunHandler,     ///< Call the handler (in the open transaction when transactional) →
                   ///< Response, or BusinessDuplicate when a business constraint of the sink
                   ///< said the effect exists (transactional only).
  kSinkComplete,   ///< Complete key with value, kept for ttl: in the open transaction (staged
                   ///< for COMMIT) → Done, or on its own for owner_token (kRun) → Completed
                   ///< (false: the row was no longer this attempt's).
  kCommit,         ///< Commit the open transaction → Done, or BusinessDuplicate when a
                   ///< business constraint of the sink fired with it (a deferred constraint,
                   ///< a statement the handler staged): the transaction is over either way.
  kRollback,       ///< Roll the open transaction back → Done (a failure changes nothing).
  kSinkRelease,    ///< Sink::release(key, owner_token) → Done.
  kWait,           ///< Wake at `at`, or at once when the call is stopped or past its
                   ///< deadline → Done.
  kDecideFailure,  ///< DeduplicatorOptions::on_handler_failure(error) → FailureDecision.
  kEmit,           ///< Record `event` in DeduplicatorOptions::metrics and hand it to on_decision
                   ///< → Done.
  kReturn,         ///< The call ends with CallPlan::outcome().
  kThrow,          ///< The call ends by throwing CallPlan::error().
};

/// The number of step kinds (for tables indexed by StepKind).
inline constexpr std::size_t kStepKinds = static_cast<std::size_t>(StepKind::kThrow) + 1;

/// The step's name without its `k`, e.g. "GuardClaim", for traces and reports.
[[nodiscard]] std::string_view step_name(StepKind kind) noexcept;

/// What the plan counted since the last step, recorded in Metrics before the step is performed
/// (InProcess::perform()).
struct StepNotes {
  std::uint8_t guard_errors = 0;  ///< Metrics::record_backend_error(Layer::kRedisGuard) each.
  std::uint8_t sink_errors = 0;   ///< Metrics::record_backend_error(Layer::kPgSink) each.
  std::uint8_t releases = 0;      ///< Metrics::record_release() each.
  [[nodiscard]] bool any() const noexcept { return guard_errors + sink_errors + releases > 0; }
};

/// One step. The views point into the plan: valid until the next resume().
struct Step {
  StepKind kind = StepKind::kReturn;
  std::string_view key{};            ///< The key text the step acts on.
  std::string_view request_id{};     ///< Guard claim: the request ID; sink steps: the row's owner.
  std::string_view fingerprint{};    ///< Claims: the fingerprint as records keep it,
                                     ///< `options_tag.hex` (may be empty).
  std::string_view owner_token{};    ///< Guard complete/release: the claim's owner token; sink
                                     ///< steps of kRun: the row's fencing token.
  std::string_view value{};          ///< Completions: the response; kLocalPut: the cache entry.
  std::chrono::milliseconds ttl{0};  ///< Retention (completions, transactional claim; 0: the
                                     ///< backend's own), or the local cache entry's TTL.
  PlanTime at{};                     ///< kWait: when to wake.
  /// The driver cuts this step short (cancels its I/O, wakes its wait, cancels the handler) when
  /// the call is stopped or its deadline passes while it runs, and reports how it ended (the
  /// plan reads a failure then as the stop's or the deadline's). False once the handler has
  /// returned (what follows it runs to its end), but for the pause before a completion the
  /// guard failed to save is sent again.
  bool interruptible = false;
  /// kSinkBegin before a claim, and a transactional kSinkComplete: the step may go with the next
  /// one (kSinkClaim; kCommit) in one round trip. The driver may then report Done at once and
  /// perform it with the next step; a failure of either is reported at the next step, where
  /// the plan treats it alike (nothing ran yet; the commit did not happen).
  bool with_next = false;
  /// kGuardRelease of a claim a cancellation cut short in flight (it may hold): the driver sends
  /// the release and reports Done without waiting for its answer, which would wait as long as
  /// the claim's did (a stopped server). The release still runs after the claim: both go on the
  /// node's one connection, in order.
  bool unawaited = false;
  StepNotes notes{};                     ///< Counts to record before performing it.
  const DecisionEvent* event = nullptr;  ///< kEmit: the event (valid until the next resume()).
  std::exception_ptr error{};            ///< kDecideFailure: the handler's exception.
};

// ---- the results a driver reports
// ----------------------------------------------------------------

struct Started {};   ///< The first resume() of a call.
struct Done {};      ///< The step was performed.
struct CacheEntry {  ///< kLocalGet: the entry found, if any.
  std::optional<std::string> entry;
};
struct Completed {  ///< kGuardComplete: whether this call still owned the claim.
  bool owned = true;
};
struct Response {  ///< kRunHandler: the handler returned this response.
  std::string text;
};
/// kRunHandler or kCommit (transactional): a business constraint fired.
struct BusinessDuplicate {};

/// The result of the step performed, or how it failed.
using StepResult = std::variant<Started, Done, CacheEntry, ClaimResult, Completed, SinkClaim,
                                Response, BusinessDuplicate, FailureDecision, StepError>;

/// What a kCommit that threw `error` reports, in every driver: a unique violation of a business
/// constraint (`business_duplicate`) makes the call a duplicate; the failure of a statement the
/// handler staged (`handlers_statement`) is the handler's failure (kOther), not the sink's;
/// anything else is classified as any step's failure.
[[nodiscard]] StepResult commit_failure(const std::exception_ptr& error, bool business_duplicate,
                                        bool handlers_statement);

/// What a driver tells the plan at each step.
struct Input {
  PlanTime now{};        ///< The driver's monotonic clock, now.
  bool stopped = false;  ///< Request::stop, or the deduplicator's shutdown, is requested.
  StepResult result{Started{}};
};

/// A renewal a driver owes the plan while the handler runs (see CallPlan::renewal()).
struct RenewalStep {
  std::string_view key{};              ///< The claimed key.
  std::string_view owner_token{};      ///< The claim's owner token; empty: no guard claim.
  std::chrono::milliseconds lease{0};  ///< Guard::renew(key, owner_token, lease).
  /// The owner of the sink's row of a run() call, renewed with it: Sink::renew(key, sink_owner,
  /// 0). Empty when the call holds no sink row.
  std::string_view sink_owner{};
};

/// What one layer answered to its part of a RenewalStep.
enum class RenewalAnswer : std::uint8_t {
  kNotAsked,  ///< The step named no claim of this layer.
  kOwned,     ///< Extended.
  kLost,      ///< The claim is gone or another owner's: its renewal stops.
  kFailed,    ///< The backend failed: the claim may be lost; its renewal goes on trying.
};

/// The answers to one RenewalStep. A driver sends each layer's part whatever the other one
/// answered: when Redis is down or lost the claim, the sink's row is all that still stops a
/// duplicate, and must not expire under a running handler.
struct RenewalAnswers {
  RenewalAnswer guard = RenewalAnswer::kNotAsked;
  RenewalAnswer sink = RenewalAnswer::kNotAsked;
  std::exception_ptr failure;  ///< The first failed part's exception.

  /// kOwned or kLost.
  [[nodiscard]] static RenewalAnswer of(bool owned) noexcept {
    return owned ? RenewalAnswer::kOwned : RenewalAnswer::kLost;
  }
  /// Sends `layer`'s part (guard or sink): `renew()` answers whether the claim is still owned;
  /// what it throws makes the part failed. For the drivers that do not suspend.
  template <class Renew>
  void ask(RenewalAnswer& layer, Renew&& renew) noexcept {
    try {
      layer = of(renew());
    } catch (...) {
      failed(layer);
    }
  }
  /// Inside a catch block: `layer` (guard or sink) failed with the exception in flight.
  void failed(RenewalAnswer& layer) noexcept {
    layer = RenewalAnswer::kFailed;
    if (!failure) failure = std::current_exception();
  }
  /// True when no part was lost or failed.
  [[nodiscard]] bool extended() const noexcept;
  /// Context::renew()'s answer: false when a layer's claim was lost; otherwise rethrows the
  /// first failure; otherwise true.
  [[nodiscard]] bool answer() const;
};

/// Where a call's steps are journaled (see CallPlan::step_journal()).
struct JournalTarget {
  std::string_view key{};          ///< The claimed key.
  std::string_view owner_token{};  ///< The guard claim's owner token (the journal's fence).
};

/// One call. Built by the driver when the call starts; lives until it returns or throws.
class CallPlan {
 public:
  /// Whether a call of `request` in `mode` needs an `attempt_id` from its driver: when the
  /// request has no request ID, and for run() with a sink (its row's fencing token). Otherwise
  /// the plan ignores it, and a driver may pass an empty one.
  [[nodiscard]] static bool needs_attempt_id(const PlanRules& rules, const Request& request,
                                             CallMode mode) noexcept;
  /// `request` must outlive the plan. `now` is the call's start (monotonic), `wall_now` the
  /// wall clock at the start (time buckets of fallback keys), `attempt_id` a fresh unique ID of
  /// this call (see needs_attempt_id()).
  CallPlan(const PlanRules& rules, const Request& request, CallMode mode, PlanTime now,
           std::chrono::system_clock::time_point wall_now, std::string attempt_id);

  /// Takes the result of the step last returned (Started{} the first time) and returns the
  /// step to perform now.
  [[nodiscard]] Step resume(Input&& input);

  // ---- the end -----------------------------------------------------------------------------
  /// kReturn: the outcome (moved out).
  [[nodiscard]] Outcome outcome() noexcept { return std::move(outcome_); }
  /// kThrow: the exception to rethrow.
  [[nodiscard]] std::exception_ptr error() const noexcept { return error_; }
  /// True once the plan has returned kThrow (error() is then the call's end; error() alone
  /// does not say so, since a call that returns an outcome may have recorded one too).
  [[nodiscard]] bool threw() const noexcept { return state_ == State::kThrow; }

  // ---- the deadline ------------------------------------------------------------------------
  /// When the call's deadline passes (PlanTime::max() without one): a driver interrupts an
  /// interruptible step under way then.
  [[nodiscard]] PlanTime deadline() const noexcept { return deadline_; }

  // ---- the lease, while the handler runs ---------------------------------------------------
  /// When the next automatic renewal is due; nullopt when none is (no claim to renew, renewal
  /// off, the handler is not running, or the claim was found lost).
  [[nodiscard]] std::optional<PlanTime> renewal_due() const noexcept;
  /// The renewal to perform (the handler's Context::renew() asks for it too); nullopt when the
  /// call holds nothing to renew.
  [[nodiscard]] std::optional<RenewalStep> renewal() const noexcept;
  /// The renewal sent at `sent` got `answers`. A layer's lost or failed part makes
  /// lease_lost() true; automatic renewal stops once every layer the call holds was lost, and
  /// goes on trying after a failure (the backend may come back before the lease ends).
  void renewed(PlanTime sent, const RenewalAnswers& answers) noexcept;
  /// Time left on the claim's lease at `now` (by the driver's clock: Redis' own TTL decides);
  /// zero without a claim.
  [[nodiscard]] std::chrono::milliseconds remaining_lease(PlanTime now) const noexcept;
  /// True once a renewal found the claim lost or failed, or `now` is past the lease's end.
  [[nodiscard]] bool lease_lost(PlanTime now) const noexcept;

  // ---- Context::step() ----------------------------------------------------------------------
  /// Where the handler's steps are journaled: the guard claim's key and owner token; nullopt
  /// when the call holds no guard claim (Redis was skipped under kFailOpen, or the call passed
  /// through unguarded), whose steps run on every attempt. Throws idem::ConfigError when the
  /// deduplicator has no guard.
  [[nodiscard]] std::optional<JournalTarget> step_journal() const;

  // ---- what the handler's Context shows ----------------------------------------------------
  [[nodiscard]] const Request& request() const noexcept { return request_; }
  [[nodiscard]] std::string_view key() const noexcept { return key_.key; }
  [[nodiscard]] std::string_view fingerprint() const noexcept { return key_.fingerprint; }
  [[nodiscard]] CallMode mode() const noexcept { return mode_; }

 private:
  // Where the call is: each state has one step (see step(); kind_of() maps them in this order).
  enum class State : std::uint8_t {
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
    kFailureSinkRelease,  // the sink's row of a run() call, after a failure or a stop
    kDecideFailure,
    kStoreBegin,  // failure policy kStoreAsResponse (transactional: its own transaction)
    kStoreClaim,
    kStoreComplete,
    kStoreCommit,
    kStoreRollback,
    kLocalPut,
    kGuardComplete,
    kCompleteWait,  // before the guard's completion is sent again (save_retry_for)
    kGuardRelease,
    kEmit,
    kReturn,
    kThrow,
  };

  // Taking each result (plan.cc, "results").
  void take(Started);
  void take(Done);
  void take(CacheEntry&& entry);
  void take(ClaimResult&& claim);
  void take(Completed completed);
  void take(SinkClaim&& claim);
  void take(Response&& response);
  void take(BusinessDuplicate);
  void take(FailureDecision&& decision);
  void take(StepError&& error);
  void claim_failed(StepError error);
  void cleanup_failed(const StepError& error);
  [[nodiscard]] bool resend_completion(std::string_view what);
  void completion_unsaved(std::string_view what);
  // The stop and the deadline before a step of the handler's side (plan.cc, "interruptions").
  void settle();
  [[nodiscard]] bool before_handler() const noexcept;
  [[nodiscard]] bool past_deadline() const noexcept { return now_ >= deadline_; }
  void stop_before_handler();
  void deadline_before_handler();
  // The layers.
  void lookup();
  void claim_guard();
  void guard_claimed(ClaimResult claim);
  void repeat(Outcome outcome);
  void guard_failed(std::string_view why);
  void enter_sink();
  void enter_handler();
  void sink_claimed(SinkClaim claim);
  void sink_unavailable(std::string_view why);
  // Failures.
  void failed_after_handler(StepError error);
  void handler_failed(StepError error);
  // The error of a call its stop or deadline interrupted while its handler ran (`what`: how it
  // showed): DeadlineExceeded or Cancelled, its claims kept until their leases end.
  [[nodiscard]] std::exception_ptr interruption_error(const std::string& what) const;
  void after_failure();
  void apply(FailureDecision decision);
  void store_failed();
  // The end.
  void finish_executed();
  void conclude(Outcome outcome);
  void begin_completion();
  void end_completion();
  void finish(Outcome outcome);
  void release_or(State next);
  void proceed(State next);
  void end_with(std::exception_ptr error, bool cancelled);
  void emit_or_end();
  void internal_error(std::string_view what);
  [[nodiscard]] Step step() noexcept;
  [[nodiscard]] static StepKind kind_of(State state) noexcept;
  void start_handler() noexcept;
  [[nodiscard]] Step sink_step(Step step) const noexcept;
  void go(State state) noexcept { state_ = state; }
  [[nodiscard]] static Outcome unavailable(Layer layer, std::string_view why);
  [[nodiscard]] std::chrono::milliseconds record_retention() const noexcept;
  [[nodiscard]] std::chrono::milliseconds local_ttl() const noexcept;
  [[nodiscard]] bool transactional() const noexcept { return mode_ == CallMode::kTransactional; }
  [[nodiscard]] bool holds_claim() const noexcept { return !owner_token_.empty(); }
  // Whether the open transaction holds this call's claim (kSinkClaim answered or pending).
  [[nodiscard]] bool transaction_open() const noexcept;
  // The owner token of this call's sink row: its attempt ID, or its request ID without one.
  [[nodiscard]] const std::string& sink_token() const noexcept {
    return attempt_id_.empty() ? sink_owner_ : attempt_id_;
  }
  // Whether this call claims and completes a record in the sink.
  [[nodiscard]] bool sink_records() const noexcept;

  const PlanRules& rules_;
  const Request& request_;
  const CallMode mode_;
  const PlanTime start_;
  const std::chrono::system_clock::time_point wall_start_;
  const PlanTime deadline_;
  PlanTime now_;            // as the driver last said
  bool stopped_ = false;    // as the driver last said
  std::string sink_owner_;  // request ID, or the attempt ID when the request has none
  std::string attempt_id_;  // this attempt's own ID: the fencing token of its run() sink row
  State state_ = State::kStart;

  CallKey key_;
  std::string owner_token_;      // non-empty while this call owns a Redis claim
  bool claim_in_doubt_ = false;  // owner_token_ is a claim's that a cancellation cut short
  std::string probe_token_;      // owner of the previous-bucket probe while it is held
  bool probe_in_doubt_ = false;  // probe_token_ is a probe's that a cancellation cut short
  std::string response_;         // the handler's (or the stored failure's) response
  std::string local_entry_;      // kLocalPut's value
  Outcome waiting_;              // kWait: the in-progress answer, should the wait end
  PlanTime wait_deadline_{};
  PlanTime wake_at_{};
  State after_release_ = State::kEmit;
  StepNotes notes_;                // counted since the last step
  bool claim_rows_ = true;         // false: run unclaimed (pass-through, reentrant retry)
  bool had_claim_ = false;         // this call claimed the key in the guard
  bool handler_started_ = false;   // the handler was called
  bool handler_returned_ = false;  // the handler returned (or failed): nothing cuts the rest short
  bool owned_ = true;              // the guard's complete found the claim still ours
  bool holds_sink_row_ = false;    // run(): the sink's row claimed by this attempt, not finished
  bool sink_row_lost_ = false;     // run(): the sink's completion found the row taken over

  // The lease while the handler runs.
  PlanTime lease_deadline_{};
  bool lease_lost_ = false;
  bool renewing_ = false;               // automatic renewal is on for this call
  bool guard_claim_lost_ = false;       // a renewal found the guard's claim lost
  bool sink_row_renewal_lost_ = false;  // a renewal found the sink's row lost
  PlanTime next_renewal_{};

  // The end.
  Outcome outcome_;
  std::exception_ptr error_;
  StepError handler_error_;          // the handler's failure, for kDecideFailure and the event
  bool cancelled_ = false;           // error_ is a cancellation: no decision
  bool commit_unknown_ = false;      // a commit (idem's or the handler's) of unknown outcome
  bool completing_failure_ = false;  // the completion stores a failure's response
  std::string save_error_;           // completions of the handler's response that failed
  std::string release_error_;        // releases of this call's claims that failed
  std::string error_text_;           // the event's error
  DecisionEvent event_;
  State after_emit_ = State::kReturn;

  // Resending the guard's completion (save_retry_for): the next pause, until when, and the
  // failure it follows.
  std::chrono::milliseconds resend_after_{0};
  PlanTime resend_until_{};
  std::string resend_error_;
};

}  // namespace idem::detail
