#include "sink/async_pg_sink.h"

#include <asio/associated_cancellation_slot.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/detached.hpp>
#include <asio/dispatch.hpp>
#include <asio/redirect_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "common/sha256.h"
#include "idem/errors.h"
#include "idem/key.h"
#include "pg/errors.h"
#include "sink/claim_check.h"
#include "sink/sql.h"

namespace idem::detail {
namespace {

constexpr int kClaimAttempts = 3;  // an expired or vanished row is retried, not looped on
constexpr std::string_view kLockNotAvailable = "55P03";

std::string ms_text(std::chrono::milliseconds duration) { return std::to_string(duration.count()); }

// Another transaction holds an uncommitted claim of the key past lock_timeout (55P03).
SinkClaim held_elsewhere() {
  SinkClaim open;
  open.status = SinkStatus::kInProgress;
  open.same_request = false;
  return open;
}

PgAsyncSettings connection_settings(const PgSinkOptions& options, const SinkStatements& sql) {
  using std::chrono::milliseconds;
  PgAsyncSettings settings;
  settings.conninfo = options.conninfo;
  const milliseconds bound =
      options.response_timeout.count() > 0 ? options.response_timeout : milliseconds(30000);
  settings.connect_timeout = bound;
  settings.statement_timeout = bound;
  // The session settings PgSink gives its connections.
  settings.setup = {"SET statement_timeout = " + ms_text(options.statement_timeout),
                    "SET lock_timeout = " + ms_text(options.lock_timeout)};
  // idem's own statements are parsed and planned once per connection, as PgSink prepares them,
  // and so are BEGIN, COMMIT and ROLLBACK (in the order of Prepared).
  settings.prepared = {sql.claim, sql.lookup, sql.take_over, sql.complete, sql.release, sql.renew,
                       sql.lock,  sql.record, "BEGIN",       "COMMIT",     "ROLLBACK",  sql.writes};
  settings.statement_cache = options.statement_cache;  // the handlers' statements
  return settings;
}

// idem's statements as the connections run them: their index in the settings' `prepared`.
PgStatement prepared(Prepared statement) {
  return PgStatement::prepared(static_cast<std::size_t>(statement));
}

// Where a batch's sync points are: one for all its statements (one round trip, one write of the
// server's answers; after a failed one the rest fail unrun, as the transaction is aborted
// anyway), or its last statement (a COMMIT) with a sync point of its own, so that it runs
// whatever failed before it.
enum class Syncs { kOne, kLastAlone };

// `batch` (of one explicit transaction) with its statements marked for `syncs`.
PgBatch synced(PgBatch batch, Syncs syncs = Syncs::kOne) {
  const std::size_t shared = syncs == Syncs::kLastAlone ? batch.size() - 1 : batch.size();
  for (std::size_t i = 0; i + 1 < shared; ++i) {
    PgStatement marked = std::move(batch[i].first).with_next();
    batch[i].first = std::move(marked);
  }
  return batch;
}

// `ends[i]`'s error, rethrown, if any.
void rethrow_end(const PgBatchEnds& ends, std::size_t i) {
  if (ends[i].first) std::rethrow_exception(ends[i].first);
}

// Why a statement that ended with `error` may have run, or nothing when the server refused it.
// For a COMMIT: its answer never came (the connection lost), or the server ended the session with
// it (a pg_terminate_backend() may land after the commit). Only the statement's own answer
// decides (the next holder may share the connection by then).
std::optional<std::string> in_doubt(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const PostgresError& e) {
    if (!e.sqlstate().empty() && !is_connection_loss(e.sqlstate())) return std::nullopt;
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// `error`, of one of idem's own statements, rethrown; with the pointer to migrate() when it says
// a table or column is missing.
[[noreturn]] void rethrow_own(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const PostgresError& e) {
    const std::string_view hint = migrate_hint(e.sqlstate());
    if (hint.empty()) throw;
    throw PostgresError(e.what() + std::string(hint), e.retryable(), e.sqlstate());
  }
}

// rethrow_end() for one of idem's own statements (rethrow_own()).
void rethrow_own_end(const PgBatchEnds& ends, std::size_t i) {
  if (ends[i].first) rethrow_own(ends[i].first);
}

}  // namespace

AsyncPgSink::AsyncPgSink(const asio::any_io_executor& executor, const PgSinkOptions& options)
    : options_((validate_sink_options(options), options)) {
  if (options_.pooling == PgPooling::kTransaction) {
    throw ConfigError(
        "idem: the async driver's sink needs PgPooling::kSession (a session of its own per "
        "connection)");
  }
  const PgAsyncSettings settings = connection_settings(options_, sink_statements(options_));
  for (std::size_t i = 0; i < options_.pool_size; ++i) {
    connections_.push_back(PgAsyncConnection::create(executor, settings));
  }
  held_.assign(connections_.size(), false);
}

AsyncPgSink::~AsyncPgSink() { close(); }

void AsyncPgSink::close() {
  for (const auto& connection : connections_) connection->close();
}

std::shared_ptr<PgAsyncConnection> AsyncPgSink::shared_connection() {
  std::shared_ptr<PgAsyncConnection> best;
  for (std::size_t i = 0; i < connections_.size(); ++i) {
    if (held_[i]) continue;
    if (best == nullptr || connections_[i]->in_flight() < best->in_flight()) {
      best = connections_[i];
    }
  }
  if (best != nullptr) best->drop_if_stale();  // a new unit of work starts on it
  return best;
}

asio::awaitable<void> AsyncPgSink::wait_for_connection(bool to_hold) {
  std::deque<std::shared_ptr<asio::steady_timer>>& queue = to_hold ? hold_waiters_ : share_waiters_;
  auto timer = std::make_shared<asio::steady_timer>(co_await asio::this_coro::executor,
                                                    asio::steady_timer::time_point::max());
  queue.push_back(timer);
  std::error_code ignored;
  co_await timer->async_wait(asio::redirect_error(asio::use_awaitable, ignored));
  if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) {
    // Woken and cancelled at once: the connection it was woken for goes to the next in line.
    const bool woken = std::erase(queue, timer) == 0;
    if (woken && to_hold) wake_next_holder();
    throw Cancelled("idem: postgres: cancelled while waiting for a connection");
  }
}

