// The facade: wraps a handler so that a duplicate request never has its effect twice.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/pg_sink.h"
#include "idem/redis_guard.h"

namespace idem {

/// The layer that decided an outcome.
enum class Layer {
  kHandler,     ///< No layer stopped the request: the handler ran (Outcome::Kind::kExecuted).
  kRequestId,   ///< Layer 1: a repeat of a request ID completed earlier in this process.
  kRedisGuard,  ///< Layer 2: the Redis claim.
  kFingerprint, ///< Layer 3: the payload fingerprint (fallback key or mismatch).
  kPgSink,      ///< Layer 4: the Postgres unique index.
};

/// Stable lowercase name of a layer ("handler", "request_id", "redis_guard", "fingerprint",
/// "pg_sink"), for metrics labels and logs.
[[nodiscard]] std::string_view to_string(Layer layer) noexcept;

/// One inbound request as the facade sees it. The idempotency key is taken, in this order, from
/// (user, intent, biz_key) when biz_key is set, else from the request ID, else from the payload
/// fingerprint (the fallback key `fp:{user}:{intent}:{hex}`).
struct Request {
  std::string request_id;  ///< Validated request ID (see request_id.h); empty when none.
  std::string user;        ///< User or account; required.
  std::string intent;      ///< Operation name, e.g. "refund"; required.
  std::string biz_key;     ///< Business identity, e.g. "order-7"; empty when none.
  std::string payload;     ///< JSON payload to fingerprint; empty when none.
};

/// The result of Deduplicator::run(). A value, not an exception: duplicates are normal.
struct Outcome {
  enum class Kind {
    kExecuted,    ///< First time: the handler ran and committed; `response` is its result.
    kDuplicate,   ///< Repeat of a completed request; `response` is the stored one, if kept.
    kInProgress,  ///< Repeat while the first execution is still running (HTTP 409).
    kMismatch,    ///< Same key, different payload fingerprint (HTTP 422).
    kUnavailable, ///< A required backend was unreachable; nothing was executed.
  };
  Kind kind = Kind::kExecuted;
  Layer layer = Layer::kHandler;        ///< Which layer decided.
  std::optional<std::string> response;  ///< Handler's or replayed response.

  /// True when `response` is a replay of an earlier execution's response.
  [[nodiscard]] bool replayed() const noexcept { return kind == Kind::kDuplicate && response.has_value(); }
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
