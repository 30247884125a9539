// The conformance suite of the call plan's drivers: one table of scenarios (scenarios.cc), each run
// through every driver (the blocking Deduplicator, the AsyncDeduplicator, and a step driver over
// the simulator's backends), each asserting the same ending of every call and the same state
// afterwards. README.md beside this file says how a scenario reads and how to plug in a driver.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "backends.h"
#include "drivers.h"
#include "faulty_backends.h"
#include "idem/clock.h"
#include "idem/deduplicator.h"
#include "idem/metrics.h"

namespace idem::conformance {

class World;

/// A step of a call where a fault may be injected: the backend calls, and the handler's start.
enum class Op {
  kGuardClaim,
  kGuardComplete,
  kGuardRelease,
  kGuardRenew,
  kSinkClaim,
  kSinkComplete,
  kSinkRelease,
  kSinkRenew,
  kSinkBegin,      ///< BEGIN of a run_transactional() call (drivers with transactions).
  kCommit,         ///< COMMIT of a run_transactional() call (drivers with transactions).
  kHandler,        ///< The handler, when it starts (before Behaviour::on_start).
  kDecideFailure,  ///< DeduplicatorOptions::on_handler_failure, when the scenario sets one.
  kEmit,           ///< DeduplicatorOptions::on_decision, with each decision event.
};

/// What happens at the `nth` step `op` of call `call` (counted from 1, per call).
struct Fault {
  int call = 0;
  Op op = Op::kGuardClaim;
  int nth = 1;
  bool stop = false;              ///< Request the call's stop (Request::stop) first.
  bool stop_from_thread = false;  ///< The same, from another thread (joined before the step).
  /// Another thread requests the stop a millisecond later, while the step goes on (a handler
  /// that waits until stopped); joined when the call has ended.
  bool stop_later = false;
  bool shutdown = false;  ///< Shut the deduplicator down (TestDriver::shutdown()) first.
  bool deadline = false;  ///< Make the call's deadline pass first (drivers with a deadline).
  /// The call's deadline is still ahead here: it passes later, while the step goes on (a handler
  /// that waits until stopped is cut short by it).
  bool deadline_later = false;
  /// Then fail the step with this exception: before it reaches the backend, or with `after`
  /// once the backend applied it (its answer lost, as on a timeout).
  std::function<std::exception_ptr()> error{};
  bool after = false;
  bool unreplicated = false;  ///< kGuardClaim: the claim answers ClaimResult::replicated false.
  std::function<void(World&)> act{};  ///< Anything else, before the step.
};

/// One call of a scenario, and how it must end.
struct Call {
  Request request{};
  test::Behaviour handler{};
  bool transactional = false;            ///< run_transactional() (drivers with transactions).
  bool stopped_before = false;           ///< Its stop is requested before the call starts.
  std::function<void(World&)> before{};  ///< Acts on the world first (another process, clocks).
  /// The ending, as render_ending() writes it: "executed handler response=done", "duplicate
  /// redis_guard replayed response=done", "throws MissingKey", ...
  std::string ending{};
  /// Times the handler ran; -1: once when `ending` starts with "executed", else never.
  int runs = -1;
  /// What the handler saw, as render_saw() writes it; empty: not checked.
  std::string saw{};
};

/// The state of one key afterwards, in each layer, as probe_guard() / probe_sink() /
/// the local cache probe render it: "absent", "in_progress", "completed(response)",
/// "completed(sha256)" (over the size cap), "completed()" (no response kept); the local cache:
/// "hit(response)" or "miss". Empty: not checked (the layer is not configured).
struct Held {
  int call = 0;       ///< The key of this call's request...
  std::string key{};  ///< ... or this key text.
  std::string guard{};
  std::string sink{};
  std::string local{};
};

/// One row of the table.
struct Scenario {
  std::string name{};  ///< CamelCase: the test's name.
  std::string area{};  ///< Which part of the rules (for the counts by area).
  std::string row{};   ///< The row of docs/semantics.md it proves (empty: none of the table).
  bool guard = true;
  bool sink = false;
  std::function<void(DeduplicatorOptions&)> options{};
  std::chrono::milliseconds guard_lease{std::chrono::seconds(30)};
  std::size_t sink_max_response_bytes = std::size_t{64} * 1024;
  std::vector<Call> calls{};
  std::vector<Fault> faults{};
  std::vector<Held> held{};
  std::vector<std::string> events{};  ///< As render_event() writes them, in order.
  std::string metrics{};              ///< As RecordingMetrics::render() writes them.
  bool needs_deadline = false;
  bool needs_transactions = false;
  /// Drivers it does not apply to, and why (the backends cannot express it).
  std::map<std::string, std::string> not_on{};
  /// Drivers known to break a rule here: the scenario is skipped there with this reason.
  std::map<std::string, std::string> known_divergence{};
};

/// The table.
[[nodiscard]] const std::vector<Scenario>& scenarios();

/// Which backends a driver runs over.
enum class Backends { kInMemory, kSimulated };

/// A driver of the suite: its name (in test names), its backends, and how to make it.
struct DriverSpec {
  std::string name{};
  Backends backends = Backends::kInMemory;
  std::function<std::unique_ptr<test::TestDriver>(World&, test::DriverSetup)> make;
};

/// Every driver the suite runs.
[[nodiscard]] const std::vector<DriverSpec>& drivers();

/// Counts of the Metrics calls, and the library's own counters beside them.
class RecordingMetrics final : public Metrics {
 public:
  void record_decision(const DecisionEvent& event) noexcept override;
  void record_handler_failure(const DecisionEvent& event) noexcept override;
  void record_failed_release(const DecisionEvent& event) noexcept override {
    library_.record_failed_release(event);
  }
  void record_backend_error(Layer layer) noexcept override;
  void record_release() noexcept override { releases_.fetch_add(1); }
  void record_renewal(bool ok) noexcept override { (ok ? renewals_ok_ : renewals_failed_)++; }
  /// "decisions=1 guard_errors=1 ...": each count that is not zero, in a fixed order; "none".
  [[nodiscard]] std::string render() const;