void AsyncPgSink::wake_next_holder() {
  if (hold_waiters_.empty()) return;
  const std::shared_ptr<asio::steady_timer> next = std::move(hold_waiters_.front());
  hold_waiters_.pop_front();
  next->cancel();
}

asio::awaitable<std::shared_ptr<PgAsyncConnection>> AsyncPgSink::hold() {
  for (;;) {
    // The least busy: the transaction's statements queue behind run()'s already sent there.
    if (std::shared_ptr<PgAsyncConnection> best = shared_connection()) {
      for (std::size_t i = 0; i < connections_.size(); ++i) {
        if (connections_[i] == best) held_[i] = true;
      }
      co_return best;
    }
    co_await wait_for_connection(true);
  }
}

void AsyncPgSink::give_back(const std::shared_ptr<PgAsyncConnection>& connection) {
  for (std::size_t i = 0; i < connections_.size(); ++i) {
    if (connections_[i] == connection) held_[i] = false;
  }
  // A statement of run() takes no connection for itself: every one waiting goes on. A
  // transaction takes it: one goes on (waking them all made each give-back wake every waiting
  // transaction, 1 000 of them, to find one connection). One that finds the connection taken
  // meanwhile waits again, at the back; it was not the only way to it being taken.
  std::deque<std::shared_ptr<asio::steady_timer>> sharing = std::move(share_waiters_);
  share_waiters_.clear();
  for (const auto& waiter : sharing) waiter->cancel();
  wake_next_holder();
}

