// Observability: one structured event per decision, and counters you can scrape.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "idem/export.h"
#include "idem/outcome.h"

namespace idem {

class Guard;
class RedisGuard;
class PgSink;
class Sink;

/// What the facade decided for one call. The views are valid only during the callback.
struct DecisionEvent {
  std::string_view request_id{};   ///< Validated request ID; empty when the request had none.
  std::string_view key{};          ///< The idempotency key text (escaped, safe to log).
  std::string_view fingerprint{};  ///< Payload fingerprint (hex); empty when not computed.
  Layer layer = Layer::kHandler;   ///< The layer that decided.
  Outcome::Kind outcome = Outcome::Kind::kExecuted;  ///< What was decided.
  std::chrono::microseconds latency{0};              ///< Whole call, handler included.
  int attempt = 1;  ///< Request::attempt: the delivery count the caller reported.
  /// The handler was called and the call ended in an exception instead of an outcome: the
  /// handler's own (a business failure; the claim then follows the FailureAction), or idem's
  /// completion or the commit after the handler returned. The exception still propagates to the
  /// caller; `outcome` is then kExecuted and `layer` kHandler. A cancellation (idem::Cancelled) and
  /// an error before the handler (bad input, a ConfigError) emit no event, unless a release of a
  /// claim the call took failed (see ended_before_handler).
  bool handler_failed = false;
  /// handler_failed: the exception's what() as thrown, or "unknown exception". It may hold line
  /// breaks (PostgreSQL's messages do) and any byte: escape it before a line-based log.
  std::string_view error{};
  /// kExecuted: what failed when the handler's response could not be saved in every layer that
  /// holds the claim (Outcome::save_error, "layer: error"); empty when it was.
  std::string_view save_error{};
  /// What failed when a release of this call's claim failed (after a handler failure, or when a
  /// later layer stopped the call), as "layer: error": the claim stays until its lease ends, so
  /// repeats get kInProgress meanwhile. Empty when every release succeeded. The handler's own
  /// exception still propagates unchanged.
  std::string_view release_error{};
  /// The call ended by an exception that decides nothing (before its handler ran: a stop, its
  /// deadline, bad input a backend found; or a cancellation, also of a handler that had
  /// started) and a release of a claim it took before its handler ran failed (`release_error`;
  /// e.g. a claim given up to wait for another execution): such a call emits this one event so
  /// that the claim left until its lease ends is told with its key.
  /// `error` is the exception's what(); `layer` and `outcome` mean nothing. Passed to
  /// Metrics::record_failed_release(), not record_decision().
  bool ended_before_handler = false;
  /// Set when the call had no idempotency key and ran unguarded (MissingKeyPolicy::
  /// kPassThrough): why it had none (e.g. the fingerprint's selection held nothing to key on).
  std::string_view unkeyed{};
};

/// How one Context::step() (or AsyncContext::step()) ended, for Metrics::record_step(). A step
/// whose `fn` threw, or that ended in idem::StepInputMismatch, is not counted.
enum class StepEnding : std::uint8_t {
  kJournaled,  ///< It ran, and its result was journaled beside the call's guard claim.
  kReplayed,   ///< Its journaled result was returned; it did not run.
  /// It ran in run_transactional() and wrote through the transaction: not journaled (it commits
  /// with the call's record, or runs again).
  kInTransaction,
  kUnguarded,  ///< It ran with no guard claim to journal beside (Redis skipped under kFailOpen).
  kClaimLost,  ///< It ran, but its journal write was refused: idem::ClaimLost.
  /// It ran, and its result was over DeduplicatorOptions::max_step_result_bytes: not journaled.
  kTooLarge,
};
/// The label of `ending`: "journaled", "replayed", "in_transaction", "unguarded", "claim_lost",
/// "too_large". Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string_view to_string(StepEnding ending) noexcept;

/// Receives the facade's counts. Implementations must be thread-safe and must not throw.
class IDEM_EXPORT Metrics {
 public:
  virtual ~Metrics() = default;
  /// One call of Deduplicator::run() or run_transactional() that produced an outcome.
  virtual void record_decision(const DecisionEvent& event) noexcept = 0;
  /// One call whose handler failed (`event.handler_failed`; see DecisionEvent). Such a call
  /// produced no outcome and is not passed to record_decision(). Default: ignored.
  virtual void record_handler_failure(const DecisionEvent& event) noexcept { (void)event; }
  /// One call that ended before its handler ran with a failed release
  /// (DecisionEvent::ended_before_handler). Default: ignored.
  virtual void record_failed_release(const DecisionEvent& event) noexcept { (void)event; }
  /// A backend call of `layer` failed (the facade then applied its failure policy).
  virtual void record_backend_error(Layer layer) noexcept = 0;
  /// This call released its Redis claim (business failure, or a later layer stopped it).
  virtual void record_release() noexcept = 0;
  /// A lease renewal succeeded (`ok`) or failed.
  virtual void record_renewal(bool ok) noexcept = 0;
  /// A backend of `layer` found a value under an idem key that idem did not write, or a damaged
  /// one (idem::ForeignRecord), and refused to read it as a record. Called by the guard itself
  /// (RedisGuardOptions::metrics), also when the caller sees only the exception; the facade
  /// then applies its failure policy as for any backend error. Default: ignored.
  virtual void record_foreign_record(Layer layer) noexcept { (void)layer; }
  /// A step of a handler ended (see StepEnding). Called on the handler's thread (the loop for
  /// the async driver). Default: ignored.
  virtual void record_step(StepEnding ending) noexcept { (void)ending; }
  /// Tells the metrics which backends the calls it counts go to (either may be null), so that
  /// gauges can be read from them at scrape time (InProcessMetrics reports a RedisGuard's
  /// breaker and pool and a PgSink's pool). Safe to call again with the same backends, from
  /// any thread. Default: ignored.
  virtual void watch_backends(const std::shared_ptr<Guard>& guard,
                              const std::shared_ptr<Sink>& sink) noexcept {
    (void)guard;
    (void)sink;
  }
};

/// In-process counters, latency histograms and backend gauges, rendered in the Prometheus
/// text exposition format (version 0.0.4) by Prometheus' naming conventions: base units
/// (seconds), `_total` counters. Thread-safe; recording is lock-free (relaxed atomics).
class IDEM_EXPORT InProcessMetrics final : public Metrics {
 public:
  /// Upper bounds of the latency histogram buckets, in microseconds (+Inf is implicit); the
  /// text renders them in seconds (`le="0.00005"` … `le="2"`).
  static constexpr std::array<std::int64_t, 12> kLatencyBucketsUs = {
      50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 100000, 500000, 2000000};

