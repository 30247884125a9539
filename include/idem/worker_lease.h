// A Redis lease on a Snowflake worker ID, so two live processes never use the same one.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "idem/clock.h"
#include "idem/export.h"
#include "idem/redis_guard.h"

namespace idem {

/// Options of a WorkerIdLease; validated by its constructor (idem::ConfigError).
struct WorkerIdLeaseOptions {
  /// Where the lease lives. Only url, connect_timeout, command_timeout and keepalive are used
  /// (one connection, owned by the lease): url names one server (redis://, rediss:// or
  /// unix://); a redis-sentinel:// URL is a ConfigError.
  RedisOptions redis{};
  /// The worker ID to lease, 0–1023. Required: the default -1 is a ConfigError.
  std::int32_t worker_id = -1;
  /// This process' identity, stored as the key's value (shown by GET, useful when a start-up
  /// is refused). Empty (the default) means a fresh UUIDv7.
  std::string owner{};
  /// The key is key_prefix + worker ID in decimal: "idem:worker:17" by default.
  std::string key_prefix = "idem:worker:";
  /// Lease time to live, ms (SET … PX): how long the ID stays reserved after this process
  /// stops renewing it (crash, partition). Default 10 s; > 0.
  std::chrono::milliseconds ttl{10000};
  /// A background thread renews the lease this often, ms. Default 3 s; > 0 and at most ttl/2,
  /// so one failed renewal does not lose the lease.
  std::chrono::milliseconds renew_interval{3000};
  /// Time source for valid_until_ms(), ms since the Unix epoch; null means system_clock().
  /// Give a SnowflakeGenerator that uses this lease the same clock.
  std::shared_ptr<Clock> clock{};
};

/// Holds `SET {key_prefix}{worker_id} {owner} NX PX {ttl}` on Redis for its lifetime and renews
/// it in the background (owner-checked: WATCH, GET, MULTI/PEXPIRE/EXEC). A lease found taken by
/// another owner is lost for good; one that could not be renewed stays valid only until the
/// last successful renewal's send time + ttl (valid_until_ms()). The destructor stops renewing
/// and deletes the key if it is still this owner's. Give it to SnowflakeOptions::lease: the
/// generator then refuses to issue IDs while the lease is not held.
///
/// Limit: a Redis that loses the key (restart without persistence, failover before
/// replication) lets another process take the ID while this one still trusts its lease, for
/// up to `ttl`; the next renewal then finds the other owner and stops this generator. Use a
/// persistent, replicated Redis, or keep `ttl` short.
///
/// Thread-safe: held() and valid_until_ms() are lock-free reads; renew() is serialized.
class IDEM_EXPORT WorkerIdLease {
 public:
  /// Acquires the lease. Throws idem::ConfigError for bad options or when the worker ID is
  /// already leased by another owner (a start-up that must be refused), idem::RedisError
  /// when Redis cannot be reached.
  explicit WorkerIdLease(WorkerIdLeaseOptions options);
  ~WorkerIdLease();
  WorkerIdLease(const WorkerIdLease&) = delete;
  WorkerIdLease& operator=(const WorkerIdLease&) = delete;

  /// The leased worker ID.
  [[nodiscard]] std::int32_t worker_id() const noexcept;
  /// The value stored in the key (options.owner, or the generated UUIDv7).
  [[nodiscard]] const std::string& owner() const noexcept;

  /// Clock time (ms) until which the lease is known to be held; 0 once it is lost.
  [[nodiscard]] std::int64_t valid_until_ms() const noexcept;

  /// True while the clock is before valid_until_ms().
  [[nodiscard]] bool held() const noexcept;

  /// Renews now (the background thread calls this). Re-acquires an expired key with SET NX.
  /// Throws idem::RedisError when Redis fails (retryable; the lease may still be held until
  /// valid_until_ms()) or when another owner holds the key (not retryable; lost for good).
  void renew();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
