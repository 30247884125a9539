#include "idem/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace idem {
namespace {

constexpr Layer kAllLayers[] = {Layer::kHandler, Layer::kRequestId, Layer::kRedisGuard,
                                Layer::kFingerprint, Layer::kPgSink};
constexpr Outcome::Kind kAllKinds[] = {Outcome::Kind::kExecuted, Outcome::Kind::kDuplicate,
                                       Outcome::Kind::kInProgress, Outcome::Kind::kMismatch,
                                       Outcome::Kind::kUnavailable};

constexpr std::size_t index_of(Layer layer) { return static_cast<std::size_t>(layer); }
constexpr std::size_t index_of(Outcome::Kind kind) { return static_cast<std::size_t>(kind); }

// The outcomes of the guard and the sink that the seed's duplicate rate counts: a record was
// there (a Redis reject, a unique conflict), whatever its state or fingerprint.
constexpr Outcome::Kind kRejectKinds[] = {Outcome::Kind::kDuplicate, Outcome::Kind::kInProgress,
                                          Outcome::Kind::kMismatch};

// Adds `item` to `watched` unless it is there; drops expired entries on the way.
template <class T>
void add_watched(std::vector<std::weak_ptr<const T>>& watched,
                 const std::shared_ptr<const T>& item) {
  std::erase_if(watched, [](const auto& w) { return w.expired(); });
  const bool known =
      std::any_of(watched.begin(), watched.end(), [&](const auto& w) { return w.lock() == item; });
  if (!known) watched.emplace_back(item);
}

// The live entries of `watched`.
template <class T>
std::vector<std::shared_ptr<const T>> alive(const std::vector<std::weak_ptr<const T>>& watched) {
  std::vector<std::shared_ptr<const T>> out;
  for (const auto& w : watched) {
    if (auto item = w.lock()) out.push_back(std::move(item));
  }
  return out;
}

// A bucket bound or a sum in seconds, from microseconds: the shortest text that reads back as
// the same double ("5e-05", "0.001", "2").
std::string seconds_text(std::int64_t us) {
  return fmt::format("{}", static_cast<double>(us) / 1e6);
}

// The gauges of the watched backends: breaker states of the guards, and per layer the sums of
// their pools' figures. Nothing for a layer with no watched backend.
void append_backend_gauges(fmt::memory_buffer& out,
                           const std::vector<std::shared_ptr<const RedisGuard>>& guards,
                           const std::vector<std::shared_ptr<const PgSink>>& sinks) {
  auto it = std::back_inserter(out);
  if (!guards.empty()) {
    std::size_t closed = 0;
    std::size_t open = 0;
    std::size_t half_open = 0;
    for (const auto& guard : guards) {
      switch (guard->breaker_state()) {
        case BreakerState::kClosed:
          ++closed;
          break;
        case BreakerState::kOpen:
          ++open;
          break;
        case BreakerState::kHalfOpen:
          ++half_open;
          break;
      }
    }
    fmt::format_to(it,
                   "# HELP idem_redis_breaker_state Redis guards whose circuit breaker is in each "
                   "state (open: Redis is skipped for the cool-down).\n"
                   "# TYPE idem_redis_breaker_state gauge\n"
                   "idem_redis_breaker_state{{state=\"closed\"}} {}\n"
                   "idem_redis_breaker_state{{state=\"open\"}} {}\n"
                   "idem_redis_breaker_state{{state=\"half_open\"}} {}\n",
                   closed, open, half_open);
  }
  struct LayerPools {
    Layer layer;
    PoolStats stats;
  };
  std::vector<LayerPools> pools;
  const auto add = [&pools](Layer layer, const PoolStats& one) {
    if (pools.empty() || pools.back().layer != layer) pools.push_back({layer, {}});
    PoolStats& total = pools.back().stats;
    total.size += one.size;
    total.open += one.open;
    total.in_use += one.in_use;
    total.waiters += one.waiters;
  };
  for (const auto& guard : guards) add(Layer::kRedisGuard, guard->pool_stats());
  for (const auto& sink : sinks) add(Layer::kPgSink, sink->pool_stats());
  if (pools.empty()) return;
  const struct {
    const char* name;
    const char* help;
    std::size_t PoolStats::*field;
  } series[] = {
      {"idem_pool_connections_max", "Most connections the pools may open.", &PoolStats::size},
      {"idem_pool_connections_open", "Connections open now (idle, in use or connecting).",
       &PoolStats::open},
      {"idem_pool_connections_in_use", "Connections borrowed by a call now.", &PoolStats::in_use},
      {"idem_pool_waiters",
       "Threads waiting for a connection now (each up to the pool's borrow_timeout).",
       &PoolStats::waiters},
  };
  for (const auto& one : series) {
    fmt::format_to(it, "# HELP {} {} By layer.\n# TYPE {} gauge\n", one.name, one.help, one.name);
    for (const LayerPools& layer : pools) {
      fmt::format_to(it, "{}{{layer=\"{}\"}} {}\n", one.name, to_string(layer.layer),
                     layer.stats.*one.field);
    }
  }
}

}  // namespace