asio::awaitable<PgResultPtr> AsyncPgSink::exec(Prepared statement, PgParams params,
                                               bool cancellable, std::optional<OwnRow> own_row) {
  std::shared_ptr<PgAsyncConnection> connection = shared_connection();
  while (connection == nullptr) {
    co_await wait_for_connection(false);
    connection = shared_connection();
  }
  try {
    if (cancellable) {
      co_return co_await connection->exec(prepared(statement), std::move(params),
                                          asio::use_awaitable);
    }
    co_return co_await connection->exec(
        prepared(statement), std::move(params),
        asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  } catch (const PostgresError&) {
    rethrow_own(std::current_exception());
  } catch (const Cancelled&) {
    // Sent or queued, the statement may still run. The connection runs its statements in order,
    // so a release queued behind it runs after it and finds the row only if it wrote one.
    if (own_row) {
      connection->exec(prepared(Prepared::kRelease),
                       pg_params(options_.ns, own_row->key, own_row->owner), asio::detached);
    }
    throw;
  }
}

asio::awaitable<SinkClaim> AsyncPgSink::claim(std::string_view key, std::string_view request_id,
                                              std::string_view fingerprint,
                                              std::string_view owner_token) {
  validate_sink_claim(key, request_id, owner_token);
  const std::string_view owner = owner_token.empty() ? request_id : owner_token;
  for (int attempt = 0; attempt < kClaimAttempts; ++attempt) {
    PgResultPtr inserted;
    try {
      // Named, as every PgParams here: GCC 12 cannot keep a temporary across a co_await.
      PgParams insert =
          pg_params(options_.ns, key, request_id, fingerprint, ms_text(options_.lease), owner);
      // An attempt's own owner token fences the row: a claim cut short is released with it. A
      // request ID is no such fence (a concurrent delivery of it may hold the row).
      std::optional<OwnRow> own_row;
      if (!owner_token.empty()) own_row = OwnRow{key, owner_token};
      inserted = co_await exec(Prepared::kClaim, std::move(insert), true, own_row);
    } catch (const PostgresError& error) {
      if (error.sqlstate() != kLockNotAvailable) throw;
      co_return held_elsewhere();
    }
    if (std::string_view(PQcmdTuples(inserted.get())) == "1") co_return SinkClaim{};
    PgParams lookup = pg_params(options_.ns, key);
    const PgResultPtr found = co_await exec(Prepared::kLookup, std::move(lookup), true);
    const PGresult* row = found.get();
    if (PQntuples(row) == 0) continue;                     // released or purged since the insert
    if (std::string_view(PQgetvalue(row, 0, 5)) == "t") {  // expired: take the key over
      PgParams take_over = pg_params(options_.ns, key);
      (void)co_await exec(Prepared::kTakeOver, std::move(take_over), true);
      continue;
    }
    co_return existing_claim(row, request_id, fingerprint);
  }
  throw PostgresError("idem: postgres: the row of the key kept changing during claim", true);
}

asio::awaitable<bool> AsyncPgSink::complete(std::string_view key, std::string_view owner,
                                            std::string_view response,
                                            std::chrono::milliseconds retention) {
  PgParams params = complete_params(options_, key, response, sink_retention(options_, retention),
                                    std::string(owner));
  const PgResultPtr updated = co_await exec(Prepared::kComplete, std::move(params), false);
  co_return std::string_view(PQcmdTuples(updated.get())) == "1";
}

asio::awaitable<bool> AsyncPgSink::release(std::string_view key, std::string_view owner) {
  PgParams params = pg_params(options_.ns, key, owner);
  const PgResultPtr deleted = co_await exec(Prepared::kRelease, std::move(params), false);
  co_return std::string_view(PQcmdTuples(deleted.get())) == "1";
}

asio::awaitable<bool> AsyncPgSink::renew(std::string_view key, std::string_view owner,
                                         std::chrono::milliseconds lease) {
  PgParams params = pg_params(options_.ns, key, owner, ms_text(sink_lease(options_, lease)));
  const PgResultPtr updated = co_await exec(Prepared::kRenew, std::move(params), false);
  co_return std::string_view(PQcmdTuples(updated.get())) == "1";
}

}  // namespace idem::detail

