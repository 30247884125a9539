// The facade's decision rules, free of I/O: from what a layer found to the outcome.
// Unit-tested without servers (tests/unit/facade/decision_test.cc).
#pragma once

#include <optional>
#include <string>

#include "idem/deduplicator.h"

namespace idem::detail {

/// A record already holds the key (found by `layer`): the outcome for the repeat.
/// A different fingerprint is a Mismatch whatever the state; otherwise a COMPLETED record is a
/// Duplicate (replaying `response` when kept) and an IN_PROGRESS one is InProgress.
[[nodiscard]] Outcome decide_repeat(Layer layer, RecordState state, bool fingerprint_matches,
                                    std::optional<std::string> response);

/// The Redis guard answered: std::nullopt when the caller owns the claim and goes on.
[[nodiscard]] std::optional<Outcome> decide_on_guard(ClaimResult claim);

/// The Postgres sink answered: std::nullopt when the row was inserted and the handler may run.
[[nodiscard]] std::optional<Outcome> decide_on_sink(SinkClaim claim);

}  // namespace idem::detail
