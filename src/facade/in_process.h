// The steps of a call that need no I/O, performed alike by every driver of the call plan: the
// local cache (layer 1), the caller's failure decision, the decision event and the metrics.
// The plan calls no user code; a driver hands each step here first, and performs only what is
// left (its I/O, its waits, the handler).
#pragma once

#include <memory>
#include <optional>

#include "facade/plan.h"

namespace idem {
class LocalCache;
}

namespace idem::detail {

/// Cheap to make (two pointers): one per call or per process. Thread safety as the options'
/// callbacks and the cache (LocalCache, Metrics: thread-safe).
class InProcess {
 public:
  /// `cache` may be null when the options turn layer 1 off.
  InProcess(const PlanRules& rules, LocalCache* cache) noexcept : rules_(&rules), cache_(cache) {}

  /// Records `step`'s notes in the metrics, then performs it when it is kLocalGet, kLocalPut,
  /// kDecideFailure or kEmit: its result. nullopt for every other step (the driver's).
  /// Never throws: a failing on_decision or on_handler_failure changes no outcome.
  [[nodiscard]] std::optional<StepResult> perform(const Step& step) const;

  /// Reports a renewal to `plan` (CallPlan::renewed) and records it in the metrics.
  void renewed(CallPlan& plan, PlanTime sent, const RenewalAnswers& answers) const noexcept;

 private:
  const PlanRules* rules_;
  LocalCache* cache_;
};

/// The local cache (layer 1) the options ask for; null when local_cache_capacity is 0.
[[nodiscard]] std::unique_ptr<LocalCache> local_cache_for(const DeduplicatorOptions& options);

}  // namespace idem::detail