void InProcessMetrics::record_decision(const DecisionEvent& event) noexcept {
  const std::size_t layer = index_of(event.layer);
  decisions_[layer * kKinds + index_of(event.outcome)].fetch_add(1, std::memory_order_relaxed);
  const std::int64_t us = event.latency.count();
  const auto bucket = static_cast<std::size_t>(
      std::lower_bound(kLatencyBucketsUs.begin(), kLatencyBucketsUs.end(), us) -
      kLatencyBucketsUs.begin());
  latency_buckets_[layer][bucket].fetch_add(1, std::memory_order_relaxed);
  latency_sum_us_[layer].fetch_add(us, std::memory_order_relaxed);
  count_failed_writes(event);
}

void InProcessMetrics::record_handler_failure(const DecisionEvent& event) noexcept {
  handler_failures_.fetch_add(1, std::memory_order_relaxed);
  count_failed_writes(event);
}

void InProcessMetrics::count_failed_writes(const DecisionEvent& event) noexcept {
  if (!event.save_error.empty()) unsaved_results_.fetch_add(1, std::memory_order_relaxed);
  if (!event.release_error.empty()) failed_releases_.fetch_add(1, std::memory_order_relaxed);
}

void InProcessMetrics::record_backend_error(Layer layer) noexcept {
  backend_errors_[index_of(layer)].fetch_add(1, std::memory_order_relaxed);
}

void InProcessMetrics::record_release() noexcept {
  releases_.fetch_add(1, std::memory_order_relaxed);
}