namespace idem::detail {

// ---- AsyncPgTransaction ------------------------------------------------------------------------

AsyncPgTransaction::~AsyncPgTransaction() {
  if (connection_ == nullptr) return;
  if (begun_ && connection_->generation() == generation_) {
    // Left open (the call's coroutine was destroyed): the session must not keep it.
    send_rollback();
  }
  give_back();
}

void AsyncPgTransaction::send_rollback() {
  // Queued on the connection before any statement of its next holder; its answer is not awaited
  // (a failure means the session is gone, and the transaction with it).
  connection_->exec(prepared(Prepared::kRollback), {}, [](std::exception_ptr, PgResultPtr) {});
}

void AsyncPgTransaction::give_back() noexcept {
  if (connection_ == nullptr) return;
  sink_.give_back(connection_);
  connection_.reset();
}

void AsyncPgTransaction::check_session() const {
  if (connection_ == nullptr) throw Error("idem: internal: a statement outside the transaction");
  if (begun_ && connection_->generation() != generation_) {
    throw connection_error("the connection of the transaction was lost (rolled back)");
  }
}

asio::awaitable<void> AsyncPgTransaction::open(bool begin_now) {
  connection_ = co_await sink_.hold();
  generation_ = connection_->generation();
  begun_ = true;
  pending_begin_ = !begin_now;
  if (begin_now)
    (void)co_await connection_->exec(prepared(Prepared::kBegin), {}, asio::use_awaitable);
}

asio::awaitable<SinkClaim> AsyncPgTransaction::claim(std::string_view key,
                                                     std::string_view request_id,
                                                     std::string_view fingerprint) {
  validate_sink_claim(key, request_id);
  check_session();
  last_writes_.reset();
  const PgSinkOptions& o = sink_.options_;
  PgBatch batch;
  batch.reserve(3);
  if (pending_begin_) batch.emplace_back(prepared(Prepared::kBegin), PgParams{});
  const std::size_t lock = batch.size();
  batch.emplace_back(prepared(Prepared::kLock), pg_params(o.ns, key));
  batch.emplace_back(prepared(Prepared::kLookup), pg_params(o.ns, key));
  pending_begin_ = false;
  PgBatchEnds ends =
      co_await connection_->exec_batch(synced(std::move(batch)), asio::use_awaitable);
  if (lock > 0) rethrow_end(ends, 0);  // BEGIN
  try {
    rethrow_end(ends, lock);
  } catch (const PostgresError& error) {
    if (error.sqlstate() != kLockNotAvailable) throw;
    co_return held_elsewhere();  // this transaction is aborted now: the plan rolls it back
  }
  rethrow_own_end(ends, lock + 1);
  const PGresult* row = ends[lock + 1].second.get();
  if (PQntuples(row) == 0) co_return SinkClaim{};
  if (std::string_view(PQgetvalue(row, 0, 5)) == "t") {  // expired: ours (we hold its lock)
    PgParams take_over = pg_params(o.ns, key);
    (void)co_await connection_->exec(prepared(Prepared::kTakeOver), std::move(take_over),
                                     asio::use_awaitable);
    co_return SinkClaim{};
  }
  co_return existing_claim(row, request_id, fingerprint);
}

template <typename Token>
asio::awaitable<PgResultPtr> AsyncPgTransaction::send(PgStatement statement, PgParams params,
                                                      Token token) {
  if (!pending_begin_ && staged_.empty()) {
    co_return co_await connection_->exec(std::move(statement), std::move(params), token);
  }
  PgBatch batch = std::move(staged_);
  staged_.clear();
  handler_staged_ = 0;
  if (pending_begin_) batch.insert(batch.begin(), {prepared(Prepared::kBegin), PgParams{}});
  pending_begin_ = false;
  batch.emplace_back(std::move(statement), std::move(params));
  PgBatchEnds ends = co_await connection_->exec_batch(synced(std::move(batch)), token);
  for (std::size_t i = 0; i < ends.size(); ++i) rethrow_end(ends, i);
  co_return std::move(ends.back().second);
}

asio::awaitable<PgResultPtr> AsyncPgTransaction::exec(std::string sql, PgParams params) {
  require_no_nul(params);
  check_session();
  last_writes_.reset();
  co_return co_await send(PgStatement::cached(std::move(sql)), std::move(params),
                          asio::use_awaitable);
}

void AsyncPgTransaction::stage(std::string sql, PgParams params) {
  require_no_nul(params);
  check_session();
  last_writes_.reset();
  staged_.emplace_back(PgStatement::cached(std::move(sql)), std::move(params));
  ++handler_staged_;
}

void AsyncPgTransaction::record(std::string_view key, std::string_view request_id,
                                std::string_view fingerprint, std::string_view response,
                                std::chrono::milliseconds retention) {
  validate_sink_claim(key, request_id);
  const PgSinkOptions& o = sink_.options_;
  staged_.emplace_back(
      prepared(Prepared::kRecord),
      record_params(o, key, request_id, fingerprint, response, sink_retention(o, retention)));
}

asio::awaitable<void> AsyncPgTransaction::commit() {
  check_session();
  PgBatch batch = std::move(staged_);
  staged_.clear();
  // The handler's statements are batch[first, first + handler_staged_).
  const std::size_t first = pending_begin_ ? 1 : 0;
  const std::size_t handlers = std::exchange(handler_staged_, 0);
  if (pending_begin_) batch.insert(batch.begin(), {prepared(Prepared::kBegin), PgParams{}});
  pending_begin_ = false;
  batch.emplace_back(prepared(Prepared::kCommit), PgParams{});
  // With a transaction or a statement waiting for a connection, the connection goes to it as soon
  // as COMMIT is queued: the next holder's statements queue behind this COMMIT and leave with it,
  // one round trip fewer per transaction. COMMIT then has a sync point of its own, so it runs
  // whatever failed before it (in a failed transaction it answers ROLLBACK) and the session has
  // left the transaction before the next holder's first statement; and it leaves with the turn,
  // so that the next holder's first flight goes in the same write. With nobody waiting, the
  // connection is kept until the answers, and one sync point (one write) serves the batch.
  const bool hand_over = sink_.someone_waiting();
  const std::shared_ptr<PgAsyncConnection> connection = connection_;
  if (hand_over) give_back();
  PgBatchEnds ends = co_await connection->exec_batch(
      synced(std::move(batch), hand_over ? Syncs::kLastAlone : Syncs::kOne),
      asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable), hand_over);
  begun_ = false;
  for (std::size_t i = 0; i + 1 < ends.size(); ++i) {
    // A staged statement the server refused: the transaction cannot have committed (COMMIT was
    // skipped, or answered ROLLBACK). Lost answers are COMMIT's to judge, below.
    if (!ends[i].first || in_doubt(ends[i].first)) continue;
    if (!hand_over) {
      // Still in the failed transaction: ROLLBACK goes before any statement of the next holder.
      send_rollback();
      give_back();
    }
    handler_failed_ = i >= first && i < first + handlers;
    if (handler_failed_) std::rethrow_exception(ends[i].first);
    rethrow_own(ends[i].first);
  }
  give_back();
  if (ends.back().first) {
    if (const std::optional<std::string> why = in_doubt(ends.back().first)) {
      throw CommitOutcomeUnknown("idem: postgres: COMMIT ended with its connection (" + *why +
                                 ") (commit outcome unknown)");
    }
  }
  rethrow_end(ends, ends.size() - 1);
  check_committed(PQcmdStatus(ends.back().second.get()));
}

