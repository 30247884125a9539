#include "idem/pg_sink.h"

#include <libpq-fe.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <optional>
#include <pqxx/pqxx>
#include <utility>
#include <vector>

#include "common/sha256.h"
#include "idem/errors.h"
#include "idem/fingerprint.h"
#include "idem/key.h"
#include "idem/pg_sql.h"  // generated from src/sink/schema.sql: kSchemaScript
#include "pg/cancel.h"
#include "pg/errors.h"
#include "pg/pool.h"
#include "pg/watchdog.h"
#include "sink/batched_transaction.h"
#include "sink/claim_check.h"
#include "sink/pg_transaction.h"
#include "sink/sql.h"
#include "sink/statements.h"

namespace idem {
namespace {

// The transaction whose claim, on this thread, answered kInProgress after its lock wait ran out
// (which aborts the transaction): watched() ends that one without error, as documented.
thread_local const pqxx::transaction_base* claim_wait_aborted = nullptr;

constexpr int kClaimAttempts = 3;  // an expired or vanished row is retried, not looped on
constexpr const char* kLockNotAvailable = "55P03";

// The sink's prepared statements, by index into PgSink::Impl::sql.
enum Statement : std::size_t {
  kClaim,
  kLockKey,
  kLookup,
  kTakeOver,
  kRecord,
  kComplete,
  kRelease,
  kRenew,
  kPurge,
  kInspect,
  kLockRow,
  kEvict,
  kWrites,
  kCount
};
constexpr std::array<const char*, kCount> kStatementNames{
    "idem_claim",    "idem_lock_key", "idem_lookup", "idem_take_over", "idem_record",
    "idem_complete", "idem_release",  "idem_renew",  "idem_purge",     "idem_inspect",
    "idem_lock_row", "idem_evict",    "idem_writes"};

}  // namespace

void detail::validate_sink_options(const PgSinkOptions& options) {
  if (options.conninfo.empty()) throw ConfigError("idem: PgSinkOptions::conninfo is empty");
  if (options.ns.empty()) throw ConfigError("idem: PgSinkOptions::ns is empty");
  if (options.ns.size() > kMaxKeyComponentBytes) {
    // Part of the unique key: with three key components it stays inside the B-tree row limit.
    throw ConfigError("idem: PgSinkOptions::ns is longer than kMaxKeyComponentBytes (" +
                      std::to_string(kMaxKeyComponentBytes) + ")");
  }
  if (options.pool_size == 0) throw ConfigError("idem: PgSinkOptions::pool_size must be >= 1");
  if (options.borrow_timeout.count() < 0 || options.statement_timeout.count() < 0 ||
      options.lock_timeout.count() < 0 || options.response_timeout.count() < 0) {
    throw ConfigError("idem: PgSinkOptions timeouts must not be negative");
  }
  // PostgreSQL's settings are an int of milliseconds.
  constexpr std::chrono::milliseconds kMaxServerTimeout{std::numeric_limits<int>::max()};
  if (options.statement_timeout > kMaxServerTimeout || options.lock_timeout > kMaxServerTimeout) {
    throw ConfigError(
        "idem: PgSinkOptions::statement_timeout and lock_timeout must be at most 2147483647 ms");
  }
  if (options.response_timeout.count() > 0 &&
      (options.statement_timeout.count() == 0 || options.lock_timeout.count() == 0 ||
       options.response_timeout <= options.statement_timeout ||
       options.response_timeout <= options.lock_timeout)) {
    throw ConfigError(
        "idem: PgSinkOptions::response_timeout must be 0, or longer than statement_timeout and "
        "lock_timeout, which must then be set (not 0)");
  }
  if (options.lease.count() <= 0) throw ConfigError("idem: PgSinkOptions::lease must be > 0");
  if (options.retention.count() <= 0) {
    throw ConfigError("idem: PgSinkOptions::retention must be > 0");
  }
  if (options.schema.empty()) throw ConfigError("idem: PgSinkOptions::schema is empty");
  if (options.table.empty()) throw ConfigError("idem: PgSinkOptions::table is empty");
  (void)detail::quote_identifier(options.schema);  // throws ConfigError (a NUL byte)
  (void)detail::quote_identifier(options.table);
  // Longer names would be truncated by the server: the table's derived names would then collide
  // (with each other, or with the table's own), and migrate() would skip creating one of them.
  constexpr std::size_t kMaxTableBytes =
      detail::kMaxIdentifierBytes - detail::SchemaNames::kExpiresIndexSuffix.size();
  if (options.table.size() > kMaxTableBytes) {
    throw ConfigError("idem: PgSinkOptions::table is at most " + std::to_string(kMaxTableBytes) +
                      " bytes (PostgreSQL keeps " + std::to_string(detail::kMaxIdentifierBytes) +
                      " of a name, and migrate() names an index <table>" +
                      std::string(detail::SchemaNames::kExpiresIndexSuffix) + ")");
  }
  detail::validate_conninfo(options.conninfo);
}

namespace {

// `conninfo` bounding the connect by `response_timeout` too, unless it sets connect_timeout
// itself: libpq's connect_timeout, in whole seconds, at least 2 (libpq's minimum).
std::string with_connect_timeout(const std::string& conninfo,
                                 std::chrono::milliseconds response_timeout) {
  if (response_timeout.count() == 0 || conninfo.find("connect_timeout") != std::string::npos) {
    return conninfo;
  }
  constexpr std::int64_t kMaxSeconds = 24 * 60 * 60;
  const std::int64_t seconds = std::clamp<std::int64_t>(
      std::chrono::ceil<std::chrono::seconds>(response_timeout).count(), 2, kMaxSeconds);
  const std::string setting = "connect_timeout=" + std::to_string(seconds);
  if (conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://")) {
    return conninfo + (conninfo.find('?') == std::string::npos ? "?" : "&") + setting;
  }
  return conninfo + " " + setting;
}

// The statements' SQL for the records table `table` (already quoted).
std::array<std::string, kCount> statements(const std::string& table) {
  std::array<std::string, kCount> sql;
  // Every claim of a key first takes the key's transaction-scoped advisory lock (kLockKey), so
  // that claims of one key, whichever statement makes them, wait for each other instead of
  // meeting at the unique index (docs/pg_sink.md, "What a call costs"). A colliding hash only
  // makes two keys wait for each other.
  const std::string key_lock = "pg_advisory_xact_lock(hashtextextended($2, hashtext($1)))";
  // The lock is a CTE the insert reads from, so it is held before the row is inserted (a
  // volatile CTE is evaluated once, never inlined); ON CONFLICT sees committed rows whatever
  // the statement's snapshot. Whether it inserted is its command tag's count ("INSERT 0 1"):
  // like the lock below, it answers no column and no row, either of which would cost the client
  // a heap block per call in libpq (2 KB for the columns, 1 KB for the rows).
  sql[kClaim] = "WITH key_lock AS (SELECT " + key_lock + ") INSERT INTO " + table +
                " (ns, key, request_id, fingerprint, expires_at, owner_token)"
                " SELECT $1, $2, $3, $4, now() + $5::float8 * interval '1 ms', $6 FROM key_lock"
                " ON CONFLICT (ns, key) DO NOTHING";
  sql[kLockKey] = "SELECT WHERE " + key_lock + " IS NULL";  // never null: no row
  sql[kLookup] =
      "SELECT state, fingerprint, request_id, response, response_sha256,"
      " expires_at <= now() FROM " +
      table + " WHERE ns = $1 AND key = $2";
  sql[kTakeOver] = "DELETE FROM " + table + " WHERE ns = $1 AND key = $2 AND expires_at <= now()";
  // The whole record of a first execution, written once with COMMIT (no ON CONFLICT: a row of
  // the key that appeared meanwhile fails the statement, so COMMIT never runs).
  sql[kRecord] = "INSERT INTO " + table +
                 " (ns, key, request_id, fingerprint, state, response, response_sha256, expires_at)"
                 " VALUES ($1, $2, $3, $4, 'completed', $5, $6, now() + $7::float8 * interval "
                 "'1 ms')";
  // $6: the claim's owner token in non-transactional mode (fencing: an earlier attempt of the
  // same request never completes a later one's takeover); NULL inside the claiming transaction.
  sql[kComplete] = "UPDATE " + table +
                   " SET state = 'completed', response = $3, response_sha256 = $4,"
                   " expires_at = now() + $5::float8 * interval '1 ms'"
                   " WHERE ns = $1 AND key = $2 AND state = 'in_progress'"
                   " AND owner_token = coalesce($6, owner_token)";
  sql[kRelease] = "DELETE FROM " + table +
                  " WHERE ns = $1 AND key = $2 AND owner_token = $3 AND state = 'in_progress'";
  sql[kRenew] = "UPDATE " + table +
                " SET expires_at = greatest(expires_at, now() + $4::float8 * interval '1 ms')"
                " WHERE ns = $1 AND key = $2 AND owner_token = $3 AND state = 'in_progress'";
  sql[kPurge] = "DELETE FROM " + table + " WHERE ctid = ANY (ARRAY(SELECT ctid FROM " + table +
                " WHERE expires_at <= now() ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED))";
  // Times in whole ms: the TTL by the server's clock, and the expiry since the Unix epoch.
  sql[kInspect] =
      "SELECT state, request_id, fingerprint, octet_length(response), response_sha256,"
      " floor(extract(epoch FROM expires_at - now()) * 1000)::bigint,"
      " floor(extract(epoch FROM expires_at) * 1000)::bigint, owner_token FROM " +
      table + " WHERE ns = $1 AND key = $2";
  sql[kLockRow] = "SELECT state FROM " + table + " WHERE ns = $1 AND key = $2 FOR UPDATE";
  sql[kEvict] = "DELETE FROM " + table + " WHERE ns = $1 AND key = $2";
  // The view is read only once the transaction has an ID (an uncorrelated subquery under CASE
  // runs only when its branch is taken): a transaction that wrote nothing costs a function call.
  sql[kWrites] =
      "SELECT txid_current_if_assigned() IS NOT NULL, CASE WHEN txid_current_if_assigned() IS "
      "NULL THEN 0 ELSE (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint "
      "FROM pg_stat_xact_user_tables) END";
  return sql;
}

}  // namespace

struct PgSink::Impl {
  explicit Impl(PgSinkOptions opts)
      : options((detail::validate_sink_options(opts), std::move(opts))),
        names(detail::SchemaNames::for_table(options.schema, options.table)),
        sql(statements(detail::quote_identifier(options.schema) + "." +
                       detail::quote_identifier(options.table))),
        watchdog(options.response_timeout),
        pool(with_connect_timeout(options.conninfo, options.response_timeout), options.pool_size,
             options.borrow_timeout, [this](pqxx::connection& conn) { setup(conn); }) {}

