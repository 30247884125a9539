// Outcomes of the facade: what happened to a request and which layer decided.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/export.h"

namespace idem {

/// The layer that decided an outcome.
enum class Layer {
  kHandler,      ///< No layer stopped the request: the handler ran (Outcome::Kind::kExecuted).
  kRequestId,    ///< Layer 1, the request-ID layer: a repeat of a key completed earlier in this
                 ///< process, answered by its local cache without a network round trip.
  kRedisGuard,   ///< Layer 2: the Redis claim.
  kFingerprint,  ///< Layer 3, the payload fingerprint. It stores nothing itself: a fallback
                 ///< key's duplicate or a mismatch is reported under the layer whose record
                 ///< answered (request_id, redis_guard, pg_sink), so the facade never reports
                 ///< this layer; Metrics implementations may see it from other callers.
  kPgSink,       ///< Layer 4: the Postgres unique index.
};

/// Stable lowercase name of a layer ("handler", "request_id", "redis_guard", "fingerprint",
/// "pg_sink"), for metrics labels and logs. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string_view to_string(Layer layer) noexcept;

/// The result of Deduplicator::run(). A value, not an exception: duplicates are normal.
struct Outcome {
  /// What happened to the request.
  enum class Kind {
    kExecuted,     ///< First time: the handler ran and committed; `response` is its result.
    kDuplicate,    ///< Repeat of a completed request; `response` is the stored one, if kept.
    kInProgress,   ///< Repeat while the first execution is still running (HTTP 409).
    kMismatch,     ///< Same key, different payload fingerprint (HTTP 422).
    kUnavailable,  ///< A required backend was unreachable; nothing was executed.
  };
  Kind kind = Kind::kExecuted;            ///< What happened.
  Layer layer = Layer::kHandler;          ///< Which layer decided.
  std::optional<std::string> response{};  ///< Handler's or replayed response.
  std::string error{};                    ///< kUnavailable: the backend's error message.
  /// kExecuted: true when this call's claim ended before the handler returned (its Redis lease
  /// ran out and another delivery took the key, or a renewal failed; in run(), its sink row was
  /// found taken over when it was completed), so another delivery may have run the handler too.
  /// With run_transactional() the sink's unique index still kept the effect single. With run()
  /// the sink's row has a lease of its own (PgSinkOptions::lease), renewed with the Redis lease;
  /// when it is true there, treat the effect as possibly doubled (alert, reconcile). Renew long
  /// handlers (DeduplicatorOptions::auto_renew_interval, Context::renew()) to avoid it. Two limits:
  /// it is decided by the guard's answer to the completion and the local clock, so a completion
  /// that failed (Redis unreachable at that moment) leaves it false unless the lease had run out by
  /// the local clock; and a handler that starts after its lease already ran out (a process paused
  /// between the claim and the handler) is told only through this flag and
  /// Context::lease_lost(), it is not stopped from starting. A layer whose claim was lost did
  /// not save this call's response either (its completion is refused; save_error does not name
  /// it): when no other layer saved it, a later repeat runs the handler again.
  bool lease_lost = false;
  /// kExecuted: empty when every layer holding this call's claim saved the handler's response
  /// (the guard's completion after its resends, DeduplicatorOptions::save_retry_for);
  /// otherwise what failed, as "layer: error" for each layer whose completion failed (e.g.
  /// "redis_guard: idem: redis: connection refused"; "; " between two; a completion refused
  /// because the claim was lost is told by lease_lost instead). The handler ran and
  /// `response` is its own, but that layer's record stays IN_PROGRESS until its lease ends: a
  /// repeat meanwhile gets kInProgress from it, and after the lease one that no other layer
  /// answers (a guard without a sink, the sink's row in run()) runs the handler again. What to do:
  /// answer the caller as usual (an HTTP 200; an MQ consumer may ack), and alert or reconcile;
  /// with run_transactional() the committed row answers every later repeat, so only the guard
  /// can be named here.
  std::string save_error{};

  /// True unless a completion failed (see save_error).
  [[nodiscard]] bool saved() const noexcept { return save_error.empty(); }

  /// True when `response` is a replay of an earlier execution's response.
  [[nodiscard]] bool replayed() const noexcept {
    return kind == Kind::kDuplicate && response.has_value();
  }
};

/// Stable lowercase name of an outcome kind ("executed", "duplicate", "in_progress",
/// "mismatch", "unavailable"), for metrics labels and logs. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string_view to_string(Outcome::Kind kind) noexcept;

}  // namespace idem
