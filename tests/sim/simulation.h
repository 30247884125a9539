// The deterministic simulation of idem's call plan (docs/simulation.md): many concurrent calls
// of detail::CallPlan (src/facade/plan.h), in run_transactional() and run() mode, with and
// without a sink, interleaved by one seeded scheduler on one thread, against a simulated Redis
// guard, a simulated PostgreSQL (the sink's rows and a business ledger) and simulated processes
// with local caches and clocks of their own. The seed decides the configuration, the workload
// (duplicates from every source of the storm demo, keys reused with another payload, requests
// keyed by their payload or by nothing), every interleaving, every stop, deadline and fault, so
// a failing seed replays exactly. The invariants are checked as the run goes and when it has
// drained; the first violation ends the run.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backends.h"
#include "facade/plan.h"

namespace idem::sim {

/// A bug planted in the simulator's own driver or backends, to show that the invariants catch
/// it (production code is never changed).
enum class Bug {
  kNone,
  kReleaseOnCancel,                ///< The driver releases the guard claim of a cancelled call.
  kCompleteWithoutOwnerCheck,      ///< The guard's complete marks any live record COMPLETED.
  kAckBeforeCommit,                ///< The consumer acks its message when the handler returns.
  kKeyFromEmptySelection,          ///< The driver keys a request without ID or business key by the
                                   ///< fingerprint of its selection, even an empty one.
  kStopIgnoredBeforeHandler,       ///< The driver tells the plan of no stop until the handler runs.
  kReleaseOnDeadline,              ///< The driver releases the guard claim of a call whose deadline
                                   ///< passed while its handler ran.
  kFailedCompletionReportedSaved,  ///< The driver reports a guard complete that failed as done.
  kFailedReleaseReportedDone,      ///< The driver reports a release that failed as done.
  kGuardIgnoresFingerprint,        ///< The guard answers every repeat as the same payload.
  kGuardKeepsOverCapBody,          ///< The guard keeps a response over its size cap.
  kRepeatReportedAsSameRequest,    ///< The guard answers REPEAT_SAME whatever the request ID.
  kBucketProbeSkipped,     ///< The driver answers the previous time bucket's probe FIRST unasked.
  kInterruptAfterHandler,  ///< The driver cuts steps short after the handler returned too.
  kInterruptedCallSkipsRelease,  ///< Stopped or past its deadline before its handler, the driver
                                 ///< reports the release of the call's claim done without sending
                                 ///< it.
  kSinkBusyReportedClaimed,      ///< The driver reports a run() sink row another attempt holds
                                 ///< as claimed.
  kGuardForgetsEarly,  ///< The guard keeps a completed record for the lease, not the retention.
  kJournalWithoutOwnerCheck,  ///< The guard journals a step whoever owns the key's record.
};
inline constexpr std::size_t kBugs = static_cast<std::size_t>(Bug::kJournalWithoutOwnerCheck) + 1;

/// "none", "release-on-cancel", ..., as `--bug` takes them (docs/simulation.md).
[[nodiscard]] std::string_view to_string(Bug bug) noexcept;
/// The bug of a name of to_string(); nullopt for an unknown name.
[[nodiscard]] std::optional<Bug> parse_bug(std::string_view name) noexcept;

/// The faults the seed injects.
enum class Fault {
  kCrash,                   ///< A process dies: its calls vanish, their messages come back later.
  kShutdown,                ///< A process shuts down: its calls are stopped, then it restarts.
  kPause,                   ///< A process freezes (GC, VM steal): its handlers outlive leases.
  kClockSkew,               ///< A process's monotonic clock changes rate (up to +-10 %).
  kCancel,                  ///< One call's Request::stop is requested.
  kRedisRestart,            ///< Redis restarts without persistence: every record lost.
  kRedisFailover,           ///< A replica up to max_lag behind takes over: recent writes lost.
  kRedisOutage,             ///< Redis refuses connections for a while (nothing lost).
  kRedisEviction,           ///< Redis evicts one live record (maxmemory).
  kPgOutage,                ///< PostgreSQL restarts: open transactions roll back, then it is down.
  kRedisTimeoutApplied,     ///< A Redis command times out after it took effect.
  kRedisTimeoutLost,        ///< A Redis command times out without taking effect.
  kPgTimeout,               ///< A statement times out: the connection and its transaction go.
  kCommitUnknownCommitted,  ///< The commit's answer is lost; it did commit.
  kCommitUnknownLost,       ///< The commit's answer is lost; it did not commit.
  kCommitRefused,           ///< The server refuses the commit (serialization failure).
  kSlowHandler,             ///< A handler runs 1-3 leases long.
  kHandlerFailure,          ///< A handler throws a (transient) business error.
  kAckLost,                 ///< The broker loses an ack: the message is redelivered.
};
inline constexpr std::size_t kFaultKinds = static_cast<std::size_t>(Fault::kAckLost) + 1;
/// A short name ("crash", "redis-failover", ...).
[[nodiscard]] std::string_view to_string(Fault fault) noexcept;

/// What the calls of a run did and met, counted for coverage (idem-sim prints them).
enum class Tally {
  // How each call runs and how it is keyed.
  kTransactional,       ///< run_transactional().
  kRun,                 ///< run() with the sink.
  kRunWithoutSink,      ///< run() with the guard alone.
  kBusinessKey,         ///< Keyed by (user, intent, business key).
  kRequestId,           ///< Keyed by its request ID alone.
  kFallbackKey,         ///< No request ID, no business key: keyed by its payload's fingerprint.
  kBucketed,            ///< ... in a time bucket (the previous bucket probed).
  kMissingKey,          ///< No key at all (a selection that holds nothing): MissingKey.
  kPassThrough,         ///< No key at all: run unguarded (MissingKeyPolicy::kPassThrough).
  kMismatchingPayload,  ///< A key reused with another payload.
  kReentrantRun,        ///< A retry of a reentrant intent run unclaimed beside the first.
  kOverCapReplay,       ///< A replay of a response over the size cap.
  // Stops, by where the call was when its stop was requested.
  kStoppedBeforeStart,    ///< Before its first step.
  kStoppedBeforeHandler,  ///< While it claimed or waited (not on a lock).
  kStoppedInLockWait,     ///< While its sink claim waited on the key's lock.
  kStoppedMidHandler,     ///< While its handler ran.
  kStoppedAfterHandler,   ///< After its handler returned (completion, commit).
  // Deadlines, by where the call was when its deadline passed.
  kDeadlineBeforeHandler,
  kDeadlineInLockWait,
  kDeadlineMidHandler,
  kDeadlineAfterHandler,
  kCutShort,  ///< Interruptible steps the driver cut short (a stop, the deadline).
  // Saves.
  kFailedCompletion,  ///< Completions that failed after the handler ran.
  kFailedRelease,     ///< Releases that failed.
  // Steps inside a handler (Context::step()).
  kStepRun,       ///< Steps whose function ran.
  kStepReplayed,  ///< Steps answered from the journal.
  kStepFenced,    ///< Step results the guard refused to journal (the claim was another's).
  kStepRerun,  ///< Steps run again, by an attempt that lost its claim, after they were journaled.
};
inline constexpr std::size_t kTallies = static_cast<std::size_t>(Tally::kStepRerun) + 1;
/// A short name ("transactional", "stopped-in-lock-wait", ...).
[[nodiscard]] std::string_view to_string(Tally tally) noexcept;

/// What one run is asked to do.
struct RunOptions {
  std::uint64_t seed = 1;
  Bug bug = Bug::kNone;
  /// Keep a trace of every step and fault (a re-run of a failing seed does).
  bool trace = false;
  /// Faults not to inject, by number (the order in which the run drew them): minimize() uses it.
  std::set<int> suppressed{};
};

/// A broken invariant.
struct Violation {
  std::string invariant;  ///< Its name (see docs/simulation.md).
  int logical = -1;       ///< The logical request concerned, -1 when none.
  std::string detail;     ///< What was seen.
};

/// One line of a trace.
struct TraceLine {
  Time at = 0;         ///< Simulated time, ms.
  int logical = -1;    ///< The logical request the step served; -1 for the world's events.
  bool fault = false;  ///< An injected fault.
  std::string text;
};

/// What one run did.
struct RunResult {
  std::uint64_t seed = 0;
  std::string config;        ///< The configuration the seed chose, one line.
  std::size_t steps = 0;     ///< Scheduling points run (plan steps, handler ticks, events).
  std::size_t calls = 0;     ///< Deduplicator calls started.
  std::size_t logicals = 0;  ///< Logical requests of the workload.
  std::size_t messages = 0;  ///< Their messages (duplicates included).
  std::array<std::size_t, kFaultKinds> faults{};  ///< Faults injected, by kind.
  /// Plan steps performed, by detail::StepKind (kLocalGet ... kThrow), in that order.
  std::array<std::size_t, detail::kStepKinds> plan_steps{};
  /// How calls ended, by Outcome::Kind (kExecuted ... kUnavailable), then by an exception.
  std::array<std::size_t, 6> endings{};
  std::array<std::size_t, kTallies> tallies{};  ///< Coverage, by Tally.
  std::vector<int> injected;  ///< Numbers of the faults injected (see RunOptions::suppressed).
  std::optional<Violation> violation;
  std::vector<TraceLine> trace;  ///< With RunOptions::trace.

  [[nodiscard]] std::size_t fault_count() const noexcept;
};

/// The name of a plan step by its number (RunResult::plan_steps): "LocalGet" ... "Throw".
[[nodiscard]] std::string_view step_name(std::size_t kind);

/// Runs one seed. Deterministic: the same options give the same result.
[[nodiscard]] RunResult run(const RunOptions& options);

/// A failing seed made small: faults are taken out one at a time while the run still breaks an
/// invariant (so each fault left is needed), then the run is traced.
struct Reproduction {
  RunResult run;             ///< The traced run with the faults left.
  std::set<int> suppressed;  ///< The faults taken out.
  /// The violation, then the steps of the logical request concerned and every fault, one per
  /// line.
  std::string text;
};

/// Minimizes a failing seed (`run({seed, bug})` must break an invariant).
[[nodiscard]] Reproduction minimize(std::uint64_t seed, Bug bug);
/// The same for a run of `options` (its seed and bug).
[[nodiscard]] Reproduction minimize(RunOptions options);

}  // namespace idem::sim