  void record_decision(const DecisionEvent& event) noexcept override;
  void record_handler_failure(const DecisionEvent& event) noexcept override;
  void record_failed_release(const DecisionEvent& event) noexcept override {
    count_failed_writes(event);
  }
  void record_backend_error(Layer layer) noexcept override;
  void record_release() noexcept override;
  void record_renewal(bool ok) noexcept override;
  void record_foreign_record(Layer layer) noexcept override {
    (void)layer;
    foreign_records_.fetch_add(1, std::memory_order_relaxed);
  }
  void record_step(StepEnding ending) noexcept override {
    steps_[static_cast<std::size_t>(ending)].fetch_add(1, std::memory_order_relaxed);
  }
  /// Watches `guard` when it is a RedisGuard and `sink` when it is a PgSink (see watch()).
  void watch_backends(const std::shared_ptr<Guard>& guard,
                      const std::shared_ptr<Sink>& sink) noexcept override;

  /// Reports `guard`'s circuit breaker and connection pool as gauges in prometheus_text().
  /// Holds it weakly: a destroyed guard drops out. Watching the same guard twice counts it
  /// once. Several guards add up (per breaker state, per pool figure). Thread-safe.
  void watch(const std::shared_ptr<const RedisGuard>& guard);
  /// Reports `sink`'s connection pool as gauges in prometheus_text(); as watch(guard).
  void watch(const std::shared_ptr<const PgSink>& sink);

