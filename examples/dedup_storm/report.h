// idem-storm's results and the three ways it reports them: the table on stdout, --report-json
// and --report-html (one self-contained HTML file with SVG charts, nothing fetched).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "chaos.h"

namespace storm {

/// What one configuration's run counted.
struct ConfigResult {
  std::size_t deliveries = 0;
  std::size_t duplicates_injected = 0;
  std::int64_t duplicate_effects = 0;
  /// Of them, booked by the late redeliveries (after the retention, when no guard remembers the
  /// request any more: only the sink's record can stop them).
  std::int64_t late_duplicate_effects = 0;
  /// Of the main phase's, booked again after the handler's own COMMIT lost its connection before
  /// its answer came (PostgreSQL restarted under it): the transaction had committed, the handler
  /// threw, and a redelivery ran it again. A guard alone cannot tell such a commit from one that
  /// did not happen; the sink's record in the same transaction can (`all`).
  std::int64_t in_doubt_duplicate_effects = 0;
  std::int64_t lost_requests = 0;
  std::size_t redeliveries =
      0;  ///< Attempts redelivered after InProgress, Unavailable or an error.
  std::map<std::string, std::size_t> stopped_by_layer;
  std::map<std::string, std::size_t> outcomes;
  std::vector<ChaosEvent> chaos;  ///< --chaos: the failovers and restarts, measured.
  double deliveries_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;

  /// Duplicate effects / deliveries, in percent: how many deliveries booked a refund again.
  [[nodiscard]] double duplicate_rate_percent() const;
  /// The duplicate effects of the main phase (the late redeliveries' left out).
  [[nodiscard]] std::int64_t main_duplicate_effects() const {
    return duplicate_effects - late_duplicate_effects;
  }
};

/// The seed's production duplicate rate (duplicate effects / deliveries, %) for a configuration
/// of the same layers: none 11.7, request-id 3.1, redis 0.42, all 0.08; nullopt for another name.
[[nodiscard]] std::optional<double> seed_duplicate_rate_percent(const std::string& config);

/// Results in run order: (configuration name, its result).
using Results = std::vector<std::pair<std::string, ConfigResult>>;

/// The table idem-storm prints, one row per configuration.
[[nodiscard]] std::string format_table(const Results& results);

/// The results as JSON (the topology, and an object keyed by configuration). Throws
/// std::runtime_error when the file cannot be written.
void write_json_report(const std::string& path, const Results& results,
                       const std::string& topology);

/// The results as one HTML page: the duplicate rate of each configuration beside the seed's
/// production figure, and what stopped the duplicates, drawn as inline SVG, with the table.
/// `run` describes the run (requests, workers, seed) in the page's subtitle. Throws
/// std::runtime_error when the file cannot be written.
void write_html_report(const std::string& path, const Results& results, const std::string& run);

}  // namespace storm
