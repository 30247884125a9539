// Vocabulary shared by the Redis guard and the Postgres sink.
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

namespace idem {

/// State of an idempotency record.
enum class RecordState {
  kInProgress,  ///< Claimed; the first execution has not completed (or crashed mid-way).
  kCompleted,   ///< The first execution completed; its response may be replayed.
};

/// A record as stored, read without claiming it (RedisGuard::inspect(), PgSink::inspect()):
/// for operators and tools such as idemctl, never for deciding a request.
struct RecordInfo {
  RecordState state = RecordState::kInProgress;  ///< IN_PROGRESS or COMPLETED.
  /// The owner of the claim, what release() checks: in Redis the claiming attempt's token (32
  /// lowercase hex); in Postgres the claim's owner token (in run(), the facade's attempt ID, a
  /// UUIDv7), or its request ID when the claim gave none.
  std::string owner_token{};
  /// Request ID of the claim; empty when the request had none.
  std::string request_id{};
  /// Payload fingerprint stored with the claim; empty when none.
  std::string fingerprint{};
  /// Remaining time to live by the server's clock, in ms (Redis PTTL; Postgres expires_at -
  /// now(), negative for an expired row not purged yet). nullopt: the key has no expiry.
  std::optional<std::chrono::milliseconds> ttl{};
  /// Postgres: when the row expires (lease or retention end), from the server, ms precision.
  /// nullopt for Redis (only the TTL is known there).
  std::optional<std::chrono::system_clock::time_point> expires_at{};
  /// Size in bytes of the response stored verbatim; nullopt when none is stored (IN_PROGRESS,
  /// or a response over the size cap, of which only the SHA-256 is kept).
  std::optional<std::size_t> response_bytes{};
  /// Lowercase hex SHA-256 of a response that was over the size cap; nullopt otherwise.
  std::optional<std::string> response_sha256{};
};

/// Which records force_release() may delete.
enum class ForceReleaseScope {
  kInProgressOnly,  ///< Only an IN_PROGRESS claim (a stuck lease); a COMPLETED record is kept.
  /// Any record. Deleting a COMPLETED record forgets that the operation ran: the next request
  /// with this key executes its side effect again.
  kAnyState,
};

/// What force_release() did.
enum class ForceReleaseStatus {
  kReleased,   ///< The record was deleted, whoever owned it.
  kNotFound,   ///< There was no record.
  kCompleted,  ///< The record is COMPLETED and the scope was kInProgressOnly: it was kept.
};

}  // namespace idem
