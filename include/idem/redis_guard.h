// Layer 2, the Redis guard: one atomic round trip claims an idempotency key.
//
// Record layout, key grammar and the choice of claim implementation: docs/redis_guard.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/export.h"
#include "idem/guard.h"
#include "idem/metrics.h"
#include "idem/pool_stats.h"
#include "idem/record.h"

namespace idem {

/// Connection settings for Redis (one pool per RedisGuard).
struct RedisOptions {
  /// `redis://[[user]:password@]host[:port][/db]` (port defaults to 6379, db to 0),
  /// `rediss://…` (the same over TLS 1.2+, e.g. for managed Redis: the server's certificate is
  /// verified against the system CA store, or `?ca_file=PATH`; `&cert_file=PATH&key_file=PATH`
  /// present a client certificate; `&server_name=NAME` checks another name than the host;
  /// `&verify=none` skips verification, for tests only; a file that cannot be loaded is an
  /// idem::ConfigError in the constructor), `unix://path/to/socket[?db=N]`, or Redis Sentinel in
  /// Lettuce's URI form
  /// `redis-sentinel://[[user]:password@]host1[:port1][,host2[:port2]...][/db]#master-name`
  /// (or `?sentinelMasterId=master-name` instead of the fragment; Sentinel ports default to
  /// 26379). Credentials are sent with AUTH: `AUTH user password` when the URL names a user
  /// (`redis://user:@host`, an empty password, as an ACL user made `nopass` needs), `AUTH
  /// password` for a password alone (`redis://:password@host`, or `redis://password@host` as
  /// Lettuce reads it), none without either. The database is sent with SELECT. With Sentinel
  /// both are the master's: the Sentinels are asked without AUTH and without TLS (the URL has
  /// no way to say either). With Sentinel the guard asks the
  /// Sentinels in turn for the master (SENTINEL get-master-addr-by-name), checks ROLE on every
  /// new connection, asks again after a retryable failure (connection lost, timeout, READONLY,
  /// a replica's ROLE) and follows `+switch-master` through one helper thread per guard, which
  /// listens on every Sentinel: from the first event of a failover of the master (+odown,
  /// +try-failover, ...) until the guard has moved to the master +switch-master names (at most
  /// 10 s), claim() and claim_batch() throw a retryable idem::RedisError without writing, since
  /// the old master may lose what it takes meanwhile; see docs/redis_guard.md.
  std::string url = "redis://127.0.0.1:6379/0";
  /// Most connections open at once (per master node with `cluster`). Must be ≥ 1.
  std::size_t pool_size = 8;
  /// Longest wait for a free connection when all `pool_size` are in use, in ms; then
  /// idem::RedisError (retryable). 0: take a free connection if there is one, else fail at once.
  std::chrono::milliseconds borrow_timeout{1000};
  /// Time allowed to establish a connection (TCP or unix), in ms, 1..2^31-1.
  std::chrono::milliseconds connect_timeout{500};
  /// Time allowed for one command's reply (per socket read/write), in ms, 1..2^31-1.
  /// A connection that timed out is destroyed, so a late reply is never read as the answer
  /// to a later command.
  std::chrono::milliseconds command_timeout{500};
  /// Enables TCP keepalive on TCP connections.
  bool keepalive = true;
  /// After a failed connect, new connects are not attempted (the call fails at once with the
  /// last connect error) for a backoff that starts at this value and doubles on each further
  /// failure up to `reconnect_backoff_max`, in ms. 0 disables the backoff.
  std::chrono::milliseconds reconnect_backoff{10};
  /// Cap of the reconnect backoff, in ms. Must be ≥ reconnect_backoff.
  std::chrono::milliseconds reconnect_backoff_max{1000};
  /// `url` is a seed node of a Redis Cluster: each key goes to the master of its slot (CRC16
  /// mod 16384, map from CLUSTER SLOTS), MOVED (reload the map) and ASK (ASKING) are followed,
  /// up to 5 redirections per call. After a retryable failure (connection lost or refused, a
  /// timeout, CLUSTERDOWN, TRYAGAIN, the node's breaker open) the map is reloaded (at most one
  /// reload at a time and one per 100 ms), and the call goes once more to the slot's new master
  /// when it has one (a replica promoted by failover). The URL must be `redis://` or
  /// `rediss://` (every node is then reached over TLS with the seed's settings) with database 0.
  bool cluster = false;
};

/// Circuit breaker of a RedisGuard, one per Redis server (the standalone server, each Sentinel
/// master, each cluster master): after `failure_threshold` consecutive calls to that server
/// failed with a retryable idem::RedisError, its breaker opens and every call to it throws
/// idem::RedisError at once (no I/O) for `open_for`; then one call is let through as a half-open
/// probe: its success closes the breaker, its failure opens it again. A failover moves calls to
/// the new master, whose breaker is its own. Uses the monotonic clock; it decides only
/// whether to try Redis, never what a record means.
struct CircuitBreakerOptions {
  /// Consecutive retryable failures that open the breaker. 0 disables the breaker.
  std::uint32_t failure_threshold = 5;
  /// How long the breaker stays open before a half-open probe, in ms. Must be > 0.
  std::chrono::milliseconds open_for{1000};
};

/// How claim() talks to Redis. Both give the same answers (the same tests run against both).
enum class ClaimMethod {
  /// `EVALSHA` of lua/claim.lua (loaded once with SCRIPT LOAD; NOSCRIPT reloads once).
  kLuaScript,
  /// A single `SET key record NX PX lease GET` (Redis ≥ 7.0): no script to load. On an
  /// older server every claim fails with a non-retryable idem::RedisError saying so.
  kSetNxGet,
};

/// Options of a RedisGuard.
struct RedisGuardOptions {
  RedisOptions redis{};             ///< Where Redis is and how to connect.
  CircuitBreakerOptions breaker{};  ///< When to stop trying Redis for a while.
  /// First component of every Redis key: `{prefix}:{ns}:{key text}`. Escaped like a key
  /// component (see escape_key_component()). Must be non-empty and, escaped, at most
  /// kMaxKeyComponentBytes (idem::ConfigError otherwise).
  std::string prefix = "idem";
  /// Namespace (service or tenant), second component of every Redis key. Escaped like a key
  /// component. Must be non-empty and, escaped, at most kMaxKeyComponentBytes (ConfigError).
  std::string ns = "default";
  /// TTL of an IN_PROGRESS claim (the lease), in ms, > 0, at most 100 years.
  std::chrono::milliseconds lease{std::chrono::seconds(30)};
  /// TTL of a COMPLETED record (the retention), in ms, > 0, at most 100 years.
  std::chrono::milliseconds retention{std::chrono::hours(24)};
  /// Largest response stored verbatim, in bytes. A larger response is stored as its SHA-256
  /// (lowercase hex) only, and a repeat gets ClaimResult::response_sha256 without a body.
  std::size_t max_response_bytes = 64 * 1024;
  /// Receives Metrics::record_foreign_record() for every value under a guard key that is not an
  /// idem record (idem::ForeignRecord); may be the facade's DeduplicatorOptions::metrics. Empty:
  /// not counted (the exception still says it).
  std::shared_ptr<Metrics> metrics{};
  /// The claim implementation. Default kSetNxGet: one native command, up to ~1.5× the script's
  /// throughput when Redis' CPU is the limit, equal otherwise (docs/redis_guard.md,
  /// bench/guard.sh); needs Redis ≥ 7.0, else use kLuaScript.
  ClaimMethod claim_method = ClaimMethod::kSetNxGet;

