#include "facade/in_process.h"

#include <algorithm>
#include <bit>
#include <string>

#include "idem/local_cache.h"
#include "idem/metrics.h"

namespace idem::detail {
namespace {

void record(Metrics& metrics, const StepNotes& notes) noexcept {
  for (int i = 0; i < notes.guard_errors; ++i) metrics.record_backend_error(Layer::kRedisGuard);
  for (int i = 0; i < notes.sink_errors; ++i) metrics.record_backend_error(Layer::kPgSink);
  for (int i = 0; i < notes.releases; ++i) metrics.record_release();
}

}  // namespace

std::optional<StepResult> InProcess::perform(const Step& step) const {
  const DeduplicatorOptions& o = rules_->options();
  if (Metrics* metrics = o.metrics.get(); metrics != nullptr && step.notes.any()) {
    record(*metrics, step.notes);
  }
  switch (step.kind) {
    case StepKind::kLocalGet:
      return CacheEntry{cache_->get(step.key)};
    case StepKind::kLocalPut:
      cache_->put(step.key, std::string(step.value), step.ttl);
      return Done{};
    case StepKind::kDecideFailure:
      try {
        return o.on_handler_failure(step.error);
      } catch (...) {
        return FailureDecision{};  // a decision that failed: the default, release
      }
    case StepKind::kEmit:
      if (Metrics* metrics = o.metrics.get()) {
        if (step.event->ended_before_handler) {
          metrics->record_failed_release(*step.event);
        } else if (step.event->handler_failed) {
          metrics->record_handler_failure(*step.event);
        } else {
          metrics->record_decision(*step.event);
        }
      }
      if (o.on_decision) {
        try {
          o.on_decision(*step.event);
        } catch (...) {
          // A failing log sink must not turn an executed request into an error.
        }
      }
      return Done{};
    default:
      return std::nullopt;
  }
}

std::unique_ptr<LocalCache> local_cache_for(const DeduplicatorOptions& options) {
  if (options.local_cache_capacity == 0) return nullptr;
  return std::make_unique<LocalCache>(LocalCacheOptions{
      .max_entries = options.local_cache_capacity,
      .ttl = options.local_cache_ttl,
      .shards = std::min<std::size_t>(16, std::bit_floor(options.local_cache_capacity))});
}

void InProcess::renewed(CallPlan& plan, PlanTime sent,
                        const RenewalAnswers& answers) const noexcept {
  if (Metrics* metrics = rules_->options().metrics.get()) {
    metrics->record_renewal(answers.extended());
  }
  plan.renewed(sent, answers);
}

}  // namespace idem::detail
