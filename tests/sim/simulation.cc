#include "simulation.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>

#include "facade/in_process.h"
#include "facade/plan.h"
#include "facade/step_error.h"
#include "idem/clock.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
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
constexpr Time kRedisTimeout = 50;  // a Redis command's timeout, ms
constexpr Time kPgTimeout = 100;    // a statement's timeout (the connection is then closed)
constexpr Time kLockTimeout = 200;  // PgSinkOptions::lock_timeout
constexpr Time kHandlerCheck = 5;   // a running handler looks at its stop token this often
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

std::string what(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

template <class E>
bool is(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
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

  [[nodiscard]] std::string describe() const {
    std::string text = std::to_string(processes) + " processes, " + std::to_string(logicals) +
                       " logical requests, lease " + std::to_string(lease.count()) +
                       " ms, retention " + std::to_string(retention.count()) + " ms";
    if (local_cache) text += ", local cache";
    if (auto_renew) text += ", auto-renew";
    text += fail_closed ? ", redis fail-closed" : ", redis fail-open";
    if (wait_for_result) text += ", wait-for-result";
    if (keep_on_failure) text += ", keep-on-failure";
    if (store_declines) text += ", declines stored";
    if (batched) text += ", batched round trips";
    if (business_key) text += ", business-key claim";
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
  return c;
}

// ---- the workload ------------------------------------------------------------------------------

enum class Source { kOriginal, kDoubleClick, kRacingRetry, kRedelivery, kLateRedelivery };

std::string_view source_name(Source source) {
  static constexpr std::array<std::string_view, 5> kNames = {
      "original", "double-click", "racing-retry", "redelivery", "late-redelivery"};
  return kNames.at(static_cast<std::size_t>(source));
}

// One user intent: a refund of one order. Keyed by its business key, or (id_keyed) by its
// request ID alone, so a double click with a new ID would be another operation: it gets none.
struct Logical {
  bool declined = false;  // its handler always declines (a deterministic business error)
  std::string user;
  std::string biz_key;
  std::string payload;
  std::string request_id;
};

// One message of the queue (at-least-once): acked after a final outcome, else redelivered.
struct Message {
  int logical = 0;
  Source source = Source::kOriginal;
  std::string request_id;
  Time visible_at = 0;
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
  bool up = true;
  bool draining = false;  // shut down: takes no message, goes down when its calls end
  Time down_until = 0;
  Time paused_until = 0;
  std::shared_ptr<ManualClock> cache_clock = std::make_shared<ManualClock>();
  std::unique_ptr<LocalCache> cache;
  std::unique_ptr<std::stop_source> shutdown = std::make_unique<std::stop_source>();

  [[nodiscard]] PlanTime plan_time(Time t) const { return PlanTime(milliseconds(clock.local(t))); }
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
  Request request;
  std::stop_source stop;
  std::unique_ptr<CallPlan> plan;
  std::optional<Step> current;    // the step the plan asked for, until it is reported
  StepResult pending{Started{}};  // the last step's result, for the next resume()
  Time ready_at = 0;

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

  // The guard claim of the call's key, while the driver believes it holds it.
  bool holds = false;
  std::string key;
  std::string owner_token;

  bool handler_started = false;
  Time handler_end = 0;
  bool handler_fails = false;
  bool handler_checks_stop = true;
  std::optional<Time> returned_at;  // when the handler returned holding (it believed) a claim
  // The guard's complete answered, and whether by Redis' history as it stood then the claim was
  // held when the handler returned.
  bool complete_answered = false;
  bool held_through_return = false;
  bool acked_early = false;
  std::string response;
};

// ---- the simulation ----------------------------------------------------------------------------

class Simulation {
 public:
  explicit Simulation(const RunOptions& options);
  RunResult run();

 private:
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

  // The driver: one step of a call.
  void step(Call& c);
  void guard_step(Call& c, const Step& step);
  void sink_step(Call& c, const Step& step);
  void commit(Call& c);
  void start_handler(Call& c);
  void handler_tick(Call& c);
  void renew(Call& c);
  void finish(Call& c, std::optional<Outcome> outcome, std::exception_ptr error);
  void check_outcome(const Call& c, const Outcome& outcome);
  void protect_if_half_done(const Call& c, std::string_view how);
  void fail(Call& c, std::exception_ptr failure);
  // The step of `c` under way was performed: `result` goes to the plan with the next resume().
  static void report(Call& c, StepResult result) {
    c.pending = std::move(result);
    c.current.reset();
  }
  [[nodiscard]] bool stopped(const Call& c) const {
    return c.stop.stop_requested() || processes_[c.process].shutdown->stop_requested();
  }
  // The in-process steps of `c`, on its process's local cache.
  [[nodiscard]] detail::InProcess in_process(const Call& c) {
    return detail::InProcess(*rules_, &processes_[c.process].local_cache(now_));
  }
  void check_claim(const Call& c, std::string_view key);
  template <class Op>
  auto redis(Call& c, Op&& op, std::exception_ptr& failure) -> std::optional<decltype(op())>;
  bool statement(Call& c);
  void wake_waiters(SimPostgres::TxId tx);
  void ack(Message& m, const Call& c);
  void nack(Message& m);

  // Faults and invariants.
  [[nodiscard]] bool in_fault_window() const { return now_ < config_.fault_end; }
  bool draw(std::uint64_t per_mille);
  void injected(Fault kind, int logical, std::string text);
  void violate(std::string invariant, int logical, std::string detail);
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

  // Invariants' memory.
  std::map<int, int> executed_;  // logical -> calls that answered kExecuted
  struct Protection {
    Time until = 0;
    int call = 0;
  };
  std::map<std::string, Protection, std::less<>> protected_;  // key -> a half-done call's lease

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

  redis_ = std::make_shared<SimRedis>(
      now_,
      SimRedis::Options{.lease = config_.lease,
                        .retention = config_.retention,
                        .max_lag = 300,
                        .complete_checks_owner = options.bug != Bug::kCompleteWithoutOwnerCheck});
  pg_ = std::make_shared<SimPostgres>(now_, config_.lease, milliseconds(std::chrono::hours(1)));

  DeduplicatorOptions o;
  o.local_cache_capacity = config_.local_cache ? 64 : 0;
  o.local_cache_ttl = config_.retention / 2;
  o.guard = redis_;
  o.sink = pg_;
  o.fingerprint = FingerprintOptions{};
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
  // The simulated PostgreSQL runs calls in transactions and has a business constraint.
  rules_ = std::make_unique<PlanRules>(
      o, detail::DriverTraits{.transactions = true, .business_constraints = true});

  processes_.resize(static_cast<std::size_t>(config_.processes));
  for (Process& p : processes_) {
    p.clock.anchor_local = config_rng_.between(0, 1000000000);
    p.clock.ppm = config_rng_.chance(300) ? config_rng_.between(-50000, 50000) : 0;
    p.cache = std::make_unique<LocalCache>(LocalCacheOptions{
        .max_entries = 64, .ttl = o.local_cache_ttl, .shards = 1, .clock = p.cache_clock});
  }

  // The workload: every logical request's original message, and its duplicates.
  for (int i = 0; i < config_.logicals; ++i) {
    const bool id_keyed = workload_.chance(250);
    Logical l;
    l.declined = config_.store_declines && workload_.chance(150);
    l.user = "u" + std::to_string(i % 3);
    l.biz_key = id_keyed ? "" : "order-" + std::to_string(i);
    l.payload = R"({"order":)" + std::to_string(i) + R"(,"amount":)" +
                std::to_string(workload_.between(1, 999)) + "}";
    l.request_id = "req-" + std::to_string(i) + "-0";
    const Time at = workload_.between(0, config_.arrivals - 1);
    auto add = [&](Source source, std::string request_id, Time visible_at) {
      messages_.push_back(Message{i, source, std::move(request_id), visible_at});
    };
    add(Source::kOriginal, l.request_id, at);
    if (!id_keyed && workload_.chance(config_.double_clicks)) {
      add(Source::kDoubleClick, "req-" + std::to_string(i) + "-1", at + workload_.between(0, 80));
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
  c.response = "response-of-call-" + std::to_string(c.id);
  c.request = Request{.request_id = m.request_id,
                      .user = l.user,
                      .intent = "refund",
                      .biz_key = l.biz_key,
                      .payload = l.payload,
                      .attempt = ++m.deliveries,
                      .stop = c.stop.get_token()};
  Process& p = processes_[c.process];
  c.plan = std::make_unique<CallPlan>(
      *rules_, c.request, CallMode::kTransactional, p.plan_time(now_),
      std::chrono::system_clock::time_point(milliseconds(p.clock.local(now_))),
      "attempt-" + std::to_string(c.id));
  c.ready_at = now_;
  m.call = c.id;
  ++result_.calls;
  if (tracing()) {
    trace(c, "delivered (" + std::string(source_name(m.source)) + ", request ID " + m.request_id +
                 ", delivery " + std::to_string(m.deliveries) + ")");
  }
  calls_.emplace(c.id, std::move(call));
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
        if (call->process == process) call->ready_at = std::min(call->ready_at, now_ + 1);
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
      if (c.phase == Call::Phase::kHandler) c.ready_at = std::min(c.ready_at, now_ + 1);
      return;
    }
    case Fault::kRedisRestart: {
      const std::size_t lost = redis_->restart();
      redis_down_until_ = now_ + faults_.between(0, 200);
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

void Simulation::step(Call& c) {
  if (c.phase == Call::Phase::kHandler) {
    handler_tick(c);
    return;
  }
  Process& p = processes_[c.process];
  if (!c.current) {
    c.current = c.plan->resume(Input{p.plan_time(now_), stopped(c), std::move(c.pending)});
    ++result_.plan_steps.at(static_cast<std::size_t>(c.current->kind));
  }
  const Step step = *c.current;
  switch (step.kind) {
    case StepKind::kLocalGet:
    case StepKind::kLocalPut:
    case StepKind::kDecideFailure:
    case StepKind::kEmit: {
      StepResult result = *in_process(c).perform(step);
      if (tracing() && step.kind == StepKind::kLocalGet) {
        trace(c, "LocalGet " + std::string(step.key) +
                     (std::get<CacheEntry>(result).entry ? " -> hit" : " -> miss"));
      }
      if (tracing() && step.kind == StepKind::kLocalPut)
        trace(c, "LocalPut " + std::string(step.key));
      report(c, std::move(result));
      c.ready_at = now_;
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
      sink_step(c, step);
      return;
    case StepKind::kRunHandler:
      start_handler(c);
      return;
    case StepKind::kWait:
      if (tracing())
        trace(c, "Wait " + std::to_string(reading(step.at) - p.clock.local(now_)) + " ms");
      report(c, Done{});
      c.ready_at = std::max(now_ + 1, p.clock.when(reading(step.at)));
      return;
    case StepKind::kReturn:
      finish(c, c.plan->outcome(), nullptr);
      return;
    case StepKind::kThrow:
      finish(c, std::nullopt, c.plan->error());
      return;
  }
}

template <class Op>
auto Simulation::redis(Call& c, Op&& op, std::exception_ptr& failure)
    -> std::optional<decltype(op())> {
  if (now_ < redis_down_until_) {
    failure = std::make_exception_ptr(RedisError("idem: redis: connection refused", true));
    c.ready_at = now_ + 1;
    return std::nullopt;
  }
  if (in_fault_window() && draw(config_.step_faults)) {
    const bool applied = faults_.chance(500);
    injected(applied ? Fault::kRedisTimeoutApplied : Fault::kRedisTimeoutLost, c.logical,
             "c" + std::to_string(c.id) + ": redis command times out" +
                 (applied ? " after it took effect" : ", not applied"));
    if (applied) (void)op();
    failure = std::make_exception_ptr(RedisError("idem: redis: timeout", true));
    c.ready_at = now_ + kRedisTimeout;
    return std::nullopt;
  }
  c.ready_at = now_ + latency();
  return op();
}

void Simulation::guard_step(Call& c, const Step& step) {
  std::exception_ptr failure;
  const std::string key(step.key);
  switch (step.kind) {
    case StepKind::kGuardClaim: {
      std::optional<ClaimResult> claim = redis(
          c,
          [&] {
            ClaimResult answer = redis_->claim(step.key, step.request_id, step.fingerprint);
            if (answer.status == ClaimStatus::kFirst) check_claim(c, key);
            return answer;
          },
          failure);
      if (!claim) break;
      if (tracing()) {
        trace(c, "GuardClaim " + key + " -> " + std::string(claim_name(claim->status)) +
                     (claim->status == ClaimStatus::kFirst
                          ? " (token " + claim->owner_token.substr(28) + ")"
                          : " " + std::string(state_name(claim->state))));
      }
      if (claim->status == ClaimStatus::kFirst) {
        c.holds = true;
        c.key = key;
        c.owner_token = claim->owner_token;
      }
      report(c, *std::move(claim));
      return;
    }
    case StepKind::kGuardComplete: {
      std::optional<bool> owned = redis(
          c, [&] { return redis_->complete(step.key, step.owner_token, step.value, step.ttl); },
          failure);
      if (step.owner_token == c.owner_token) c.holds = false;
      if (!owned) break;
      if (tracing()) trace(c, "GuardComplete " + key + (*owned ? " -> owned" : " -> not owned"));
      c.complete_answered = true;
      c.held_through_return =
          c.returned_at && redis_->held_at(c.key, c.owner_token, *c.returned_at);
      report(c, Completed{*owned});
      return;
    }
    case StepKind::kGuardRelease: {
      std::optional<bool> released = redis(
          c, [&] { return redis_->release(step.key, step.owner_token); }, failure);
      if (step.owner_token == c.owner_token) c.holds = false;
      if (!released) break;
      if (tracing()) trace(c, "GuardRelease " + key + (*released ? " -> deleted" : " -> not ours"));
      report(c, Done{});
      return;
    }
    default:
      return;
  }
  if (tracing())
    trace(c, std::string(detail::step_name(step.kind)) + " " + key + " -> " + what(failure));
  fail(c, failure);
}

// A statement of the open transaction may run: PostgreSQL is up, the transaction alive, and the
// seed lets the statement answer. Otherwise the failure is reported to the plan.
bool Simulation::statement(Call& c) {
  std::exception_ptr failure;
  if (now_ < pg_down_until_) {
    failure =
        std::make_exception_ptr(PostgresError("idem: postgres: connection refused", true, "08006"));
  } else if (c.tx == 0 || !pg_->is_open(c.tx)) {
    failure = std::make_exception_ptr(
        PostgresError("idem: postgres: server closed the connection", true, "08006"));
  } else if (in_fault_window() && draw(config_.step_faults)) {
    injected(Fault::kPgTimeout, c.logical,
             "c" + std::to_string(c.id) + ": statement times out, its connection is closed");
    pg_->rollback(c.tx);
    wake_waiters(c.tx);
    failure =
        std::make_exception_ptr(PostgresError("idem: postgres: statement timeout", true, "57014"));
    c.ready_at = now_ + kPgTimeout;
  }
  if (!failure) return true;
  if (c.ready_at <= now_) c.ready_at = now_ + 1;
  if (tracing()) trace(c, "statement fails: " + what(failure));
  if (c.phase == Call::Phase::kHandler) return false;  // the handler reports it itself
  fail(c, failure);
  return false;
}

void Simulation::sink_step(Call& c, const Step& step) {
  switch (step.kind) {
    case StepKind::kSinkBegin:
      if (config_.batched && step.with_next) {
        c.begin_pending = true;  // BEGIN goes with the claim: its failure is the claim's
        if (tracing()) trace(c, "SinkBegin (sent with the claim)");
        c.ready_at = now_;
        report(c, Done{});
        return;
      }
      if (now_ < pg_down_until_) {
        if (tracing()) trace(c, "SinkBegin -> connection refused");
        c.ready_at = now_ + 1;
        fail(c, std::make_exception_ptr(
                    PostgresError("idem: postgres: connection refused", true, "08006")));
        return;
      }
      c.tx = pg_->begin();
      if (tracing()) trace(c, "SinkBegin tx" + std::to_string(c.tx));
      c.ready_at = now_ + latency();
      report(c, Done{});
      return;
    case StepKind::kSinkClaim: {
      if (std::exchange(c.begin_pending, false) && now_ >= pg_down_until_) c.tx = pg_->begin();
      if (!statement(c)) {
        c.phase = Call::Phase::kPlan;
        return;
      }
      SimPostgres::TxId blocker = 0;
      std::optional<SinkClaim> claim =
          pg_->claim(c.tx, step.key, step.request_id, step.fingerprint, step.ttl, &blocker);
      if (!claim) {
        if (c.phase != Call::Phase::kLockWait) {
          c.phase = Call::Phase::kLockWait;
          c.lock_deadline = now_ + kLockTimeout;
          if (tracing())
            trace(c,
                  "SinkClaim " + std::string(step.key) + " waits for tx" + std::to_string(blocker));
        }
        if (now_ < c.lock_deadline) {
          c.blocked_by = blocker;
          c.ready_at = c.lock_deadline;
          return;
        }
        // lock_timeout: the wait is cancelled and the transaction aborted.
        pg_->rollback(c.tx);
        wake_waiters(c.tx);
        claim = SinkClaim{};
        claim->status = SinkStatus::kInProgress;
      }
      c.phase = Call::Phase::kPlan;
      c.blocked_by = 0;
      if (tracing()) {
        trace(c, "SinkClaim " + std::string(step.key) + " -> " +
                     (claim->status == SinkStatus::kClaimed ? "claimed"
                      : claim->status == SinkStatus::kInProgress
                          ? "in progress (lock timeout)"
                          : "duplicate " + std::string(state_name(claim->state))));
      }
      c.ready_at = now_ + latency();
      report(c, *std::move(claim));
      return;
    }
    case StepKind::kSinkComplete:
      if (config_.batched && step.with_next) {
        c.record_pending = Call::Record{std::string(step.key), std::string(step.value), step.ttl};
        if (tracing()) trace(c, "SinkComplete " + std::string(step.key) + " (sent with COMMIT)");
        c.ready_at = now_;
        report(c, Done{});
        return;
      }
      if (!statement(c)) return;
      pg_->complete(c.tx, step.key, step.value, step.ttl);
      if (tracing()) trace(c, "SinkComplete " + std::string(step.key));
      c.ready_at = now_ + latency();
      report(c, Done{});
      return;
    case StepKind::kCommit:
      commit(c);
      return;
    case StepKind::kRollback:
      if (c.tx != 0 && pg_->is_open(c.tx)) {
        pg_->rollback(c.tx);
        wake_waiters(c.tx);
      }
      if (tracing()) trace(c, "Rollback tx" + std::to_string(c.tx));
      c.tx = 0;
      c.ready_at = now_ + latency();
      report(c, Done{});
      return;
    case StepKind::kSinkRelease:
      // run() only: the simulation drives run_transactional().
      (void)pg_->release(step.key, step.owner_token);
      report(c, Done{});
      return;
    default:
      return;
  }
}

void Simulation::commit(Call& c) {
  const SimPostgres::TxId tx = std::exchange(c.tx, 0);
  if (const std::optional<Call::Record> record = std::exchange(c.record_pending, std::nullopt);
      record && now_ >= pg_down_until_ && pg_->is_open(tx)) {
    pg_->complete(tx, record->key, record->value, record->ttl);
  }
  std::exception_ptr failure;
  if (now_ < pg_down_until_ || !pg_->is_open(tx)) {
    failure = std::make_exception_ptr(
        PostgresError("idem: postgres: server closed the connection", true, "08006"));
    c.ready_at = now_ + 1;
  } else if (in_fault_window() && draw(config_.step_faults)) {
    const std::uint64_t kind = faults_.below(3);
    if (kind == 0) {
      injected(Fault::kCommitRefused, c.logical, "c" + std::to_string(c.id) + ": commit refused");
      pg_->rollback(tx);
      failure = std::make_exception_ptr(
          PostgresError("idem: postgres: could not serialize access", false, "40001"));
    } else {
      const bool committed = kind == 1;
      injected(committed ? Fault::kCommitUnknownCommitted : Fault::kCommitUnknownLost, c.logical,
               "c" + std::to_string(c.id) + ": commit's answer lost (" +
                   (committed ? "it committed)" : "it did not commit)"));
      if (committed) {
        pg_->commit(tx);
      } else {
        pg_->rollback(tx);
      }
      failure = std::make_exception_ptr(
          CommitOutcomeUnknown("idem: postgres: connection lost (commit outcome unknown)"));
    }
    wake_waiters(tx);
    c.ready_at = now_ + kPgTimeout;
  } else {
    pg_->commit(tx);
    wake_waiters(tx);
    c.ready_at = now_ + latency();
  }
  const std::size_t effects = pg_->effects_of(c.logical).size();
  if (effects > 1) {
    violate("at-most-once", c.logical,
            "the effect of logical request " + std::to_string(c.logical) + " committed " +
                std::to_string(effects) + " times (last by c" + std::to_string(c.id) + ")");
    return;
  }
  if (failure) {
    if (tracing()) trace(c, "Commit tx" + std::to_string(tx) + " -> " + what(failure));
    fail(c, failure);
  } else {
    if (tracing()) trace(c, "Commit tx" + std::to_string(tx) + " -> committed");
    report(c, Done{});
  }
}

void Simulation::wake_waiters(SimPostgres::TxId tx) {
  for (auto& [id, call] : calls_) {
    if (call->blocked_by == tx) call->ready_at = now_;
  }
}

void Simulation::start_handler(Call& c) {
  c.phase = Call::Phase::kHandler;
  c.handler_started = true;
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
  const bool stopped = c.stop.stop_requested() || p.shutdown->stop_requested();
  std::exception_ptr failure;
  if (stopped && c.handler_checks_stop) {
    failure = std::make_exception_ptr(Cancelled("idem: handler cancelled (stop seen)"));
  } else if (now_ < c.handler_end) {
    c.ready_at = std::min(c.handler_end, now_ + kHandlerCheck);
    if (const auto due = c.plan->renewal_due()) {
      c.ready_at = std::max(now_ + 1, std::min(c.ready_at, p.clock.when(reading(*due))));
    }
    return;
  } else if (c.handler_fails) {
    failure = std::make_exception_ptr(std::runtime_error("transient business error (simulated)"));
  } else if (logicals_[c.logical].declined) {
    failure = std::make_exception_ptr(Declined(c.logical));
  } else if (statement(c)) {
    // The business write, in the sink's transaction.
    Effect effect{c.logical, c.id, c.response, 0};
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
          c.ready_at = c.lock_deadline;
          return;
        }
        pg_->rollback(c.tx);  // lock_timeout: the statement fails, the transaction is aborted
        wake_waiters(c.tx);
      }
      c.blocked_by = 0;
      if (written == SimPostgres::BusinessWrite::kDuplicate) {
        c.phase = Call::Phase::kPlan;
        c.ready_at = now_ + latency();
        if (tracing()) trace(c, "RunHandler: the business key exists (unique violation)");
        report(c, BusinessDuplicate{});
        return;
      }
    } else {
      pg_->write_effect(c.tx, std::move(effect));
    }
    if (!pg_->is_open(c.tx)) {
      failure = std::make_exception_ptr(
          PostgresError("idem: postgres: canceling statement due to lock timeout", true, "55P03"));
    } else {
      if (c.holds) c.returned_at = now_;
      c.phase = Call::Phase::kPlan;
      c.ready_at = now_ + latency();
      if (tracing()) trace(c, "RunHandler returns " + c.response);
      report(c, Response{c.response});
      if (options_.bug == Bug::kAckBeforeCommit) {
        ack(messages_[c.message], c);  // planted: the consumer acks before the commit
        c.acked_early = true;
      }
      return;
    }
  } else {
    failure = std::make_exception_ptr(
        PostgresError("idem: postgres: server closed the connection", true, "08006"));
  }
  c.phase = Call::Phase::kPlan;
  if (c.ready_at <= now_) c.ready_at = now_ + latency();
  if (tracing()) trace(c, "RunHandler throws: " + what(failure));
  fail(c, failure);
}

void Simulation::renew(Call& c) {
  Process& p = processes_[c.process];
  const std::optional<detail::RenewalStep> step = c.plan->renewal();
  if (!step) return;
  const detail::RenewalStep& renewal = *step;
  const PlanTime sent = p.plan_time(now_);
  std::exception_ptr failure;
  const std::optional<bool> owned = redis(
      c, [&] { return redis_->renew(renewal.key, renewal.owner_token, renewal.lease); }, failure);
  if (owned) {
    if (tracing()) trace(c, std::string("renew -> ") + (*owned ? "extended" : "lost"));
    in_process(c).renewed(*c.plan, sent, *owned);
  } else {
    if (tracing()) trace(c, "renew -> " + what(failure));
    in_process(c).renewed(*c.plan, sent, std::nullopt);
  }
}

// Reports a failed step. After the handler started, a cancellation, a commit whose outcome is
// unknown and any failure while a stop is requested leave the effect possibly half done: from
// here on the call's claim must keep its key until its lease ends.
void Simulation::fail(Call& c, std::exception_ptr failure) {
  if (c.handler_started) {
    const Process& p = processes_[c.process];
    const bool stopped = c.stop.stop_requested() || p.shutdown->stop_requested();
    if (is<Cancelled>(failure)) {
      protect_if_half_done(c, "cancelled");
    } else if (is<CommitOutcomeUnknown>(failure)) {
      protect_if_half_done(c, "commit outcome unknown");
    } else if (stopped) {
      protect_if_half_done(c, "failed while its stop was requested");
    }
  }
  report(c, detail::classify(std::move(failure)));
}

// Invariant: the claim of an execution that ended without a clean answer keeps its key until
// its lease ends (unless Redis itself lost the record).
void Simulation::check_claim(const Call& c, std::string_view key) {
  const auto found = protected_.find(key);
  if (found == protected_.end() || found->second.until <= now_) return;
  violate("claim-kept-after-unclean-end", c.logical,
          "c" + std::to_string(c.id) + " claimed " + std::string(key) + " FIRST at " +
              std::to_string(now_) + " ms, while the claim of c" +
              std::to_string(found->second.call) +
              " (which ended without a clean answer) was leased until " +
              std::to_string(found->second.until) + " ms");
}

void Simulation::protect_if_half_done(const Call& c, std::string_view how) {
  if (!c.handler_started || !c.holds) return;
  const std::optional<Time> until = redis_->expiry(c.key, c.owner_token);
  if (!until || *until <= now_) return;
  Protection& p = protected_[c.key];
  if (p.until < *until) p = Protection{*until, c.id};
  if (tracing()) {
    trace(c, "ended without a clean answer (" + std::string(how) + "): its claim is leased until " +
                 std::to_string(*until) + " ms");
  }
}

void Simulation::finish(Call& c, std::optional<Outcome> outcome, std::exception_ptr error) {
  Message& m = messages_[c.message];
  ++result_.endings.at(outcome ? static_cast<std::size_t>(outcome->kind) : 5);
  if (outcome) {
    if (tracing()) {
      trace(c, "returns " + std::string(to_string(outcome->kind)) + " (" +
                   std::string(to_string(outcome->layer)) + ")" +
                   (outcome->response ? " " + *outcome->response : "") +
                   (outcome->lease_lost ? " lease_lost" : ""));
    }
    check_outcome(c, *outcome);
  } else {
    if (tracing()) trace(c, "throws " + what(error));
    if (options_.bug == Bug::kReleaseOnCancel && is<Cancelled>(error) && c.holds &&
        now_ >= redis_down_until_) {
      (void)redis_->release(c.key, c.owner_token);  // planted: a cancellation releases the claim
      if (tracing()) trace(c, "(planted bug) released its claim on cancellation");
    }
  }
  if (result_.violation) return;
  // Final answers are acked (a decline too: retrying cannot change it); the rest is redelivered.
  const bool decided = outcome ? outcome->kind == Outcome::Kind::kExecuted ||
                                     outcome->kind == Outcome::Kind::kDuplicate ||
                                     outcome->kind == Outcome::Kind::kMismatch
                               : is<Declined>(error);
  m.call = 0;
  if (!c.acked_early) {
    if (decided) {
      ack(m, c);
    } else {
      nack(m);
    }
  }
  const int process = c.process;
  calls_.erase(c.id);  // `c` is gone from here on
  maybe_go_down(process);
}

void Simulation::check_outcome(const Call& c, const Outcome& outcome) {
  const std::vector<const Effect*> effects = pg_->effects_of(c.logical);
  const std::string who = "c" + std::to_string(c.id);
  switch (outcome.kind) {
    case Outcome::Kind::kExecuted: {
      const bool own = std::any_of(effects.begin(), effects.end(),
                                   [&](const Effect* e) { return e->call == c.id; });
      if (!own) {
        violate("outcomes-agree-with-the-ledger", c.logical,
                who + " answered kExecuted, but its effect is not in the ledger");
        return;
      }
      if (++executed_[c.logical] > 1) {
        violate("outcomes-agree-with-the-ledger", c.logical,
                who + " answered kExecuted for a logical request already executed");
        return;
      }
      if (c.returned_at && c.complete_answered && !outcome.lease_lost && !c.held_through_return) {
        violate("lease-lost-is-told", c.logical,
                who +
                    " answered kExecuted with lease_lost false, but its claim was gone (by "
                    "Redis) before its handler returned");
      }
      return;
    }
    case Outcome::Kind::kDuplicate:
      if (logicals_[c.logical].declined) {
        // The stored decline is replayed; nothing of the request ever commits.
        const std::string declined = Declined(c.logical).what();
        if (!effects.empty() || (outcome.response && *outcome.response != declined)) {
          violate("outcomes-agree-with-the-ledger", c.logical,
                  who + " answered kDuplicate " + outcome.response.value_or("(no response)") +
                      " for a declined request");
        }
      } else if (effects.empty()) {
        violate("outcomes-agree-with-the-ledger", c.logical,
                who + " answered kDuplicate (" + std::string(to_string(outcome.layer)) +
                    "), but no effect of the request ever committed");
      } else if (outcome.response && *outcome.response != effects.front()->response) {
        violate("outcomes-agree-with-the-ledger", c.logical,
                who + " replayed " + *outcome.response + ", but the committed effect answered " +
                    effects.front()->response);
      }
      return;
    case Outcome::Kind::kMismatch:
      violate("outcomes-agree-with-the-ledger", c.logical,
              who + " answered kMismatch, but every delivery carries the same payload");
      return;
    case Outcome::Kind::kInProgress:
    case Outcome::Kind::kUnavailable:
      return;
  }
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

// ---- faults and invariants ---------------------------------------------------------------------

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
                                      "FAULT #" + std::to_string(fault_number_ - 1) + " " +
                                          std::string(to_string(kind)) + ": " + std::move(text)});
  }
}