  /// Decisions of `kind` taken by `layer` so far.
  [[nodiscard]] std::uint64_t decisions(Layer layer, Outcome::Kind kind) const noexcept;
  /// All decisions so far (calls whose handler failed are not decisions).
  [[nodiscard]] std::uint64_t total_decisions() const noexcept;
  /// Calls whose handler failed so far.
  [[nodiscard]] std::uint64_t handler_failures() const noexcept;
  /// Calls that executed but whose response a layer failed to save (DecisionEvent::save_error).
  [[nodiscard]] std::uint64_t unsaved_results() const noexcept {
    return unsaved_results_.load(std::memory_order_relaxed);
  }
  /// Calls a release of whose claim failed (DecisionEvent::release_error).
  [[nodiscard]] std::uint64_t failed_releases() const noexcept {
    return failed_releases_.load(std::memory_order_relaxed);
  }
  /// Foreign or damaged values found under idem keys so far (record_foreign_record()).
  [[nodiscard]] std::uint64_t foreign_records() const noexcept {
    return foreign_records_.load(std::memory_order_relaxed);
  }
  /// Steps that ended as `ending` so far (record_step()).
  [[nodiscard]] std::uint64_t steps(StepEnding ending) const noexcept {
    return steps_[static_cast<std::size_t>(ending)].load(std::memory_order_relaxed);
  }
  /// Backend errors of `layer` so far.
  [[nodiscard]] std::uint64_t backend_errors(Layer layer) const noexcept;
  /// The seed's duplicate rate, and only it: (Redis guard rejects + Postgres sink unique
  /// conflicts) / calls, where a reject or conflict is a kDuplicate, kInProgress or kMismatch
  /// decided by that layer, and calls are all decisions. A kUnavailable (a backend down under
  /// fail_closed) is no duplicate; repeats stopped by layer 1 or the fingerprint layer are not
  /// in the seed's formula (idem_decisions_total has them). 0 when no calls.
  [[nodiscard]] double duplicate_rate() const noexcept;

  /// Metrics as Prometheus text: counters `idem_decisions_total{layer,outcome}`,
  /// `idem_handler_failures_total`, `idem_unsaved_results_total`, `idem_failed_releases_total`,
  /// `idem_foreign_records_total`, `idem_steps_total{ending}` (StepEnding),
  /// `idem_backend_errors_total{layer}`, `idem_releases_total`,
  /// `idem_renewals_total{result}`; the gauge `idem_duplicate_rate`; the histogram
  /// `idem_decision_duration_seconds{layer}` (the whole call, handler included); and for what
  /// watch() was given, the gauges `idem_redis_breaker_state{state}` (guards in closed, open,
  /// half_open) and `idem_pool_connections_max`, `idem_pool_connections_open`,
  /// `idem_pool_connections_in_use`, `idem_pool_waiters` `{layer}` (see PoolStats): a blocking
  /// RedisGuard's and PgSink's (an AsyncDeduplicator's clients report none).
  /// docs/prometheus/ has a scrape configuration, alert rules and a Grafana dashboard for them.
  [[nodiscard]] std::string prometheus_text() const;

 private:
  static constexpr std::size_t kLayers = 5;
  static constexpr std::size_t kKinds = 5;
  std::array<std::atomic<std::uint64_t>, kLayers * kKinds> decisions_{};
  std::array<std::atomic<std::uint64_t>, kLayers> backend_errors_{};
  std::array<std::array<std::atomic<std::uint64_t>, kLatencyBucketsUs.size() + 1>, kLayers>
      latency_buckets_{};
  std::array<std::atomic<std::int64_t>, kLayers> latency_sum_us_{};
  void count_failed_writes(const DecisionEvent& event) noexcept;

  std::atomic<std::uint64_t> handler_failures_{0};
  std::atomic<std::uint64_t> unsaved_results_{0};
  std::atomic<std::uint64_t> failed_releases_{0};
  std::atomic<std::uint64_t> releases_{0};
  std::atomic<std::uint64_t> renewals_ok_{0};
  std::atomic<std::uint64_t> renewals_failed_{0};
  std::atomic<std::uint64_t> foreign_records_{0};
  std::array<std::atomic<std::uint64_t>, 6> steps_{};  // by StepEnding
  mutable std::mutex watched_mutex_;
  std::vector<std::weak_ptr<const RedisGuard>> guards_;  // guarded by watched_mutex_
  std::vector<std::weak_ptr<const PgSink>> sinks_;       // guarded by watched_mutex_
};

}  // namespace idem
