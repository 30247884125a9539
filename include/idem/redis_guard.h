// Layer 2, the Redis guard: one atomic round trip claims an idempotency key.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/record.h"

namespace idem {

/// Connection settings for Redis.
struct RedisOptions {
  /// `redis://host:port/db`. Default: a local server on the standard port, database 0.
  std::string url = "redis://127.0.0.1:6379/0";
  /// Most connections open at once. Must be ≥ 1.
  std::size_t pool_size = 8;
  /// Time allowed to establish a TCP connection.
  std::chrono::milliseconds connect_timeout{500};
  /// Time allowed for one command's reply; a connection that timed out is discarded.
  std::chrono::milliseconds command_timeout{500};
};

/// Options of a RedisGuard.
struct RedisGuardOptions {
  RedisOptions redis;
  /// First component of every Redis key: `{prefix}:{ns}:{key text}`.
  std::string prefix = "idem";
  /// Namespace (service or tenant), second component of every Redis key. Must be non-empty.
  std::string ns = "default";
  /// TTL of an IN_PROGRESS claim (the lease), in milliseconds. Must be > 0.
  std::chrono::milliseconds lease{std::chrono::seconds(30)};
  /// TTL of a COMPLETED record (the retention), in milliseconds. Must be > 0.
  std::chrono::milliseconds retention{std::chrono::hours(24)};
};

/// What a claim found.
enum class ClaimStatus {
  kFirst,        ///< No record existed: the caller now owns the claim.
  kRepeatSame,   ///< A record exists, created by this same request ID (retry, redelivery).
  kRepeatOther,  ///< A record exists, created by another request ID (same operation again).
};

/// Answer of RedisGuard::claim().
struct ClaimResult {
  ClaimStatus status = ClaimStatus::kFirst;
  /// The caller's owner token when status is kFirst (needed for complete/release/renew);
  /// empty otherwise.
  std::string owner_token;
  /// State of the record found (kInProgress for a fresh claim).
  RecordState state = RecordState::kInProgress;
  /// Whether the stored fingerprint equals the caller's (true for a fresh claim).
  bool fingerprint_matches = true;
  /// The stored response of a COMPLETED record.
  std::optional<std::string> response;
};

/// The Redis guard. Thread-safe: one instance serves all threads of a process through its
/// connection pool. Every method throws idem::RedisError when Redis fails or is unreachable.
class RedisGuard {
 public:
  /// Throws idem::ConfigError on invalid options. Does not connect until first use.
  explicit RedisGuard(RedisGuardOptions options);
  ~RedisGuard();
  RedisGuard(const RedisGuard&) = delete;
  RedisGuard& operator=(const RedisGuard&) = delete;

  /// Atomically claims `key` (an encoded key text, see IdempotencyKey::encode()) for
  /// `request_id`, in one round trip (Lua script via EVALSHA).
  [[nodiscard]] ClaimResult claim(std::string_view key, std::string_view request_id,
                                  std::string_view fingerprint);

  /// Marks the claim COMPLETED with `response` and sets the retention TTL. Acts only when
  /// `owner_token` still owns the claim; returns false (and changes nothing) otherwise.
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response);

  /// Deletes the claim if and only if `owner_token` owns it (compare-and-delete). Returns
  /// whether it deleted. Never deletes another owner's claim.
  bool release(std::string_view key, std::string_view owner_token);

  /// The full Redis key for a key text: `{prefix}:{ns}:{key}`.
  [[nodiscard]] std::string redis_key(std::string_view key) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