asio::awaitable<void> AsyncPgTransaction::rollback() {
  staged_.clear();
  handler_staged_ = 0;
  const bool open = begun_ && !pending_begin_ && connection_ != nullptr &&
                    connection_->generation() == generation_;
  begun_ = false;
  if (open) {
    std::exception_ptr failure;
    try {
      (void)co_await connection_->exec(
          prepared(Prepared::kRollback), {},
          asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
    } catch (...) {
      failure = std::current_exception();
    }
    give_back();
    if (failure) std::rethrow_exception(failure);
    co_return;
  }
  give_back();
}

asio::awaitable<TransactionWrites> AsyncPgTransaction::writes() {
  check_session();
  // BEGIN not sent yet and nothing staged: nothing written.
  if (pending_begin_ && staged_.empty()) co_return TransactionWrites{};
  if (last_writes_) co_return *last_writes_;
  const PgResultPtr row =
      co_await send(prepared(Prepared::kWrites), {},
                    asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
  last_writes_ = TransactionWrites{std::string_view(PQgetvalue(row.get(), 0, 0)) == "t",
                                   std::strtoll(PQgetvalue(row.get(), 0, 1), nullptr, 10)};
  co_return *last_writes_;
}

bool AsyncPgTransaction::business_duplicate(const std::exception_ptr& error) const {
  return detail::business_duplicate(error, sink_.options_.business_constraints);
}

}  // namespace idem::detail
