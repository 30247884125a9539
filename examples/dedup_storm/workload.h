// The duplicate-storm workload: logical refund requests and their deliveries, duplicates
// injected the way the seed incident saw them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace storm {

/// Where a delivery came from.
enum class Source {
  kOriginal,        ///< The first delivery of a logical request.
  kDoubleClick,     ///< A user clicked again: new request ID, same business key and payload.
  kRedelivery,      ///< The MQ redelivered: same request ID, some deliveries later.
  kRacingRetry,     ///< The platform retried while the first is running: same request ID, at once.
  kLateRedelivery,  ///< Redelivered after the guard's retention ended (C14).
};

/// One delivery of a logical refund request.
struct Delivery {
  std::uint32_t logical = 0;  ///< Index of the logical request (its order number).
  Source source = Source::kOriginal;
  std::string request_id;
  std::string user;
  std::string order_id;
  std::int64_t account = 0;
  std::int64_t amount_cents = 0;
  std::string payload;  ///< JSON, identical for every delivery of one logical request.
};

/// Deliveries in the order workers take them, plus the late ones sent after the retention.
struct Workload {
  std::vector<Delivery> deliveries;
  std::vector<Delivery> late_deliveries;
  std::size_t logical_requests = 0;
  std::size_t duplicates = 0;  ///< Deliveries that are not the original, late ones included.
};

/// How many duplicates there are and where they come from.
struct Mix {
  /// Share of all deliveries (late ones included) that are duplicates, 0 <= share < 1. The seed
  /// incident's 11.7 % by default; above 50 % a logical request gets several duplicates.
  double duplicate_share = 0.117;
  /// Relative weights of the duplicate sources (any non-negative numbers, not all 0).
  double double_click = 35;
  double redelivery = 30;
  double racing_retry = 25;
  double late_redelivery = 10;
};

/// Parses `--mix` text: comma-separated `source=weight` with the sources double-click,
/// redelivery, racing-retry and late (unnamed ones keep their default weight). Throws
/// std::invalid_argument with a message for the user.
Mix parse_mix(const std::string& text, double duplicate_share);

/// Builds the workload deterministically from `seed` and `mix`; `accounts` accounts share the
/// refunds. The default mix gives the seed incident's workload.
Workload make_workload(std::uint64_t seed, std::size_t logical_requests, std::int64_t accounts,
                       const Mix& mix = {});

}  // namespace storm
