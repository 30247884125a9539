// One run_transactional() call's transaction on a PgSink, for the blocking driver of the call
// plan: claim-first, with the key locked and its record read in BEGIN's round trip, and the
// record written once in COMMIT's (docs/pg_sink.md, "What a call costs"). The same steps as the
// async sink's AsyncPgTransaction (src/sink/async_pg_sink.h), blocking the caller's thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "idem/pg_sink.h"
#include "sink/statements.h"

struct pg_conn;

namespace idem::detail {

/// Holds one of the sink's pooled connections from open() until commit(), rollback() or its
/// destruction (which rolls back). Every error is an idem::PostgresError; a connection found
/// lost is destroyed, never given back to the pool. Not thread-safe (one call's thread, and a
/// cancel of its running statement from another: see raw_connection()). The sink must outlive
/// it.
class PgTransaction {
 public:
  explicit PgTransaction(PgSink& sink) noexcept;
  ~PgTransaction();
  PgTransaction(const PgTransaction&) = delete;
  PgTransaction& operator=(const PgTransaction&) = delete;

  /// Borrows a connection (waiting up to PgSinkOptions::borrow_timeout) and opens the
  /// transaction. `begin_now`: BEGIN goes at once (nothing is claimed in this transaction), else
  /// it goes with claim().
  void open(bool begin_now);
  /// Takes the key's advisory lock (waiting for a transaction that holds it, up to
  /// lock_timeout: then kInProgress, and the transaction is aborted: roll it back) and reads its
  /// committed record; in one round trip with a held-back BEGIN. No record: kClaimed (an
  /// expired one is deleted first). A record: kDuplicate with its state, fingerprint match and
  /// response. Nothing is written: record() writes the record.
  [[nodiscard]] SinkClaim claim(std::string_view key, std::string_view request_id,
                                std::string_view fingerprint);
  /// Stages the completed record of `key` (owner `request_id`, `fingerprint`, `response`
  /// size-capped as PgSink::complete(), kept `retention` ms, 0: PgSinkOptions::retention), to be
  /// inserted with COMMIT.
  void record(std::string_view key, std::string_view request_id, std::string_view fingerprint,
              std::string_view response, std::chrono::milliseconds retention);
  /// Stages a statement of the handler's own (Context::stage()), sent ahead of the next
  /// writes() reading or else with the record and COMMIT; prepared per PgSinkOptions::
  /// statement_cache (a text's first use on a connection prepares it: a round trip within
  /// response_timeout, and its failure, an idem::PostgresError, aborts the transaction).
  void stage(std::string sql, PgParams params);
  /// Runs `write` (the handler, which writes through tx()) and answers false when it ended in a
  /// unique violation of one of PgSinkOptions::business_constraints (the transaction is left
  /// aborted: roll it back). Other libpqxx errors become idem::PostgresError; any other
  /// exception passes through.
  [[nodiscard]] bool business_write(const std::function<void()>& write);
  /// The staged statements (the handler's, then the record) and COMMIT in one round trip. A
  /// staged statement that fails rolls everything back (its error is thrown, and
  /// handler_statement_failed() tells whose it was); a connection lost during COMMIT is an
  /// idem::CommitOutcomeUnknown. Gives the connection back.
  void commit();
  /// Whether commit() threw the error of a statement the handler staged (the handler's failure,
  /// not the sink's).
  [[nodiscard]] bool handler_statement_failed() const noexcept { return handler_failed_; }
  /// ROLLBACK, within response_timeout; a failure is swallowed (the transaction is gone with its
  /// connection). Gives the connection back.
  void rollback() noexcept;

  /// What the transaction has written so far (a round trip once BEGIN went, within
  /// response_timeout; the handler's staged statements go ahead of the reading, in its round
  /// trip, and the first that fails is thrown), for Context::step() to tell a step that wrote
  /// through it.
  [[nodiscard]] TransactionWrites writes();

  /// The open transaction, for the handler's statements.
  [[nodiscard]] pqxx::transaction_base& tx();
  /// The libpq connection, for a cancel of the statement it runs (PQcancel); null before open().
  [[nodiscard]] pg_conn* raw_connection() noexcept;

 private:
  struct Held;
  // Runs `fn` translating libpqxx errors; a lost connection is not given back.
  template <typename F>
  decltype(auto) guarded(F&& fn);

  PgSink& sink_;
  std::unique_ptr<Held> held_;
  std::size_t handler_staged_ = 0;  // staged by the handler and not sent yet
  bool handler_failed_ = false;     // commit() threw a handler's error
};

}  // namespace idem::detail
