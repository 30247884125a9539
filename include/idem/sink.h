// The record contract of layer 4, kept by every sink: PgSink (PostgreSQL: the row commits in
// the caller's transaction, or in a short one of its own) and InMemorySink (one process: tests,
// single-instance services). The facade drives any Sink in Deduplicator::run(); only a PgSink
// can serve run_transactional(), whose handler writes in the PostgreSQL transaction.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "idem/export.h"
#include "idem/record.h"

namespace idem {

/// What a sink claim found.
enum class SinkStatus {
  kClaimed,     ///< The row was inserted (in the caller's transaction, or committed on its own):
                ///< go on with the business write.
  kDuplicate,   ///< A committed row already holds the key (see SinkClaim::state).
  kInProgress,  ///< PgSink: another transaction holds an uncommitted claim of the key and did
                ///< not finish within PgSinkOptions::lock_timeout. The caller's transaction is
                ///< aborted by the cancelled wait: roll it back (transact() does so by itself).
};

/// Answer of Sink::claim() (and of PgSink's claim in a transaction).
struct SinkClaim {
  SinkStatus status = SinkStatus::kClaimed;  ///< What the claim found.
  /// State of the existing row (kInProgress for a fresh claim or an open competitor).
  RecordState state = RecordState::kInProgress;
  /// Whether the stored fingerprint and the caller's say the same payload, by
  /// fingerprints_match() (fingerprint.h): an empty fingerprint (on either side), or two made
  /// under other fingerprint options, carry no verdict and match.
  bool fingerprint_matches = true;
  /// Whether the existing row was claimed by the same request ID (a retry or redelivery).
  bool same_request = true;
  /// Stored response of a COMPLETED row, when it was within the sink's size cap
  /// (max_response_bytes).
  std::optional<std::string> response{};
  /// Lowercase hex SHA-256 of a COMPLETED row's response that was over the size cap; empty
  /// otherwise.
  std::string response_sha256{};
};

/// A sink in its non-transactional form: each call commits on its own. The row of a key is
/// owned by its claim's owner token (the facade gives each attempt its own), or by the claim's
/// request ID when it gave none (see claim()).
/// Implementations are thread-safe; their backend's failures throw idem::BackendError
/// (PgSink: idem::PostgresError).
class IDEM_EXPORT Sink {
 public:
  virtual ~Sink() = default;

  /// Creates or upgrades what the sink stores its rows in, idempotently (PgSink: the schema
  /// objects, see PgSink::migrate()). Default: nothing to create (InMemorySink).
  virtual void migrate() {}

  /// Claims `key` (an encoded key text; idem::InvalidKey when it fails validate_key_text()) for
  /// `request_id` (at most 64 bytes, else idem::InvalidRequestId): a fresh row is committed
  /// IN_PROGRESS for the sink's lease, and answers kClaimed; a row past its expiry is taken
  /// over. An existing row answers kDuplicate with its state, fingerprint match and response.
  /// `fingerprint` may be empty (no verdict). The row is owned by `owner_token` (at most 64
  /// bytes, else idem::InvalidKey; the facade gives each attempt its own, a fencing token), or by
  /// `request_id` when it is empty: complete(), release() and renew() act only for that owner, so
  /// an earlier attempt of the same request never completes or releases a later attempt's takeover.
  [[nodiscard]] virtual SinkClaim claim(std::string_view key, std::string_view request_id,
                                        std::string_view fingerprint,
                                        std::string_view owner_token = {}) = 0;
  /// Marks the IN_PROGRESS row of `key` owned by `owner` (the claim's owner token, or its
  /// request ID when it had none) COMPLETED with `response` (size-capped: above the cap only its
  /// SHA-256 is kept), kept for `retention` in ms (0: the sink's configured retention; < 0:
  /// idem::ConfigError). Returns false, changing nothing, when there is no such row (its lease
  /// ended and another attempt took the key over, or it is completed already).
  virtual bool complete(std::string_view key, std::string_view owner, std::string_view response,
                        std::chrono::milliseconds retention) = 0;
  /// Deletes the IN_PROGRESS row of `key` owned by `owner`, so the operation may be retried.
  /// Never deletes another owner's or a completed row. Returns whether it deleted.
  virtual bool release(std::string_view key, std::string_view owner) = 0;
  /// Extends the IN_PROGRESS row of `key` owned by `owner` to at least `lease` (ms; 0: the
  /// sink's configured lease; < 0: idem::ConfigError) from now. Returns false when the row is
  /// no longer `owner`'s (its lease ended and it was taken over) or is completed. The facade
  /// renews the row with the Redis lease while a run() handler works. Default: nothing to renew
  /// (true).
  virtual bool renew(std::string_view key, std::string_view owner,
                     std::chrono::milliseconds lease) {
    (void)key;
    (void)owner;
    (void)lease;
    return true;
  }
  /// The largest response complete() keeps, in bytes: a repeat of a larger one is a duplicate
  /// without a response. The facade's local cache then replays none either. Default: no cap
  /// (SIZE_MAX).
  [[nodiscard]] virtual std::size_t max_response_bytes() const noexcept { return SIZE_MAX; }
  /// How long a COMPLETED row is kept when complete() is given 0, in ms; 0 when unknown (the
  /// default). The facade's local cache never answers a key longer than the longest retention
  /// of its guard and sink, when both say it.
  [[nodiscard]] virtual std::chrono::milliseconds retention() const noexcept {
    return std::chrono::milliseconds(0);
  }
};

}  // namespace idem