  /// Durability of the guard's writes: how many replicas must hold a claim, a completion or a
  /// renewal before the guard answers. 0 (the default) waits for none: Redis replicates
  /// asynchronously, so a failover (Sentinel or Cluster promoting a replica, or the old master
  /// demoted after SENTINEL FAILOVER) may lose the writes of its last moments, and a guard-only
  /// deployment then runs those requests again. With N > 0, every claim, complete() and renew()
  /// is followed by `WAIT N replication_timeout` in the same write (one round trip: the client
  /// adds none; the write's reply comes once N replicas acknowledged it, or the timeout passed):
  /// - claim() (and each key of claim_batch(), one WAIT after the batch): a kFirst claim that
  ///   fewer than N replicas acknowledged answers ClaimResult::replicated = false, with its owner
  ///   token (the caller owns it, on the master only; the facade releases it and answers
  ///   Unavailable when failing closed). Repeats are unaffected.
  /// - complete() and renew(): fewer than N acknowledgements throw a retryable idem::RedisError
  ///   ("not acknowledged by N replicas within T ms"); the write was made on the master and may
  ///   or may not survive a failover.
  /// - release() waits for none: a release lost in a failover only leaves the claim until its
  ///   lease ends. inspect() and force_release() wait for none either.
  /// What it guarantees: a write answered as acknowledged is in the memory of N replicas. A
  /// failover that promotes one of them keeps it; Sentinel and Cluster promote, among the
  /// replicas they can reach, the one with the largest replication offset, which holds every
  /// write any replica acknowledged. Set N to the number of replicas of each master to keep
  /// that true when an acknowledging replica is itself down during the failover. WAIT is not
  /// consensus: a replica restarted without persistence forgets. What it does not cover: a
  /// completion that failed leaves the (replicated) claim IN_PROGRESS until its lease ends.
  /// What it costs: each write waits for a master-to-replica round trip; with fewer than N
  /// replicas connected (a replica that has just synced counts from its first acknowledgement,
  /// within a second) every claim waits the whole replication_timeout and is answered not
  /// replicated. docs/operations.md has the measurements. In a cluster the WAIT goes to the master
  /// of the key's slot, on the connection of the write (WAIT counts that connection's writes).
  std::uint32_t min_replicas = 0;
  /// With min_replicas > 0: the longest a write waits for its replicas' acknowledgement, in ms,
  /// > 0 and < redis.command_timeout (the reply of the write comes after it).
  std::chrono::milliseconds replication_timeout{100};
};

/// One key of RedisGuard::claim_batch().
struct ClaimRequest {
  std::string_view key{};          ///< Encoded key text (see IdempotencyKey::encode()).
  std::string_view request_id{};   ///< Request ID of the caller; may be empty.
  std::string_view fingerprint{};  ///< Payload fingerprint; empty when none.
};

/// State of the guard's circuit breaker.
enum class BreakerState {
  kClosed,    ///< Calls go to Redis.
  kOpen,      ///< Calls throw idem::RedisError at once, without I/O, until the cool-down ends.
  kHalfOpen,  ///< Cool-down over: the next call is a probe (others throw at once until it ends).
};

/// The Redis guard. Thread-safe: one instance serves all threads of a process through its
/// connection pool. Every Redis call throws idem::RedisError when Redis fails, times out or is
/// unreachable (retryable() says whether the same call may succeed later), and at once, without
/// I/O, while the circuit breaker is open. A failed call never yields kFirst: when claim()
/// throws, the caller does not own the key (it may own it in Redis, until the lease ends).
class IDEM_EXPORT RedisGuard final : public Guard {
 public:
  /// Throws idem::ConfigError on invalid options. Does not connect until first use.
  explicit RedisGuard(RedisGuardOptions options);
  ~RedisGuard();
  RedisGuard(const RedisGuard&) = delete;
  RedisGuard& operator=(const RedisGuard&) = delete;

