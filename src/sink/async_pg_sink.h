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
#include <string>
#include <string_view>
#include <vector>

#include "idem/pg_sink.h"
#include "idem/sink.h"
#include "pg/async_connection.h"
#include "sink/statements.h"

namespace idem::detail {

/// `bytes` as PostgreSQL's text input of a bytea: "\x" and hex.
[[nodiscard]] std::string bytea_literal(std::string_view bytes);
/// A bytea column of a text-format result, decoded; nullopt for NULL.
[[nodiscard]] std::optional<std::string> bytea_value(const PGresult* result, int row, int column);

class AsyncPgSink {
 public:
  /// Throws idem::ConfigError on invalid options (as PgSink does) and for PgPooling::kTransaction.
  AsyncPgSink(const asio::any_io_executor& executor, const PgSinkOptions& options);
  AsyncPgSink(const AsyncPgSink&) = delete;
  AsyncPgSink& operator=(const AsyncPgSink&) = delete;
  ~AsyncPgSink();

  /// As PgSink::claim(key, request_id, fingerprint, owner_token): committed on its own for the
  /// lease, owned by `owner_token` (by `request_id` when empty).
  asio::awaitable<SinkClaim> claim(std::string_view key, std::string_view request_id,
                                   std::string_view fingerprint, std::string_view owner_token);
  /// As PgSink::complete(key, owner, response, retention).
  asio::awaitable<bool> complete(std::string_view key, std::string_view owner,
                                 std::string_view response, std::chrono::milliseconds retention);
  /// As PgSink::release(key, owner).
  asio::awaitable<bool> release(std::string_view key, std::string_view owner);
  /// As PgSink::renew(key, owner, lease); `lease` 0 is the configured one.
  asio::awaitable<bool> renew(std::string_view key, std::string_view owner,
                              std::chrono::milliseconds lease);

  [[nodiscard]] const PgSinkOptions& options() const noexcept { return options_; }
  /// The connections, for tests.
  [[nodiscard]] const std::vector<std::shared_ptr<PgAsyncConnection>>& connections() const {
    return connections_;
  }
  /// Closes every connection (pending statements fail).
  void close();

 private:
  friend class AsyncPgTransaction;
  // A connection for one statement of run(): the least busy one not held by a transaction, or
  // null when every one is held.
  std::shared_ptr<PgAsyncConnection> shared_connection();
  // Runs `sql` with `params` on a shared connection (waiting for one when all are held);
  // `cancellable`: whether the awaiting coroutine's cancellation reaches it.
  asio::awaitable<PgResultPtr> exec(const std::string& sql, PgParams params, bool cancellable);
  // A connection of its own, waiting on the loop for one when all are held.
  asio::awaitable<std::shared_ptr<PgAsyncConnection>> hold();
  // Gives back a connection hold() handed out.
  void give_back(const std::shared_ptr<PgAsyncConnection>& connection);
  // Waits until a connection is given back (or the wait is cancelled: idem::Cancelled).
  asio::awaitable<void> wait_for_connection();

  const PgSinkOptions options_;
  const SinkStatements sql_;
  std::vector<std::shared_ptr<PgAsyncConnection>> connections_;
  std::vector<bool> held_;                                   // by index of connections_
  std::deque<std::shared_ptr<asio::steady_timer>> waiters_;  // woken when one is given back
};

}  // namespace idem::detail
