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

/// Builds the workload deterministically from `seed`. About 11.7 % of all deliveries are
/// duplicates; `accounts` accounts share the refunds.
Workload make_workload(std::uint64_t seed, std::size_t logical_requests, std::int64_t accounts);

}  // namespace storm
