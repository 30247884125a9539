// Snowflake request IDs: 64-bit, time-ordered, unique per worker ID without coordination.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/clock.h"
#include "idem/export.h"

namespace idem {

class WorkerIdLease;

/// Default Snowflake epoch: 2024-01-01T00:00:00Z, in ms since the Unix epoch. The 41-bit
/// timestamp lasts about 69.7 years from the epoch.
inline constexpr std::chrono::milliseconds kDefaultSnowflakeEpoch{1704067200000};
/// Highest Snowflake worker ID (10 bits).
inline constexpr std::int32_t kMaxSnowflakeWorkerId = 1023;
/// IDs one Snowflake generator can issue per millisecond (12-bit sequence).
inline constexpr std::uint32_t kSnowflakeIdsPerMs = 4096;

/// Options of a SnowflakeGenerator; validated by its constructor (idem::ConfigError).
struct SnowflakeOptions {
  /// This process' worker ID, 0–1023. Required: the default -1 is a ConfigError. Two live
  /// generators with the same worker ID and epoch can issue the same ID; a WorkerIdLease
  /// keeps processes apart.
  std::int32_t worker_id = -1;
  /// Custom epoch in ms since the Unix epoch; >= 0 and not in the future.
  std::chrono::milliseconds epoch = kDefaultSnowflakeEpoch;
  /// How far the clock may step back before next() gives up: a step of at most this much
  /// is waited out (next() blocks until the clock is back); a longer one throws
  /// idem::ClockMovedBackwards at once. Default 10 ms; 0 never waits; >= 0.
  std::chrono::milliseconds max_backward_wait{10};
  /// Time source (ms since the Unix epoch); null means system_clock().
  std::shared_ptr<Clock> clock{};
  /// Optional Redis lease on the worker ID (worker_lease.h). When set, worker_id may stay -1
  /// (the lease's is used) or must equal the lease's, and next() refuses to issue IDs once
  /// the clock reaches the lease's valid_until_ms() (lost, or not renewed in time). A lease
  /// serves one generator for its whole life: a second generator given it is a ConfigError.
  std::shared_ptr<const WorkerIdLease> lease{};
};

/// The fields of a Snowflake ID.
struct SnowflakeParts {
  std::int64_t unix_ms = 0;    ///< Timestamp, ms since the Unix epoch.
  std::int32_t worker_id = 0;  ///< 0–1023.
  std::uint32_t sequence = 0;  ///< 0–4095, the ID's rank within its millisecond.
};

/// Generates 64-bit Snowflake IDs: 1 zero bit, 41-bit ms timestamp since the epoch, 10-bit
/// worker ID, 12-bit sequence. IDs of one generator are strictly increasing, across all
/// threads, and never reused: 4096 IDs in one millisecond make the next call wait for the
/// next millisecond; a clock step back is waited out (up to max_backward_wait) or refused.
/// An ID's timestamp is never ahead of the clock reading that issued it.
///
/// Thread-safe and lock-free: the whole state is one atomic 64-bit word updated by CAS.
class IDEM_EXPORT SnowflakeGenerator {
 public:
  /// Throws idem::ConfigError for a worker ID outside 0–1023, a negative wait, an epoch that
  /// is negative, in the future, or more than 2^41 ms in the past, or a lease that already
  /// serves another generator.
  explicit SnowflakeGenerator(SnowflakeOptions options);

  /// The next ID. Throws idem::ClockMovedBackwards when the clock is behind the last issued
  /// ID by more than max_backward_wait (or still behind after waiting that long),
  /// idem::RedisError when a lease is configured and not held (retryable() unless another
  /// owner took it), and idem::Error when the 41-bit timestamp is exhausted.
  [[nodiscard]] std::uint64_t next();

  /// The worker ID in every ID (0–1023).
  [[nodiscard]] std::int32_t worker_id() const noexcept { return worker_id_; }
  /// The epoch, ms since the Unix epoch.
  [[nodiscard]] std::chrono::milliseconds epoch() const noexcept { return epoch_; }

  /// Splits `id` into its fields, for a generator with the given epoch.
  [[nodiscard]] static SnowflakeParts decompose(
      std::uint64_t id, std::chrono::milliseconds epoch = kDefaultSnowflakeEpoch) noexcept;

 private:
  std::int32_t worker_id_;
  std::chrono::milliseconds epoch_;
  std::chrono::milliseconds max_backward_wait_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<const WorkerIdLease> lease_;
  /// Last issued (timestamp since epoch << 12 | sequence); 0 before the first ID.
  std::atomic<std::uint64_t> last_{0};
};

/// Fixed length of snowflake_to_base32() text.
inline constexpr std::size_t kSnowflakeBase32Length = 13;

/// Decimal text of a Snowflake ID (1–20 digits; not fixed-length, so it does not sort as
/// text). Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string snowflake_to_decimal(std::uint64_t id);
/// Parses decimal text made only of digits (leading zeros accepted); std::nullopt when
/// malformed or over 64 bits. Thread-safe. Several texts give one ID ("42", "042"), and so do
/// base32 texts in another case or with aliases: a request ID is compared as text, so a client
/// must send back the text it was given, never a re-encoding.
[[nodiscard]] IDEM_EXPORT std::optional<std::uint64_t> snowflake_from_decimal(
    std::string_view text) noexcept;

/// Crockford base32 (digits and uppercase letters without I, L, O, U), 13 characters,
/// zero-padded, so the text sorts like the numbers. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::string snowflake_to_base32(std::uint64_t id);
/// Parses 13 Crockford base32 characters, case-insensitive, with Crockford's aliases
/// (O→0, I and L→1); std::nullopt when malformed or over 64 bits. Thread-safe.
[[nodiscard]] IDEM_EXPORT std::optional<std::uint64_t> snowflake_from_base32(
    std::string_view text) noexcept;

/// The seed's request-ID format as a named option: the Snowflake ID in base32 (13 chars)
/// followed by 8 base32 chars of HMAC-SHA-256(key, last 8 bytes of the user ID), 21 chars in
/// all, a valid request ID. The user part is not reversible without the key, yet the same
/// user always gives the same 8 chars (so IDs can be grouped by user without exposing it).
/// Thread-safe (immutable after construction).
class IDEM_EXPORT SeedIdFormat {
 public:
  /// Length of every formatted ID.
  static constexpr std::size_t kLength = kSnowflakeBase32Length + 8;
  /// Shortest HMAC key accepted, in bytes.
  static constexpr std::size_t kMinKeyBytes = 16;

  /// Throws idem::ConfigError when `key` is shorter than kMinKeyBytes.
  explicit SeedIdFormat(std::string key);

  /// The formatted ID for `snowflake` and `user_id` (any bytes; fewer than 8 are all used).
  /// Throws idem::Error if OpenSSL's HMAC fails. Thread-safe (const).
  [[nodiscard]] std::string format(std::uint64_t snowflake, std::string_view user_id) const;

 private:
  std::string key_;
};

}  // namespace idem
