// One PostgreSQL connection that never blocks its Asio loop: libpq's non-blocking API
// (PQconnectStart/PQconnectPoll, PQsendQueryParams, PQconsumeInput/PQisBusy, PQflush) driven by
// socket readiness on the loop, in pipeline mode (libpq 14+): statements issued while others
// run are sent at once, each followed by its own sync point, so concurrent statements share
// round trips and an error in one never aborts another's. The statements of one loop turn leave
// together (TCP_CORK around them: libpq 15 writes to the socket at every sync point). A
// statement that ends a flight (not with_next()) issued with nothing on the wire is sent when it
// is issued, with the flight it ends, instead of a turn of the loop later. A batch (exec_batch())
// is several statements issued as one operation: queued together, sent together, completed once
// with the end of each.
//
// Deadlines: each statement has one (its timeout from the call). When it passes, the connection
// is closed and every pending statement fails with a retryable idem::PostgresError (SQLSTATE
// 08006, "connection lost"): a stalled server never holds the loop, and a late result is never
// delivered to a later statement. A COMMIT that fails that way has an unknown outcome.
//
// Cancellation: when a statement's (or a batch's) cancellation slot is emitted, it completes at
// once with idem::Cancelled (not a business failure), and when it is the one running with
// nothing sent behind its sync point, it is cancelled on the server too (PQcancel, on a helper
// thread since libpq 15's cancel blocks; it ends with SQLSTATE 57014, its result dropped), so the
// statements queued behind it go on. PostgreSQL cancels whatever its backend runs when the request
// arrives: nothing more is sent until PQcancel returned, when the server has the request (one that
// has not in connect_timeout closes the connection), so it cannot cancel the next statement; and a
// statement already sent behind another sync point waits for the one running to end. A cancelled
// statement still waiting behind others may still run; its result is dropped. A stopped server
// never holds a cancelled call.
//
// Thread safety: not thread-safe; use it from its executor's thread. Completion handlers are
// dispatched to their associated executor.
#pragma once

#include <libpq-fe.h>

#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/async_op.h"
#include "pg/result.h"

namespace idem::detail {

/// Completion signature of a statement: its result (PGRES_TUPLES_OK or PGRES_COMMAND_OK), or an
/// exception_ptr holding idem::PostgresError (server error with its SQLSTATE, connection loss,
/// timeout) or idem::Cancelled.
using PgSignature = void(std::exception_ptr, PgResultPtr);

struct PgAsyncSettings {
  /// A libpq connection string or URI (sslmode etc. as libpq reads them).
  std::string conninfo;
  /// Bound on connecting (TCP, TLS, authentication), in ms (> 0).
  std::chrono::milliseconds connect_timeout{5000};
  /// Default bound on one statement from the call to its result, in ms (> 0).
  std::chrono::milliseconds statement_timeout{5000};
  /// Statements sent ahead of everything else on every new connection (session settings such
  /// as `SET lock_timeout = 1000`), bounded by connect_timeout; their results are dropped.
  std::vector<std::string> setup{};
  /// Statement texts prepared on each connection at their first use (PQsendPrepare in the same
  /// flight, then sent by name), run as PgStatement::prepared(index): the server parses and
  /// plans them once per connection instead of once per call.
  std::vector<std::string> prepared{};
  /// How many distinct texts of PgStatement::cached() each connection prepares, as `prepared`,
  /// at their first use: the first ones; any text beyond goes unnamed. 0: none.
  std::size_t statement_cache = 0;
};

/// What a statement runs: SQL text (implicitly, from a string: sent unnamed, parsed and planned
/// by the server each time), SQL text the connection prepares at its first use (cached()), or
/// one of the connection settings' `prepared` texts by its index (no text copied per call; sent
/// by name).
class PgStatement {
 public:
  PgStatement(std::string sql) : sql_(std::move(sql)) {}  // NOLINT: implicit, for SQL text
  PgStatement(const char* sql) : sql_(sql) {}             // NOLINT: implicit, for SQL text
  /// PgAsyncSettings::prepared[index]; a statement past its end fails with idem::Error.
  [[nodiscard]] static PgStatement prepared(std::size_t index) {
    PgStatement statement;
    statement.prepared_ = static_cast<int>(index);
    return statement;
  }
  /// `sql`, prepared by the connection at its first use there and then sent by name, within
  /// PgAsyncSettings::statement_cache (else sent unnamed, as SQL text is).
  [[nodiscard]] static PgStatement cached(std::string sql) {
    PgStatement statement(std::move(sql));
    statement.cached_ = true;
    return statement;
  }
  /// This statement shares the sync point of the statement sent right after it, in the same
  /// write (one issued in the same turn of the loop): the server answers the two in one flush,
  /// which saves it a write and the client a wake-up. An error in this statement makes the
  /// server skip every statement up to that sync point (they fail, "not run"); so it is for the
  /// statements of one explicit transaction, which an error aborts anyway. With no statement
  /// sent after it, it has a sync point of its own.
  [[nodiscard]] PgStatement&& with_next() && noexcept {
    sync_with_next_ = true;
    return std::move(*this);
  }
  /// Whether it was marked with_next().
  [[nodiscard]] bool syncs_with_next() const noexcept { return sync_with_next_; }
  /// The index into PgAsyncSettings::prepared, or -1 for SQL text.
  [[nodiscard]] int prepared_index() const noexcept { return prepared_; }
  /// Whether it is SQL text to prepare on the connection (cached()).
  [[nodiscard]] bool is_cached() const noexcept { return cached_; }
  /// The SQL text (empty for a prepared one).
  [[nodiscard]] const std::string& sql() const noexcept { return sql_; }

