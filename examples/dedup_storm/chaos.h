// --chaos: what was failed over or restarted mid-run, and how long calls failed after it.
#pragma once

#include <chrono>
#include <cstddef>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "idem/metrics.h"

namespace storm {

using Clock = std::chrono::steady_clock;

/// One failover or restart during a configuration's run, and what it cost.
struct ChaosEvent {
  std::string backend;  ///< "redis" or "pg".
  std::string kind;     ///< "failover" (IDEM_FAILOVER_MS reported) or "restart".
  std::size_t at_delivery = 0;
  Clock::time_point started{};
  double command_ms = 0;  ///< How long the chaos command ran (the failover plus bringing the old
                          ///< node back as a replica, or the restart).
  /// The failover's own time as the command saw it: from the SIGKILL (or crash) until the new
  /// master (primary) answers. nullopt for a restart.
  std::optional<double> failover_ms;
  // Measured from the run, between this event and the next one (or the end of the main phase):
  std::size_t failed_attempts = 0;  ///< Deliveries that failed (error or Unavailable).
  double unavailable_ms = 0;        ///< From the event to the last failed attempt; 0: none failed.
  std::size_t redis_errors = 0;     ///< Redis guard backend errors the facade absorbed.
  double redis_error_ms = 0;        ///< From the event to the last of them.
  std::size_t pg_errors = 0;        ///< Postgres sink backend errors.
  double pg_error_ms = 0;           ///< From the event to the last of them.
};

/// Runs `command` with the shell; its stderr passes through, its stdout is scanned for
/// IDEM_FAILOVER_MS=N / IDEM_RESTART_MS=N. Returns the event with the timing filled in; a
/// command that failed is reported on stderr and still returned.
ChaosEvent run_chaos(const std::string& backend, const std::string& command,
                     std::size_t at_delivery);

/// Failed attempts and backend errors with their times, to attribute to chaos events. Receives
/// the facade's metrics (Metrics) of the configurations that have a guard or a sink.
/// Thread-safe.
class FailureLog final : public idem::Metrics {
 public:
  void record_decision(const idem::DecisionEvent&) noexcept override {}
  void record_backend_error(idem::Layer layer) noexcept override;
  void record_release() noexcept override {}
  void record_renewal(bool) noexcept override {}

  /// A delivery attempt failed (an exception, or Unavailable).
  void attempt_failed() noexcept;

  /// The handler's own COMMIT for `order_id` lost its connection before its answer came
  /// (pqxx::in_doubt_error): it may have committed.
  void commit_in_doubt(const std::string& order_id) noexcept;
  /// The orders of commit_in_doubt(), so far.
  [[nodiscard]] std::set<std::string> in_doubt_orders() const;

  /// Fills the measured fields of `events` (in time order); `end` closes the last one.
  void attribute(std::vector<ChaosEvent>& events, Clock::time_point end) const;

 private:
  struct Entry {
    Clock::time_point at;
    int what;  // 0 attempt, 1 redis error, 2 pg error
  };
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;
  std::set<std::string> in_doubt_;
};

/// The events as JSON objects, times in ms.
nlohmann::json to_json(const std::vector<ChaosEvent>& events);

/// The largest unavailable_ms among `events` (0 when none).
double max_unavailable_ms(const std::vector<ChaosEvent>& events);

}  // namespace storm
