// The backend steps a call performs through the blocking Guard and Sink contracts, alike for
// every driver that calls them (the blocking Deduplicator, the simulator's driver): the guard's
// claim, completion and release, and the sink's outside a transaction.
#pragma once

#include <optional>

#include "facade/plan.h"

namespace idem::detail {

/// Performs `step` when it is kGuardClaim, kGuardComplete or kGuardRelease (on `guard`),
/// kSinkRelease, or, unless `in_transaction`, kSinkClaim or kSinkComplete (on `sink`): its result.
/// nullopt for every other step. Throws what the backend throws; the plan's rules classify it.
/// Thread safety as the backends'.
[[nodiscard]] std::optional<StepResult> perform_contract_step(Guard* guard, Sink* sink,
                                                              bool in_transaction,
                                                              const Step& step);

}  // namespace idem::detail