  [[nodiscard]] bool transaction_pooling() const noexcept {
    return options.pooling == PgPooling::kTransaction;
  }

  // Session settings of a new pooled connection (set_variable: they survive libpqxx's
  // transparent reconnects). Behind a transaction pooler the session is not ours: nothing.
  void setup(pqxx::connection& conn) const {
    if (transaction_pooling()) return;
    conn.set_variable("statement_timeout", std::to_string(options.statement_timeout.count()));
    conn.set_variable("lock_timeout", std::to_string(options.lock_timeout.count()));
  }

  // Runs a sink statement in `tx` within response_timeout: prepared on the transaction's
  // connection on first use (libpqxx makes a repeated prepare() of the same text a no-op), or,
  // behind a transaction pooler, sent with its parameters as an unnamed statement (PQexecParams:
  // parse, bind and execute in one message sequence, so it never outlives the transaction).
  template <typename... Args>
  pqxx::result exec(pqxx::transaction_base& tx, Statement statement, Args&&... args) const {
    return run_own(tx, [&] {
      if (transaction_pooling()) return tx.exec_params(sql[statement], std::forward<Args>(args)...);
      tx.conn().prepare(kStatementNames[statement], sql[statement]);
      return tx.exec_prepared(kStatementNames[statement], std::forward<Args>(args)...);
    });
  }

