#include "facade/contract_steps.h"

#include "idem/guard.h"
#include "idem/sink.h"

namespace idem::detail {

std::optional<StepResult> perform_contract_step(Guard* guard, Sink* sink, bool in_transaction,
                                                const Step& step) {
  switch (step.kind) {
    case StepKind::kGuardClaim:
      return guard->claim(step.key, step.request_id, step.fingerprint);
    case StepKind::kGuardComplete:
      return Completed{guard->complete(step.key, step.owner_token, step.value, step.ttl)};
    case StepKind::kGuardRelease:
      (void)guard->release(step.key, step.owner_token);
      return Done{};
    case StepKind::kSinkClaim:
      if (in_transaction) return std::nullopt;
      return sink->claim(step.key, step.request_id, step.fingerprint, step.owner_token);
    case StepKind::kSinkComplete:
      if (in_transaction) return std::nullopt;
      return Completed{sink->complete(step.key, step.owner_token, step.value, step.ttl)};
    case StepKind::kSinkRelease:  // never in the transaction: rollback undid the claim there
      (void)sink->release(step.key, step.owner_token);
      return Done{};
    default:
      return std::nullopt;
  }
}

}  // namespace idem::detail