  /// Atomically claims `key` (an encoded key text, see IdempotencyKey::encode()) for
  /// `request_id` in one round trip. On kFirst the record is IN_PROGRESS with TTL = lease.
  /// Throws idem::ForeignRecord when the key holds a value idem did not write (left as is).
  /// Throws idem::InvalidKey when `key` fails validate_key_text() (so no caller text becomes a
  /// Redis Cluster hash tag), idem::RedisError when Redis fails.
  [[nodiscard]] ClaimResult claim(std::string_view key, std::string_view request_id,
                                  std::string_view fingerprint) override;

  /// Claims every key of `requests` in one pipelined round trip per node (the whole batch on a
  /// standalone server, one pipeline per master in a cluster; a claim redirected because its
  /// slot moved is sent again on its own); answer i belongs to requests[i]. Each claim is atomic
  /// on its own (not the batch as a whole). Throws idem::InvalidKey before any I/O when a key
  /// fails validate_key_text(), idem::RedisError when a round trip fails (then no answer is known),
  /// and when one key's answer is an error or a foreign value (idem::ForeignRecord): then the
  /// claims the batch did make are released first (owner-checked, best effort), so no key stays
  /// held by it.
  [[nodiscard]] std::vector<ClaimResult> claim_batch(const std::vector<ClaimRequest>& requests);