  // What one of idem's statements answered: the rows it returned, and the rows an INSERT,
  // UPDATE or DELETE changed.
  struct Answer {
    std::size_t rows = 0;
    std::size_t changed = 0;
  };

  // Runs `statement` with `params` in `tx` within response_timeout. In a pqxx::dbtransaction
  // (every autocommit unit and transaction of the sink's own, and a caller's pqxx::work) it goes
  // as a one-statement flight on libpq directly: through libpqxx every statement is followed by
  // a poll for notifications, one more system call. Other transactions go through libpqxx.
  Answer run(pqxx::transaction_base& tx, Statement statement,
             const detail::PgParams& params) const {
    auto* const own = dynamic_cast<pqxx::dbtransaction*>(&tx);
    if (own == nullptr) {
      const pqxx::result result = exec(tx, statement, pqxx::prepare::make_dynamic_params(params));
      return Answer{result.size(), result.affected_rows()};
    }
    return run_own(tx, [&] {
      const detail::PgResultPtr result =
          detail::run_flight(detail::raw_connection(*own), {flight(tx, statement, params)});
      const std::string_view text = PQcmdTuples(result.get());  // "" for a SELECT
      std::size_t changed = 0;
      (void)std::from_chars(text.data(), text.data() + text.size(), changed);
      return Answer{static_cast<std::size_t>(PQntuples(result.get())), changed};
    });
  }

  // Runs fn(), which sends idem's own statements on tx's connection, within response_timeout; a
  // missing table or column gets detail::migrate_hint() added to its error.
  template <typename F>
  auto run_own(pqxx::transaction_base& tx, F&& fn) const -> decltype(fn()) {
    try {
      return watchdog.run(tx.conn().sock(), std::forward<F>(fn));
    } catch (const pqxx::sql_error& error) {
      const std::string_view hint = detail::migrate_hint(error.sqlstate());
      if (hint.empty()) throw;
      throw pqxx::sql_error(detail::pq_message(error.what()).append(hint), error.query(),
                            error.sqlstate().c_str());
    }
  }

  // Runs body(tx) as one short unit of its own: an autocommit unit (each statement commits by
  // itself) on a session of ours; behind a transaction pooler, a watched transaction (its first
  // round trip sets the timeouts with SET LOCAL), committed unless keep(result) is false.
  template <typename Body, typename Keep>
  auto autocommit(pqxx::connection& conn, Body&& body, Keep&& keep) {
    if (!transaction_pooling()) {
      detail::BatchedTransaction tx(conn, {});
      return body(tx);
    }
    std::optional<decltype(body(std::declval<pqxx::transaction_base&>()))> result;
    watched_transaction(conn, [&](pqxx::work& tx) {
      result.emplace(body(tx));
      return keep(*result);
    });
    return std::move(*result);
  }
  template <typename Body>
  auto autocommit(pqxx::connection& conn, Body&& body) {
    return autocommit(conn, std::forward<Body>(body), [](const auto&) { return true; });
  }

  // Runs body(tx) in a transaction on `conn`; commits when it returns true, rolls back when it
  // returns false or throws. BEGIN, COMMIT and ROLLBACK wait at most response_timeout (the
  // statements of `body` are its own business).
  template <typename Body>
  bool watched_transaction(pqxx::connection& conn, Body&& body) {
    return watched<pqxx::work>(
        conn,
        [&](std::optional<pqxx::work>& tx) {
          tx.emplace(conn);
          if (transaction_pooling()) tx->exec0(local_timeouts[0] + "; " + local_timeouts[1]);
        },
        std::forward<Body>(body));
  }

  // What opens a transaction: BEGIN, and behind a transaction pooler the timeouts for it.
  [[nodiscard]] std::vector<std::string> begin_statements() const {
    std::vector<std::string> begin{"BEGIN"};
    if (transaction_pooling())
      begin.insert(begin.end(), local_timeouts.begin(), local_timeouts.end());
    return begin;
  }

  // `statement` with `params` for a flight (BatchedTransaction): by the name it is prepared
  // under on this connection (prepared now if it is not yet: a round trip, which the caller
  // bounds with run_own()), or behind a transaction pooler its text, sent unnamed.
  detail::PgFlightStatement flight(pqxx::transaction_base& tx, Statement statement,
                                   detail::PgParams params) const {
    if (transaction_pooling()) return {sql[statement], false, std::move(params)};
    prepare(tx, statement);
    return {kStatementNames[statement], true, std::move(params)};
  }

