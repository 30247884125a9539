// Layer 4, the Postgres sink: the idempotency key under a UNIQUE index, inserted in the same
// transaction as the business write.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/export.h"
#include "idem/pool_stats.h"
#include "idem/record.h"
#include "idem/sink.h"

namespace pqxx {
class transaction_base;  // libpqxx's transaction; include <pqxx/pqxx> to use it.
}

namespace idem {

namespace detail {
class PgTransaction;  // the blocking driver's transaction (src/sink/pg_transaction.h)
}

/// What the sink's connections lead to: a session of their own, or a transaction pooler that
/// hands each transaction to any server connection (docs/pg_sink.md, "pgbouncer").
enum class PgPooling {
  /// PostgreSQL directly, or a pooler in session mode (pgbouncer `pool_mode = session`): each
  /// connection is one server session for its whole life. Statements are prepared once per
  /// connection (protocol-level PQprepare, named `idem_*`); statement_timeout and lock_timeout
  /// are session settings, set once; single statements outside a transaction commit by
  /// themselves.
  kSession,
  /// A pooler in transaction mode (pgbouncer `pool_mode = transaction`; pgbouncer 1.18 cannot
  /// carry protocol-level prepared statements there, and no pooler keeps session settings):
  /// idem keeps no session state. Every statement is sent with its parameters as an unnamed
  /// statement (PQexecParams: parsed on each call), every transaction idem opens begins with
  /// `SET LOCAL statement_timeout …; SET LOCAL lock_timeout …` (one extra round trip), and the
  /// non-transactional claim(), complete(), release() and purge_expired() each run in such a
  /// short transaction (BEGIN, SET LOCAL, the statements, COMMIT) instead of committing by
  /// themselves. A transaction handed to a handler must not PREPARE statements, use
  /// session-level SET, LISTEN or session advisory locks either.
  kTransaction,
};

/// Options of a PgSink. Validated once by the PgSink constructor (idem::ConfigError).
struct PgSinkOptions {
  /// libpq connection string: a `postgresql://` URL or `key=value` keywords. Required; one libpq
  /// cannot parse (an unknown keyword, bad percent-encoding) is an idem::ConfigError. A value
  /// libpq parses but cannot use (`connect_timeout=abc`) fails at the first connect, as a
  /// retryable idem::PostgresError. For a
  /// primary with standbys, list every host and let libpq find the one that accepts writes:
  /// `host=a,b port=5432,5432 target_session_attrs=read-write` (docs/operations.md, "High
  /// availability").
  std::string conninfo{};
  /// Session (default) or transaction pooling between the sink and PostgreSQL; see PgPooling.
  PgPooling pooling = PgPooling::kSession;
  /// Schema of the records. Quoted as an identifier, so any non-empty name without a NUL
  /// byte is safe (used exactly as given, case included; PostgreSQL keeps the first 63 bytes
  /// of a longer one). migrate() creates it.
  std::string schema = "public";
  /// Table of the records, in `schema`; quoted like it, up to 48 bytes (migrate() creates it
  /// and an index named `<table>_expires_at_idx`, which must fit PostgreSQL's 63).
  std::string table = "idem_records";
  /// Namespace (service or tenant) stored with each row; part of the unique key. Non-empty,
  /// at most idem::kMaxKeyComponentBytes bytes (idem/key.h; idem::ConfigError otherwise), so the
  /// key stays inside PostgreSQL's B-tree row limit.
  std::string ns = "default";
  /// Most connections open at once. Must be ≥ 1.
  std::size_t pool_size = 8;
  /// How long a call waits for a free pooled connection, in ms, before it throws a retryable
  /// idem::PostgresError. 0: take a free connection if there is one, else fail at once.
  std::chrono::milliseconds borrow_timeout{5000};
  /// Server-side `statement_timeout` of the sink's connections, in ms (a statement running longer
  /// is cancelled: retryable idem::PostgresError, SQLSTATE 57014). 0 means no limit;
  /// at most 2^31-1 (PostgreSQL takes an int).
  std::chrono::milliseconds statement_timeout{5000};
  /// Server-side `lock_timeout` of the sink's connections, in ms. Bounds how long a claim waits
  /// for another transaction that holds an uncommitted claim of the same key; when it runs out the
  /// claim answers SinkStatus::kInProgress. It applies to every statement on the sink's
  /// connections, business writes included (those throw a retryable idem::PostgresError,
  /// SQLSTATE 55P03). 0 means wait without limit (not recommended: a stuck transaction then
  /// blocks its duplicates); at most 2^31-1.
  std::chrono::milliseconds lock_timeout{1000};
  /// Client-side bound, in ms, on how long idem waits for the server to answer one of its own
  /// statements (claim, complete, release, inspect, purge, force_release, ping) and the BEGIN,
  /// COMMIT and ROLLBACK of every transaction it opens (transact(), transact_if(), migrate()).
  /// The server-side timeouts cannot fire when the server stopped answering (a stopped process,
  /// a paused VM, a partition the keepalives have not noticed); then, after response_timeout,
  /// the connection's socket is shut down and the call throws a retryable idem::PostgresError
  /// (SQLSTATE 08006), or a non-retryable one for a COMMIT, whose outcome is unknown. Connecting
  /// is bounded by it too (libpq's connect_timeout, whole seconds, at least 2) unless `conninfo`
  /// sets connect_timeout. The caller's own statements inside a transaction are not bounded.
  /// Must be 0 (no bound), or longer than statement_timeout and lock_timeout, which must then be
  /// set (a server timeout of 0 waits without limit, which a client bound would cut off); a
  /// value beyond the clock's range never fires. Costs one helper thread per PgSink.
  std::chrono::milliseconds response_timeout{10000};
  /// How long an IN_PROGRESS row committed by the non-transactional claim() lives, in ms, before
  /// another claim may take the key over (the owner crashed). Must be > 0.
  std::chrono::milliseconds lease{30000};
  /// How long a row committed by a transactional claim or completed is kept, in seconds, before
  /// purge_expired() may delete it and a new claim may take the key. Must be > 0.
  std::chrono::seconds retention{std::chrono::hours(24)};
  /// Largest response stored as is, in bytes. A larger response is not stored: only its SHA-256
  /// is kept, and a duplicate gets no body (SinkClaim::response_sha256 set instead).
  std::size_t max_response_bytes = std::size_t{64} * 1024;
  /// Names of UNIQUE constraints on the caller's own business tables whose violation (SQLSTATE
  /// 23505) means "this operation was already done", e.g. the seed's
  /// `refund_records_idem_key_key`. See run_business_write(). Any other 23505 is an error.
  std::vector<std::string> business_constraints{};
  /// The statement cache of handlers' own texts: of the SQL texts that run_transactional()
  /// handlers send through idem (AsyncTransaction::exec() and stage(), Context::stage()), the
  /// first `statement_cache` distinct ones are prepared on each connection at their first use
  /// there (parsed and planned once per connection, then sent by name); any later text is sent
  /// unnamed, parsed on every call. 0: none prepared. Each prepared text costs its plan's memory
  /// in each server session. Statements a handler runs through its pqxx transaction are its own
  /// (libpqxx's prepare() and exec_prepared() prepare them).
  std::size_t statement_cache = 64;
};

/// The Postgres sink. Thread-safe: one instance serves all threads through its bounded
/// connection pool; a pqxx transaction handed to a body belongs to that body's thread only.
/// Every method throws idem::PostgresError when PostgreSQL fails (retryable() for connection
/// loss, serialization failure, deadlock, lock or statement timeout); connections that broke or
/// were left in a failed transaction are never handed out again.
class IDEM_EXPORT PgSink final : public Sink {
 public:
  /// Throws idem::ConfigError on invalid options. Does not connect until first use.
  explicit PgSink(PgSinkOptions options);
  ~PgSink();
  PgSink(const PgSink&) = delete;
  PgSink& operator=(const PgSink&) = delete;

