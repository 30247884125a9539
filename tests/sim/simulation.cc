#include "simulation.h"

#include <algorithm>
#include <asio/error.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <system_error>
#include <utility>

#include "exception_ptr.h"
#include "facade/call_key.h"
#include "facade/in_process.h"
#include "facade/plan.h"
#include "facade/step_error.h"
#include "facade/steps.h"
#include "idem/clock.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/local_cache.h"
#include "idem/metrics.h"
#include "rng.h"

namespace idem::sim {
namespace {

using detail::BusinessDuplicate;
using detail::CacheEntry;
using detail::CallMode;
using detail::CallPlan;
using detail::Completed;
using detail::Done;
using detail::Input;
using detail::PlanRules;
using detail::PlanTime;
using detail::Response;
using detail::Started;
using detail::Step;
using detail::StepKind;
using detail::StepResult;
using std::chrono::milliseconds;

constexpr Time kNever = INT64_MAX;
constexpr Time kRedisTimeout = 50;        // a Redis command's timeout, ms
constexpr Time kPgTimeout = 100;          // a statement's timeout (the connection is then closed)
constexpr Time kLockTimeout = 200;        // PgSinkOptions::lock_timeout
constexpr Time kHandlerCheck = 5;         // a running handler looks at its stop token this often
constexpr Time kSinkRetention = 3600000;  // the sink keeps a completed row an hour
constexpr std::size_t kResponseCap = 64;  // the guard's and the sink's max_response_bytes
constexpr std::int64_t kEpochMs = 1700000000000;  // the wall clocks' origin (time buckets)
constexpr std::size_t kMaxSteps = 300000;

// Independent streams of one seed.
enum Stream : std::uint64_t { kConfigStream, kWorkloadStream, kSchedulerStream, kFaultStream };

// ---- names -------------------------------------------------------------------------------------

constexpr std::array<std::string_view, kFaultKinds> kFaultNames = {
    "crash",
    "shutdown",
    "pause",
    "clock-skew",
    "cancel",
    "redis-restart",
    "redis-failover",
    "redis-outage",
    "redis-eviction",
    "pg-outage",
    "redis-timeout-applied",
    "redis-timeout-lost",
    "pg-timeout",
    "commit-unknown-committed",
    "commit-unknown-lost",
    "commit-refused",
    "slow-handler",
    "handler-failure",
    "ack-lost",
};

constexpr std::array<std::string_view, kTallies> kTallyNames = {
    "transactional",
    "run",
    "run-without-sink",
    "business-key",
    "request-id",
    "fallback-key",
    "bucketed",
    "missing-key",
    "pass-through",
    "mismatching-payload",
    "reentrant-run",
    "over-cap-replay",
    "stopped-before-start",
    "stopped-before-handler",
    "stopped-in-lock-wait",
    "stopped-mid-handler",
    "stopped-after-handler",
    "deadline-before-handler",
    "deadline-in-lock-wait",
    "deadline-mid-handler",
    "deadline-after-handler",
    "cut-short",
    "failed-completion",
    "failed-release",
    "step-run",
    "step-replayed",
    "step-fenced",
    "step-rerun",
};

}  // namespace

std::string_view step_name(std::size_t kind) {
  return detail::step_name(static_cast<StepKind>(kind));
}

namespace {

std::string_view claim_name(ClaimStatus status) {
  static constexpr std::array<std::string_view, 3> kNames = {"FIRST", "REPEAT_SAME",
                                                             "REPEAT_OTHER"};
  return kNames.at(static_cast<std::size_t>(status));
}

std::string_view state_name(RecordState state) {
  return state == RecordState::kCompleted ? "COMPLETED" : "IN_PROGRESS";
}

using test::is;
using test::what;

// The failures the simulated servers and the driver report.
std::exception_ptr pg_error(const char* text, const char* sqlstate) {
  return std::make_exception_ptr(
      PostgresError(std::string("idem: postgres: ") + text, true, sqlstate));
}
std::exception_ptr connection_lost() { return pg_error("server closed the connection", "08006"); }
// A statement cancelled on the server (a stop, the deadline): SQLSTATE 57014.
std::exception_ptr statement_cancelled() {
  return pg_error("canceling statement due to user request", "57014");
}
// An operation the driver cancelled, as Asio reports it (operation_aborted, in Asio's own error
// category: an ECANCELED of std::system_category() is another error code).
std::exception_ptr operation_aborted() {
  return std::make_exception_ptr(
      std::system_error(asio::error::make_error_code(asio::error::operation_aborted)));
}

// ---- the seed's choices ------------------------------------------------------------------------

struct Config {
  int processes = 2;
  int logicals = 4;
  milliseconds lease{300};
  milliseconds retention{1500};
  bool local_cache = false;
  bool auto_renew = false;
  bool fail_closed = false;
  bool wait_for_result = false;
  bool keep_on_failure = false;
  bool store_declines = false;  // a declined refund is stored as the response (kStoreAsResponse)
  bool emit = false;
  bool metrics = false;
  // The driver sends BEGIN with the claim and the record with COMMIT (Step::with_next), as the
  // blocking Deduplicator does; otherwise each step is a round trip of its own.
  bool batched = false;
  // TransactionalClaim::kBusinessKey: the ledger's UNIQUE key is the claim; idem keeps no
  // record in PostgreSQL.
  bool business_key = false;
  // The duplicate sources of the storm demo, per mille of logical requests (racing retries: up
  // to three), and how long a handler normally runs (ms).
  std::uint64_t double_clicks = 250;
  std::uint64_t racing_retries = 200;
  std::uint64_t redeliveries = 200;
  std::uint64_t late_redeliveries = 100;
  Time handler_ms = 30;
  std::uint64_t world_faults = 10;  // per mille of scheduling points that inject a world fault
  std::uint64_t step_faults = 20;   // per mille of backend steps that fail
  Time arrivals = 1000;             // messages first arrive within [0, arrivals)
  Time fault_end = 2000;            // no fault is injected from here on
  // What the plan decides beyond run_transactional() with named keys.
  bool sink = true;                  // DeduplicatorOptions::sink (else run() with the guard alone)
  std::uint64_t run_share = 0;       // per mille of logical requests run with run()
  std::uint64_t fallback_share = 0;  // per mille keyed by their payload (no ID, no business key)
  std::uint64_t unkeyed_share = 0;   // per mille whose payload selects nothing: no key at all
  bool select_fields = false;        // FingerprintOptions::include {"/order", "/amount"}
  std::chrono::seconds time_bucket{0};
  milliseconds fallback_retention{60000};
  bool pass_through = false;         // MissingKeyPolicy::kPassThrough
  bool reentrant = false;            // the intent "notify" is reentrant; some requests use it
  std::uint64_t reused_share = 0;    // per mille whose key is reused with another payload
  std::uint64_t over_cap_share = 0;  // per mille whose response is over the size cap
  milliseconds deadline{0};          // DriverTraits::deadline (0: none)

  [[nodiscard]] std::string describe() const {
    std::string text = std::to_string(processes) + " processes, " + std::to_string(logicals) +
                       " logical requests, lease " + std::to_string(lease.count()) +
                       " ms, retention " + std::to_string(retention.count()) + " ms";
    if (!sink) text += ", no sink";
    if (sink && run_share > 0) text += ", run() " + std::to_string(run_share) + " per mille";
    if (local_cache) text += ", local cache";
    if (auto_renew) text += ", auto-renew";
    text += fail_closed ? ", redis fail-closed" : ", redis fail-open";
    if (wait_for_result) text += ", wait-for-result";
    if (keep_on_failure) text += ", keep-on-failure";
    if (store_declines) text += ", declines stored";
    if (batched) text += ", batched round trips";
    if (business_key) text += ", business-key claim";
    if (fallback_share + unkeyed_share > 0) {
      text += ", payload-keyed " + std::to_string(fallback_share) + " and unkeyed " +
              std::to_string(unkeyed_share) + " per mille (" +
              (pass_through ? "pass-through" : "rejected") + "), fallback retention " +
              std::to_string(fallback_retention.count()) + " ms";
    }
    if (time_bucket.count() > 0)
      text += ", time bucket " + std::to_string(time_bucket.count()) + " s";
    if (reentrant) text += ", reentrant intents";
    if (reused_share > 0) text += ", keys reused " + std::to_string(reused_share) + " per mille";
    if (over_cap_share > 0) {
      text += ", responses over the cap " + std::to_string(over_cap_share) + " per mille";
    }
    if (deadline.count() > 0) text += ", deadline " + std::to_string(deadline.count()) + " ms";
    text += ", faults " + std::to_string(world_faults) + "/" + std::to_string(step_faults) +
            " per mille until " + std::to_string(fault_end) + " ms";
    return text;
  }
};

Config choose_config(Rng& rng) {
  Config c;
  c.processes = static_cast<int>(rng.between(2, 5));
  c.logicals = static_cast<int>(rng.between(3, 12));
  static constexpr std::array<std::int64_t, 4> kLeases = {150, 300, 600, 1000};
  c.lease = milliseconds(kLeases.at(rng.below(kLeases.size())));
  c.retention = c.lease * rng.between(3, 8);
  c.local_cache = rng.chance(600);
  c.auto_renew = rng.chance(500);
  c.fail_closed = rng.chance(250);
  c.wait_for_result = rng.chance(250);
  c.keep_on_failure = rng.chance(200);
  c.store_declines = rng.chance(300);
  c.metrics = rng.chance(300);
  c.batched = rng.chance(500);
  c.business_key = rng.chance(250);
  c.emit = rng.chance(300);
  c.double_clicks = static_cast<std::uint64_t>(rng.between(0, 600));
  c.racing_retries = static_cast<std::uint64_t>(rng.between(0, 600));
  c.redeliveries = static_cast<std::uint64_t>(rng.between(0, 600));
  c.late_redeliveries = static_cast<std::uint64_t>(rng.between(0, 300));
  c.handler_ms = rng.between(5, c.lease.count() / 2);
  c.world_faults = static_cast<std::uint64_t>(rng.between(5, 40));
  c.step_faults = static_cast<std::uint64_t>(rng.between(5, 60));
  c.arrivals = rng.between(200, 2000);
  c.fault_end = c.arrivals + rng.between(500, 3000);
  // Modes: a sink in most seeds, run_transactional(), run() or both.
  c.sink = rng.chance(850);
  static constexpr std::array<std::uint64_t, 4> kRunShares = {0, 0, 400, 1000};
  c.run_share = c.sink ? kRunShares.at(rng.below(kRunShares.size())) : 1000;
  if (!c.sink) c.business_key = false;
  // Keys made of payloads, or of nothing.
  if (rng.chance(500)) {
    c.select_fields = true;
    c.fallback_share = static_cast<std::uint64_t>(rng.between(100, 400));
    c.unkeyed_share = static_cast<std::uint64_t>(rng.between(0, 200));
    c.pass_through = rng.chance(500);
    if (rng.chance(500)) c.time_bucket = std::chrono::seconds(rng.between(1, 3));
    if (rng.chance(300)) c.fallback_retention = c.lease * rng.between(2, 6);
  } else {
    c.select_fields = rng.chance(300);
  }
  c.reentrant = rng.chance(250);
  if (rng.chance(300)) c.reused_share = static_cast<std::uint64_t>(rng.between(100, 400));
  if (rng.chance(300)) c.over_cap_share = static_cast<std::uint64_t>(rng.between(200, 600));
  if (rng.chance(300))
    c.deadline = milliseconds(rng.between(c.handler_ms / 2 + 5, 3 * c.lease.count()));
  return c;
}

// ---- the workload ------------------------------------------------------------------------------

enum class Source { kOriginal, kDoubleClick, kRacingRetry, kRedelivery, kLateRedelivery, kReuse };

std::string_view source_name(Source source) {
  static constexpr std::array<std::string_view, 6> kNames = {
      "original",   "double-click",    "racing-retry",
      "redelivery", "late-redelivery", "key reused with another payload"};
  return kNames.at(static_cast<std::size_t>(source));
}

// How a logical request is keyed.
enum class Keying {
  kBusiness,   // (user, intent, business key)
  kRequestId,  // its request ID alone: a double click with a new ID would be another operation
  kFallback,   // neither: its payload's fingerprint
  kUnkeyed,    // neither, and a payload whose selection holds nothing: no key at all
};

// One user intent: a refund (or, in seeds with reentrant intents, a notification) of one order.
struct Logical {
  Keying keying = Keying::kBusiness;
  bool transactional = true;  // run_transactional(); else run()
  bool declined = false;      // its handler always declines (a deterministic business error)
  bool reused = false;        // its key is reused with another payload (variant 1)
  bool over_cap = false;      // its responses are over the guard's and the sink's cap
  bool reentrant = false;     // its intent is reentrant
  int steps = 0;              // its handler's steps (Context::step())
  std::string user;
  std::string intent;
  std::string biz_key;
  std::string request_id;
  std::array<std::string, 2> payloads;  // [1]: the other payload its key is reused with

  [[nodiscard]] bool fallback() const { return keying == Keying::kFallback; }
};

// One message of the queue (at-least-once): acked after a final outcome, else redelivered.
struct Message {
  int logical = 0;
  Source source = Source::kOriginal;
  std::string request_id;
  Time visible_at = 0;
  int variant = 0;
  bool acked = false;
  int call = 0;  // the call processing it, 0 when none
  int deliveries = 0;
};

// A deterministic business error: the same request is declined every time it runs.
class Declined : public std::runtime_error {
 public:
  explicit Declined(int logical)
      : std::runtime_error("declined: insufficient funds for logical request " +
                           std::to_string(logical)) {}
};

// ---- processes ---------------------------------------------------------------------------------

// A process's monotonic clock: local = anchor_local + (t - anchor_true) * (1 + ppm / 10^6).
// Integer arithmetic, so the same seed gives the same readings everywhere.
struct ProcessClock {
  Time anchor_true = 0;
  std::int64_t anchor_local = 0;
  std::int64_t ppm = 0;