  // A statement of a run_transactional() handler's own (Context::stage()) for a flight on
  // `conn`: by the name its text is prepared under there (the first statement_cache distinct
  // texts of each connection, prepared at their first use: a round trip, which the caller bounds
  // with the watchdog), else, and behind a transaction pooler, its text, sent unnamed.
  detail::PgFlightStatement handler_statement(detail::PgConnection& conn, std::string sql,
                                              detail::PgParams params) const {
    auto& names = conn.statement_names;
    auto found = names.find(sql);
    if (found == names.end()) {
      if (transaction_pooling() || names.size() >= options.statement_cache) {
        return {std::move(sql), false, std::move(params)};
      }
      std::string name = "idem_h" + std::to_string(names.size());
      conn.prepare(name, sql);
      found = names.emplace(std::move(sql), std::move(name)).first;
    }
    conn.prepare_now(found->second);  // a text that fails to prepare fails at each use
    return {found->second, true, std::move(params)};
  }

  // Prepares `statement` on tx's connection unless it is already (libpqxx skips a repeat): a
  // round trip the first time. Nothing behind a transaction pooler (no statement outlives the
  // transaction there).
  void prepare(pqxx::transaction_base& tx, Statement statement) const {
    if (transaction_pooling()) return;
    tx.conn().prepare(kStatementNames[statement], sql[statement]);
    tx.conn().prepare_now(kStatementNames[statement]);
  }

  // The transaction of watched_transaction(), of type Tx, opened by open(std::optional<Tx>&).
  template <typename Tx, typename Open, typename Body>
  bool watched(pqxx::connection& conn, Open&& open, Body&& body) {
    const int socket = conn.sock();
    std::optional<Tx> tx;
    watchdog.run(socket, [&] { open(tx); });
    claim_wait_aborted = nullptr;
    bool commit = false;
    try {
      commit = body(*tx);
    } catch (...) {
      try {
        watchdog.run(socket, [&] { tx->abort(); });
      } catch (...) {
        // The body's failure is the one the caller must see.
      }
      throw;
    }
    if (commit && PQtransactionStatus(detail::raw_connection(*tx)) == PQTRANS_INERROR) {
      // A statement failed, so COMMIT could only roll back: the caller must not read "committed".
      // After a claim's lock wait (kInProgress) that is the documented end, without error; after
      // an error the body caught and went on from, an error.
      watchdog.run(socket, [&] { tx->abort(); });
      if (claim_wait_aborted != &*tx) throw nothing_committed();
      return false;
    }
    try {
      watchdog.run(socket, [&] { commit ? tx->commit() : tx->abort(); });
    } catch (const pqxx::usage_error&) {
      throw nothing_committed();  // libpqxx saw the failed statement itself and refused
    }
    return commit;
  }

  // A body that returned after a statement of its transaction failed: nothing committed.
  static PostgresError nothing_committed() {
    return PostgresError(
        "idem: postgres: nothing was committed: a statement of the transaction failed and the "
        "body went on",
        false, "25P02");
  }

  // Borrows a connection and runs fn(connection), translating libpqxx errors; a connection
  // that was lost is destroyed, never returned to the pool.
  template <typename F>
  decltype(auto) with_connection(F&& fn) {
    auto lease = pool.borrow();
    try {
      return detail::translating([&]() -> decltype(auto) { return fn(*lease); });
    } catch (const PostgresError& error) {
      if (detail::is_connection_loss(error.sqlstate())) lease.discard();
      throw;
    }
  }

  // `owner` is the claim's owner token (complete/release/renew check it); `request_id` when
  // empty.
  SinkClaim claim(pqxx::transaction_base& tx, std::string_view key, std::string_view request_id,
                  std::string_view fingerprint, std::chrono::milliseconds expiry,
                  std::string_view owner = {}) const {
    detail::validate_sink_claim(key, request_id, owner);
    const std::string k(key);
    const detail::PgParams claim_params =
        detail::pg_params(options.ns, key, request_id, fingerprint, std::to_string(expiry.count()),
                          owner.empty() ? request_id : owner);
    return detail::translating([&] {
      try {
        for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
          if (run(tx, kClaim, claim_params).changed != 0) return SinkClaim{};
          const pqxx::result found = exec(tx, kLookup, options.ns, k);
          if (found.empty()) continue;   // released or purged since the insert
          if (found[0][5].as<bool>()) {  // expired: take the key over
            exec(tx, kTakeOver, options.ns, k);
            continue;
          }
          return existing(found[0], request_id, fingerprint);
        }
      } catch (const pqxx::sql_error& error) {
        if (error.sqlstate() != kLockNotAvailable) throw;
        claim_wait_aborted = &tx;
        return held_elsewhere();
      }
      throw PostgresError("idem: postgres: the row of the key kept changing during claim", true);
    });
  }

  // A claim that waited lock_timeout for another transaction holding the key.
  static SinkClaim held_elsewhere() {
    SinkClaim open;
    open.status = SinkStatus::kInProgress;
    open.same_request = false;
    return open;
  }

  static SinkClaim existing(const pqxx::row& row, std::string_view request_id,
                            std::string_view fingerprint) {
    const auto state = row[0].as<std::string>();
    const auto stored_fingerprint = row[1].as<std::string>();
    const auto stored_request_id = row[2].as<std::string>();
    detail::StoredRow stored{state, stored_fingerprint, stored_request_id, std::nullopt,
                             std::nullopt};
    if (!row[3].is_null()) stored.response = pqxx::binarystring(row[3]).str();
    if (!row[4].is_null()) stored.response_sha256 = row[4].as<std::string>();
    return detail::existing_claim(std::move(stored), request_id, fingerprint);
  }