 private:
  PgStatement() = default;
  std::string sql_;
  int prepared_ = -1;
  bool cached_ = false;
  bool sync_with_next_ = false;
};

/// Statements of one unit of work issued together (exec_batch()) with their parameters.
using PgBatch = std::vector<std::pair<PgStatement, PgParams>>;
/// The ends of a batch's statements, in order: what PgSignature would give each (an error or a
/// result).
using PgBatchEnds = std::vector<std::pair<std::exception_ptr, PgResultPtr>>;
/// Completion signature of a batch: an error only when it was refused whole (empty, or naming a
/// prepared statement that does not exist; nothing was sent), else the end of every statement.
using PgBatchSignature = void(std::exception_ptr, PgBatchEnds);

class PgAsyncConnection : public std::enable_shared_from_this<PgAsyncConnection> {
 public:
  using executor_type = asio::any_io_executor;
  using Clock = std::chrono::steady_clock;

  [[nodiscard]] static std::shared_ptr<PgAsyncConnection> create(executor_type executor,
                                                                 PgAsyncSettings settings);
  ~PgAsyncConnection();
  PgAsyncConnection(const PgAsyncConnection&) = delete;
  PgAsyncConnection& operator=(const PgAsyncConnection&) = delete;

  [[nodiscard]] executor_type get_executor() const noexcept { return executor_; }

  /// Runs `statement` with `params` ($1, $2, ...) and completes with PgSignature.
  /// Connects first when needed. `statement` and `params` are moved into the operation.
  template <typename Token>
  auto exec(PgStatement statement, PgParams params, Token&& token) {
    return exec(std::move(statement), std::move(params), settings_.statement_timeout,
                std::forward<Token>(token));
  }
  template <typename Token>
  auto exec(PgStatement statement, PgParams params, std::chrono::milliseconds timeout,
            Token&& token) {
    return asio::async_initiate<Token, PgSignature>(
        [self = shared_from_this()](auto handler, PgStatement what, PgParams values,
                                    std::chrono::milliseconds limit) {
          self->enqueue(
              make_pending_op<PgResultPtr>(std::move(handler), self->executor_, &on_cancel),
              std::move(what), std::move(values), limit);
        },
        token, std::move(statement), std::move(params), timeout);
  }

