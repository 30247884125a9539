// Layer 4 on an event loop: the PostgreSQL sink of the async driver, over a small pool of
// PgAsyncConnection (libpq's non-blocking API in pipeline mode). The same table, statements and
// answers as the blocking PgSink (src/sink/statements.h says them once for both): a claim in
// run() is PgSink::claim(key, request_id, fingerprint), and so on.
//
// Statements of run() go to the connection with the fewest statements in flight, pipelined
// with the others there; a transaction (transaction()) holds one connection of its own until
// it ends, and waits on the loop for one when all are held.
//
// Cancellation: claim() and the statements of a transaction's handler honour the awaiting
// coroutine's cancellation (a running statement is cancelled on the server: idem::Cancelled);
// complete(), release(), COMMIT and ROLLBACK ignore it: what follows a handler always runs to
// its end, bounded by the statement deadline.
//
// Thread safety: not thread-safe; use it from its executor's thread. String views given to a
// call must stay valid until it completes.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/pg_sink.h"
#include "idem/sink.h"
#include "pg/async_connection.h"
#include "sink/async_sink.h"
#include "sink/statements.h"

namespace idem::detail {

/// idem's statements (SinkStatements) as the sink's connections prepare them: the index of each
/// in their PgAsyncSettings::prepared.
enum class Prepared : std::size_t {
  kClaim,
  kLookup,
  kTakeOver,
  kComplete,
  kRelease,
  kRenew,
  kLock,
  kRecord,
  kBegin,  ///< The transaction's own statements.
  kCommit,
  kRollback,
  kWrites,  ///< What the transaction wrote (TransactionWrites).
};

class AsyncPgSink final : public AsyncSink {
 public:
  /// Throws idem::ConfigError on invalid options (as PgSink does) and for PgPooling::kTransaction.
  AsyncPgSink(const asio::any_io_executor& executor, const PgSinkOptions& options);
  AsyncPgSink(const AsyncPgSink&) = delete;
  AsyncPgSink& operator=(const AsyncPgSink&) = delete;
  ~AsyncPgSink();

  /// As PgSink::claim(key, request_id, fingerprint, owner_token): committed on its own for the
  /// lease, owned by `owner_token` (by `request_id` when empty).
  asio::awaitable<SinkClaim> claim(std::string_view key, std::string_view request_id,
                                   std::string_view fingerprint,
                                   std::string_view owner_token) override;
  /// As PgSink::complete(key, owner, response, retention).
  asio::awaitable<bool> complete(std::string_view key, std::string_view owner,
                                 std::string_view response,
                                 std::chrono::milliseconds retention) override;
  /// As PgSink::release(key, owner).
  asio::awaitable<bool> release(std::string_view key, std::string_view owner) override;
  /// As PgSink::renew(key, owner, lease); `lease` 0 is the configured one.
  asio::awaitable<bool> renew(std::string_view key, std::string_view owner,
                              std::chrono::milliseconds lease) override;

  [[nodiscard]] const PgSinkOptions& options() const noexcept { return options_; }
  /// The connections, for tests.
  [[nodiscard]] const std::vector<std::shared_ptr<PgAsyncConnection>>& connections() const {
    return connections_;
  }
  /// Closes every connection (pending statements fail).
  void close() override;

 private:
  friend class AsyncPgTransaction;
  // A connection for one statement of run(): the least busy one not held by a transaction, or
  // null when every one is held.
  std::shared_ptr<PgAsyncConnection> shared_connection();
  // Runs `statement` with `params` on a shared connection (waiting for one when all are held);
  // `cancellable`: whether the awaiting coroutine's cancellation reaches it. `own_row`: the row
  // of this attempt's that the statement may write (views valid until it completes): when a
  // cancellation cuts it short, its release goes behind it on its connection (unawaited).
  struct OwnRow {
    std::string_view key;
    std::string_view owner;
  };
  asio::awaitable<PgResultPtr> exec(Prepared statement, PgParams params, bool cancellable,
                                    std::optional<OwnRow> own_row = std::nullopt);
  // A connection of its own (the least busy one not held), waiting on the loop for one when all
  // are held.
  asio::awaitable<std::shared_ptr<PgAsyncConnection>> hold();
  // Gives back a connection hold() handed out.
  void give_back(const std::shared_ptr<PgAsyncConnection>& connection);
  // Waits until a connection is given back (or the wait is cancelled: idem::Cancelled): for
  // hold() when `to_hold` (transactions are woken one per connection given back), else for a
  // statement of run() (all of those are woken).
  asio::awaitable<void> wait_for_connection(bool to_hold);
  // Wakes the first transaction waiting for a connection, if any.
  void wake_next_holder();
  // Whether a transaction or a statement of run() waits for a connection.
  [[nodiscard]] bool someone_waiting() const noexcept {
    return !hold_waiters_.empty() || !share_waiters_.empty();
  }