  // Runs the complete statement; `owner` is the request ID in non-transactional mode.
  bool complete(pqxx::transaction_base& tx, std::string_view key, std::string_view response,
                const std::optional<std::string>& owner,
                std::chrono::milliseconds retention) const {
    const detail::PgParams params = detail::complete_params(
        options, key, response, detail::sink_retention(options, retention), owner);
    return detail::translating([&] { return run(tx, kComplete, params).changed == 1; });
  }

  PgSinkOptions options;
  // The session settings of setup(), for one transaction (PgPooling::kTransaction).
  // Behind a transaction pooler, what bounds every transaction of ours (session settings would
  // not stay with it).
  std::vector<std::string> local_timeouts{
      "SET LOCAL statement_timeout = " + std::to_string(options.statement_timeout.count()),
      "SET LOCAL lock_timeout = " + std::to_string(options.lock_timeout.count())};
  detail::SchemaNames names;
  std::array<std::string, kCount> sql;  // by Statement
  mutable detail::PgWatchdog watchdog;  // thread-safe; bounds exec() and commits
  detail::PgPool pool;
};

PgSink::PgSink(PgSinkOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

PgSink::~PgSink() = default;

void PgSink::migrate() { (void)migrate_schema(); }

PgSink::Migration PgSink::migrate_schema() {
  const detail::MigrationScript script =
      detail::split_migrations(detail::substitute_names(detail::kSchemaScript, impl_->names));
  const std::string schema = detail::quote_identifier(impl_->names.schema);
  const std::string versions = schema + "." + detail::quote_identifier(impl_->names.versions);
  Migration done;
  impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->watched_transaction(conn, [&](pqxx::work& tx) {
      // A migration under way elsewhere is waited for up to statement_timeout, not lock_timeout
      // (a claim's bound): processes that start together all migrate. The DDL below waits for
      // table locks within lock_timeout again.
      tx.exec("SET LOCAL lock_timeout = 0");
      tx.exec_params("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                     "idem.migrate:" + impl_->names.schema + "." + impl_->names.table);
      tx.exec("SET LOCAL lock_timeout = " + std::to_string(impl_->options.lock_timeout.count()));
      // Skipped when present: CREATE … IF NOT EXISTS still demands the CREATE privilege.
      if (tx.exec_params1("SELECT to_regnamespace($1) IS NULL", schema)[0].as<bool>()) {
        tx.exec("CREATE SCHEMA IF NOT EXISTS " + schema);
      }
      if (tx.exec_params1("SELECT to_regclass($1) IS NULL", versions)[0].as<bool>()) {
        tx.exec(script.preamble);
      }
      done.from = tx.exec1("SELECT coalesce(max(version), 0) FROM " + versions)[0].as<int>();
      done.to = done.from;
      for (const auto& step : script.steps) {
        if (step.version <= done.from) continue;
        tx.exec(step.sql);
        done.to = step.version;
      }
      return true;
    });
  });
  return done;
}

int PgSink::schema_version() {
  const std::string versions = detail::quote_identifier(impl_->names.schema) + "." +
                               detail::quote_identifier(impl_->names.versions);
  return impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->watchdog.run(conn.sock(), [&] {
      pqxx::nontransaction tx(conn);
      if (tx.exec_params1("SELECT to_regclass($1) IS NULL", versions)[0].as<bool>()) return 0;
      return tx.exec1("SELECT coalesce(max(version), 0) FROM " + versions)[0].as<int>();
    });
  });
}

void PgSink::ping() {
  impl_->with_connection([&](pqxx::connection& conn) {
    pqxx::nontransaction tx(conn);
    impl_->watchdog.run(conn.sock(), [&] { (void)tx.exec1("SELECT 1"); });
  });
}

bool PgSink::transact_if(const std::function<bool(pqxx::transaction_base&)>& body) {
  return impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->watched_transaction(conn, [&](pqxx::work& tx) { return body(tx); });
  });
}

void PgSink::transact(const std::function<void(pqxx::transaction_base&)>& body) {
  (void)transact_if([&](pqxx::transaction_base& tx) {
    body(tx);
    return true;
  });
}

SinkClaim PgSink::claim(pqxx::transaction_base& tx, std::string_view key,
                        std::string_view request_id, std::string_view fingerprint,
                        std::chrono::milliseconds retention) {
  // The row commits only with the business write, so it is as good as done: keep it for the
  // whole retention even if complete() is never called.
  return impl_->claim(tx, key, request_id, fingerprint,
                      detail::sink_retention(impl_->options, retention));
}

void PgSink::complete(pqxx::transaction_base& tx, std::string_view key, std::string_view response,
                      std::chrono::milliseconds retention) {
  if (!impl_->complete(tx, key, response, std::nullopt, retention)) {
    throw Error("idem: complete() without an in-progress claim of the key in this transaction");
  }
}