void InProcessMetrics::record_renewal(bool ok) noexcept {
  (ok ? renewals_ok_ : renewals_failed_).fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t InProcessMetrics::decisions(Layer layer, Outcome::Kind kind) const noexcept {
  return decisions_[index_of(layer) * kKinds + index_of(kind)].load(std::memory_order_relaxed);
}

std::uint64_t InProcessMetrics::total_decisions() const noexcept {
  std::uint64_t total = 0;
  for (const auto& count : decisions_) total += count.load(std::memory_order_relaxed);
  return total;
}

std::uint64_t InProcessMetrics::handler_failures() const noexcept {
  return handler_failures_.load(std::memory_order_relaxed);
}

std::uint64_t InProcessMetrics::backend_errors(Layer layer) const noexcept {
  return backend_errors_[index_of(layer)].load(std::memory_order_relaxed);
}

double InProcessMetrics::duplicate_rate() const noexcept {
  const std::uint64_t total = total_decisions();
  if (total == 0) return 0.0;
  std::uint64_t rejects = 0;
  for (const Layer layer : {Layer::kRedisGuard, Layer::kPgSink}) {
    for (const Outcome::Kind kind : kRejectKinds) rejects += decisions(layer, kind);
  }
  return static_cast<double>(rejects) / static_cast<double>(total);
}

void InProcessMetrics::watch(const std::shared_ptr<const RedisGuard>& guard) {
  if (guard == nullptr) return;
  std::lock_guard lock(watched_mutex_);
  add_watched(guards_, guard);
}

void InProcessMetrics::watch(const std::shared_ptr<const PgSink>& sink) {
  if (sink == nullptr) return;
  std::lock_guard lock(watched_mutex_);
  add_watched(sinks_, sink);
}

void InProcessMetrics::watch_backends(const std::shared_ptr<Guard>& guard,
                                      const std::shared_ptr<Sink>& sink) noexcept {
  try {
    watch(std::shared_ptr<const RedisGuard>(std::dynamic_pointer_cast<RedisGuard>(guard)));
    watch(std::shared_ptr<const PgSink>(std::dynamic_pointer_cast<PgSink>(sink)));
  } catch (...) {  // out of memory: no gauges, the counters still count
  }
}

std::string_view to_string(StepEnding ending) noexcept {
  switch (ending) {
    case StepEnding::kJournaled:
      return "journaled";
    case StepEnding::kReplayed:
      return "replayed";
    case StepEnding::kInTransaction:
      return "in_transaction";
    case StepEnding::kUnguarded:
      return "unguarded";
    case StepEnding::kClaimLost:
      return "claim_lost";
    case StepEnding::kTooLarge:
      return "too_large";
  }
  return "unknown";
}

std::string InProcessMetrics::prometheus_text() const {
  auto out = fmt::memory_buffer();
  auto it = std::back_inserter(out);
  fmt::format_to(
      it,
      "# HELP idem_decisions_total Calls of the idem facade by deciding layer and outcome.\n"
      "# TYPE idem_decisions_total counter\n");
  for (const Layer layer : kAllLayers) {
    for (const Outcome::Kind kind : kAllKinds) {
      fmt::format_to(it, "idem_decisions_total{{layer=\"{}\",outcome=\"{}\"}} {}\n",
                     to_string(layer), to_string(kind), decisions(layer, kind));
    }
  }
  fmt::format_to(it,
                 "# HELP idem_handler_failures_total Calls whose handler threw (or whose commit "
                 "failed).\n"
                 "# TYPE idem_handler_failures_total counter\nidem_handler_failures_total {}\n",
                 handler_failures());
  fmt::format_to(it,
                 "# HELP idem_unsaved_results_total Calls that executed but whose response a "
                 "layer holding the claim failed to save (Outcome::save_error).\n"
                 "# TYPE idem_unsaved_results_total counter\nidem_unsaved_results_total {}\n",
                 unsaved_results());
  fmt::format_to(it,
                 "# HELP idem_failed_releases_total Calls whose claim could not be released "
                 "(it stays until its lease ends).\n"
                 "# TYPE idem_failed_releases_total counter\nidem_failed_releases_total {}\n",
                 failed_releases());
  fmt::format_to(it,
                 "# HELP idem_foreign_records_total Values under idem keys that idem did not "
                 "write, or damaged records (idem::ForeignRecord).\n"
                 "# TYPE idem_foreign_records_total counter\nidem_foreign_records_total {}\n",
                 foreign_records());
  fmt::format_to(it,
                 "# HELP idem_steps_total Steps of handlers (Context::step) by how they ended.\n"
                 "# TYPE idem_steps_total counter\n");
  for (const StepEnding ending :
       {StepEnding::kJournaled, StepEnding::kReplayed, StepEnding::kInTransaction,
        StepEnding::kUnguarded, StepEnding::kClaimLost, StepEnding::kTooLarge}) {
    fmt::format_to(it, "idem_steps_total{{ending=\"{}\"}} {}\n", to_string(ending), steps(ending));
  }
  fmt::format_to(it,
                 "# HELP idem_backend_errors_total Failed backend calls by layer.\n"
                 "# TYPE idem_backend_errors_total counter\n");
  for (const Layer layer : {Layer::kRedisGuard, Layer::kPgSink}) {
    fmt::format_to(it, "idem_backend_errors_total{{layer=\"{}\"}} {}\n", to_string(layer),
                   backend_errors(layer));
  }
  fmt::format_to(
      it,
      "# HELP idem_releases_total Redis claims released by their owner.\n"
      "# TYPE idem_releases_total counter\nidem_releases_total {}\n"
      "# HELP idem_renewals_total Lease renewals by result.\n"
      "# TYPE idem_renewals_total counter\n"
      "idem_renewals_total{{result=\"ok\"}} {}\nidem_renewals_total{{result=\"failed\"}} {}\n"
      "# HELP idem_duplicate_rate (Redis guard rejects + Postgres sink conflicts) / total calls.\n"
      "# TYPE idem_duplicate_rate gauge\nidem_duplicate_rate {}\n",
      releases_.load(), renewals_ok_.load(), renewals_failed_.load(), duplicate_rate());
  fmt::format_to(it,
                 "# HELP idem_decision_duration_seconds Duration of facade calls (handler "
                 "included) by deciding layer, in seconds.\n"
                 "# TYPE idem_decision_duration_seconds histogram\n");
  for (const Layer layer : kAllLayers) {
    const auto& buckets = latency_buckets_[index_of(layer)];
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kLatencyBucketsUs.size(); ++b) {
      cumulative += buckets[b].load(std::memory_order_relaxed);
      fmt::format_to(it, "idem_decision_duration_seconds_bucket{{layer=\"{}\",le=\"{}\"}} {}\n",
                     to_string(layer), seconds_text(kLatencyBucketsUs[b]), cumulative);
    }
    cumulative += buckets.back().load(std::memory_order_relaxed);
    fmt::format_to(it, "idem_decision_duration_seconds_bucket{{layer=\"{}\",le=\"+Inf\"}} {}\n",
                   to_string(layer), cumulative);
    fmt::format_to(it, "idem_decision_duration_seconds_sum{{layer=\"{}\"}} {}\n", to_string(layer),
                   seconds_text(latency_sum_us_[index_of(layer)].load(std::memory_order_relaxed)));
    fmt::format_to(it, "idem_decision_duration_seconds_count{{layer=\"{}\"}} {}\n",
                   to_string(layer), cumulative);
  }
  std::vector<std::shared_ptr<const RedisGuard>> guards;
  std::vector<std::shared_ptr<const PgSink>> sinks;
  {
    std::lock_guard lock(watched_mutex_);
    guards = alive(guards_);
    sinks = alive(sinks_);
  }
  append_backend_gauges(out, guards, sinks);
  return fmt::to_string(out);
}

}  // namespace idem