  const PgSinkOptions options_;
  std::vector<std::shared_ptr<PgAsyncConnection>> connections_;
  std::vector<bool> held_;  // by index of connections_
  // Woken when a connection is given back: every statement of run() waiting (shared use), and
  // the first transaction waiting (hold()).
  std::deque<std::shared_ptr<asio::steady_timer>> share_waiters_;
  std::deque<std::shared_ptr<asio::steady_timer>> hold_waiters_;
};

/// One run_transactional() call's transaction on the async sink (docs/pg_sink.md, "What a call
/// costs", the same statements as PgTransaction): BEGIN goes with the claim's advisory lock and
/// read in one round trip (pipelined), the record INSERT with COMMIT. Holds one of the sink's
/// connections from open() until commit(), rollback() or its destruction; a connection lost
/// meanwhile fails every later statement (retryable, SQLSTATE 08006) instead of running it
/// outside the transaction. Not thread-safe; on the sink's executor. The sink must outlive it.
class AsyncPgTransaction {
 public:
  explicit AsyncPgTransaction(AsyncPgSink& sink) noexcept : sink_(sink) {}
  ~AsyncPgTransaction();
  AsyncPgTransaction(const AsyncPgTransaction&) = delete;
  AsyncPgTransaction& operator=(const AsyncPgTransaction&) = delete;

  /// Holds a connection of its own, waiting on the loop while every one is held (the awaiting
  /// coroutine's cancellation ends the wait: idem::Cancelled). `begin_now`: sends BEGIN at once
  /// (nothing is claimed in this transaction), else BEGIN goes with claim().
  asio::awaitable<void> open(bool begin_now);
  /// As PgTransaction::claim(): BEGIN, the key's advisory lock and its record's read, in one round
  /// trip. An expired record is deleted (one more); 55P03 on the lock: kInProgress (the
  /// transaction is aborted: roll it back). Cancellable.
  asio::awaitable<SinkClaim> claim(std::string_view key, std::string_view request_id,
                                   std::string_view fingerprint);
  /// A statement of the handler's own, cancellable (a running one is cancelled on the server);
  /// the statements stage()d before it go in its round trip, ahead of it (the first one that
  /// fails is thrown).
  asio::awaitable<PgResultPtr> exec(std::string sql, PgParams params);
  /// A statement of the handler's own whose result is not awaited: sent ahead of the next
  /// exec(), or else with the record and COMMIT.
  void stage(std::string sql, PgParams params);
  /// As PgTransaction::record(): stages the completed record, inserted with COMMIT.
  void record(std::string_view key, std::string_view request_id, std::string_view fingerprint,
              std::string_view response, std::chrono::milliseconds retention);
  /// The staged statements (the handler's, then the record) and COMMIT in one round trip, not
  /// cancellable. A staged statement that fails rolls everything back (its error is thrown,
  /// and handler_statement_failed() tells whose it was); a COMMIT whose connection was lost, or
  /// whose session the server ended (57P01-57P03), is an idem::CommitOutcomeUnknown, decided
  /// from COMMIT's own answer. When a transaction or a statement waits for a connection, gives
  /// the connection back as soon as COMMIT is queued, before its answer: the next holder's
  /// statements follow it in the same write, after COMMIT's sync point of its own (so they never
  /// run inside a failed transaction); a connection lost during this COMMIT fails them too.
  /// Otherwise gives it back once the answers came, the batch under one sync point.
  asio::awaitable<void> commit();
  /// Whether commit() threw the error of a statement the handler staged (the handler's failure,
  /// not the sink's).
  [[nodiscard]] bool handler_statement_failed() const noexcept { return handler_failed_; }
  /// ROLLBACK (not cancellable; nothing when the session is gone); gives the connection back.
  asio::awaitable<void> rollback();
  /// As PgTransaction::writes(): what the transaction has written so far. One round trip once
  /// BEGIN went, none before, and none when no statement went through the transaction (claim(),
  /// exec(), stage()) since the last reading, which then still holds; staged statements go
  /// ahead of the reading, in its round trip. Not cancellable.
  asio::awaitable<TransactionWrites> writes();
  /// Whether `error`, thrown out of the handler, is a unique violation of one of
  /// PgSinkOptions::business_constraints (the effect exists already).
  [[nodiscard]] bool business_duplicate(const std::exception_ptr& error) const;

 private:
  // Fails (08006) when the session that ran BEGIN is gone.
  void check_session() const;
  // Sends ROLLBACK without awaiting its answer.
  void send_rollback();
  void give_back() noexcept;
  // `statement` in one round trip with what must go before it (BEGIN held back, the handler's
  // staged statements); throws the first failure. `token`: use_awaitable, cancellable or not.
  template <typename Token>
  asio::awaitable<PgResultPtr> send(PgStatement statement, PgParams params, Token token);

  AsyncPgSink& sink_;
  std::shared_ptr<PgAsyncConnection> connection_;
  std::uint64_t generation_ = 0;  // the connection's, when BEGIN was sent
  bool begun_ = false;
  bool pending_begin_ = false;                    // BEGIN goes with the claim
  PgBatch staged_;                                // the handler's, then the record
  std::size_t handler_staged_ = 0;                // of staged_, the handler's (first)
  bool handler_failed_ = false;                   // commit() threw a handler's error
  std::optional<TransactionWrites> last_writes_;  // writes()'s, until the next exec()
};

}  // namespace idem::detail