bool PgSink::run_business_write(pqxx::transaction_base& tx,
                                const std::function<void(pqxx::transaction_base&)>& write) {
  auto* outer = dynamic_cast<pqxx::dbtransaction*>(&tx);
  if (outer == nullptr) {
    throw Error("idem: run_business_write() needs a transaction with savepoints (transact())");
  }
  return detail::translating([&] {
    // A subtransaction, not SAVEPOINT statements on `tx`: libpqxx aborts the whole transaction
    // a failed exec() ran in, so a write sent with exec() must fail in a transaction of its own.
    pqxx::subtransaction savepoint(*outer, "idem_business_write");
    try {
      write(savepoint);
    } catch (const pqxx::unique_violation& error) {
      if (!detail::names_constraint(error.what(), impl_->options.business_constraints)) throw;
      savepoint.abort();  // ROLLBACK TO SAVEPOINT, unless libpqxx sent it already
      return false;
    }
    savepoint.commit();  // RELEASE SAVEPOINT
    return true;
  });
}

SinkClaim PgSink::claim(std::string_view key, std::string_view request_id,
                        std::string_view fingerprint, std::string_view owner_token) {
  return impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->autocommit(
        conn,
        [&](pqxx::transaction_base& tx) {
          return impl_->claim(tx, key, request_id, fingerprint, impl_->options.lease, owner_token);
        },
        // A lock timeout (kInProgress) aborted the transaction: nothing to commit.
        [](const SinkClaim& claim) { return claim.status != SinkStatus::kInProgress; });
  });
}

bool PgSink::complete(std::string_view key, std::string_view owner, std::string_view response,
                      std::chrono::milliseconds retention) {
  return impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->autocommit(conn, [&](pqxx::transaction_base& tx) {
      return impl_->complete(tx, key, response, std::string(owner), retention);
    });
  });
}

bool PgSink::release(std::string_view key, std::string_view owner) {
  return impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->autocommit(conn, [&](pqxx::transaction_base& tx) {
      return impl_->run(tx, kRelease, detail::pg_params(impl_->options.ns, key, owner)).changed ==
             1;
    });
  });
}

std::size_t PgSink::max_response_bytes() const noexcept {
  return impl_->options.max_response_bytes;
}

std::chrono::milliseconds PgSink::retention() const noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(impl_->options.retention);
}

bool PgSink::renew(std::string_view key, std::string_view owner, std::chrono::milliseconds lease) {
  const std::chrono::milliseconds extend = detail::sink_lease(impl_->options, lease);
  return impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->autocommit(conn, [&](pqxx::transaction_base& tx) {
      return impl_
                 ->run(tx, kRenew,
                       detail::pg_params(impl_->options.ns, key, owner,
                                         std::to_string(extend.count())))
                 .changed == 1;
    });
  });
}

std::optional<RecordInfo> PgSink::inspect(std::string_view key) {
  validate_key_text(key);  // as RedisGuard's: a text no claim could have made is an error
  return impl_->with_connection([&](pqxx::connection& conn) -> std::optional<RecordInfo> {
    pqxx::nontransaction tx(conn);
    const pqxx::result found = impl_->exec(tx, kInspect, impl_->options.ns, std::string(key));
    if (found.empty()) return std::nullopt;
    const pqxx::row row = found[0];
    RecordInfo info;
    info.state = row[0].as<std::string>() == "completed" ? RecordState::kCompleted
                                                         : RecordState::kInProgress;
    info.request_id = row[1].as<std::string>();
    info.fingerprint = row[2].as<std::string>();
    if (!row[3].is_null()) info.response_bytes = row[3].as<std::size_t>();
    if (!row[4].is_null()) info.response_sha256 = row[4].as<std::string>();
    info.ttl = std::chrono::milliseconds(row[5].as<std::int64_t>());
    info.expires_at =
        std::chrono::system_clock::time_point(std::chrono::milliseconds(row[6].as<std::int64_t>()));
    info.owner_token = row[7].as<std::string>();
    return info;
  });
}

ForceReleaseStatus PgSink::force_release(std::string_view key, ForceReleaseScope scope) {
  validate_key_text(key);
  const std::string k(key);
  ForceReleaseStatus status = ForceReleaseStatus::kReleased;
  impl_->with_connection([&](pqxx::connection& conn) {
    return impl_->watched_transaction(conn, [&](pqxx::work& tx) {
      // The key's lock first, as a claim takes it: a claim not committed yet holds it (its row
      // is invisible to FOR UPDATE until then).
      impl_->exec(tx, kLockKey, impl_->options.ns, k);
      const pqxx::result found = impl_->exec(tx, kLockRow, impl_->options.ns, k);
      if (found.empty()) {
        status = ForceReleaseStatus::kNotFound;
      } else if (scope == ForceReleaseScope::kInProgressOnly &&
                 found[0][0].as<std::string>() == "completed") {
        status = ForceReleaseStatus::kCompleted;
      } else {
        impl_->exec(tx, kEvict, impl_->options.ns, k);
      }
      return true;
    });
  });
  return status;
}

const PgSinkOptions& PgSink::options() const noexcept { return impl_->options; }

PoolStats PgSink::pool_stats() const { return impl_->pool.stats(); }

std::size_t PgSink::purge_expired(std::size_t batch_size) {
  if (batch_size == 0) throw ConfigError("idem: purge_expired batch_size must be >= 1");
  std::size_t total = 0;
  for (;;) {
    const std::size_t deleted = impl_->with_connection([&](pqxx::connection& conn) {
      return impl_->autocommit(conn, [&](pqxx::transaction_base& tx) {
        return static_cast<std::size_t>(impl_->exec(tx, kPurge, batch_size).affected_rows());
      });
    });
    total += deleted;
    if (deleted < batch_size) return total;
  }
}

// ---- the blocking driver's transaction (src/sink/pg_transaction.h) -----------------------------

