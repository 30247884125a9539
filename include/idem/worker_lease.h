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
  /// stops renewing it (crash, partition). Default 10 s; 1..2147483647.
  std::chrono::milliseconds ttl{10000};
  /// A background thread renews the lease this often, ms; after a failed renewal it tries again
  /// after a fifth of this, until one succeeds, so one failure does not lose the lease. Default
  /// 3 s; > 0 and at most ttl/2.
  std::chrono::milliseconds renew_interval{3000};
  /// On release (destruction), the key is kept this much longer, ms, instead of deleted: the
  /// next process to lease the worker ID starts at least this long after this one issued its
  /// last ID, so their IDs cannot collide while their clocks differ by less than this. Set it
  /// above the clock skew between the hosts. Default 1 s; 1..2147483647.
  std::chrono::milliseconds handover_margin{1000};
  /// Time source for valid_until_ms(), ms since the Unix epoch; null means system_clock().
  /// Give a SnowflakeGenerator that uses this lease the same clock.
  std::shared_ptr<Clock> clock{};
};

/// Holds `SET {key_prefix}{worker_id} {owner} NX PX {ttl}` on Redis for its lifetime and renews
/// it in the background (owner-checked: WATCH, GET, MULTI/PEXPIRE/EXEC). A lease found taken by
/// another owner is lost for good; one that could not be renewed (Redis down, or answering an
/// error such as LOADING or BUSY) stays valid only until the last successful renewal's send
/// time + ttl (valid_until_ms()). The destructor stops renewing and, if the key is still this
/// owner's, lets it expire after `handover_margin`. Give it to SnowflakeOptions::lease: the
/// generator then refuses to issue IDs while the lease is not held. A lease serves one
/// generator for its whole life: two generators on one worker ID issue the same IDs, so a
/// second one is refused.
///
/// Limit: a Redis that loses the key (restart without persistence, FLUSHALL, failover before
/// replication) lets another process take the ID while this one still trusts its lease, until
/// this one's next renewal finds the other owner and stops this generator: up to
/// `renew_interval`, or up to `ttl` while this process cannot reach Redis. Use a persistent,
/// replicated Redis, or keep `renew_interval` short.
///
/// Thread-safe: held() and valid_until_ms() are lock-free reads; renew() is serialized.
class IDEM_EXPORT WorkerIdLease {
 public:
  /// Acquires the lease. Throws idem::ConfigError for bad options or when the key exists (a
  /// start-up that must be refused): another owner holds it, or an owner with the same `owner`
  /// text that did not release it (a crash: it expires after ttl), or it was released less than
  /// handover_margin ago. idem::RedisError when Redis cannot be reached or answers an error.
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
  /// Throws idem::RedisError when Redis fails or answers an error (retryable as the error is,
  /// e.g. LOADING and BUSY are; the lease may still be held until valid_until_ms()) or when
  /// another owner holds the key (not retryable; lost for good).
  void renew();

 private:
  friend class SnowflakeGenerator;
  /// True the first time: the lease then serves the generator that asked.
  [[nodiscard]] bool bind_generator() const noexcept;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