  /// Creates or upgrades the schema objects (src/sink/schema.sql) to the current version.
  /// Idempotent, and safe to run concurrently from many processes: one migrates at a time (an
  /// advisory lock, waited for up to statement_timeout), the others then find it done. Throws
  /// idem::PostgresError (the migration's transaction rolls back).
  void migrate() override;

  /// The schema versions a migration went between (see schema_version()).
  struct Migration {
    int from = 0;  ///< What it found: 0 when migrate() never ran on this schema and table.
    int to = 0;    ///< What it left: the current version.
  };
  /// As migrate(), and says what it did. Both versions are read under the migration's lock, so
  /// of migrations run at once each reports its own: the first from what it found, the others
  /// from the version it left.
  Migration migrate_schema();

  /// The highest schema migration applied (src/sink/schema.sql's `-- idem:migration N`), 0 when
  /// migrate() never ran on this schema and table.
  [[nodiscard]] int schema_version();

  /// Checks that the server answers on this sink's connection settings (credentials included):
  /// borrows a pooled connection, connecting if none is open, and runs `SELECT 1` within
  /// response_timeout. For start-up and readiness checks. Throws idem::PostgresError; a failed
  /// connect is retryable() whatever its cause (libpq does not tell a wrong password from a
  /// server that is starting), and its message says which.
  void ping();

