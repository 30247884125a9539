#include "facade/decision.h"

#include <utility>

namespace idem::detail {

Outcome decide_repeat(Layer layer, RecordState state, bool fingerprint_matches,
                      std::optional<std::string> response) {
  Outcome outcome;
  outcome.layer = layer;
  if (!fingerprint_matches) {
    outcome.kind = Outcome::Kind::kMismatch;
  } else if (state == RecordState::kCompleted) {
    outcome.kind = Outcome::Kind::kDuplicate;
    outcome.response = std::move(response);
  } else {
    outcome.kind = Outcome::Kind::kInProgress;
  }
  return outcome;
}

std::optional<Outcome> decide_on_guard(ClaimResult claim) {
  if (claim.status == ClaimStatus::kFirst) return std::nullopt;
  return decide_repeat(Layer::kRedisGuard, claim.state, claim.fingerprint_matches,
                       std::move(claim.response));
}

std::optional<Outcome> decide_on_sink(SinkClaim claim) {
  if (claim.status == SinkStatus::kClaimed) return std::nullopt;
  if (claim.status == SinkStatus::kInProgress) {
    // Another transaction holds an uncommitted claim: its fingerprint is not visible yet.
    return decide_repeat(Layer::kPgSink, RecordState::kInProgress, true, std::nullopt);
  }
  return decide_repeat(Layer::kPgSink, claim.state, claim.fingerprint_matches,
                       std::move(claim.response));
}

}  // namespace idem::detail
