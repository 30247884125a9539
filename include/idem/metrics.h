// Observability: one structured event per decision, and counters you can scrape.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/export.h"
#include "idem/outcome.h"

namespace idem {

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
  /// handler's own (a business failure; its claim was released), or idem's completion or the
  /// commit after the handler returned. The exception still propagates to the caller; `outcome`
  /// is then kExecuted and `layer` kHandler. A cancellation (idem::Cancelled) and an error
  /// before the handler (bad input, a ConfigError) emit no event.
  bool handler_failed = false;
  /// handler_failed: the exception's what() as thrown, or "unknown exception". It may hold line
  /// breaks (PostgreSQL's messages do) and any byte: escape it before a line-based log.
  std::string_view error{};
};

/// Receives the facade's counts. Implementations must be thread-safe and must not throw.
class IDEM_EXPORT Metrics {
 public:
  virtual ~Metrics() = default;
  /// One call of Deduplicator::run() or run_transactional() that produced an outcome.
  virtual void record_decision(const DecisionEvent& event) noexcept = 0;
  /// One call whose handler failed (`event.handler_failed`; see DecisionEvent). Such a call
  /// produced no outcome and is not passed to record_decision(). Default: ignored.
  virtual void record_handler_failure(const DecisionEvent& event) noexcept { (void)event; }
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
};

/// Lock-free in-process counters and latency histograms, rendered in the Prometheus text
/// exposition format (version 0.0.4). Thread-safe.
class IDEM_EXPORT InProcessMetrics final : public Metrics {
 public:
  /// Upper bounds of the latency histogram buckets, in microseconds (+Inf is implicit).
  static constexpr std::array<std::int64_t, 12> kLatencyBucketsUs = {
      50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 100000, 500000, 2000000};

  void record_decision(const DecisionEvent& event) noexcept override;
  void record_handler_failure(const DecisionEvent& event) noexcept override;
  void record_backend_error(Layer layer) noexcept override;
  void record_release() noexcept override;
  void record_renewal(bool ok) noexcept override;
  void record_foreign_record(Layer layer) noexcept override {
    (void)layer;
    foreign_records_.fetch_add(1, std::memory_order_relaxed);
  }

  /// Decisions of `kind` taken by `layer` so far.
  [[nodiscard]] std::uint64_t decisions(Layer layer, Outcome::Kind kind) const noexcept;
  /// All decisions so far (calls whose handler failed are not decisions).
  [[nodiscard]] std::uint64_t total_decisions() const noexcept;
  /// Calls whose handler failed so far.
  [[nodiscard]] std::uint64_t handler_failures() const noexcept;
  /// Foreign or damaged values found under idem keys so far (record_foreign_record()).
  [[nodiscard]] std::uint64_t foreign_records() const noexcept {
    return foreign_records_.load(std::memory_order_relaxed);
  }
  /// Backend errors of `layer` so far.
  [[nodiscard]] std::uint64_t backend_errors(Layer layer) const noexcept;
  /// The seed's duplicate rate: (Redis guard rejects + Postgres sink conflicts) / total calls,
  /// where a reject is any outcome other than kExecuted that the layer decided. 0 when no calls.
  [[nodiscard]] double duplicate_rate() const noexcept;

  /// Metrics as Prometheus text: `idem_decisions_total{layer,outcome}`,
  /// `idem_handler_failures_total`, `idem_backend_errors_total{layer}`, `idem_releases_total`,
  /// `idem_renewals_total{result}`, `idem_duplicate_rate`, and the histogram
  /// `idem_decision_latency_us{layer}`.
  [[nodiscard]] std::string prometheus_text() const;

 private:
  static constexpr std::size_t kLayers = 5;
  static constexpr std::size_t kKinds = 5;
  std::array<std::atomic<std::uint64_t>, kLayers * kKinds> decisions_{};
  std::array<std::atomic<std::uint64_t>, kLayers> backend_errors_{};
  std::array<std::array<std::atomic<std::uint64_t>, kLatencyBucketsUs.size() + 1>, kLayers>
      latency_buckets_{};
  std::array<std::atomic<std::int64_t>, kLayers> latency_sum_us_{};
  std::atomic<std::uint64_t> handler_failures_{0};
  std::atomic<std::uint64_t> releases_{0};
  std::atomic<std::uint64_t> renewals_ok_{0};
  std::atomic<std::uint64_t> renewals_failed_{0};
  std::atomic<std::uint64_t> foreign_records_{0};
};

}  // namespace idem