  /// Runs `batch`'s statements in order as one operation: queued and sent together (each with
  /// the sync point its with_next() gives it), each with the default statement timeout, and
  /// completes with PgBatchSignature once every one ended. A cancellation reaches every statement
  /// not ended yet (each ends with idem::Cancelled; a running one is cancelled on the server as
  /// exec()'s is). `batch` is moved into the operation.
  /// `with_the_turn`: sent with what else is issued in this turn of the loop even when nothing
  /// is on the wire (for a batch that hands the connection to a statement issued next, as a
  /// COMMIT ahead of the next transaction's BEGIN: one write for both).
  template <typename Token>
  auto exec_batch(PgBatch batch, Token&& token, bool with_the_turn = false) {
    return asio::async_initiate<Token, PgBatchSignature>(
        [self = shared_from_this(), with_the_turn](auto handler, PgBatch statements) {
          self->enqueue(
              make_pending_op<PgBatchEnds>(std::move(handler), self->executor_, &on_cancel_batch),
              std::move(statements), with_the_turn);
        },
        token, std::move(batch));
  }

  /// Closes the connection; pending statements fail (retryable, SQLSTATE 08006).
  void close();

  /// Statements sent or queued whose result has not come (including cancelled ones).
  [[nodiscard]] std::size_t in_flight() const noexcept { return pending_.size(); }
  /// Before a new unit of work (a single statement, a transaction's BEGIN): a connection with
  /// nothing in flight whose server ended the session while it was idle (a restart) is closed,
  /// so the work opens a new session instead of failing on the dead one. Never between the
  /// statements of a transaction: they must not move to another session.
  void drop_if_stale();
  /// Times a connection was established.
  [[nodiscard]] std::uint64_t connects() const noexcept { return connects_; }
  /// Bumped each time the connection is dropped (lost, timed out, closed): a session's statements
  /// (an open transaction) are gone once it changed.
  [[nodiscard]] std::uint64_t generation() const noexcept { return generation_; }

 private:
  using Op = PendingOp<PgResultPtr>;
  using BatchOp = PendingOp<PgBatchEnds>;
  // A batch while some of its statements are queued: its operation (null once completed) and
  // the ends so far. BatchOp::entry points here.
  struct Batch {
    std::unique_ptr<BatchOp> op;
    PgBatchEnds ends;
    std::size_t left = 0;  // statements not ended
    PgAsyncConnection* owner = nullptr;
  };
  struct Pending {
    std::unique_ptr<Op> op;  // a statement of its own; null: cancelled while queued, or batched
    std::shared_ptr<Batch> batch;  // the batch it is statement `in_batch` of (null: none, or
    std::size_t in_batch = 0;      // the batch was cancelled: the result is dropped)
    PgAsyncConnection* owner = nullptr;
    PgStatement statement{""};
    PgParams params;
    bool sent = false;
    bool sync_with_next = false;    // PgStatement::with_next()
    bool synced = true;             // sent with a sync point of its own (ends at PIPELINE_SYNC)
    int ends_left = 0;              // its commands (Prepare, statement) whose NULL is unread
    bool cancel_requested = false;  // PQcancel sent for it: its 57014 is idem::Cancelled
    int preparing = -1;             // index into texts_ whose Prepare result comes first
    PgResultPtr result;             // the statement's result, kept until its sync point
    std::chrono::milliseconds timeout{0};
    Clock::time_point deadline;
  };

  PgAsyncConnection(executor_type executor, PgAsyncSettings settings);