  /// Borrows a pooled connection, opens a transaction (READ COMMITTED), runs `body` in it and
  /// commits when `body` returns; rolls back and rethrows when it throws (pqxx errors translated
  /// to idem::PostgresError, other exceptions unchanged). Commits nothing after a claim that
  /// answered kInProgress (its lock wait aborted the transaction), and returns without error.
  /// When another statement failed and `body` caught the error and returned, nothing is
  /// committed either, and it throws a non-retryable idem::PostgresError (SQLSTATE 25P02).
  void transact(const std::function<void(pqxx::transaction_base&)>& body);

  /// Like transact(), but commits only when `body` returns true (rolls back when it returns
  /// false, e.g. after run_business_write() reported a duplicate). Returns whether it committed:
  /// false also when `body` returned true after a claim that answered kInProgress.
  bool transact_if(const std::function<bool(pqxx::transaction_base&)>& body);

  /// Inserts the claim row for `key` inside `tx` (`INSERT … ON CONFLICT DO NOTHING
  /// RETURNING`, after the key's transaction-scoped advisory lock, which every claim of idem
  /// takes), before the caller's business write. A conflict with a committed row never
  /// aborts `tx`; it answers kDuplicate with that row's state, fingerprint match and response.
  /// A conflict with an open transaction waits up to lock_timeout, then answers kInProgress.
  /// A row past its expiry is taken over (answers kClaimed). `key` is an encoded key text
  /// (IdempotencyKey::encode()); `request_id` is at most 64 bytes (else idem::InvalidRequestId);
  /// `fingerprint` may be empty. `tx` normally comes from transact(); on a connection of the
  /// caller's own the sink prepares its statements on first use, but that connection's own lock
  /// and statement timeouts apply. The row commits only with `tx`, so it is kept for `retention`
  /// in ms (0: PgSinkOptions::retention; < 0: idem::ConfigError) even if complete() is never
  /// called.
  [[nodiscard]] SinkClaim claim(pqxx::transaction_base& tx, std::string_view key,
                                std::string_view request_id, std::string_view fingerprint,
                                std::chrono::milliseconds retention = std::chrono::milliseconds(0));

  /// Marks the row of `key`, claimed earlier in `tx`, COMPLETED with `response` (size-capped)
  /// and keeps it for `retention` in ms (0: PgSinkOptions::retention; < 0: idem::ConfigError;
  /// a payload-keyed request's fallback key is kept shorter), inside `tx`, before commit. Throws
  /// idem::Error when `tx` holds no in-progress claim of `key`.
  void complete(pqxx::transaction_base& tx, std::string_view key, std::string_view response,
                std::chrono::milliseconds retention = std::chrono::milliseconds(0));

