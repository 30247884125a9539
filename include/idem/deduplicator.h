// The facade: wraps a handler so that a duplicate request never has its effect twice.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/metrics.h"
#include "idem/outcome.h"
#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace idem {

/// One inbound request as the facade sees it. The idempotency key is taken, in this order, from
/// (user, intent, biz_key) when biz_key is set, else from the request ID, else from the payload
/// fingerprint (the fallback key `fp:{user}:{intent}:{hex}`).
struct Request {
  std::string request_id;  ///< Validated request ID (see request_id.h); empty when none.
  std::string user;        ///< User or account; required.
  std::string intent;      ///< Operation name, e.g. "refund"; required.
  std::string biz_key;     ///< Business identity, e.g. "order-7"; empty when none.
  std::string payload;     ///< JSON payload to fingerprint; empty when none.
  int attempt = 1;         ///< Delivery count reported by the caller (MQ, FC retry); for logs.
};

/// Options of a Deduplicator. Every layer is optional; a null pointer leaves it out.
struct DeduplicatorOptions {
  /// Layer 1: remember up to this many request IDs completed in this process and answer their
  /// repeats without a network round trip. 0 turns the layer off.
  std::size_t local_cache_capacity = 10000;
  /// How long layer 1 remembers a completed request, in milliseconds. Keep it no longer than
  /// the guard's retention, so a repeat after the retention reaches the sink.
  std::chrono::milliseconds local_cache_ttl{std::chrono::seconds(30)};
  /// Layer 2. Shared so several deduplicators can use one pool.
  std::shared_ptr<RedisGuard> guard;
  /// Layer 3: fingerprint the payload (mismatch detection and fallback key).
  bool fingerprint = true;
  /// Layer 4. Shared so several deduplicators can use one pool.
  std::shared_ptr<PgSink> sink;
  /// Counters and histograms (e.g. an InProcessMetrics); null for none.
  std::shared_ptr<Metrics> metrics;
  /// Called once per decision with the request ID, key, fingerprint, layer, outcome, latency and
  /// attempt. Must not throw; nothing is logged when empty.
  std::function<void(const DecisionEvent&)> on_decision;
};

/// The idempotency facade. Thread-safe: one instance serves all threads.
///
/// A handler that throws has its claim released (owner only) and the exception propagates;
/// a handler that throws idem::Cancelled keeps its claim until the lease ends.
/// Throws idem::InvalidRequestId, idem::InvalidKey, idem::PayloadError for bad input, and
/// idem::RedisError only when no sink is configured to fall back on.
class Deduplicator {
 public:
  explicit Deduplicator(DeduplicatorOptions options);
  ~Deduplicator();
  Deduplicator(const Deduplicator&) = delete;
  Deduplicator& operator=(const Deduplicator&) = delete;

  /// Runs `handler` once per idempotency key. With a sink, the claim row is written in its own
  /// short transaction around the handler.
  [[nodiscard]] Outcome run(const Request& request, const std::function<std::string()>& handler);

  /// Runs `handler` inside the sink's transaction, after the claim row is inserted, so the
  /// claim and the handler's writes commit together or not at all. Requires a sink
  /// (idem::ConfigError otherwise).
  [[nodiscard]] Outcome run_transactional(
      const Request& request, const std::function<std::string(pqxx::transaction_base&)>& handler);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