namespace detail {

// The connection a PgTransaction holds, and its transaction once open.
struct PgTransaction::Held {
  explicit Held(PgPool::Lease held) : lease(std::move(held)) {}
  PgPool::Lease lease;
  std::optional<BatchedTransaction> tx;
};

PgTransaction::PgTransaction(PgSink& sink) noexcept : sink_(sink) {}

PgTransaction::~PgTransaction() { rollback(); }

template <typename F>
decltype(auto) PgTransaction::guarded(F&& fn) {
  try {
    return translating(std::forward<F>(fn));
  } catch (const PostgresError& error) {
    if (held_ && is_connection_loss(error.sqlstate())) held_->lease.discard();
    throw;
  }
}

void PgTransaction::open(bool begin_now) {
  PgSink::Impl& impl = *sink_.impl_;
  held_ = std::make_unique<Held>(translating([&] { return impl.pool.borrow(); }));
  guarded([&] {
    pqxx::connection& conn = *held_->lease;
    impl.watchdog.run(conn.sock(), [&] {
      held_->tx.emplace(conn, impl.begin_statements());
      if (begin_now) held_->tx->begin_now();
    });
  });
}

SinkClaim PgTransaction::claim(std::string_view key, std::string_view request_id,
                               std::string_view fingerprint) {
  const PgSink::Impl& impl = *sink_.impl_;
  validate_sink_claim(key, request_id);
  BatchedTransaction& tx = *held_->tx;
  const std::string& ns = impl.options.ns;
  const std::string k(key);
  return guarded([&] {
    try {
      const PgResultPtr found = impl.run_own(tx, [&] {
        // The statements' Prepares, on a connection's first use, are bounded with the send;
        // so is the record's, which record() then sends with COMMIT (no round trip of its own,
        // and no watch of its own on every call).
        impl.prepare(tx, kRecord);
        std::vector<PgFlightStatement> flight;
        flight.push_back(impl.flight(tx, kLockKey, pg_params(ns, k)));
        flight.push_back(impl.flight(tx, kLookup, pg_params(ns, k)));
        return tx.send(std::move(flight));
      });
      if (PQntuples(found.get()) == 0) return SinkClaim{};
      // Expired: the key is ours (we hold its lock).
      if (std::string_view(PQgetvalue(found.get(), 0, 5)) == "t") {
        impl.exec(tx, kTakeOver, ns, k);
        return SinkClaim{};
      }
      return existing_claim(found.get(), request_id, fingerprint);
    } catch (const pqxx::sql_error& error) {
      if (error.sqlstate() != kLockNotAvailable) throw;
      return PgSink::Impl::held_elsewhere();
    }
  });
}

void PgTransaction::record(std::string_view key, std::string_view request_id,
                           std::string_view fingerprint, std::string_view response,
                           std::chrono::milliseconds retention) {
  const PgSink::Impl& impl = *sink_.impl_;
  validate_sink_claim(key, request_id);
  BatchedTransaction& tx = *held_->tx;
  const std::chrono::milliseconds keep = detail::sink_retention(impl.options, retention);
  guarded([&] {
    tx.at_commit(impl.flight(
        tx, kRecord, record_params(impl.options, key, request_id, fingerprint, response, keep)));
  });
}

void PgTransaction::stage(std::string sql, PgParams params) {
  require_no_nul(params);
  const PgSink::Impl& impl = *sink_.impl_;
  BatchedTransaction& tx = *held_->tx;
  guarded([&] {
    // Its text is the handler's: no migrate hint on its errors (run_own()).
    tx.at_commit(impl.watchdog.run(tx.conn().sock(), [&] {
      return impl.handler_statement(*held_->lease, std::move(sql), std::move(params));
    }));
  });
  ++handler_staged_;
}

bool PgTransaction::business_write(const std::function<void()>& write) {
  const PgSink::Impl& impl = *sink_.impl_;
  return guarded([&] {
    try {
      write();
    } catch (const pqxx::unique_violation& error) {
      if (!names_constraint(error.what(), impl.options.business_constraints)) throw;
      return false;
    } catch (const PostgresError&) {
      // A statement it staged, sent ahead of Context::step()'s reading.
      if (!business_duplicate(std::current_exception(), impl.options.business_constraints)) {
        throw;
      }
      return false;
    }
    return true;
  });
}

void PgTransaction::commit() {
  const std::unique_ptr<Held> held = std::move(held_);
  held_ = nullptr;
  const std::size_t handlers = std::exchange(handler_staged_, 0);  // staged first, then the record
  // A statement sent with exec() failed and libpqxx aborted the transaction: the handler caught
  // the error and returned, but nothing of the transaction can commit.
  if (held->tx->aborted()) throw rolled_back_commit_error();
  try {
    translating(
        [&] { sink_.impl_->watchdog.run(held->lease->sock(), [&] { held->tx->commit(); }); });
  } catch (const PostgresError& error) {
    if (is_connection_loss(error.sqlstate())) held->lease.discard();
    const std::optional<std::size_t> failed = held->tx->failed_staged();
    handler_failed_ = failed && *failed < handlers;
    throw;
  }
}

void PgTransaction::rollback() noexcept {
  if (!held_) return;
  const std::unique_ptr<Held> held = std::move(held_);
  try {
    if (held->tx) sink_.impl_->watchdog.run(held->lease->sock(), [&] { held->tx->abort(); });
  } catch (...) {
    held->lease.discard();  // the transaction is gone with its connection
  }
}

TransactionWrites PgTransaction::writes() {
  BatchedTransaction& tx = *held_->tx;
  if (!tx.begun() && handler_staged_ == 0) return {};  // nothing sent yet: nothing written
  const PgSink::Impl& impl = *sink_.impl_;
  handler_staged_ = 0;  // they go ahead of the reading, in its round trip
  return guarded([&] {
    // Not run_own(): neither the reading nor the handler's statements are on idem's table.
    const PgResultPtr row = impl.watchdog.run(
        tx.conn().sock(), [&] { return tx.send({impl.flight(tx, kWrites, {})}); });
    std::int64_t rows = 0;
    const std::string_view text = PQgetvalue(row.get(), 0, 1);
    (void)std::from_chars(text.data(), text.data() + text.size(), rows);
    return TransactionWrites{std::string_view(PQgetvalue(row.get(), 0, 0)) == "t", rows};
  });
}

pqxx::transaction_base& PgTransaction::tx() { return *held_->tx; }

pg_conn* PgTransaction::raw_connection() noexcept {
  return held_ && held_->tx ? detail::raw_connection(*held_->tx) : nullptr;
}

// ---- what the async sink shares (src/sink/statements.h) ----------------------------------------

std::chrono::milliseconds sink_lease(const PgSinkOptions& options,
                                     std::chrono::milliseconds lease) {
  if (lease.count() < 0) throw ConfigError("idem: a sink lease must not be negative");
  return lease.count() > 0 ? lease
                           : std::chrono::duration_cast<std::chrono::milliseconds>(options.lease);
}

std::chrono::milliseconds sink_retention(const PgSinkOptions& options,
                                         std::chrono::milliseconds retention) {
  if (retention.count() < 0) throw ConfigError("idem: a sink retention must not be negative");
  return retention.count() > 0
             ? retention
             : std::chrono::duration_cast<std::chrono::milliseconds>(options.retention);
}

SinkStatements sink_statements(const PgSinkOptions& options) {
  std::array<std::string, kCount> sql =
      statements(quote_identifier(options.schema) + "." + quote_identifier(options.table));
  return SinkStatements{
      std::move(sql[kClaim]),    std::move(sql[kLookup]),  std::move(sql[kTakeOver]),
      std::move(sql[kComplete]), std::move(sql[kRelease]), std::move(sql[kRenew]),
      std::move(sql[kLockKey]),  std::move(sql[kRecord]),  std::move(sql[kWrites])};
}

SinkClaim existing_claim(StoredRow row, std::string_view request_id, std::string_view fingerprint) {
  SinkClaim answer;
  answer.status = SinkStatus::kDuplicate;
  answer.state = row.state == "completed" ? RecordState::kCompleted : RecordState::kInProgress;
  answer.fingerprint_matches = fingerprints_match(row.fingerprint, fingerprint);
  answer.same_request = row.request_id == request_id;
  answer.response = std::move(row.response);
  if (row.response_sha256) answer.response_sha256 = std::move(*row.response_sha256);
  return answer;
}

SinkClaim existing_claim(const PGresult* lookup, std::string_view request_id,
                         std::string_view fingerprint) {
  StoredRow stored{PQgetvalue(lookup, 0, 0), PQgetvalue(lookup, 0, 1), PQgetvalue(lookup, 0, 2),
                   bytea_value(lookup, 0, 3), std::nullopt};
  if (PQgetisnull(lookup, 0, 4) == 0) stored.response_sha256 = PQgetvalue(lookup, 0, 4);
  return existing_claim(std::move(stored), request_id, fingerprint);
}

std::string bytea_literal(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text = "\\x";
  text.reserve(2 + 2 * bytes.size());
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    text.push_back(kHex[byte >> 4]);
    text.push_back(kHex[byte & 0x0F]);
  }
  return text;
}