  /// Runs the caller's business write under a savepoint: `write` gets a pqxx::subtransaction of
  /// `tx` and sends its statements through it (exec(), exec_params(), exec_prepared()). Returns
  /// true when it succeeded; returns false when it raised a unique violation (SQLSTATE 23505) of
  /// one of PgSinkOptions::business_constraints: the write is undone and `tx` stays usable (roll
  /// it back to leave no claim row: transact_if()). Any other error propagates (a 23505 of
  /// another constraint as a non-retryable idem::PostgresError). Throws idem::Error when `tx` is
  /// no pqxx::dbtransaction (a nontransaction has no savepoints).
  [[nodiscard]] bool run_business_write(pqxx::transaction_base& tx,
                                        const std::function<void(pqxx::transaction_base&)>& write);

  /// Non-transactional mode, for callers without their own database writes: claims `key` in its
  /// own short transaction (see Sink::claim()). A fresh row is committed IN_PROGRESS for
  /// `lease`, owned by `owner_token` (or `request_id` when empty); finish it with
  /// complete(key, owner, response) or release(key, owner).
  [[nodiscard]] SinkClaim claim(std::string_view key, std::string_view request_id,
                                std::string_view fingerprint,
                                std::string_view owner_token = {}) override;

  /// Non-transactional mode: marks the IN_PROGRESS row of `key` owned by `owner` (its owner
  /// token, or its request ID) COMPLETED with `response` (size-capped), kept for `retention` in
  /// ms (0: PgSinkOptions::retention). Returns false when there is no such row (its lease ended
  /// and another attempt took it over).
  bool complete(std::string_view key, std::string_view owner, std::string_view response,
                std::chrono::milliseconds retention = std::chrono::milliseconds(0)) override;

  /// Non-transactional mode: deletes the IN_PROGRESS row of `key` owned by `owner`, so the
  /// operation may be retried. Never deletes another owner's or a completed row. Returns
  /// whether a row was deleted.
  bool release(std::string_view key, std::string_view owner) override;

  /// Non-transactional mode: extends the IN_PROGRESS row of `key` owned by `owner` to at least
  /// `lease` from now (0: PgSinkOptions::lease), by the server's clock. See Sink::renew().
  bool renew(std::string_view key, std::string_view owner,
             std::chrono::milliseconds lease = std::chrono::milliseconds(0)) override;

  /// PgSinkOptions::max_response_bytes.
  [[nodiscard]] std::size_t max_response_bytes() const noexcept override;
  /// PgSinkOptions::retention, in ms.
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override;

  /// Reads the committed row of `key` (an encoded key text) in this namespace without claiming
  /// or changing it; nullopt when there is none. A claim still uncommitted in another
  /// transaction is invisible. An expired row not purged yet is returned with a negative ttl.
  /// owner_token is the row's owner, what release() checks. Throws idem::InvalidKey when `key`
  /// fails validate_key_text(). For operators and tools (idemctl inspect), not for deciding
  /// requests.
  [[nodiscard]] std::optional<RecordInfo> inspect(std::string_view key);

  /// Deletes the row of `key` in this namespace whatever its request ID, in one short
  /// transaction that takes the key's lock first, as a claim does (waiting up to lock_timeout
  /// for a transaction holding an open claim of it, then a retryable idem::PostgresError,
  /// SQLSTATE 55P03):
  /// an operator's way to free a claim stuck until its lease ends. With kInProgressOnly a
  /// COMPLETED row is kept (kCompleted); with kAnyState it is deleted too, and the next
  /// request with this key runs its side effect again. Prefer release(key, owner). Throws
  /// idem::InvalidKey when `key` fails validate_key_text().
  ForceReleaseStatus force_release(std::string_view key, ForceReleaseScope scope);

  /// Deletes rows whose expiry (Postgres' now()) has passed, at most `batch_size` (≥ 1) per
  /// short transaction, skipping rows locked by others, until a batch comes back short.
  /// Returns how many rows were deleted. batch_size 0 is an idem::ConfigError.
  std::size_t purge_expired(std::size_t batch_size = 1000);

  /// The options in force (as validated by the constructor).
  [[nodiscard]] const PgSinkOptions& options() const noexcept;

  /// What the sink's connection pool holds now. Thread-safe, no I/O; for gauges
  /// (InProcessMetrics::watch()) and sizing.
  [[nodiscard]] PoolStats pool_stats() const;

 private:
  friend class detail::PgTransaction;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