  static void on_cancel(Op& op);
  static void on_cancel_batch(BatchOp& op);
  // A cached() statement as the connection sends it: by the index of its text among texts_
  // (added there while statement_cache allows), else as SQL text.
  PgStatement resolved(PgStatement statement);
  void enqueue(std::unique_ptr<Op> op, PgStatement statement, PgParams params,
               std::chrono::milliseconds timeout);
  void enqueue(std::unique_ptr<BatchOp> op, PgBatch statements, bool with_the_turn);
  // Whether the statement's prepared index exists (else `op` was completed with the error).
  template <typename Result>
  bool refused(std::unique_ptr<PendingOp<Result>>& op, const PgStatement& statement);
  // Queues a statement (its op, if any, is set by the caller).
  Pending& push(PgStatement statement, PgParams params, std::chrono::milliseconds timeout);
  // Once statements are queued: connects, sends them at once or schedules the send (always
  // with `with_the_turn`).
  void after_enqueue(bool with_the_turn = false);
  void connect();
  void poll_connect();
  void wait(bool for_write);
  void on_ready();
  void send_unsent();
  // Sends every statement not sent yet; the failure, if any (the connection is then unusable:
  // the caller fails it).
  std::exception_ptr send_all_unsent();
  // send_unsent() at the next turn of the loop, once for all that is queued in this one.
  void schedule_send();
  bool send(Pending& entry, const std::vector<const char*>& values);
  // TCP_CORK on the socket (Linux): true when set.
  bool set_cork(bool on) const noexcept;
  bool read_results();
  void finish_front(PgResultPtr result);
  // Gives `entry`'s end to its operation or its batch's (`in_handler`: see finish_in_handler()).
  static void deliver(Pending& entry, std::exception_ptr error, PgResultPtr result,
                      bool in_handler);
  void cancel(Pending* entry);
  void cancel_batch(Batch& batch);
  // Cancels `entry` on the server when it runs with nothing sent behind its sync point.
  void cancel_if_running(Pending* entry);
  // Whether nothing is sent behind the front's sync point: a cancel request that comes once the
  // front ended can reach only the statements aborted with it (its sync point's).
  [[nodiscard]] bool alone_on_the_wire() const;
  // Sends what is queued once the cancel request under way has reached the server.
  void after_cancel_delivered(Clock::time_point give_up);
  void arm_deadline(Clock::time_point deadline);
  friend class QueueDeadline;  // calls on_deadline()
  void on_deadline(Clock::time_point deadline);
  void fail(const std::exception_ptr& error);
  void drop_socket() noexcept;

  executor_type executor_;
  const PgAsyncSettings settings_;
  PGconn* conn_ = nullptr;
  enum class State { kIdle, kConnecting, kReady } state_ = State::kIdle;
  bool connect_wants_write_ = false;
  std::unique_ptr<asio::posix::stream_descriptor> socket_;  // wraps PQsocket, never closes it
  int socket_fd_ = -1;
  bool waiting_read_ = false;
  bool waiting_write_ = false;
  bool flush_pending_ = false;
  bool send_scheduled_ = false;
  std::deque<Pending> pending_;
  std::vector<const char*> values_;  // send_unsent()'s parameter pointers, kept for their capacity
  // The texts prepared by name: settings_.prepared, then the cached() ones in order of first use
  // (a deque: the views in cached_ stay valid).
  std::deque<std::string> texts_;
  std::unordered_map<std::string_view, std::size_t> cached_;  // a cached() text: its index
  std::vector<std::string> prepared_names_;                   // of texts_: idem_async_<index>
  std::vector<bool> prepared_;  // on this connection (reset when it is dropped)
  QueueDeadline deadline_;
  asio::steady_timer connect_timer_;
  // A cancel request under way (null: none): set by its helper thread once PQcancel returned,
  // when the server has it. Nothing is sent meanwhile.
  std::shared_ptr<std::atomic<bool>> cancel_delivered_;
  asio::steady_timer cancel_wait_;
  std::uint64_t connects_ = 0;
  std::uint64_t generation_ = 0;  // bumped when the connection is dropped
};

}  // namespace idem::detail