void Simulation::violate(std::string invariant, int logical, std::string detail) {
  if (result_.violation) return;
  result_.violation = Violation{std::move(invariant), logical, std::move(detail)};
}

void Simulation::final_checks() {
  for (std::size_t l = 0; l < logicals_.size(); ++l) {
    const std::size_t effects = pg_->effects_of(static_cast<int>(l)).size();
    if (effects != (logicals_[l].declined ? 0u : 1u)) {
      violate("eventually-exactly-once", static_cast<int>(l),
              "logical request " + std::to_string(l) + " committed " + std::to_string(effects) +
                  " times once every message was acked (a lost request)");
      return;
    }
  }
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

}  // namespace

// ---- the public face ---------------------------------------------------------------------------

namespace {
constexpr std::array<std::string_view, 4> kBugNames = {
    "none", "release-on-cancel", "complete-without-owner-check", "ack-before-commit"};
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

std::size_t RunResult::fault_count() const noexcept {
  std::size_t total = 0;
  for (const std::size_t n : faults) total += n;
  return total;
}

RunResult run(const RunOptions& options) { return Simulation(options).run(); }

Reproduction minimize(std::uint64_t seed, Bug bug) {
  RunOptions options{.seed = seed, .bug = bug};
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
      if (attempt.violation) {
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
