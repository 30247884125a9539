// The rules every call of a deduplicator shares: its options validated once (every ConfigError
// of the facade), its fingerprinters, and what the plan needs of the driver's backends.
#include <algorithm>
#include <array>

#include "facade/plan.h"
#include "idem/errors.h"

namespace idem::detail {
namespace {

// True when `pointer` is `field` or a member below it.
bool at_or_below(const std::string& pointer, const std::string& field) {
  return pointer == field || pointer.starts_with(field + "/");
}

// `fingerprint` leaving out the members that carry the request ID (see
// DeduplicatorOptions::request_id_fields).
FingerprintOptions without_request_id_fields(FingerprintOptions fingerprint,
                                             const DeduplicatorOptions& options) {
  if (!fingerprint.domain_separated) return fingerprint;  // the seed's digest, byte for byte
  for (const std::string& field : options.request_id_fields) {
    const bool included = std::any_of(fingerprint.include.begin(), fingerprint.include.end(),
                                      [&](const std::string& p) { return at_or_below(p, field); });
    const bool excluded = std::any_of(fingerprint.exclude.begin(), fingerprint.exclude.end(),
                                      [&](const std::string& p) { return at_or_below(field, p); });
    if (!included && !excluded) fingerprint.exclude.push_back(field);
  }
  return fingerprint;
}

// The checks of the options a driver's backends cannot serve.
void check_backends(const DeduplicatorOptions& o, const DriverTraits& traits) {
  if (traits.deadline.count() < 0) {
    throw ConfigError("idem: AsyncDeduplicatorOptions::deadline must be >= 0");
  }
  if (traits.on_loop && (dynamic_cast<RedisGuard*>(o.guard.get()) != nullptr ||
                         dynamic_cast<PgSink*>(o.sink.get()) != nullptr)) {
    throw ConfigError(
        "idem: AsyncDeduplicatorOptions::base: a RedisGuard or PgSink blocks its thread on "
        "every call; set AsyncDeduplicatorOptions::redis / postgres instead");
  }
  if (o.transactional_claim == TransactionalClaim::kBusinessKey &&
      (!traits.transactions || !traits.business_constraints)) {
    throw ConfigError(
        "idem: TransactionalClaim::kBusinessKey needs a PostgreSQL sink (a PgSink, or "
        "AsyncDeduplicatorOptions::postgres) whose business_constraints name the UNIQUE "
        "constraint that is the claim");
  }
}

constexpr std::array<std::string_view, kStepKinds> kStepNames = {
    "LocalGet",  "LocalPut",      "GuardClaim",   "GuardComplete", "GuardRelease", "SinkBegin",
    "SinkClaim", "RunHandler",    "SinkComplete", "Commit",        "Rollback",     "SinkRelease",
    "Wait",      "DecideFailure", "Emit",         "Return",        "Throw"};

}  // namespace

std::string_view step_name(StepKind kind) noexcept {
  return kStepNames[static_cast<std::size_t>(kind)];
}

PlanRules::PlanRules(const DeduplicatorOptions& options, DriverTraits traits)
    : options_(options), traits_(traits) {
  const DeduplicatorOptions& o = options_;
  if (o.wait_for_result.count() < 0 || o.wait_poll_interval.count() <= 0 ||
      o.auto_renew_interval.count() < 0 || o.save_retry_for.count() < 0) {
    throw ConfigError(
        "idem: wait_for_result, auto_renew_interval and save_retry_for must be >= 0, "
        "wait_poll_interval > 0");
  }
  if (o.fallback_retention.count() <= 0) throw ConfigError("idem: fallback_retention must be > 0");
  if (o.max_step_result_bytes == 0) throw ConfigError("idem: max_step_result_bytes must be > 0");
  check_backends(o, traits_);
  if (o.fingerprint) {
    (void)Fingerprinter(*o.fingerprint);  // validates the options as given
    FingerprintOptions unbucketed = without_request_id_fields(*o.fingerprint, o);
    unbucketed.time_bucket = std::chrono::seconds(0);
    const bool left_out = unbucketed.exclude.size() != o.fingerprint->exclude.size();
    fingerprinter_.emplace(std::move(unbucketed));
    // A fallback key keeps the request-ID members: without a request ID or a business key, a
    // message whose payload carries another request ID is another request.
    if (o.fingerprint->time_bucket.count() > 0 || left_out) {
      fallback_fingerprinter_.emplace(*o.fingerprint);
    }
  }
  guard_ = o.guard != nullptr || traits_.own_guard;
  sink_ = o.sink != nullptr || traits_.own_sink;
  if (!guard_ && !sink_ && o.local_cache_capacity == 0) {
    throw ConfigError(
        "idem: no layer to stop a duplicate: set a guard, a sink or the local cache "
        "(local_cache_capacity > 0)");
  }
  redis_failure_ = o.on_redis_failure.value_or(sink_ ? RedisFailurePolicy::kFailOpen
                                                     : RedisFailurePolicy::kFailClosed);
  std::chrono::milliseconds guard_retention{0};
  std::chrono::milliseconds sink_retention{0};
  if (traits_.own_guard) {
    guard_lease_ = traits_.own_guard_lease;
    guard_retention = traits_.own_guard_retention;
    replay_cap_ = traits_.own_guard_max_response_bytes;
  } else if (o.guard) {
    guard_lease_ = o.guard->lease();
    guard_retention = o.guard->retention();
    replay_cap_ = o.guard->max_response_bytes();
  }
  if (traits_.own_sink) {
    sink_retention = traits_.own_sink_retention;
    replay_cap_ = std::min(replay_cap_, traits_.own_sink_max_response_bytes);
  } else if (o.sink) {
    sink_retention = o.sink->retention();
    replay_cap_ = std::min(replay_cap_, o.sink->max_response_bytes());
  }
  if (o.auto_renew_interval.count() > 0 && guard_lease_.count() > 0 &&
      o.auto_renew_interval >= guard_lease_) {
    throw ConfigError(
        "idem: auto_renew_interval must be shorter than the guard's lease (a third of it, say): "
        "a renewal would come after the lease ended");
  }
  if ((!guard_ || guard_retention.count() > 0) && (!sink_ || sink_retention.count() > 0)) {
    record_lifetime_ = std::max(guard_retention, sink_retention);
  }
}

}  // namespace idem::detail