  [[nodiscard]] std::int64_t local(Time t) const {
    return anchor_local + (t - anchor_true) * (1000000 + ppm) / 1000000;
  }
  // The first simulated time at which local() reads at least `reading`.
  [[nodiscard]] Time when(std::int64_t reading) const {
    if (reading <= anchor_local) return anchor_true;
    const std::int64_t rate = 1000000 + ppm;
    return anchor_true + ((reading - anchor_local) * 1000000 + rate - 1) / rate;
  }
  void set_rate(Time now, std::int64_t new_ppm) {
    anchor_local = local(now);
    anchor_true = now;
    ppm = new_ppm;
  }
};

struct Process {
  ProcessClock clock;
  std::int64_t wall_offset = 0;  // its wall clock's error (NTP), ms
  bool up = true;
  bool draining = false;  // shut down: takes no message, goes down when its calls end
  Time down_until = 0;
  Time paused_until = 0;
  std::shared_ptr<ManualClock> cache_clock = std::make_shared<ManualClock>();
  std::unique_ptr<LocalCache> cache;
  std::unique_ptr<std::stop_source> shutdown = std::make_unique<std::stop_source>();

  [[nodiscard]] PlanTime plan_time(Time t) const { return PlanTime(milliseconds(clock.local(t))); }
  [[nodiscard]] std::chrono::system_clock::time_point wall(Time t) const {
    return std::chrono::system_clock::time_point(milliseconds(kEpochMs + t + wall_offset));
  }
  LocalCache& local_cache(Time t) {
    cache_clock->set_ms(clock.local(t));
    return *cache;
  }
};

std::int64_t reading(PlanTime at) {
  return std::chrono::duration_cast<milliseconds>(at.time_since_epoch()).count();
}

// ---- calls -------------------------------------------------------------------------------------

struct Call {
  int id = 0;
  int process = 0;
  int message = 0;
  int logical = 0;
  int variant = 0;
  CallMode mode = CallMode::kTransactional;
  Request request;
  std::string attempt;  // the attempt ID: its run() sink row's owner
  std::stop_source stop;
  std::unique_ptr<CallPlan> plan;
  bool started = false;           // the plan was resumed once
  std::optional<Step> current;    // the step the plan asked for, until it is performed
  StepResult pending{Started{}};  // the last step's result, for the next resume()
  Time ready_at = 0;

  // The step performed, until its result is delivered (at the next resume). An interruptible
  // step is cut short when the call is stopped or past its deadline before its answer arrives.
  struct Flight {
    StepKind kind = StepKind::kReturn;
    // The step's key and owner token: views into the plan, valid until its next resume().
    std::string_view key;
    std::string_view owner_token;
    bool interruptible = false;
    Time sent = 0;
    Time arrives = 0;
    // What its answer grants, should it arrive: a claim the call then owns.
    enum class Grant { kNone, kGuard, kProbe, kSinkRow } grant = Grant::kNone;
    std::string token;
    Time expires = 0;
    bool probe = false;                // a claim of the previous time bucket's key
    bool repeat = false;               // a guard claim answered REPEAT_*
    bool repeat_same_request = false;  // ... and by Redis the record is this request's
    bool previous_free = false;        // a probe: by Redis the previous bucket's key was free
  };
  std::optional<Flight> flight;

  enum class Phase { kPlan, kHandler, kLockWait } phase = Phase::kPlan;
  SimPostgres::TxId tx = 0;
  SimPostgres::TxId blocked_by = 0;  // a statement waits for this transaction's locks
  Time lock_deadline = 0;
  bool begin_pending = false;  // BEGIN goes with the next statement
  struct Record {
    std::string key;
    std::string value;
    milliseconds ttl{0};
  };
  std::optional<Record> record_pending;  // the record goes with COMMIT

  // The keys the seed expects (detail::CallKey of the request): the previous time bucket's.
  std::string previous_key;

  // The guard claim whose answer arrived (the call owns it until it completes or releases it).
  bool holds = false;
  std::string key;
  std::string owner_token;
  Time claimed_at = 0;
  Time guard_expires = 0;
  std::string probe_token;  // the previous bucket's key, claimed by the probe
  bool probed = false;      // a probe's answer arrived
  bool probe_free = false;  // ... and by Redis the key was free then
  bool probe_failed = false;
  bool probe_release_failed = false;
  // The last guard claim's answer was a repeat, and by Redis the record was this request's.
  bool repeat = false;
  bool repeat_same_request = false;
  // run() with a sink: the row of this attempt, whose answer arrived.
  bool sink_row = false;
  Time sink_expires = 0;
  bool sink_complete_owned = false;  // the sink's completion found the row still this attempt's

  bool handler_started = false;
  bool handler_returned = false;
  bool claimed_run = false;        // the handler ran holding the key (a claim, a row, a constraint)
  bool guard_at_start = false;     // ... and a guard claim
  bool sink_row_at_start = false;  // ... and a run() sink row
  Time handler_started_at = 0;
  Time handler_end = 0;
  bool handler_fails = false;
  bool handler_checks_stop = true;
  int steps_done = 0;  // the handler's steps reached
  // Its view of the step journal, as BlockingCall keeps it (no metrics, the default size cap).
  detail::StepBook steps{nullptr, DeduplicatorOptions{}.max_step_result_bytes};
  std::optional<Time> returned_at;  // when the handler returned holding (it believed) a claim
  // The guard's complete answered, and whether by Redis' history as it stood then the claim was
  // held when the handler returned.
  bool complete_answered = false;
  bool held_through_return = false;
  bool guard_saved = false;  // a guard complete applied for this call's claim
  // Until when the records its completions saved answer repeats: the guard's, the sink's.
  Time guard_kept_until = 0;
  Time sink_kept_until = 0;
  // A completion of the handler's response failed: the sink's, or the guard's last (a resend
  // that lands makes up for those before it).
  bool sink_completion_failed = false;
  bool guard_completion_failed = false;
  bool release_failed = false;  // a release of this call's claim or row failed
  [[nodiscard]] bool completion_failed() const noexcept {
    return sink_completion_failed || guard_completion_failed;
  }
  bool deadline_noted = false;
  bool emitted = false;  // a decision event was handed to on_decision / the metrics
  bool acked_early = false;
  std::string response;
};

// ---- the simulation ----------------------------------------------------------------------------

class Simulation {
 public:
  explicit Simulation(const RunOptions& options);
  RunResult run();

 private:
  void build_rules();
  void build_workload();

  // Scheduling.
  void schedule_once();
  [[nodiscard]] bool finished() const;
  [[nodiscard]] bool accepting(const Process& p) const { return p.up && !p.draining; }
  Time latency() { return sched_.chance(50) ? sched_.between(10, 60) : sched_.between(0, 3); }

  // The world.
  void deliver(int message);
  void restart(int process);
  void crash(int process, std::string_view why);
  void maybe_go_down(int process);
  void inject_world_fault();
  void request_stop(Call& c);

  // The driver: one step of a call.
  void step(Call& c);
  // The answer of the step in flight: false while it is still on its way (the call was woken
  // for a deadline that a clock's change of rate has moved since).
  bool arrive(Call& c);
  void guard_step(Call& c, const Step& step);
  void sink_step(Call& c, const Step& step);
  void run_sink_step(Call& c, const Step& step);
  void lock_wait(Call& c, const Step& step);
  void sink_claimed(Call& c, const Step& step, SinkClaim claim);
  void commit(Call& c, const Step& step);
  // A COMMIT whose answer is lost (`whose`: idem's "commit" or "the handler's own commit"),
  // which did or did not commit (the caller applies that): the fault noted, and the error its
  // caller gets.
  std::exception_ptr commit_answer_lost(const Call& c, bool committed, const std::string& whose);
  void start_handler(Call& c);
  void handler_tick(Call& c);
  [[nodiscard]] Time step_due(const Call& c) const;
  void handler_step(Call& c, std::exception_ptr& failure);
  void ran_step(const Call& c, const std::string& key, const std::string& owner_token,
                const std::string& name);
  void handler_returns(Call& c);
  void renew(Call& c);
  void finish(Call& c, std::optional<Outcome> outcome, std::exception_ptr error);
  // The step `step` of `c` was performed: `result` goes to the plan with the next resume(),
  // once it arrives at `at`.
  void reply(Call& c, const Step& step, StepResult result, Time at);
  // ... or it failed: `failure` is classified and goes to the plan.
  void fail(Call& c, const Step& step, std::exception_ptr failure, Time at);
  // What a failure of a step means for the invariants (a failed completion or release, a
  // half-done execution whose claims must stay).
  void failed(Call& c, StepKind kind, std::string_view key, std::string_view owner_token,
              const std::exception_ptr& failure);
  // Whether the call's stop is requested (Request::stop, its process's shutdown).
  [[nodiscard]] bool stopped(const Call& c) const {
    return c.stop.stop_requested() || processes_[c.process].shutdown->stop_requested();
  }
  // What the driver believes of the stop (a planted bug may hide it).
  [[nodiscard]] bool driver_stopped(const Call& c) const {
    if (options_.bug == Bug::kStopIgnoredBeforeHandler && !c.handler_started) return false;
    return stopped(c);
  }
  [[nodiscard]] bool past_deadline(const Call& c) const {
    return processes_[c.process].plan_time(now_) >= c.plan->deadline();
  }
  // The simulated time at which the call's deadline passes (kNever without one).
  [[nodiscard]] Time deadline_at(const Call& c) const;
  // The in-process steps of `c`, on its process's local cache.
  [[nodiscard]] detail::InProcess in_process(const Call& c) {
    return detail::InProcess(*rules_, &processes_[c.process].local_cache(now_));
  }
  template <class Op>
  auto redis(Call& c, Op&& op, std::exception_ptr& failure, Time& at)
      -> std::optional<decltype(op())>;
  bool statement(Call& c, const Step& step);
  bool autocommit(Call& c, std::exception_ptr& failure, Time& at);
  void wake_waiters(SimPostgres::TxId tx);
  void ack(Message& m, const Call& c);
  void nack(Message& m);

  // Faults, coverage and invariants.
  [[nodiscard]] bool in_fault_window() const { return now_ < config_.fault_end; }
  bool draw(std::uint64_t per_mille);
  void injected(Fault kind, int logical, std::string text);
  void tally(Tally what) { ++result_.tallies.at(static_cast<std::size_t>(what)); }
  void note_deadline(Call& c);
  void violate(std::string invariant, int logical, std::string detail);
  enum class Held { kClaim, kSinkRow };  // what a call holds its key by
  void check_claim(const Call& c, std::string_view key, Held held);
  void check_handler_start(Call& c);
  void check_effect(const Call& c);
  void check_outcome(const Call& c, const Outcome& outcome);
  void check_replay(const Call& c, const Outcome& outcome);
  void check_saved(const Call& c, const Outcome& outcome);
  [[nodiscard]] bool sink_row_lost_untold(const Call& c, const Outcome& outcome) const;
  void check_clean(const Call& c, const Outcome& outcome);
  void check_end(const Call& c, const std::exception_ptr& error);
  void check_event(Call& c, const DecisionEvent& event);
  void protect_if_half_done(const Call& c, std::string_view how);
  // Whether Redis lost `key`'s records (restart, failover, eviction) at or after `since`.
  [[nodiscard]] bool redis_lost(std::string_view key, Time since) const;
  void final_checks();

  // Tracing.
  [[nodiscard]] bool tracing() const { return options_.trace; }
  void trace(const Call& c, std::string text);
  void trace_world(std::string text);

  RunOptions options_;
  Rng config_rng_;
  Rng workload_;
  Rng sched_;
  Rng faults_;
  Time now_ = 0;
  Config config_;
  std::shared_ptr<SimRedis> redis_;
  std::shared_ptr<SimPostgres> pg_;
  std::unique_ptr<PlanRules> rules_;
  std::vector<Process> processes_;
  std::vector<Logical> logicals_;
  std::vector<Message> messages_;
  std::map<int, std::unique_ptr<Call>> calls_;
  int next_call_ = 1;
  Time redis_down_until_ = 0;
  Time pg_down_until_ = 0;
  int fault_number_ = 0;
  Time redis_lost_all_ = -1;                             // the last restart or failover
  std::map<std::string, Time, std::less<>> redis_lost_;  // key -> its last eviction

  // Invariants' memory.
  struct Protection {
    Time until = 0;
    int call = 0;
  };
  // key -> a half-done call's lease: its guard claim, and its run() sink row.
  std::map<std::string, Protection, std::less<>> protected_;
  std::map<std::string, Protection, std::less<>> protected_rows_;
  // (logical, key) -> the execution told clean (kExecuted, saved, lease held): until when its
  // records answer repeats, and since when it ran.
  struct Clean {
    int call = 0;
    Time guard_until = 0;
    Time sink_until = 0;
    Time since = 0;
  };
  std::map<std::pair<int, std::string>, Clean> clean_;
  std::map<int, const Call*> running_;  // calls whose handler runs, by id
  // Runs of a step after its result was journaled, by logical request and step name.
  std::map<std::pair<int, std::string>, int> step_reruns_;