 private:
  InProcessMetrics library_;
  std::atomic<int> decisions_{0};
  std::atomic<int> failures_{0};
  std::atomic<int> guard_errors_{0};
  std::atomic<int> sink_errors_{0};
  std::atomic<int> releases_{0};
  std::atomic<int> renewals_ok_{0};
  std::atomic<int> renewals_failed_{0};
};

/// The backends of one scenario's run, the hooks that inject its faults, and what it recorded.
class World {
 public:
  World(const Scenario& scenario, Backends backends);
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  /// The driver's setup: the scenario's options over these backends.
  [[nodiscard]] test::DriverSetup setup(std::chrono::milliseconds deadline) const;
  void attach(test::TestDriver& driver) { driver_ = &driver; }

  // ---- the backends --------------------------------------------------------------------------
  [[nodiscard]] Guard& guard() { return guard_->inner(); }
  [[nodiscard]] Sink& sink() { return sink_->inner(); }
  /// The simulated PostgreSQL (Backends::kSimulated), for the transactions of the sim driver.
  [[nodiscard]] sim::SimPostgres* sim_postgres() const { return sim_pg_.get(); }
  /// Moves the guard's (the sink's) clock: leases and retention end by it.
  void advance_guard(std::chrono::milliseconds by);
  void advance_sink(std::chrono::milliseconds by);

  // ---- another process, acting on the backends directly --------------------------------------
  /// Claims `key` for `request_id` in the guard (the sink), as another process does.
  void claim_elsewhere(const std::string& key, const std::string& request_id,
                       const std::string& fingerprint = "");
  void sink_claim_elsewhere(const std::string& key, const std::string& request_id);
  /// Completes the sink row sink_claim_elsewhere() took of `key`, with `response`.
  void sink_complete_elsewhere(const std::string& key, const std::string& response);
  /// Completes (releases) the claim claim_elsewhere() took of `key`.
  void complete_elsewhere(const std::string& key, const std::string& response);
  void release_elsewhere(const std::string& key);
  /// A completed record of `key` in the guard, as another process leaves it.
  void completed_elsewhere(const std::string& key, const std::string& response);