  /// Marks the claim COMPLETED with `response` (verbatim, or only its SHA-256 above
  /// max_response_bytes) and sets the retention TTL. Acts only when `owner_token` owns the
  /// record and it is still IN_PROGRESS; returns false (and changes nothing) otherwise, true
  /// without a change when this owner completed it already (a resend after a lost reply).
  /// Throws idem::ForeignRecord when the owner's record is damaged (left as is).
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response,
                std::chrono::milliseconds retention) override;
  /// complete() with the configured retention.
  bool complete(std::string_view key, std::string_view owner_token, std::string_view response);

  /// Deletes the record if and only if `owner_token` owns it and it is still IN_PROGRESS
  /// (compare-and-delete). Returns whether it deleted. Never deletes another owner's claim.
  bool release(std::string_view key, std::string_view owner_token) override;

  /// Extends the lease of an IN_PROGRESS claim owned by `owner_token` to `lease` from now
  /// (Redis' clock), in ms. Returns false (and changes nothing) when the caller no longer owns
  /// it. Throws idem::ConfigError when `lease` ≤ 0.
  bool renew(std::string_view key, std::string_view owner_token,
             std::chrono::milliseconds lease) override;

  /// renew() with the configured lease.
  bool renew(std::string_view key, std::string_view owner_token);
  /// Guard::steps(): `HGETALL` of the journal hash `{<record key>}:steps` (same Cluster slot as
  /// the record). Not on a replica: read from the master.
  [[nodiscard]] StepJournal steps(std::string_view key) override;
  /// Guard::put_step(): one Lua script checks the owner of the IN_PROGRESS record and writes the
  /// entry, the journal's TTL set to RedisGuardOptions::retention. Waits for
  /// RedisGuardOptions::min_replicas like complete().
  bool put_step(std::string_view key, std::string_view owner_token, std::string_view name,
                const JournaledStep& step) override;

  /// Reads the record of `key` (an encoded key text) and its remaining TTL in one atomic
  /// script call, without claiming or changing it. nullopt when there is no record. For
  /// operators and tools (idemctl inspect), not for deciding requests: the answer may be stale
  /// as soon as it returns. Throws idem::RedisError as every call.
  [[nodiscard]] std::optional<RecordInfo> inspect(std::string_view key);

  /// Deletes the record of `key` whoever owns it, atomically (one script): an operator's way to
  /// free a claim stuck until its lease ends. With kInProgressOnly a COMPLETED record is kept
  /// (kCompleted); with kAnyState it is deleted too, and so is the key's step journal (whatever
  /// it holds), so that the next request with this key runs its side effect, and its steps,
  /// again. kInProgressOnly keeps the journal: the retry skips the steps done. Prefer the
  /// owner-checked release(). Throws idem::RedisError.
  ForceReleaseStatus force_release(std::string_view key, ForceReleaseScope scope);

  /// The full Redis key for a key text: `{escaped prefix}:{escaped ns}:{key}`. Every method
  /// taking a key passes through it. Throws idem::InvalidKey when `key` fails
  /// validate_key_text().
  [[nodiscard]] std::string redis_key(std::string_view key) const;

  /// Checks that Redis answers and accepts this guard's settings: borrows a pooled connection
  /// (connecting, with AUTH and SELECT, if none is open) and sends PING; in a cluster, to the
  /// master of the key prefix's slot. For start-up and readiness checks: with a sink configured,
  /// the facade fails open on Redis errors, so a wrong password would otherwise show only in
  /// idem_backend_errors_total. Throws idem::RedisError like every call (retryable() false for
  /// a configuration problem such as WRONGPASS or NOAUTH; at once while the breaker is open).
  void ping();

  /// Current state of the circuit breaker: the standalone server's, the current Sentinel
  /// master's (kClosed before the first call), or in a cluster the worst of the masters'
  /// (kOpen if any is open, else kHalfOpen if any is). Thread-safe, no I/O.
  [[nodiscard]] BreakerState breaker_state() const;

  /// What the guard's connection pool holds now: the standalone server's, the current Sentinel
  /// master's (an empty pool of pool_size before the first call), or in a cluster the current
  /// masters' summed. Thread-safe, no I/O; for gauges (InProcessMetrics::watch()) and sizing.
  [[nodiscard]] PoolStats pool_stats() const;

  /// The options in force (as validated by the constructor).
  [[nodiscard]] const RedisGuardOptions& options() const noexcept;

  /// RedisGuardOptions::lease.
  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override;
  /// RedisGuardOptions::retention.
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override;
  /// RedisGuardOptions::max_response_bytes.
  [[nodiscard]] std::size_t max_response_bytes() const noexcept override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