  RunResult result_;
  struct Candidate {
    enum Kind { kCall, kDeliver, kRestart } kind;
    int id;
  };
  std::vector<Candidate> candidates_;
};

Simulation::Simulation(const RunOptions& options)
    : options_(options),
      config_rng_(options.seed, kConfigStream),
      workload_(options.seed, kWorkloadStream),
      sched_(options.seed, kSchedulerStream),
      faults_(options.seed, kFaultStream) {
  config_ = choose_config(config_rng_);
  result_.seed = options.seed;
  result_.config = config_.describe();
  const Bug bug = options.bug;
  redis_ = std::make_shared<SimRedis>(
      now_, SimRedis::Options{.lease = config_.lease,
                              .retention = config_.retention,
                              .max_lag = 300,
                              .max_response_bytes = kResponseCap,
                              .complete_checks_owner = bug != Bug::kCompleteWithoutOwnerCheck,
                              .compares_fingerprints = bug != Bug::kGuardIgnoresFingerprint,
                              .tells_requests_apart = bug != Bug::kRepeatReportedAsSameRequest,
                              .caps_responses = bug != Bug::kGuardKeepsOverCapBody,
                              .keeps_retention = bug != Bug::kGuardForgetsEarly,
                              .journal_checks_owner = bug != Bug::kJournalWithoutOwnerCheck});
  pg_ = std::make_shared<SimPostgres>(
      now_, SimPostgres::Options{.lease = config_.lease,
                                 .retention = milliseconds(kSinkRetention),
                                 .max_response_bytes = kResponseCap});
  build_rules();
  processes_.resize(static_cast<std::size_t>(config_.processes));
  for (Process& p : processes_) {
    p.clock.anchor_local = config_rng_.between(0, 1000000000);
    p.clock.ppm = config_rng_.chance(300) ? config_rng_.between(-50000, 50000) : 0;
    p.wall_offset = config_rng_.between(-300, 300);
    p.cache =
        std::make_unique<LocalCache>(LocalCacheOptions{.max_entries = 64,
                                                       .ttl = rules_->options().local_cache_ttl,
                                                       .shards = 1,
                                                       .clock = p.cache_clock});
  }
  build_workload();
}

void Simulation::build_rules() {
  DeduplicatorOptions o;
  o.local_cache_capacity = config_.local_cache ? 64 : 0;
  o.local_cache_ttl = config_.retention / 2;
  o.guard = redis_;
  if (config_.sink) o.sink = pg_;
  FingerprintOptions fingerprint;
  if (config_.select_fields) fingerprint.include = {"/order", "/amount"};
  fingerprint.time_bucket = config_.time_bucket;
  o.fingerprint = fingerprint;
  o.fallback_retention = config_.fallback_retention;
  o.on_missing_key =
      config_.pass_through ? MissingKeyPolicy::kPassThrough : MissingKeyPolicy::kReject;
  if (config_.reentrant) o.reentrant_intents = {"notify"};
  o.on_redis_failure =
      config_.fail_closed ? RedisFailurePolicy::kFailClosed : RedisFailurePolicy::kFailOpen;
  if (config_.wait_for_result) {
    o.on_concurrent_duplicate = ConcurrentDuplicatePolicy::kWaitForResult;
    o.wait_for_result = config_.lease;
    o.wait_poll_interval = config_.lease / 5;
  }
  if (config_.keep_on_failure || config_.store_declines) {
    // A decline is stored and replayed; with keep_on_failure another business error keeps the
    // claim until its lease ends; the rest (backend errors) release it.
    o.on_handler_failure = [keep = config_.keep_on_failure](std::exception_ptr error) {
      if (is<Declined>(error)) return FailureDecision{FailureAction::kStoreAsResponse, what(error)};
      if (keep && !is<BackendError>(error)) {
        return FailureDecision{FailureAction::kKeepUntilLeaseEnds, {}};
      }
      return FailureDecision{};
    };
  }
  if (config_.metrics) o.metrics = std::make_shared<InProcessMetrics>();
  if (config_.business_key) o.transactional_claim = TransactionalClaim::kBusinessKey;
  if (config_.auto_renew) o.auto_renew_interval = config_.lease / 3;
  if (config_.emit) o.on_decision = [](const DecisionEvent&) {};
  // The simulated PostgreSQL runs calls in transactions and has a business constraint; a share
  // of the seeds gives each call a deadline, as the async driver does.
  rules_ = std::make_unique<PlanRules>(
      o, detail::DriverTraits{
             .transactions = true, .business_constraints = true, .deadline = config_.deadline});
}

void Simulation::build_workload() {
  // Every logical request's original message, and its duplicates.
  for (int i = 0; i < config_.logicals; ++i) {
    Logical l;
    const std::uint64_t roll = workload_.below(1000);
    if (roll < config_.unkeyed_share) {
      l.keying = Keying::kUnkeyed;
    } else if (roll < config_.unkeyed_share + config_.fallback_share) {
      l.keying = Keying::kFallback;
    } else {
      l.keying = workload_.chance(250) ? Keying::kRequestId : Keying::kBusiness;
    }
    const bool named = l.keying == Keying::kBusiness || l.keying == Keying::kRequestId;
    l.transactional = config_.sink && !workload_.chance(config_.run_share);
    l.reentrant = config_.reentrant && workload_.chance(400);
    l.declined = config_.store_declines && l.keying != Keying::kUnkeyed && workload_.chance(150);
    l.reused = named && workload_.chance(config_.reused_share);
    l.over_cap = workload_.chance(config_.over_cap_share);
    l.steps = i % 3 == 0 ? 0 : 1 + i % 3;  // none, two or three
    l.user = "u" + std::to_string(i % 3);
    l.intent = l.reentrant ? "notify" : "refund";
    l.biz_key = l.keying == Keying::kBusiness ? "order-" + std::to_string(i) : "";
    l.request_id = named ? "req-" + std::to_string(i) + "-0" : "";
    const std::int64_t amount = workload_.between(1, 999);
    l.payloads[0] =
        l.keying == Keying::kUnkeyed
            ? R"({"note":"refund of a lost order )" + std::to_string(i) + R"(","order":null})"
            : R"({"order":)" + std::to_string(i) + R"(,"amount":)" + std::to_string(amount) + "}";
    l.payloads[1] =
        R"({"order":)" + std::to_string(i) + R"(,"amount":)" + std::to_string(amount + 1) + "}";
    const Time at = workload_.between(0, config_.arrivals - 1);
    auto add = [&](Source source, std::string request_id, Time visible_at, int variant = 0) {
      messages_.push_back(Message{i, source, std::move(request_id), visible_at, variant});
    };
    add(Source::kOriginal, l.request_id, at);
    // A double click: a new request ID for the same business key; the same body again when
    // keyed by the payload. (Keyed by the request ID alone it would be a new operation.)
    if (l.keying != Keying::kRequestId && workload_.chance(config_.double_clicks)) {
      add(Source::kDoubleClick, named ? "req-" + std::to_string(i) + "-1" : "",
          at + workload_.between(0, 80));
    }
    for (int r = 0; r < 3 && workload_.chance(config_.racing_retries); ++r) {
      add(Source::kRacingRetry, l.request_id, at + workload_.between(0, 30));
    }
    if (workload_.chance(config_.redeliveries)) {
      add(Source::kRedelivery, l.request_id, at + workload_.between(100, 3000));
    }
    if (workload_.chance(config_.late_redeliveries)) {
      add(Source::kLateRedelivery, l.request_id,
          config_.fault_end + config_.retention.count() + workload_.between(0, 1000));
    }
    // The key reused with another payload: the same request ID (an Idempotency-Key sent again
    // with another body), or the same business key under a new request ID.
    if (l.reused) {
      add(Source::kReuse,
          l.keying == Keying::kRequestId ? l.request_id : "req-" + std::to_string(i) + "-9",
          at + workload_.between(0, 1500), 1);
    }
    logicals_.push_back(std::move(l));
  }
  result_.logicals = logicals_.size();
  result_.messages = messages_.size();
}

// ---- scheduling --------------------------------------------------------------------------------

RunResult Simulation::run() {
  const Time give_up = config_.fault_end + 4 * config_.retention.count() + 30000;
  while (!result_.violation && !finished()) {
    if (result_.steps >= kMaxSteps || now_ > give_up) {
      violate("eventually-exactly-once", -1,
              "the run did not drain: " + std::to_string(calls_.size()) +
                  " calls in flight, unacked messages remain at " + std::to_string(now_) + " ms");
      break;
    }
    schedule_once();
  }
  if (!result_.violation) final_checks();
  return std::move(result_);
}

bool Simulation::finished() const {
  if (!calls_.empty()) return false;
  return std::all_of(messages_.begin(), messages_.end(), [](const Message& m) { return m.acked; });
}

void Simulation::schedule_once() {
  candidates_.clear();
  Time next = kNever;
  for (const auto& [id, call] : calls_) {
    const Time at = std::max(call->ready_at, processes_[call->process].paused_until);
    if (at <= now_) {
      candidates_.push_back({Candidate::kCall, id});
    } else {
      next = std::min(next, at);
    }
  }
  const bool anyone = std::any_of(processes_.begin(), processes_.end(),
                                  [&](const Process& p) { return accepting(p); });
  for (std::size_t m = 0; m < messages_.size(); ++m) {
    const Message& message = messages_[m];
    if (message.acked || message.call != 0) continue;
    if (message.visible_at > now_) {
      next = std::min(next, message.visible_at);
    } else if (anyone) {
      candidates_.push_back({Candidate::kDeliver, static_cast<int>(m)});
    }
  }
  for (std::size_t p = 0; p < processes_.size(); ++p) {
    const Process& process = processes_[p];
    if (process.up) continue;
    if (process.down_until <= now_) {
      candidates_.push_back({Candidate::kRestart, static_cast<int>(p)});
    } else {
      next = std::min(next, process.down_until);
    }
  }
  if (candidates_.empty()) {
    if (next == kNever) {
      violate("eventually-exactly-once", -1, "nothing can run, yet messages remain unacked");
      return;
    }
    now_ = next;
    return;
  }
  const Candidate chosen = candidates_[sched_.below(candidates_.size())];
  ++result_.steps;
  inject_world_fault();
  if (result_.violation) return;
  switch (chosen.kind) {
    case Candidate::kCall:
      // The fault may have ended the call (a crash) or frozen its process.
      if (const auto found = calls_.find(chosen.id);
          found != calls_.end() && processes_[found->second->process].paused_until <= now_) {
        step(*found->second);
      }
      return;
    case Candidate::kDeliver:
      if (messages_[chosen.id].call == 0 && !messages_[chosen.id].acked) deliver(chosen.id);
      return;
    case Candidate::kRestart:
      if (!processes_[chosen.id].up) restart(chosen.id);
      return;
  }
}

// ---- the world ---------------------------------------------------------------------------------

void Simulation::deliver(int message) {
  std::vector<int> open;
  for (std::size_t p = 0; p < processes_.size(); ++p) {
    if (accepting(processes_[p])) open.push_back(static_cast<int>(p));
  }
  if (open.empty()) return;
  Message& m = messages_[message];
  const Logical& l = logicals_[m.logical];
  auto call = std::make_unique<Call>();
  Call& c = *call;
  c.id = next_call_++;
  c.process = open[sched_.below(open.size())];
  c.message = message;
  c.logical = m.logical;
  c.variant = m.variant;
  c.mode = l.transactional ? CallMode::kTransactional : CallMode::kRun;
  c.attempt = "attempt-" + std::to_string(c.id);
  c.response = "response-of-call-" + std::to_string(c.id);
  if (l.over_cap) c.response += "-" + std::string(kResponseCap, 'x');
  c.request = Request{.request_id = m.request_id,
                      .user = l.user,
                      .intent = l.intent,
                      .biz_key = l.biz_key,
                      .payload = l.payloads.at(static_cast<std::size_t>(m.variant)),
                      .attempt = ++m.deliveries,
                      .stop = c.stop.get_token()};
  Process& p = processes_[c.process];
  if (options_.bug == Bug::kKeyFromEmptySelection && c.request.request_id.empty() &&
      c.request.biz_key.empty()) {
    // Planted: the driver keys a request without ID by its selection, even one of nothing.
    const Fingerprinter selection(*rules_->options().fingerprint);
    c.request.biz_key =
        "fp-" + selection.fingerprint(c.request.payload, c.request.user, p.wall(now_));
  }
  if (l.fallback() && config_.time_bucket.count() > 0) {
    c.previous_key = detail::CallKey::of(*rules_, c.request, p.wall(now_)).previous_bucket_key;
  }
  c.plan = std::make_unique<CallPlan>(*rules_, c.request, c.mode, p.plan_time(now_), p.wall(now_),
                                      c.attempt);
  c.ready_at = now_;
  m.call = c.id;
  ++result_.calls;
  tally(!l.transactional ? (config_.sink ? Tally::kRun : Tally::kRunWithoutSink)
                         : Tally::kTransactional);
  static constexpr std::array<Tally, 4> kKeyings = {Tally::kBusinessKey, Tally::kRequestId,
                                                    Tally::kFallbackKey, Tally::kMissingKey};
  Tally keying = kKeyings.at(static_cast<std::size_t>(l.keying));
  if (keying == Tally::kMissingKey && config_.pass_through) keying = Tally::kPassThrough;
  tally(keying);
  if (!c.previous_key.empty()) tally(Tally::kBucketed);
  if (c.variant == 1) tally(Tally::kMismatchingPayload);
  if (tracing()) {
    trace(c, "delivered (" + std::string(source_name(m.source)) + ", request ID " +
                 (m.request_id.empty() ? "none" : m.request_id) + ", delivery " +
                 std::to_string(m.deliveries) + ", " +
                 (c.mode == CallMode::kRun ? "run()" : "run_transactional()") + ")");
  }
  calls_.emplace(c.id, std::move(call));
  // A request whose caller gave up before it was taken (a client that disconnected).
  if (in_fault_window() && draw(config_.step_faults / 4)) {
    injected(Fault::kCancel, c.logical, "c" + std::to_string(c.id) + ": stopped on arrival");
    request_stop(c);
  }
}

void Simulation::restart(int process) {
  Process& p = processes_[process];
  p.up = true;
  p.draining = false;
  p.paused_until = 0;
  p.shutdown = std::make_unique<std::stop_source>();
  p.clock.set_rate(now_, p.clock.ppm);
  p.cache = std::make_unique<LocalCache>(LocalCacheOptions{.max_entries = 64,
                                                           .ttl = rules_->options().local_cache_ttl,
                                                           .shards = 1,
                                                           .clock = p.cache_clock});
  if (tracing()) trace_world("p" + std::to_string(process) + " (re)started, empty local cache");
}

void Simulation::crash(int process, std::string_view why) {
  Process& p = processes_[process];
  for (auto it = calls_.begin(); it != calls_.end();) {
    Call& c = *it->second;
    if (c.process != process) {
      ++it;
      continue;
    }
    protect_if_half_done(c, "its process died");
    if (c.tx != 0 && pg_->is_open(c.tx)) {
      pg_->rollback(c.tx);  // the server sees the connection drop
      wake_waiters(c.tx);
    }
    Message& m = messages_[c.message];
    m.call = 0;
    if (!m.acked) m.visible_at = now_ + sched_.between(300, 1000);  // XAUTOCLAIM's idle time
    if (tracing()) trace(c, "vanished with p" + std::to_string(process));
    running_.erase(c.id);
    it = calls_.erase(it);
  }
  p.up = false;
  p.draining = false;
  p.down_until = now_ + sched_.between(50, 1000);
  if (tracing()) trace_world("p" + std::to_string(process) + " down (" + std::string(why) + ")");
}

void Simulation::maybe_go_down(int process) {
  Process& p = processes_[process];
  if (!p.draining) return;
  for (const auto& [id, call] : calls_) {
    if (call->process == process) return;
  }
  crash(process, "shut down");
}

// A stop reaches `c` (its Request::stop, or its process's shutdown): the driver wakes a step it
// can cut short.
void Simulation::request_stop(Call& c) {
  static constexpr std::array<Tally, 5> kWhere = {
      Tally::kStoppedBeforeStart, Tally::kStoppedBeforeHandler, Tally::kStoppedInLockWait,
      Tally::kStoppedMidHandler, Tally::kStoppedAfterHandler};
  const std::size_t where = !c.started                          ? 0
                            : c.handler_returned                ? 4
                            : c.phase == Call::Phase::kHandler  ? 3
                            : c.phase == Call::Phase::kLockWait ? 2
                            : c.handler_started                 ? 4
                                                                : 1;
  tally(kWhere.at(where));
  const bool interruptible = c.flight && c.flight->interruptible;
  if (interruptible || c.phase != Call::Phase::kPlan) c.ready_at = std::min(c.ready_at, now_ + 1);
}

void Simulation::inject_world_fault() {
  if (!in_fault_window() || !draw(config_.world_faults)) return;
  static constexpr std::array<Fault, 10> kWorld = {
      Fault::kCrash,         Fault::kShutdown,     Fault::kPause,         Fault::kClockSkew,
      Fault::kCancel,        Fault::kRedisRestart, Fault::kRedisFailover, Fault::kRedisOutage,
      Fault::kRedisEviction, Fault::kPgOutage};
  static constexpr std::array<std::uint64_t, 10> kWeights = {12, 6, 8, 6, 14, 6, 8, 8, 4, 8};
  static constexpr std::uint64_t kTotal = [] {
    std::uint64_t total = 0;
    for (const std::uint64_t w : kWeights) total += w;
    return total;
  }();
  std::uint64_t roll = faults_.below(kTotal);
  std::size_t kind = 0;
  while (roll >= kWeights[kind]) roll -= kWeights[kind++];
  const Fault fault = kWorld[kind];
  const int process = static_cast<int>(faults_.below(processes_.size()));
  Process& p = processes_[process];
  const std::string who = "p" + std::to_string(process);
  switch (fault) {
    case Fault::kCrash:
      if (!p.up) return;
      injected(fault, -1, who + " crashes");
      crash(process, "crashed");
      return;
    case Fault::kShutdown:
      if (!accepting(p)) return;
      injected(fault, -1, who + " shuts down: stop requested on its calls");
      p.shutdown->request_stop();
      p.draining = true;
      for (auto& [id, call] : calls_) {
        if (call->process == process) request_stop(*call);
      }
      maybe_go_down(process);
      return;
    case Fault::kPause: {
      if (!p.up) return;
      const Time until = now_ + faults_.between(50, 2 * config_.lease.count());
      injected(fault, -1, who + " freezes until " + std::to_string(until) + " ms");
      p.paused_until = until;
      return;
    }
    case Fault::kClockSkew: {
      const std::int64_t ppm = faults_.between(-100000, 100000);
      injected(fault, -1, who + "'s clock now runs at " + std::to_string(ppm / 1000) + " permille");
      p.clock.set_rate(now_, ppm);
      return;
    }
    case Fault::kCancel: {
      if (calls_.empty()) return;
      auto it = calls_.begin();
      std::advance(it, static_cast<long>(faults_.below(calls_.size())));
      Call& c = *it->second;
      if (c.stop.stop_requested()) return;
      injected(fault, c.logical, "c" + std::to_string(c.id) + ": Request::stop requested");
      c.stop.request_stop();
      request_stop(c);
      return;
    }
    case Fault::kRedisRestart: {
      const std::size_t lost = redis_->restart();
      redis_down_until_ = now_ + faults_.between(0, 200);
      redis_lost_all_ = now_;
      protected_.clear();  // the guard forgot: its leases protect nothing any more
      injected(fault, -1,
               "redis restarts, " + std::to_string(lost) + " records lost, down until " +
                   std::to_string(redis_down_until_) + " ms");
      return;
    }
    case Fault::kRedisFailover: {
      const Time lag = faults_.between(0, 300);
      const std::size_t undone = redis_->failover(lag);
      redis_down_until_ = now_ + faults_.between(0, 100);
      redis_lost_all_ = now_;
      protected_.clear();
      injected(fault, -1,
               "redis fails over to a replica " + std::to_string(lag) + " ms behind, " +
                   std::to_string(undone) + " writes lost");
      return;
    }
    case Fault::kRedisOutage:
      redis_down_until_ = now_ + faults_.between(20, 500);
      injected(fault, -1, "redis unreachable until " + std::to_string(redis_down_until_) + " ms");
      return;
    case Fault::kRedisEviction: {
      const std::string key = redis_->evict(faults_.below(1000));
      if (key.empty()) return;
      protected_.erase(key);
      redis_lost_[key] = now_;
      injected(fault, -1, "redis evicts " + key);
      return;
    }
    case Fault::kPgOutage: {
      const std::size_t aborted = pg_->abort_all();
      pg_down_until_ = now_ + faults_.between(20, 300);
      for (auto& [id, call] : calls_) {
        if (call->blocked_by != 0) call->ready_at = now_;
      }
      injected(fault, -1,
               "postgres restarts, " + std::to_string(aborted) +
                   " open transactions rolled back, down until " + std::to_string(pg_down_until_) +
                   " ms");
      return;
    }
    default:
      return;
  }
}

// ---- the driver --------------------------------------------------------------------------------

Time Simulation::deadline_at(const Call& c) const {
  const PlanTime deadline = c.plan->deadline();
  if (deadline == PlanTime::max()) return kNever;
  return processes_[c.process].clock.when(reading(deadline));
}

void Simulation::step(Call& c) {
  note_deadline(c);
  if (c.phase == Call::Phase::kHandler) {
    handler_tick(c);
    return;
  }
  Process& p = processes_[c.process];
  if (!c.current) {
    if (!arrive(c)) return;
    c.started = true;
    c.current = c.plan->resume(Input{p.plan_time(now_), driver_stopped(c), std::move(c.pending)});
    ++result_.plan_steps.at(static_cast<std::size_t>(c.current->kind));
    const bool claims =
        c.current->kind == StepKind::kGuardClaim || c.current->kind == StepKind::kSinkClaim;
    if (claims && logicals_[c.logical].keying == Keying::kUnkeyed) {
      violate("unkeyed-requests-are-not-deduplicated", c.logical,
              "c" + std::to_string(c.id) + " (a payload whose selection holds nothing) claims " +
                  std::string(c.current->key));
      return;
    }
  }
  const Step step = *c.current;
  switch (step.kind) {
    case StepKind::kLocalGet:
    case StepKind::kLocalPut:
    case StepKind::kDecideFailure:
    case StepKind::kEmit: {
      if (step.kind == StepKind::kEmit) check_event(c, *step.event);
      StepResult result = *in_process(c).perform(step);
      if (tracing() && step.kind == StepKind::kLocalGet) {
        trace(c, "LocalGet " + std::string(step.key) +
                     (std::get<CacheEntry>(result).entry ? " -> hit" : " -> miss"));
      }
      if (tracing() && step.kind == StepKind::kLocalPut) {
        trace(c, "LocalPut " + std::string(step.key));
      }
      reply(c, step, std::move(result), now_);
      return;
    }
    case StepKind::kGuardClaim:
    case StepKind::kGuardComplete:
    case StepKind::kGuardRelease:
      guard_step(c, step);
      return;
    case StepKind::kSinkBegin:
    case StepKind::kSinkClaim:
    case StepKind::kSinkComplete:
    case StepKind::kCommit:
    case StepKind::kRollback:
    case StepKind::kSinkRelease:
      if (c.mode == CallMode::kRun) {
        run_sink_step(c, step);
      } else {
        sink_step(c, step);
      }
      return;
    case StepKind::kRunHandler:
      start_handler(c);
      return;
    case StepKind::kWait:
      if (tracing()) {
        trace(c, "Wait " + std::to_string(reading(step.at) - p.clock.local(now_)) + " ms");
      }
      reply(c, step, Done{}, std::max(now_ + 1, p.clock.when(reading(step.at))));
      return;
    case StepKind::kReturn:
      (void)in_process(c).perform(step);  // its notes
      finish(c, c.plan->outcome(), nullptr);
      return;
    case StepKind::kThrow:
      (void)in_process(c).perform(step);  // its notes
      finish(c, std::nullopt, c.plan->error());
      return;
  }
}

void Simulation::reply(Call& c, const Step& step, StepResult result, Time at) {
  c.pending = std::move(result);
  c.current.reset();
  Call::Flight flight = c.flight.value_or(Call::Flight{});
  flight.kind = step.kind;
  flight.key = step.key;
  flight.owner_token = step.owner_token;
  // A handler's result is final once reported; planted: the driver cuts every step short, the
  // shielded ones after the handler too.
  flight.interruptible = (step.interruptible && step.kind != StepKind::kRunHandler) ||
                         (options_.bug == Bug::kInterruptAfterHandler && c.handler_returned);
  flight.sent = now_;
  flight.arrives = at;
  c.flight = std::move(flight);
  c.ready_at = at;
  // An interruptible step is woken at the deadline, to be cut short then.
  if (c.flight->interruptible) c.ready_at = std::min(at, std::max(now_, deadline_at(c)));
}

void Simulation::fail(Call& c, const Step& step, std::exception_ptr failure, Time at) {
  if (tracing()) {
    trace(c, std::string(detail::step_name(step.kind)) + " " + std::string(step.key) + " -> " +
                 what(failure));
  }
  failed(c, step.kind, step.key, step.owner_token, failure);
  reply(c, step, detail::classify(std::move(failure)), at);
}

void Simulation::failed(Call& c, StepKind kind, std::string_view key, std::string_view owner_token,
                        const std::exception_ptr& failure) {
  if (kind == StepKind::kGuardComplete) {
    tally(Tally::kFailedCompletion);
    c.guard_completion_failed = true;
  }
  if (kind == StepKind::kSinkComplete && c.mode == CallMode::kRun && c.handler_started) {
    tally(Tally::kFailedCompletion);
    c.sink_completion_failed = true;
  }
  if ((kind == StepKind::kGuardRelease && owner_token == c.owner_token) ||
      kind == StepKind::kSinkRelease) {
    tally(Tally::kFailedRelease);
    c.release_failed = true;
  }
  if (kind == StepKind::kGuardRelease && owner_token == c.probe_token) {
    c.probe_release_failed = true;  // best effort: the probe's lease ends it
  }
  if (kind == StepKind::kGuardClaim && !c.previous_key.empty() && key == c.previous_key) {
    c.probe_failed = true;
  }
  // After the handler started, a cancellation, a commit whose outcome is unknown and any
  // failure of the handler or its commit while the call is stopped or past its deadline leave
  // the effect possibly half done: from here on its claims must keep the key until their leases
  // end. (Once the plan chose to release, a later stop changes nothing.)
  const bool execution = kind == StepKind::kRunHandler || kind == StepKind::kCommit ||
                         (kind == StepKind::kSinkComplete && c.mode == CallMode::kTransactional);
  if (c.handler_started && execution) {
    if (is<Cancelled>(failure)) {
      protect_if_half_done(c, "cancelled");
    } else if (is<CommitOutcomeUnknown>(failure)) {
      protect_if_half_done(c, "commit outcome unknown");
    } else if (stopped(c) || past_deadline(c)) {
      protect_if_half_done(c, "failed while stopped or past its deadline");
    }
  }
}

// The answer of the step performed arrives (or the step is cut short): what it grants is the
// call's from now on.
bool Simulation::arrive(Call& c) {
  if (!c.flight) return true;
  const bool interrupted = driver_stopped(c) || past_deadline(c);
  if (now_ < c.flight->arrives && !(c.flight->interruptible && interrupted)) {
    c.ready_at = c.flight->interruptible
                     ? std::min(c.flight->arrives, std::max(now_ + 1, deadline_at(c)))
                     : c.flight->arrives;
    return false;
  }
  const Call::Flight flight = *std::exchange(c.flight, std::nullopt);
  const bool arrived = now_ >= flight.arrives;
  if (arrived) {
    using Grant = Call::Flight::Grant;
    switch (flight.grant) {
      case Grant::kGuard:
        c.holds = true;
        c.owner_token = flight.token;
        c.claimed_at = flight.sent;
        c.guard_expires = flight.expires;
        break;
      case Grant::kProbe:
        c.probe_token = flight.token;
        break;
      case Grant::kSinkRow:
        c.sink_row = true;
        c.sink_expires = flight.expires;
        break;
      case Grant::kNone:
        break;
    }
    if (flight.kind == StepKind::kGuardClaim && flight.probe) {
      c.probed = true;
      c.probe_free = flight.previous_free;
    } else if (flight.kind == StepKind::kGuardClaim) {
      c.repeat = flight.repeat;
      c.repeat_same_request = flight.repeat_same_request;
    }
  }
  const bool cut = flight.interruptible && interrupted && !arrived;
  if (!cut || flight.kind == StepKind::kWait) return true;  // a wait ends Done either way
  tally(Tally::kCutShort);
  std::exception_ptr failure;
  switch (flight.kind) {
    case StepKind::kSinkBegin:
    case StepKind::kSinkClaim:
      // The statement is cancelled on the server, which aborts its transaction.
      if (c.tx != 0 && pg_->is_open(c.tx)) {
        pg_->rollback(c.tx);
        wake_waiters(c.tx);
      }
      failure = statement_cancelled();
      break;
    case StepKind::kGuardClaim:
      failure = sched_.chance(500)
                    ? operation_aborted()
                    : std::make_exception_ptr(Cancelled("idem-sim: claim cut short"));
      break;
    default:  // only with a planted bug: a step after the handler
      failure = std::make_exception_ptr(Cancelled("idem-sim: step cut short"));
      break;
  }
  if (tracing()) {
    trace(c, "cut short: " + std::string(detail::step_name(flight.kind)) + " -> " + what(failure));
  }
  failed(c, flight.kind, flight.key, flight.owner_token, failure);
  c.pending = detail::classify(std::move(failure));
  return true;
}

template <class Op>
auto Simulation::redis(Call& c, Op&& op, std::exception_ptr& failure, Time& at)
    -> std::optional<decltype(op())> {
  if (now_ < redis_down_until_) {
    failure = std::make_exception_ptr(RedisError("idem: redis: connection refused", true));
    at = now_ + 1;
    return std::nullopt;
  }
  if (in_fault_window() && draw(config_.step_faults)) {
    const bool applied = faults_.chance(500);
    injected(applied ? Fault::kRedisTimeoutApplied : Fault::kRedisTimeoutLost, c.logical,
             "c" + std::to_string(c.id) + ": redis command times out" +
                 (applied ? " after it took effect" : ", not applied"));
    if (applied) (void)op();
    failure = std::make_exception_ptr(RedisError("idem: redis: timeout", true));
    at = now_ + kRedisTimeout;
    return std::nullopt;
  }
  at = now_ + latency();
  return op();
}

void Simulation::guard_step(Call& c, const Step& step) {
  std::exception_ptr failure;
  Time at = now_;
  const std::string key(step.key);
  const bool probe = !c.previous_key.empty() && key == c.previous_key;
  switch (step.kind) {
    case StepKind::kGuardClaim: {
      Call::Flight flight;
      if (probe && options_.bug == Bug::kBucketProbeSkipped) {
        // Planted: the driver answers the probe FIRST without asking Redis.
        flight.grant = Call::Flight::Grant::kProbe;
        flight.probe = true;
        flight.previous_free = !redis_->record(key);
        c.flight = flight;
        reply(c, step, ClaimResult{.owner_token = "0000000000000000000000000000ffff"}, now_);
        return;
      }
      flight.probe = probe;
      std::optional<ClaimResult> claim = redis(
          c,
          [&] {
            flight.previous_free = !redis_->record(key);
            ClaimResult answer = redis_->claim(step.key, step.request_id, step.fingerprint);
            if (answer.status == ClaimStatus::kFirst && !probe) check_claim(c, key, Held::kClaim);
            if (answer.status != ClaimStatus::kFirst) {
              const std::optional<SimRedis::View> found = redis_->record(key);
              flight.repeat_same_request = found && found->request_id == step.request_id &&
                                           found->state == RecordState::kInProgress;
            }
            return answer;
          },
          failure, at);
      if (!claim) break;
      if (tracing()) {
        trace(c, std::string(probe ? "GuardClaim (probe) " : "GuardClaim ") + key + " -> " +
                     std::string(claim_name(claim->status)) +
                     (claim->status == ClaimStatus::kFirst
                          ? " (token " + claim->owner_token.substr(28) + ")"
                          : " " + std::string(state_name(claim->state))));
      }
      if (claim->status == ClaimStatus::kFirst) {
        flight.grant = probe ? Call::Flight::Grant::kProbe : Call::Flight::Grant::kGuard;
        flight.token = claim->owner_token;
        flight.expires = redis_->expiry(key, claim->owner_token).value_or(now_);
        if (!probe) c.key = key;
      } else {
        flight.repeat = !probe;
      }
      c.flight = flight;
      reply(c, step, *std::move(claim), at);
      return;
    }
    case StepKind::kGuardComplete: {
      std::optional<bool> owned = redis(
          c, [&] { return redis_->complete(step.key, step.owner_token, step.value, step.ttl); },
          failure, at);
      if (step.owner_token == c.owner_token) c.holds = false;
      if (!owned) {
        if (options_.bug != Bug::kFailedCompletionReportedSaved) break;
        // Planted: the driver reports the failed completion as done.
        c.guard_completion_failed = true;
        tally(Tally::kFailedCompletion);
        if (tracing()) trace(c, "GuardComplete " + key + " -> " + what(failure) + " (told done)");
        reply(c, step, Completed{true}, at);
        return;
      }
      if (tracing()) trace(c, "GuardComplete " + key + (*owned ? " -> owned" : " -> not owned"));
      c.complete_answered = true;
      c.guard_saved = *owned;
      if (*owned) c.guard_completion_failed = false;
      // A completed record answers repeats for the retention asked (the guard's own for 0).
      if (*owned)
        c.guard_kept_until = now_ + (step.ttl.count() > 0 ? step.ttl : config_.retention).count();
      c.held_through_return =
          c.returned_at && redis_->held_at(c.key, c.owner_token, *c.returned_at);
      reply(c, step, Completed{*owned}, at);
      return;
    }
    case StepKind::kGuardRelease: {
      if (options_.bug == Bug::kInterruptedCallSkipsRelease && !c.handler_started &&
          (stopped(c) || past_deadline(c)) && step.owner_token == c.owner_token) {
        // Planted: stopped or past its deadline, the driver reports the release done without
        // sending it.
        c.holds = false;
        if (tracing()) trace(c, "GuardRelease " + key + " (planted bug: not sent, told done)");
        reply(c, step, Done{}, now_);
        return;
      }
      std::optional<bool> released = redis(
          c, [&] { return redis_->release(step.key, step.owner_token); }, failure, at);
      if (step.owner_token == c.owner_token) c.holds = false;
      if (!released) {
        if (options_.bug != Bug::kFailedReleaseReportedDone || probe) break;
        // Planted: the driver reports the failed release as done.
        c.release_failed = true;
        tally(Tally::kFailedRelease);
        if (tracing()) trace(c, "GuardRelease " + key + " -> " + what(failure) + " (told done)");
        reply(c, step, Done{}, at);
        return;
      }
      if (tracing()) trace(c, "GuardRelease " + key + (*released ? " -> deleted" : " -> not ours"));
      reply(c, step, Done{}, at);
      return;
    }
    default:
      return;
  }
  fail(c, step, failure, at);
}

// A statement of the open transaction may run: PostgreSQL is up, the transaction alive, and the
// seed lets the statement answer. Otherwise the failure is reported to the plan (by the handler
// itself while it runs).
bool Simulation::statement(Call& c, const Step& step) {
  std::exception_ptr failure;
  Time at = now_ + 1;
  if (now_ < pg_down_until_) {
    failure = pg_error("connection refused", "08006");
  } else if (c.tx == 0 || !pg_->is_open(c.tx)) {
    failure = connection_lost();
  } else if (in_fault_window() && draw(config_.step_faults)) {
    injected(Fault::kPgTimeout, c.logical,
             "c" + std::to_string(c.id) + ": statement times out, its connection is closed");
    pg_->rollback(c.tx);
    wake_waiters(c.tx);
    failure = pg_error("statement timeout", "57014");
    at = now_ + kPgTimeout;
  }
  if (!failure) return true;
  if (tracing()) trace(c, "statement fails: " + what(failure));
  if (c.phase == Call::Phase::kHandler) return false;  // the handler reports it itself
  fail(c, step, failure, at);
  return false;
}

// A statement on its own (run()): PostgreSQL is up and the seed lets it answer; else `failure`
// (a timeout takes no effect).
bool Simulation::autocommit(Call& c, std::exception_ptr& failure, Time& at) {
  at = now_ + latency();
  if (now_ < pg_down_until_) {
    failure = pg_error("connection refused", "08006");
    at = now_ + 1;
  } else if (in_fault_window() && draw(config_.step_faults)) {
    injected(Fault::kPgTimeout, c.logical, "c" + std::to_string(c.id) + ": statement times out");
    failure = pg_error("statement timeout", "57014");
    at = now_ + kPgTimeout;
  }
  return !failure;
}

void Simulation::sink_step(Call& c, const Step& step) {
  switch (step.kind) {
    case StepKind::kSinkBegin:
      if (config_.batched && step.with_next) {
        c.begin_pending = true;  // BEGIN goes with the claim: its failure is the claim's
        if (tracing()) trace(c, "SinkBegin (sent with the claim)");
        reply(c, step, Done{}, now_);
        return;
      }
      if (now_ < pg_down_until_) {
        fail(c, step, pg_error("connection refused", "08006"), now_ + 1);
        return;
      }
      c.tx = pg_->begin();
      if (tracing()) trace(c, "SinkBegin tx" + std::to_string(c.tx));
      reply(c, step, Done{}, now_ + latency());
      return;
    case StepKind::kSinkClaim: {
      if (c.phase == Call::Phase::kLockWait) {
        lock_wait(c, step);
        return;
      }
      if (std::exchange(c.begin_pending, false) && now_ >= pg_down_until_) c.tx = pg_->begin();
      if (!statement(c, step)) return;
      SimPostgres::TxId blocker = 0;
      std::optional<SinkClaim> claim =
          pg_->claim(c.tx, step.key, step.request_id, step.fingerprint, step.ttl, &blocker);
      if (!claim) {
        c.phase = Call::Phase::kLockWait;
        c.lock_deadline = now_ + kLockTimeout;
        c.blocked_by = blocker;
        c.ready_at = std::min(c.lock_deadline, std::max(now_, deadline_at(c)));
        if (tracing()) {
          trace(c,
                "SinkClaim " + std::string(step.key) + " waits for tx" + std::to_string(blocker));
        }
        return;
      }
      sink_claimed(c, step, *std::move(claim));
      return;
    }
    case StepKind::kSinkComplete:
      if (config_.batched && step.with_next) {
        c.record_pending = Call::Record{std::string(step.key), std::string(step.value), step.ttl};
        if (tracing()) trace(c, "SinkComplete " + std::string(step.key) + " (sent with COMMIT)");
        reply(c, step, Done{}, now_);
        return;
      }
      if (!statement(c, step)) return;
      pg_->complete(c.tx, step.key, step.value, step.ttl);
      if (tracing()) trace(c, "SinkComplete " + std::string(step.key));
      reply(c, step, Done{}, now_ + latency());
      return;
    case StepKind::kCommit:
      commit(c, step);
      return;
    case StepKind::kRollback:
      if (c.tx != 0 && pg_->is_open(c.tx)) {
        pg_->rollback(c.tx);
        wake_waiters(c.tx);
      }
      if (tracing()) trace(c, "Rollback tx" + std::to_string(c.tx));
      c.tx = 0;
      reply(c, step, Done{}, now_ + latency());
      return;
    default:  // kSinkRelease: run() only
      return;
  }
}

// The transaction's claim answered.
void Simulation::sink_claimed(Call& c, const Step& step, SinkClaim claim) {
  if (tracing()) {
    trace(c, "SinkClaim " + std::string(step.key) + " -> " +
                 (claim.status == SinkStatus::kClaimed
                      ? "claimed"
                      : "duplicate " + std::string(state_name(claim.state))));
  }
  reply(c, step, std::move(claim), now_ + latency());
}

// The claim waits on the key's lock: it ends when the lock is free, at lock_timeout, or when the
// call is stopped or past its deadline (the driver cancels the statement on the server).
void Simulation::lock_wait(Call& c, const Step& step) {
  const bool interrupted = driver_stopped(c) || past_deadline(c);
  SimPostgres::TxId blocker = 0;
  std::optional<SinkClaim> claim;
  if (!interrupted && pg_->is_open(c.tx)) {
    claim = pg_->claim(c.tx, step.key, step.request_id, step.fingerprint, step.ttl, &blocker);
  }
  if (!claim && !interrupted && pg_->is_open(c.tx) && now_ < c.lock_deadline) {
    c.blocked_by = blocker;
    c.ready_at = std::min(c.lock_deadline, std::max(now_, deadline_at(c)));
    return;
  }
  c.phase = Call::Phase::kPlan;
  c.blocked_by = 0;
  if (claim) {
    sink_claimed(c, step, *std::move(claim));
    return;
  }
  if (!pg_->is_open(c.tx)) {
    fail(c, step, connection_lost(), now_ + 1);  // PostgreSQL restarted meanwhile
    return;
  }
  pg_->rollback(c.tx);  // the wait is cancelled, which aborts the transaction
  wake_waiters(c.tx);
  if (interrupted) {
    tally(Tally::kCutShort);
    fail(c, step, statement_cancelled(), now_ + latency());
    return;
  }
  // lock_timeout.
  SinkClaim busy;
  busy.status = SinkStatus::kInProgress;
  if (tracing()) trace(c, "SinkClaim " + std::string(step.key) + " -> in progress (lock timeout)");
  reply(c, step, busy, now_ + latency());
}

// run(): each sink step is a statement on its own.
void Simulation::run_sink_step(Call& c, const Step& step) {
  std::exception_ptr failure;
  Time at = now_;
  if (!autocommit(c, failure, at)) {
    fail(c, step, failure, at);
    return;
  }
  const std::string key(step.key);
  switch (step.kind) {
    case StepKind::kSinkClaim: {
      SinkClaim claim = pg_->claim(step.key, step.request_id, step.fingerprint, step.owner_token);
      Call::Flight flight;
      if (claim.status == SinkStatus::kClaimed) {
        check_claim(c, key, Held::kSinkRow);
        flight.grant = Call::Flight::Grant::kSinkRow;
        flight.expires = pg_->row(key) ? pg_->row(key)->expires : now_;
      } else if (options_.bug == Bug::kSinkBusyReportedClaimed &&
                 claim.status == SinkStatus::kDuplicate &&
                 claim.state == RecordState::kInProgress && claim.fingerprint_matches) {
        // Planted: the driver reports a row another attempt holds as claimed.
        claim = SinkClaim{};
        flight.grant = Call::Flight::Grant::kSinkRow;
        flight.expires = now_ + config_.lease.count();
        if (tracing()) trace(c, "SinkClaim " + key + " -> in progress, told claimed (planted bug)");
      }
      if (tracing()) {
        trace(c, "SinkClaim " + key + " -> " +
                     (claim.status == SinkStatus::kClaimed
                          ? "claimed (row of " + std::string(step.owner_token) + ")"
                          : "duplicate " + std::string(state_name(claim.state))));
      }
      c.flight = flight;
      reply(c, step, claim, at);
      return;
    }
    case StepKind::kSinkComplete: {
      const bool owned = pg_->complete(step.key, step.owner_token, step.value, step.ttl);
      if (c.handler_started) c.sink_complete_owned = owned;
      if (owned) {
        c.sink_kept_until = now_ + (step.ttl.count() > 0 ? step.ttl.count() : kSinkRetention);
      }
      c.sink_row = false;
      if (tracing()) trace(c, "SinkComplete " + key + (owned ? " -> completed" : " -> not ours"));
      reply(c, step, Completed{owned}, at);
      return;
    }
    case StepKind::kSinkRelease: {
      const bool released = pg_->release(step.key, step.owner_token);
      c.sink_row = false;
      if (tracing()) trace(c, "SinkRelease " + key + (released ? " -> deleted" : " -> not ours"));
      reply(c, step, Done{}, at);
      return;
    }
    default:
      fail(c, step, std::make_exception_ptr(Error("idem-sim: no such step in run()")), at);
      return;
  }
}

std::exception_ptr Simulation::commit_answer_lost(const Call& c, bool committed,
                                                  const std::string& whose) {
  injected(committed ? Fault::kCommitUnknownCommitted : Fault::kCommitUnknownLost, c.logical,
           "c" + std::to_string(c.id) + ": " + whose + "'s answer lost (" +
               (committed ? "it committed)" : "it did not commit)"));
  return std::make_exception_ptr(
      CommitOutcomeUnknown("idem: postgres: " + whose + ": connection lost (outcome unknown)"));
}

void Simulation::commit(Call& c, const Step& step) {
  const SimPostgres::TxId tx = std::exchange(c.tx, 0);
  if (const std::optional<Call::Record> record = std::exchange(c.record_pending, std::nullopt);
      record && now_ >= pg_down_until_ && pg_->is_open(tx)) {
    pg_->complete(tx, record->key, record->value, record->ttl);
  }
  std::exception_ptr failure;
  Time at = now_ + latency();
  if (now_ < pg_down_until_ || !pg_->is_open(tx)) {
    failure = connection_lost();
    at = now_ + 1;
  } else if (in_fault_window() && draw(config_.step_faults)) {
    const std::uint64_t kind = faults_.below(3);
    if (kind == 0) {
      injected(Fault::kCommitRefused, c.logical, "c" + std::to_string(c.id) + ": commit refused");
      pg_->rollback(tx);
      failure = std::make_exception_ptr(
          PostgresError("idem: postgres: could not serialize access", false, "40001"));
    } else {
      const bool committed = kind == 1;
      failure = commit_answer_lost(c, committed, "commit");
      if (committed) {
        pg_->commit(tx);
      } else {
        pg_->rollback(tx);
      }
    }
    wake_waiters(tx);
    at = now_ + kPgTimeout;
  } else {
    pg_->commit(tx);
    wake_waiters(tx);
    for (const Effect* effect : pg_->effects_of(c.logical)) {
      if (effect->call == c.id) c.sink_kept_until = effect->row_expires;
    }
  }
  check_effect(c);
  if (result_.violation) return;
  if (failure) {
    fail(c, step, failure, at);
  } else {
    if (tracing()) trace(c, "Commit tx" + std::to_string(tx) + " -> committed");
    reply(c, step, Done{}, at);
  }
}

void Simulation::wake_waiters(SimPostgres::TxId tx) {
  for (auto& [id, call] : calls_) {
    if (call->blocked_by == tx) call->ready_at = now_;
  }
}

// ---- the handler -------------------------------------------------------------------------------

void Simulation::start_handler(Call& c) {
  check_handler_start(c);
  if (result_.violation) return;
  c.phase = Call::Phase::kHandler;
  c.handler_started = true;
  c.handler_started_at = now_;
  running_[c.id] = &c;
  Time duration = sched_.between(1, config_.handler_ms);
  if (in_fault_window() && draw(config_.step_faults)) {
    duration = config_.lease.count() * sched_.between(10, 30) / 10;
    injected(
        Fault::kSlowHandler, c.logical,
        "c" + std::to_string(c.id) + ": the handler takes " + std::to_string(duration) + " ms");
  }
  if (in_fault_window() && draw(config_.step_faults)) {
    c.handler_fails = true;
    injected(Fault::kHandlerFailure, c.logical,
             "c" + std::to_string(c.id) + ": the handler will throw a business error");
  }
  c.handler_checks_stop = sched_.chance(700);
  c.handler_end = now_ + duration;
  c.ready_at = now_;
  if (tracing()) trace(c, "RunHandler starts (" + std::to_string(duration) + " ms)");
}

void Simulation::handler_tick(Call& c) {
  Process& p = processes_[c.process];
  if (const auto due = c.plan->renewal_due(); due && p.plan_time(now_) >= *due) {
    renew(c);
    return;
  }
  const bool stopped = driver_stopped(c);
  const bool late = past_deadline(c);
  const bool transactional = c.mode == CallMode::kTransactional;
  std::exception_ptr failure;
  if (c.blocked_by != 0 && (stopped || late)) {
    // The driver cancels the handler's waiting statement on the server.
    pg_->rollback(c.tx);
    wake_waiters(c.tx);
    c.blocked_by = 0;
    tally(Tally::kCutShort);
    failure = statement_cancelled();
  } else if (c.handler_checks_stop && (stopped || late)) {
    // The handler sees its stop token, or the driver cancels what it awaits (its statement).
    tally(Tally::kCutShort);
    const std::uint64_t how = sched_.below(3);
    failure = how == 0 && transactional ? statement_cancelled()
              : how == 1
                  ? operation_aborted()
                  : std::make_exception_ptr(Cancelled("idem: handler cancelled (stop seen)"));
  } else if (now_ >= step_due(c)) {
    handler_step(c, failure);
    if (!failure) return;
  } else if (now_ < c.handler_end) {
    c.ready_at = std::min({c.handler_end, now_ + kHandlerCheck, step_due(c)});
    if (const auto due = c.plan->renewal_due()) {
      c.ready_at = std::max(now_ + 1, std::min(c.ready_at, p.clock.when(reading(*due))));
    }
    if (const Time deadline = deadline_at(c); deadline > now_) {
      c.ready_at = std::min(c.ready_at, deadline);
    }
    return;
  } else if (c.handler_fails) {
    failure = std::make_exception_ptr(std::runtime_error("transient business error (simulated)"));
  } else if (logicals_[c.logical].declined && c.variant == 0) {
    failure = std::make_exception_ptr(Declined(c.logical));
  } else if (!transactional) {
    // run(): the handler writes its effect itself, on its own, outside any transaction.
    Time at = now_;
    if (autocommit(c, failure, at)) {
      const Effect effect{
          c.logical, c.id, c.response, 0, c.variant, c.claimed_run, std::string(c.plan->key())};
      if (!in_fault_window() || !draw(config_.step_faults)) {
        pg_->write_effect_now(effect);
        handler_returns(c);
        return;
      }
      // Its own COMMIT loses its answer: the handler throws CommitOutcomeUnknown.
      const bool committed = faults_.below(2) == 0;
      failure = commit_answer_lost(c, committed, "the handler's own commit");
      if (committed) pg_->write_effect_now(effect);
    }
  } else if (statement(c, *c.current)) {
    // The business write, in the sink's transaction.
    Effect effect{
        c.logical, c.id, c.response, 0, c.variant, c.claimed_run, std::string(c.plan->key())};
    if (config_.business_key) {
      SimPostgres::TxId blocker = 0;
      const SimPostgres::BusinessWrite written = pg_->write_unique_effect(c.tx, effect, &blocker);
      if (written == SimPostgres::BusinessWrite::kBlocked) {
        if (c.blocked_by == 0) {
          c.lock_deadline = now_ + kLockTimeout;
          if (tracing()) trace(c, "business write waits for tx" + std::to_string(blocker));
        }
        if (now_ < c.lock_deadline) {
          c.blocked_by = blocker;
          c.ready_at = std::min(c.lock_deadline, std::max(now_, deadline_at(c)));
          return;
        }
        pg_->rollback(c.tx);  // lock_timeout: the statement fails, the transaction is aborted
        wake_waiters(c.tx);
      }
      c.blocked_by = 0;
      if (written == SimPostgres::BusinessWrite::kDuplicate) {
        c.phase = Call::Phase::kPlan;
        c.handler_returned = true;
        running_.erase(c.id);
        if (tracing()) trace(c, "RunHandler: the business key exists (unique violation)");
        reply(c, *c.current, BusinessDuplicate{}, now_ + latency());
        return;
      }
    } else {
      pg_->write_effect(c.tx, std::move(effect));
    }
    if (!pg_->is_open(c.tx)) {
      failure = pg_error("canceling statement due to lock timeout", "55P03");
    } else {
      handler_returns(c);
      return;
    }
  } else {
    failure = connection_lost();
  }
  c.phase = Call::Phase::kPlan;
  running_.erase(c.id);
  if (tracing()) trace(c, "RunHandler throws: " + what(failure));
  const Step step = *c.current;
  fail(c, step, failure, now_ + latency());
}

// Step i (from 0) of a handler of n steps is due at i/(n - 1) of its run: the first as it
// starts (the journal is loaded then), the last as it ends.
Time Simulation::step_due(const Call& c) const {
  const int n = logicals_[c.logical].steps;
  if (c.steps_done >= n) return INT64_MAX;
  return c.handler_started_at + (c.handler_end - c.handler_started_at) * c.steps_done / (n - 1);
}

// The handler's next step, as BlockingCall::step() takes it: the journal loaded from the guard
// at the call's first step, the step replayed when journaled, else run and journaled (fenced by
// the claim). A failure of the guard, or its refusal (ClaimLost), is what the handler throws.
void Simulation::handler_step(Call& c, std::exception_ptr& failure) {
  const std::string name = "step-" + std::to_string(++c.steps_done);
  const std::string input = "order " + std::to_string(c.logical) + ", " + name;
  Time at = now_;
  try {
    const std::optional<detail::JournalTarget> target = c.plan->step_journal();
    if (!target) {
      c.steps.unguarded(name);
      ran_step(c, {}, {}, name);
      if (tracing()) trace(c, name + " runs (no claim: not journaled)");
      c.ready_at = now_;
      return;
    }
    const std::string key(target->key);
    const std::string token(target->owner_token);
    if (!c.steps.loaded()) {
      std::optional<StepJournal> journal = redis(
          c, [&] { return redis_->steps(key); }, failure, at);
      if (!journal) return;
      c.steps.load(*std::move(journal));
    }
    detail::StepBook::Next next = c.steps.next(name, input);
    if (next.replay) {
      tally(Tally::kStepReplayed);
      if (tracing()) trace(c, name + " replays " + *next.replay);
      c.ready_at = at;
      return;
    }
    ran_step(c, key, token, name);
    if (result_.violation) return;
    JournaledStep done{std::move(next.fingerprint), name + " of c" + std::to_string(c.id)};
    const std::optional<bool> owned = redis(
        c, [&] { return redis_->put_step(key, token, name, done); }, failure, at);
    if (!owned) return;
    if (!*owned) tally(Tally::kStepFenced);
    if (tracing()) trace(c, name + " runs, journaled: " + (*owned ? "yes" : "no (fenced)"));
    (void)c.steps.journaled(name, std::move(done), *owned);
    c.ready_at = at;
  } catch (...) {
    failure = std::current_exception();
  }
}

// A step's function runs: by the attempt that holds the key's claim, only when no attempt
// journaled the step's result (finished-step-never-rerun).
void Simulation::ran_step(const Call& c, const std::string& key, const std::string& owner_token,
                          const std::string& name) {
  tally(Tally::kStepRun);
  if (key.empty() || !redis_->journaled(key, name)) return;
  const int reruns = ++step_reruns_[{c.logical, name}];
  tally(Tally::kStepRerun);
  if (redis_->holds(key, owner_token)) {
    violate("finished-step-never-rerun", c.logical,
            "c" + std::to_string(c.id) + " holds the claim of " + key + " and runs " + name +
                " again (run " + std::to_string(reruns) +
                " after its result was journaled): the journal it loaded lacked it");
  }
}

void Simulation::handler_returns(Call& c) {
  if (c.holds) c.returned_at = now_;
  c.phase = Call::Phase::kPlan;
  c.handler_returned = true;
  running_.erase(c.id);
  if (tracing()) trace(c, "RunHandler returns " + c.response);
  const Step step = *c.current;
  reply(c, step, Response{c.response}, now_ + latency());
  if (options_.bug == Bug::kAckBeforeCommit) {
    ack(messages_[c.message], c);  // planted: the consumer acks before the commit
    c.acked_early = true;
  }
}

void Simulation::renew(Call& c) {
  Process& p = processes_[c.process];
  const std::optional<detail::RenewalStep> step = c.plan->renewal();
  if (!step) return;
  const detail::RenewalStep& renewal = *step;
  const PlanTime sent = p.plan_time(now_);
  Time at = now_;
  // As the blocking driver: the Redis claim, then the run() call's sink row, each whatever the
  // other answered.
  detail::RenewalAnswers answers;
  const auto answer = [&](detail::RenewalAnswer& layer, std::optional<bool> owned,
                          const std::exception_ptr& failure) {
    if (owned) {
      layer = answers.of(*owned);
    } else {
      layer = detail::RenewalAnswer::kFailed;
      if (!answers.failure) answers.failure = failure;
    }
  };
  if (!renewal.owner_token.empty()) {
    std::exception_ptr failure;
    const std::optional<bool> owned = redis(
        c, [&] { return redis_->renew(renewal.key, renewal.owner_token, renewal.lease); }, failure,
        at);
    if (owned && *owned) c.guard_expires = redis_->expiry(c.key, c.owner_token).value_or(now_);
    answer(answers.guard, owned, failure);
  }
  if (!renewal.sink_owner.empty()) {
    std::exception_ptr failure;
    std::optional<bool> owned;
    if (autocommit(c, failure, at)) {
      owned = pg_->renew(renewal.key, renewal.sink_owner, milliseconds(0));
      if (*owned) c.sink_expires = pg_->row(renewal.key)->expires;
    }
    answer(answers.sink, owned, failure);
  }
  if (tracing()) {
    trace(c, std::string("renew -> ") + (answers.extended() ? "extended"
                                         : answers.failure  ? what(answers.failure)
                                                            : "lost"));
  }
  in_process(c).renewed(*c.plan, sent, answers);
}

// ---- the end of a call -------------------------------------------------------------------------

void Simulation::finish(Call& c, std::optional<Outcome> outcome, std::exception_ptr error) {
  Message& m = messages_[c.message];
  ++result_.endings.at(outcome ? static_cast<std::size_t>(outcome->kind) : 5);
  if (outcome) {
    if (tracing()) {
      trace(c, "returns " + std::string(to_string(outcome->kind)) + " (" +
                   std::string(to_string(outcome->layer)) + ")" +
                   (outcome->response ? " " + *outcome->response : " (no response)") +
                   (outcome->lease_lost ? " lease_lost" : "") +
                   (outcome->save_error.empty() ? "" : " save_error: " + outcome->save_error));
    }
    check_outcome(c, *outcome);
  } else {
    if (tracing()) trace(c, "throws " + what(error));
    if (options_.bug == Bug::kReleaseOnCancel && is<Cancelled>(error) && c.holds &&
        now_ >= redis_down_until_) {
      (void)redis_->release(c.key, c.owner_token);  // planted: a cancellation releases the claim
      if (tracing()) trace(c, "(planted bug) released its claim on cancellation");
    }
    if (options_.bug == Bug::kReleaseOnDeadline && is<DeadlineExceeded>(error) && c.holds &&
        c.handler_started && now_ >= redis_down_until_) {
      (void)redis_->release(c.key, c.owner_token);  // planted: the deadline releases the claim
      if (tracing()) trace(c, "(planted bug) released its claim at the deadline");
    }
  }
  check_end(c, error);
  if (result_.violation) return;
  // Final answers are acked (a decline and a request without a key too: retrying cannot
  // change them); the rest is redelivered.
  const bool decided = outcome ? outcome->kind == Outcome::Kind::kExecuted ||
                                     outcome->kind == Outcome::Kind::kDuplicate ||
                                     outcome->kind == Outcome::Kind::kMismatch
                               : is<Declined>(error) || is<MissingKey>(error);
  m.call = 0;
  if (!c.acked_early) {
    if (decided) {
      ack(m, c);
    } else {
      nack(m);
    }
  }
  const int process = c.process;
  running_.erase(c.id);
  calls_.erase(c.id);  // `c` is gone from here on
  maybe_go_down(process);
}

void Simulation::ack(Message& m, const Call& c) {
  if (in_fault_window() && draw(config_.step_faults)) {
    injected(Fault::kAckLost, c.logical, "the ack of c" + std::to_string(c.id) + " is lost");
    m.visible_at = now_ + sched_.between(100, 1000);
    return;
  }
  m.acked = true;
}

void Simulation::nack(Message& m) { m.visible_at = now_ + sched_.between(20, 300); }

// ---- faults and coverage -----------------------------------------------------------------------

bool Simulation::draw(std::uint64_t per_mille) {
  if (!faults_.chance(per_mille)) return false;
  const int number = fault_number_++;
  return !options_.suppressed.contains(number);
}

void Simulation::injected(Fault kind, int logical, std::string text) {
  ++result_.faults[static_cast<std::size_t>(kind)];
  result_.injected.push_back(fault_number_ - 1);
  if (tracing()) {
    result_.trace.push_back(TraceLine{now_, logical, true,
                                      "FAULT " + std::to_string(fault_number_ - 1) + " " +
                                          std::string(to_string(kind)) + ": " + std::move(text)});
  }
}

// The first step of `c` past its deadline: where the deadline found it.
void Simulation::note_deadline(Call& c) {
  if (c.deadline_noted || !past_deadline(c)) return;
  c.deadline_noted = true;
  if (tracing()) trace(c, "its deadline passes");
  if (c.handler_returned) {
    tally(Tally::kDeadlineAfterHandler);
  } else if (c.phase == Call::Phase::kHandler) {
    tally(Tally::kDeadlineMidHandler);
  } else if (c.phase == Call::Phase::kLockWait) {
    tally(Tally::kDeadlineInLockWait);
  } else if (!c.handler_started) {
    tally(Tally::kDeadlineBeforeHandler);
  } else {
    tally(Tally::kDeadlineAfterHandler);
  }
}

bool Simulation::redis_lost(std::string_view key, Time since) const {
  if (redis_lost_all_ >= since) return true;
  const auto found = redis_lost_.find(key);
  return found != redis_lost_.end() && found->second >= since;
}

void Simulation::violate(std::string invariant, int logical, std::string detail) {
  if (result_.violation) return;
  result_.violation = Violation{std::move(invariant), logical, std::move(detail)};
}

void Simulation::trace(const Call& c, std::string text) {
  if (!tracing()) return;
  result_.trace.push_back(TraceLine{
      now_, c.logical, false,
      "p" + std::to_string(c.process) + " c" + std::to_string(c.id) + " " + std::move(text)});
}

void Simulation::trace_world(std::string text) {
  if (!tracing()) return;
  result_.trace.push_back(TraceLine{now_, -1, false, std::move(text)});
}

// ---- the invariants ----------------------------------------------------------------------------

// claim-kept-after-unclean-end: the claim of an execution that ended without a clean answer (and
// in run() its sink row) keeps its key until its lease ends (unless Redis itself lost the record).
void Simulation::check_claim(const Call& c, std::string_view key, Held held) {
  const auto& kept = held == Held::kClaim ? protected_ : protected_rows_;
  const auto found = kept.find(key);
  if (found == kept.end() || found->second.until <= now_) return;
  const std::string what = held == Held::kClaim ? "claim" : "sink row";
  violate("claim-kept-after-unclean-end", c.logical,
          "c" + std::to_string(c.id) + " took the " + what + " of " + std::string(key) + " at " +
              std::to_string(now_) + " ms, while the " + what + " of c" +
              std::to_string(found->second.call) +
              " (which ended without a clean answer) was leased until " +
              std::to_string(found->second.until) + " ms");
}

void Simulation::protect_if_half_done(const Call& c, std::string_view how) {
  if (!c.handler_started) return;
  auto protect = [&](Held held, const std::string& key, Time until) {
    Protection& p = (held == Held::kClaim ? protected_ : protected_rows_)[key];
    if (p.until < until) p = Protection{until, c.id};
    if (tracing()) {
      trace(c, "ended without a clean answer (" + std::string(how) + "): its " +
                   (held == Held::kClaim ? "claim" : "sink row") + " is leased until " +
                   std::to_string(until) + " ms");
    }
  };
  if (c.holds) {
    if (const std::optional<Time> until = redis_->expiry(c.key, c.owner_token);
        until && *until > now_) {
      protect(Held::kClaim, c.key, *until);
    }
  }
  if (c.sink_row) {
    const std::string key(c.plan->key());
    if (const std::optional<SimPostgres::View> row = pg_->row(key);
        row && row->owner == c.attempt && row->state == RecordState::kInProgress) {
      protect(Held::kSinkRow, key, row->expires);
    }
  }
}

// At the start of a handler: what may run, and what must not.
void Simulation::check_handler_start(Call& c) {
  const Logical& l = logicals_[c.logical];
  const std::string who = "c" + std::to_string(c.id);
  if (stopped(c) || past_deadline(c)) {
    violate("no-handler-after-stop-or-deadline", c.logical,
            who + " starts its handler although its " +
                (stopped(c) ? "stop was requested" : "deadline passed") + " before");
    return;
  }
  const bool keyed = !c.plan->key().empty();
  c.guard_at_start = c.holds;
  c.sink_row_at_start = c.sink_row;
  c.claimed_run = c.mode == CallMode::kTransactional ? keyed && !c.repeat : c.holds || c.sink_row;
  if (keyed && c.repeat) {
    // The guard answered a repeat, yet the handler runs: a retry of a reentrant intent.
    tally(Tally::kReentrantRun);
    if (!l.reentrant || !c.repeat_same_request) {
      violate("reentrant-only-for-same-request", c.logical,
              who + " runs its handler unclaimed after a repeat, but " +
                  (!l.reentrant ? "its intent is not reentrant"
                                : "the record in progress is another request's"));
      return;
    }
  }
  if (!c.previous_key.empty() && c.holds && !c.probe_failed && !(c.probed && c.probe_free)) {
    violate("bucket-window-is-probed", c.logical,
            who + " runs its handler under " + c.key + ", but the previous time bucket's key " +
                c.previous_key +
                (c.probed ? " held a record when it was probed" : " was never probed"));
    return;
  }
  // run(): no two executions at once while a lease holds (this one's included: one that starts
  // on a claim that ran out or that Redis lost meanwhile is told so by lease_lost).
  const bool own_held = config_.sink ? c.sink_row && c.sink_expires > now_
                                     : c.holds && redis_->holds(c.key, c.owner_token);
  if (c.mode != CallMode::kRun || !c.claimed_run || !own_held) return;
  for (const auto& [id, other] : running_) {
    if (other == &c || other->logical != c.logical || !other->claimed_run ||
        other->plan->key() != c.plan->key()) {
      continue;
    }
    const bool row_held = config_.sink && other->sink_row && other->sink_expires > now_;
    const bool claim_held =
        !config_.sink && other->holds && redis_->holds(other->key, other->owner_token);
    if (row_held || claim_held) {
      violate("run-exclusive-while-leased", c.logical,
              who + " starts its handler while c" + std::to_string(id) + " runs under a " +
                  (row_held ? "sink row" : "claim") + " leased until " +
                  std::to_string(row_held ? other->sink_expires : other->guard_expires) + " ms");
      return;
    }
  }
}

// at-most-once: a transaction's effect commits only when no earlier effect under the key is
// still answered by its record (the sink's unique index, or the business constraint).
void Simulation::check_effect(const Call& c) {
  const std::vector<const Effect*> effects = pg_->effects_of(c.logical);
  const auto mine = std::find_if(effects.begin(), effects.end(), [&](const Effect* e) {
    return e->call == c.id && e->committed_at == now_;
  });
  if (mine == effects.end() || !(*mine)->claimed) return;
  for (const Effect* e : effects) {
    if (e == *mine || !e->claimed || e->key != (*mine)->key || e->row_expires <= now_) continue;
    violate("at-most-once", c.logical,
            "the effect of logical request " + std::to_string(c.logical) +
                " committed twice, by c" + std::to_string(e->call) + " and c" +
                std::to_string(c.id) + " under " + e->key);
    return;
  }
}

void Simulation::check_outcome(const Call& c, const Outcome& outcome) {
  const Logical& l = logicals_[c.logical];
  const std::vector<const Effect*> effects = pg_->effects_of(c.logical);
  const std::string who = "c" + std::to_string(c.id);
  const bool unkeyed = l.keying == Keying::kUnkeyed;
  if (unkeyed && (!config_.pass_through || outcome.kind == Outcome::Kind::kInProgress ||
                  outcome.kind == Outcome::Kind::kMismatch)) {
    violate("unkeyed-requests-are-not-deduplicated", c.logical,
            who + " (a payload whose selection holds nothing) answered " +
                std::string(to_string(outcome.kind)) + " (" +
                std::string(to_string(outcome.layer)) + ")" +
                (config_.pass_through ? "" : " instead of idem::MissingKey"));
    return;
  }
  switch (outcome.kind) {
    case Outcome::Kind::kExecuted: {
      const bool own = std::any_of(effects.begin(), effects.end(),
                                   [&](const Effect* e) { return e->call == c.id; });
      if (!own) {
        violate("outcomes-agree-with-the-ledger", c.logical,
                who + " answered kExecuted, but its effect is not in the ledger");
        return;
      }
      if (outcome.response != c.response) {
        violate("no-foreign-response", c.logical,
                who + " answered kExecuted with " + outcome.response.value_or("(no response)") +
                    ", not its handler's response");
        return;
      }
      if (c.returned_at && c.complete_answered && !outcome.lease_lost && !c.held_through_return) {
        violate("lease-lost-is-told", c.logical,
                who +
                    " answered kExecuted with lease_lost false, but its claim was gone (by "
                    "Redis) before its handler returned");
        return;
      }
      check_saved(c, outcome);
      check_clean(c, outcome);
      return;
    }
    case Outcome::Kind::kDuplicate:
      check_replay(c, outcome);
      return;
    case Outcome::Kind::kMismatch:
      if (!l.reused) {
        violate("no-foreign-response", c.logical,
                who + " answered kMismatch, but its key was never used with another payload");
      }
      return;
    case Outcome::Kind::kInProgress:
    case Outcome::Kind::kUnavailable:
      return;
  }
}

// no-foreign-response: a replay is of its own request's response (or a decline stored for it),
// never of another's; over-cap-replays-have-no-body.
void Simulation::check_replay(const Call& c, const Outcome& outcome) {
  const Logical& l = logicals_[c.logical];
  const std::vector<const Effect*> effects = pg_->effects_of(c.logical);
  const std::string who = "c" + std::to_string(c.id);
  const bool own_decline = l.declined && c.variant == 0;
  auto answered = [&](std::string_view response, int variant) {
    return std::any_of(effects.begin(), effects.end(), [&](const Effect* e) {
      return e->variant == variant && e->response == response;
    });
  };
  // TransactionalClaim::kBusinessKey: the caller's constraint said the effect exists; the sink
  // sees no fingerprint and keeps no response.
  const bool business_duplicate = config_.business_key && c.mode == CallMode::kTransactional &&
                                  outcome.layer == Layer::kPgSink && !outcome.response;
  if (business_duplicate) {
    if (effects.empty()) {
      violate("outcomes-agree-with-the-ledger", c.logical,
              who + " answered kDuplicate by the business constraint, but nothing committed");
    }
    return;
  }
  if (!outcome.response) {
    if (!l.over_cap) {
      violate("outcomes-agree-with-the-ledger", c.logical,
              who + " replayed no response (" + std::string(to_string(outcome.layer)) +
                  "), but the request's responses are within the size cap");
      return;
    }
    tally(Tally::kOverCapReplay);
    if (!std::any_of(effects.begin(), effects.end(),
                     [&](const Effect* e) { return e->variant == c.variant; })) {
      violate("no-foreign-response", c.logical,
              who + " answered kDuplicate (" + std::string(to_string(outcome.layer)) +
                  ") for another payload's execution, or for none");
    }
    return;
  }
  const std::string& body = *outcome.response;
  if (body.size() > kResponseCap && outcome.layer != Layer::kRequestId) {
    violate("over-cap-replays-have-no-body", c.logical,
            who + " replayed a response of " + std::to_string(body.size()) + " bytes from " +
                std::string(to_string(outcome.layer)) + ", over its cap of " +
                std::to_string(kResponseCap));
    return;
  }
  if ((own_decline && body == Declined(c.logical).what()) || answered(body, c.variant)) return;
  const bool foreign = answered(body, 1 - c.variant) || body == Declined(c.logical).what();
  violate("no-foreign-response", c.logical,
          who + " replayed " + body +
              (foreign ? ", the response of the request that used its key with another payload"
                       : ", which no execution of its request answered"));
}

// unsaved-results-are-told: kExecuted with save_error empty means every layer holding the claim
// saved the response (by the simulated backends); a save_error, that a completion failed.
void Simulation::check_saved(const Call& c, const Outcome& outcome) {
  if (!c.claimed_run) return;  // an unclaimed run completes nothing
  const std::string who = "c" + std::to_string(c.id);
  if (!outcome.save_error.empty()) {
    if (!c.completion_failed()) {
      violate("unsaved-results-are-told", c.logical,
              who + " answered save_error '" + outcome.save_error + "', but no completion failed");
    }
    return;
  }
  if (c.completion_failed()) {
    violate("unsaved-results-are-told", c.logical,
            who +
                " answered kExecuted with save_error empty, but a completion of its response "
                "failed");
    return;
  }
  if (c.guard_at_start && !outcome.lease_lost && !c.guard_saved) {
    violate("unsaved-results-are-told", c.logical,
            who + " answered kExecuted, saved, lease held, but its guard record was not completed");
    return;
  }
  // The sink keeps every claimed execution's response: its row commits with the effect
  // (run_transactional(), TransactionalClaim::kRecord), or is claimed before the handler and
  // completed after it (run()).
  const bool row_kept = c.mode == CallMode::kTransactional
                            ? config_.business_key || c.sink_kept_until != kNever
                            : c.sink_row_at_start;
  if (config_.sink && !row_kept) {
    violate("unsaved-results-are-told", c.logical,
            who + " answered kExecuted, saved, but the sink keeps no record of it");
    return;
  }
  if (sink_row_lost_untold(c, outcome)) {
    violate("lease-lost-is-told", c.logical,
            who +
                " answered kExecuted with lease_lost false, but its sink row's lease had run "
                "out when it completed it");
  }
}

// run(): the call held a sink row when its handler started, the row's completion found it no
// longer this attempt's (its lease ran out, another attempt may have taken it over), and the
// call was told neither lease_lost nor save_error.
bool Simulation::sink_row_lost_untold(const Call& c, const Outcome& outcome) const {
  return c.mode == CallMode::kRun && c.sink_row_at_start && !c.sink_complete_owned &&
         !c.completion_failed() && !outcome.lease_lost && outcome.save_error.empty();
}

// doubled-effects-are-told: two executions under one key are never both told clean (kExecuted,
// saved, lease held) while the first one's record was kept: a doubled effect is always told.
void Simulation::check_clean(const Call& c, const Outcome& outcome) {
  if (!c.claimed_run || !outcome.save_error.empty() || outcome.lease_lost) return;
  const std::string key(c.plan->key());
  const Clean mine{c.id, c.guard_kept_until, c.sink_kept_until, c.handler_started_at};
  const auto [it, first] = clean_.try_emplace({c.logical, key}, mine);
  if (first) return;
  // The two in the order their handlers started (a later execution may be told first).
  const bool mine_later = mine.since >= it->second.since;
  const Clean earlier = mine_later ? it->second : mine;
  const Clean later = mine_later ? mine : it->second;
  // A new execution once every record of the earlier one was gone: its retention ended, or
  // Redis lost it.
  const Time guard_until = redis_lost(key, earlier.since) ? 0 : earlier.guard_until;
  if (later.since >= std::max(guard_until, earlier.sink_until)) {
    it->second = later;
    return;
  }
  violate("doubled-effects-are-told", c.logical,
          "c" + std::to_string(later.call) + " and c" + std::to_string(earlier.call) +
              " both answered kExecuted, saved, lease held, for " + key);
}

// At the end of every call.
void Simulation::check_end(const Call& c, const std::exception_ptr& error) {
  const std::string who = "c" + std::to_string(c.id);
  const Logical& l = logicals_[c.logical];
  if (error && c.handler_returned && is<Cancelled>(error)) {
    violate("the-shield", c.logical,
            who + " threw " + what(error) +
                " after its handler returned: nothing after the "
                "handler is cut short");
    return;
  }
  if (error && l.keying == Keying::kUnkeyed && !config_.pass_through && !is<MissingKey>(error) &&
      !is<Cancelled>(error)) {
    violate("unkeyed-requests-are-not-deduplicated", c.logical,
            who + " (a payload whose selection holds nothing) threw " + what(error) +
                " instead of idem::MissingKey");
    return;
  }
  // failed-releases-are-told, for a call with no event (a call stopped or past its deadline
  // before its handler ran emits one only when a release failed).
  if (c.release_failed && !c.emitted && (config_.emit || config_.metrics)) {
    violate("failed-releases-are-told", c.logical,
            who + " ended (" + (error ? what(error) : std::string("an outcome")) +
                ") after a release of its claim failed, with no decision event to tell it");
    return;
  }
  if (c.handler_started) return;
  // no-claim-left-without-handler: a call that never ran its handler releases what it claimed
  // (a claim whose answer never arrived is the lease's to end).
  const std::optional<SimRedis::View> record = redis_->record(c.key);
  if (record && !c.owner_token.empty() && record->owner_token == c.owner_token &&
      record->state == RecordState::kInProgress && !c.release_failed && !c.completion_failed() &&
      !redis_lost(c.key, c.claimed_at)) {
    violate("no-claim-left-without-handler", c.logical,
            who + " ended (" + (error ? what(error) : std::string("an outcome")) +
                ") before its handler ran, still holding its claim of " + c.key);
    return;
  }
  if (!c.probe_token.empty() && !c.probe_release_failed &&
      redis_->holds(c.previous_key, c.probe_token) && !redis_lost(c.previous_key, c.claimed_at)) {
    violate("no-claim-left-without-handler", c.logical,
            who + " ended still holding its probe of " + c.previous_key);
    return;
  }
  if (c.sink_row && !c.release_failed) {
    const std::optional<SimPostgres::View> row = pg_->row(c.plan->key());
    if (row && row->owner == c.attempt && row->state == RecordState::kInProgress) {
      violate("no-claim-left-without-handler", c.logical,
              who + " ended before its handler ran, still holding its sink row");
    }
  }
}

// failed-releases-are-told: a decision event carries release_error exactly when a release of
// the call's claim failed.
void Simulation::check_event(Call& c, const DecisionEvent& event) {
  c.emitted = true;
  if (event.release_error.empty() != c.release_failed) return;
  violate("failed-releases-are-told", c.logical,
          "c" + std::to_string(c.id) + "'s decision event says release_error '" +
              std::string(event.release_error) + "', but " +
              (c.release_failed ? "a release failed" : "no release failed"));
}

// eventually-exactly-once, once every message is acked: no request is lost, a declined one has
// no effect, and one without a key has one only as the policy says. (At most once is checked at
// each commit; run() promises no more than at least once, and that a doubled effect is told.)
void Simulation::final_checks() {
  for (std::size_t i = 0; i < logicals_.size(); ++i) {
    const Logical& l = logicals_[i];
    const std::size_t effects = pg_->effects_of(static_cast<int>(i)).size();
    const bool rejected = l.keying == Keying::kUnkeyed && !config_.pass_through;
    std::string wrong;
    if (rejected && effects > 0) {
      wrong = "it has no key and the policy rejects it, yet it has an effect";
    } else if (l.declined && !l.reused && effects > 0) {
      wrong = "it is declined every time, yet it has an effect";
    } else if (!rejected && !l.declined && !l.reused && effects == 0) {
      // (A key used with two payloads may end with neither run: each is a kMismatch of the
      // other's record, dead-lettered, as "mismatch before state" says.)
      wrong = "it has no effect (a lost request)";
    }
    if (!wrong.empty()) {
      violate("eventually-exactly-once", static_cast<int>(i),
              "logical request " + std::to_string(i) + " committed " + std::to_string(effects) +
                  " times once every message was acked: " + wrong);
      return;
    }
  }
}

}  // namespace

// ---- the public face ---------------------------------------------------------------------------

namespace {
constexpr std::array<std::string_view, kBugs> kBugNames = {
    "none",
    "release-on-cancel",
    "complete-without-owner-check",
    "ack-before-commit",
    "key-from-empty-selection",
    "stop-ignored-before-handler",
    "release-on-deadline",
    "failed-completion-reported-saved",
    "failed-release-reported-done",
    "guard-ignores-fingerprint",
    "guard-keeps-over-cap-body",
    "repeat-reported-as-same-request",
    "bucket-probe-skipped",
    "interrupt-after-handler",
    "interrupted-call-skips-release",
    "sink-busy-reported-claimed",
    "guard-forgets-early",
    "journal-without-owner-check",
};
}  // namespace

std::string_view to_string(Bug bug) noexcept { return kBugNames[static_cast<std::size_t>(bug)]; }

std::optional<Bug> parse_bug(std::string_view name) noexcept {
  for (std::size_t b = 0; b < kBugNames.size(); ++b) {
    if (kBugNames[b] == name) return static_cast<Bug>(b);
  }
  return std::nullopt;
}

std::string_view to_string(Fault fault) noexcept {
  return kFaultNames.at(static_cast<std::size_t>(fault));
}

std::string_view to_string(Tally tally) noexcept {
  return kTallyNames.at(static_cast<std::size_t>(tally));
}

std::size_t RunResult::fault_count() const noexcept {
  std::size_t total = 0;
  for (const std::size_t n : faults) total += n;
  return total;
}

RunResult run(const RunOptions& options) { return Simulation(options).run(); }

Reproduction minimize(std::uint64_t seed, Bug bug) {
  return minimize(RunOptions{.seed = seed, .bug = bug});
}

Reproduction minimize(RunOptions options) {
  const std::uint64_t seed = options.seed;
  const Bug bug = options.bug;
  options.trace = false;
  options.suppressed.clear();
  RunResult failing = run(options);
  // Take faults out while the run still fails, as delta debugging does: chunks of the injected
  // faults first (half of them, then quarters, ...), single ones last. A removal changes the
  // run, so the faults are always those of the last failing run; bounded by `budget` runs.
  int budget = 2000;
  for (std::size_t chunk = std::max<std::size_t>(failing.injected.size() / 2, 1);
       failing.violation && budget > 0;) {
    bool shrunk = false;
    const std::vector<int> faults = failing.injected;
    for (std::size_t from = 0; from < faults.size() && budget > 0; from += chunk, --budget) {
      RunOptions fewer = options;
      for (std::size_t i = from; i < std::min(faults.size(), from + chunk); ++i) {
        fewer.suppressed.insert(faults[i]);
      }
      RunResult attempt = run(fewer);
      // A removal may let the run go on to inject others: that is no smaller.
      if (attempt.violation && attempt.injected.size() < faults.size()) {
        options = std::move(fewer);
        failing = std::move(attempt);
        shrunk = true;
        break;
      }
    }
    if (shrunk) {
      chunk = std::min(chunk, std::max<std::size_t>(failing.injected.size() / 2, 1));
    } else if (chunk > 1) {
      chunk /= 2;
    } else {
      break;  // no single fault can go
    }
  }
  options.trace = true;
  Reproduction repro{run(options), options.suppressed, {}};
  const RunResult& r = repro.run;
  std::string& text = repro.text;
  text = "seed " + std::to_string(seed) + " (" + r.config + ")";
  if (bug != Bug::kNone) text += ", planted bug " + std::string(to_string(bug));
  text += "\n";
  if (!r.violation) {
    text += "no violation\n";
    return repro;
  }
  const Violation& v = *r.violation;
  text += "VIOLATION " + v.invariant + ": " + v.detail + "\n";
  text += "faults kept " + std::to_string(r.injected.size()) + " of " +
          std::to_string(r.injected.size() + repro.suppressed.size()) + "; the steps of " +
          (v.logical >= 0 ? "logical request " + std::to_string(v.logical) : "every request") +
          ", and the world's faults and events from its first step on:\n";
  bool started = v.logical < 0;
  for (const TraceLine& line : r.trace) {
    started = started || line.logical == v.logical;
    const bool world = line.logical == -1;
    if (v.logical >= 0 && line.logical != v.logical && !(world && started)) continue;
    text += "  " + std::to_string(line.at) + " ms  " + line.text + "\n";
  }
  return repro;
}

}  // namespace idem::sim
