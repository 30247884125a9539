#include "idem/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace idem {
namespace {

constexpr Layer kAllLayers[] = {Layer::kHandler, Layer::kRequestId, Layer::kRedisGuard,
                                Layer::kFingerprint, Layer::kPgSink};
constexpr Outcome::Kind kAllKinds[] = {Outcome::Kind::kExecuted, Outcome::Kind::kDuplicate,
                                       Outcome::Kind::kInProgress, Outcome::Kind::kMismatch,
                                       Outcome::Kind::kUnavailable};

constexpr std::size_t index_of(Layer layer) { return static_cast<std::size_t>(layer); }
constexpr std::size_t index_of(Outcome::Kind kind) { return static_cast<std::size_t>(kind); }

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
}

void InProcessMetrics::record_handler_failure(const DecisionEvent& /*event*/) noexcept {
  handler_failures_.fetch_add(1, std::memory_order_relaxed);
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
    for (const Outcome::Kind kind : kAllKinds) {
      if (kind != Outcome::Kind::kExecuted) rejects += decisions(layer, kind);
    }
  }
  return static_cast<double>(rejects) / static_cast<double>(total);
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
                 "# HELP idem_decision_latency_us Latency of facade calls in microseconds.\n"
                 "# TYPE idem_decision_latency_us histogram\n");
  for (const Layer layer : kAllLayers) {
    const auto& buckets = latency_buckets_[index_of(layer)];
    std::uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kLatencyBucketsUs.size(); ++b) {
      cumulative += buckets[b].load(std::memory_order_relaxed);
      fmt::format_to(it, "idem_decision_latency_us_bucket{{layer=\"{}\",le=\"{}\"}} {}\n",
                     to_string(layer), kLatencyBucketsUs[b], cumulative);
    }
    cumulative += buckets.back().load(std::memory_order_relaxed);
    fmt::format_to(it, "idem_decision_latency_us_bucket{{layer=\"{}\",le=\"+Inf\"}} {}\n",
                   to_string(layer), cumulative);
    fmt::format_to(it, "idem_decision_latency_us_sum{{layer=\"{}\"}} {}\n", to_string(layer),
                   latency_sum_us_[index_of(layer)].load(std::memory_order_relaxed));
    fmt::format_to(it, "idem_decision_latency_us_count{{layer=\"{}\"}} {}\n", to_string(layer),
                   cumulative);
  }
  return fmt::to_string(out);
}

}  // namespace idem