std::optional<std::string> bytea_value(const PGresult* result, int row, int column) {
  if (PQgetisnull(result, row, column) != 0) return std::nullopt;
  std::size_t size = 0;
  unsigned char* bytes = PQunescapeBytea(
      reinterpret_cast<const unsigned char*>(PQgetvalue(result, row, column)), &size);
  if (bytes == nullptr) throw PostgresError("idem: postgres: cannot decode a bytea value", false);
  std::string value(reinterpret_cast<const char*>(bytes), size);
  PQfreemem(bytes);
  return value;
}

namespace {

// A stored response's two columns: its bytes as a bytea literal, or over the cap NULL and its
// SHA-256.
std::pair<std::optional<std::string>, std::optional<std::string>> response_columns(
    const PgSinkOptions& options, std::string_view response) {
  if (response.size() > options.max_response_bytes) return {std::nullopt, sha256_hex(response)};
  return {bytea_literal(response), std::nullopt};
}

}  // namespace

PgParams record_params(const PgSinkOptions& options, std::string_view key,
                       std::string_view request_id, std::string_view fingerprint,
                       std::string_view response, std::chrono::milliseconds retention) {
  auto [body, sha256] = response_columns(options, response);
  return pg_params(options.ns, key, request_id, fingerprint, std::move(body), std::move(sha256),
                   std::to_string(retention.count()));
}

PgParams complete_params(const PgSinkOptions& options, std::string_view key,
                         std::string_view response, std::chrono::milliseconds retention,
                         std::optional<std::string> owner) {
  auto [body, sha256] = response_columns(options, response);
  return pg_params(options.ns, key, std::move(body), std::move(sha256),
                   std::to_string(retention.count()), std::move(owner));
}

}  // namespace detail
}  // namespace idem