  // ---- the calls -----------------------------------------------------------------------------
  /// Starts call `index`: its stop, its counts of steps.
  void begin_call(int index);
  /// The call has ended: a thread that was to stop it is joined.
  void end_call() {
    if (stopper_.joinable()) stopper_.join();
  }
  [[nodiscard]] std::stop_token stop_token() const { return stop_.get_token(); }
  void request_stop() { stop_.request_stop(); }
  /// The deduplicator's shutdown(), between calls.
  void shutdown() { driver_->shutdown(); }
  /// A step `op` of the running call begins (`claim`: a guard claim's answer, after it).
  void before(Op op);
  void after(Op op);
  void claimed(ClaimResult& claim);
  /// A deadline fault found the deadline passed already, or never ran: the run is inconclusive.
  [[nodiscard]] bool late() const;
  /// The faults that never came to their step ("call 0 GuardClaim #2"): a scenario whose fault
  /// does not fire tests nothing of it.
  [[nodiscard]] std::vector<std::string> unfired() const;
  /// No more faults or recording: the probes run.
  void quiet() { quiet_ = true; }

  // ---- what was recorded ---------------------------------------------------------------------
  [[nodiscard]] const std::vector<std::string>& events() const { return events_; }
  [[nodiscard]] std::string metrics() const { return metrics_->render(); }
  /// The key text call `index` acted on (its named key, else the key its event or handler saw).
  [[nodiscard]] std::string key_of_call(int index, const std::string& seen) const;

 private:
  void on_decision(const DecisionEvent& event);
  [[nodiscard]] const Fault* fault_at(Op op, bool after_step);

  const Scenario& scenario_;
  std::shared_ptr<ManualClock> guard_clock_ = std::make_shared<ManualClock>(1'000'000);
  std::shared_ptr<ManualClock> sink_clock_ = std::make_shared<ManualClock>(1'000'000);
  sim::Time guard_now_ = 1'000'000;
  sim::Time sink_now_ = 1'000'000;
  std::shared_ptr<sim::SimPostgres> sim_pg_;
  std::shared_ptr<test::FaultyGuard> guard_;
  std::shared_ptr<test::FaultySink> sink_;
  std::shared_ptr<RecordingMetrics> metrics_ = std::make_shared<RecordingMetrics>();
  std::map<std::string, std::string> elsewhere_tokens_;  // key -> the other process's owner
  std::vector<std::string> events_;
  std::map<int, std::string> event_keys_;  // call -> the key its event named
  test::TestDriver* driver_ = nullptr;
  int call_ = 0;
  std::stop_source stop_;
  std::map<Op, int> counts_;
  std::vector<bool> fired_ = std::vector<bool>(scenario_.faults.size());
  std::jthread stopper_;  // stop_later's thread
  int deadlines_passed_ = 0;
  bool deadline_late_ = false;
  bool quiet_ = false;
};

// ---- rendering, for expectations that read as text ---------------------------------------------

/// "executed handler response=done", "duplicate redis_guard replayed response=done",
/// "unavailable redis_guard error=...", "throws Cancelled", "throws BusinessError(refused)".
[[nodiscard]] std::string render_ending(const test::Ending& ending);
/// "key=ok request_id=r1 fingerprint=yes attempt=1 renewed=false lease_lost": `key=ok` when the
/// handler saw `key`.
[[nodiscard]] std::string render_saw(const test::Saw& saw, const std::string& key);
/// The state of `key` in a guard / a sink, read by a claim of its own (released when it was
/// the first).
[[nodiscard]] std::string probe_guard(Guard& guard, const std::string& key);
[[nodiscard]] std::string probe_sink(Sink& sink, const std::string& key);
/// The key text of a request with a business key or a request ID; empty for a fallback key.
[[nodiscard]] std::string named_key(const Request& request);

}  // namespace idem::conformance
