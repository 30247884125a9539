#include "pg/async_connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <utility>

#include "idem/errors.h"
#include "pg/cancel.h"
#include "pg/errors.h"
#include "pg/idle_session.h"

namespace idem::detail {
namespace {

std::exception_ptr lost(const std::string& message) {
  return std::make_exception_ptr(connection_error(message));
}

std::exception_ptr cancelled() {
  return std::make_exception_ptr(Cancelled("idem: postgres statement cancelled"));
}

}  // namespace

std::shared_ptr<PgAsyncConnection> PgAsyncConnection::create(executor_type executor,
                                                             PgAsyncSettings settings) {
  return std::shared_ptr<PgAsyncConnection>(
      new PgAsyncConnection(std::move(executor), std::move(settings)));
}

PgAsyncConnection::PgAsyncConnection(executor_type executor, PgAsyncSettings settings)
    : executor_(std::move(executor)),
      settings_(std::move(settings)),
      texts_(settings_.prepared.begin(), settings_.prepared.end()),
      prepared_(settings_.prepared.size(), false),
      deadline_(executor_),
      connect_timer_(executor_),
      cancel_wait_(executor_) {
  for (std::size_t i = 0; i < settings_.prepared.size(); ++i) {
    prepared_names_.push_back("idem_async_" + std::to_string(i));
  }
}

PgStatement PgAsyncConnection::resolved(PgStatement statement) {
  auto found = cached_.find(statement.sql());
  if (found == cached_.end()) {
    if (cached_.size() >= settings_.statement_cache) return PgStatement(statement.sql());
    const std::size_t index = texts_.size();
    texts_.push_back(statement.sql());
    found = cached_.emplace(texts_.back(), index).first;
    prepared_names_.push_back("idem_async_" + std::to_string(index));
    prepared_.push_back(false);
  }
  return PgStatement::prepared(found->second);
}

PgAsyncConnection::~PgAsyncConnection() {
  drop_socket();
  if (conn_ != nullptr) PQfinish(conn_);
}

void PgAsyncConnection::on_cancel(Op& op) {
  auto* entry = static_cast<Pending*>(op.entry);
  entry->owner->cancel(entry);
}

void PgAsyncConnection::on_cancel_batch(BatchOp& op) {
  auto* batch = static_cast<Batch*>(op.entry);
  batch->owner->cancel_batch(*batch);
}

template <typename Result>
bool PgAsyncConnection::refused(std::unique_ptr<PendingOp<Result>>& op,
                                const PgStatement& statement) {
  if (statement.prepared_index() < static_cast<int>(settings_.prepared.size())) return false;
  PendingOp<Result>* raw = op.get();
  raw->post_complete(std::move(op),
                     std::make_exception_ptr(Error("idem: no prepared statement " +
                                                   std::to_string(statement.prepared_index()))),
                     Result{});
  return true;
}

PgAsyncConnection::Pending& PgAsyncConnection::push(PgStatement statement, PgParams params,
                                                    std::chrono::milliseconds timeout) {
  Pending& entry = pending_.emplace_back();
  entry.sync_with_next = statement.syncs_with_next();
  entry.statement = statement.is_cached() ? resolved(std::move(statement)) : std::move(statement);
  entry.params = std::move(params);
  entry.timeout = timeout;
  entry.deadline = Clock::now() + timeout;
  entry.owner = this;
  arm_deadline(entry.deadline);
  return entry;
}

void PgAsyncConnection::enqueue(std::unique_ptr<Op> op, PgStatement statement, PgParams params,
                                std::chrono::milliseconds timeout) {
  if (refused(op, statement)) return;
  Pending& entry = push(std::move(statement), std::move(params), timeout);
  entry.op = std::move(op);
  entry.op->entry = &entry;
  after_enqueue();
}

void PgAsyncConnection::enqueue(std::unique_ptr<BatchOp> op, PgBatch statements,
                                bool with_the_turn) {
  if (statements.empty()) {
    BatchOp* raw = op.get();
    return raw->post_complete(
        std::move(op), std::make_exception_ptr(Error("idem: an empty batch of statements")), {});
  }
  for (const auto& [statement, params] : statements) {
    if (refused(op, statement)) return;
  }
  auto batch = std::make_shared<Batch>();
  batch->ends.resize(statements.size());
  batch->left = statements.size();
  batch->owner = this;
  for (std::size_t i = 0; i < statements.size(); ++i) {
    Pending& entry = push(std::move(statements[i].first), std::move(statements[i].second),
                          settings_.statement_timeout);
    entry.batch = batch;
    entry.in_batch = i;
  }
  op->entry = batch.get();
  batch->op = std::move(op);
  after_enqueue(with_the_turn);
}

void PgAsyncConnection::after_enqueue(bool with_the_turn) {
  if (state_ == State::kIdle) {
    connect();
  } else if (state_ == State::kReady && !with_the_turn && !pending_.back().sync_with_next &&
             !pending_.front().sent) {
    // It ends its flight and nothing is on the wire: nothing to wait for. A failure to send
    // fails the connection on the loop's next turn, not inside the caller's initiation.
    if (std::exception_ptr error = send_all_unsent()) {
      asio::post(executor_, [self = shared_from_this(), generation = generation_, error] {
        if (generation == self->generation_) self->fail(error);
      });
    }
  } else {
    schedule_send();  // statements issued in this turn of the loop are sent together
  }
}

void PgAsyncConnection::schedule_send() {
  if (state_ != State::kReady || send_scheduled_) return;
  send_scheduled_ = true;
  asio::post(executor_, [self = shared_from_this(), generation = generation_] {
    self->send_scheduled_ = false;
    if (generation == self->generation_) self->send_unsent();
  });
}

void PgAsyncConnection::drop_if_stale() {
  if (state_ == State::kReady && pending_.empty() && idle_session_ended(socket_fd_)) {
    fail(lost("the server ended the idle session"));  // nothing in flight fails
  }
}

void PgAsyncConnection::connect() {
  conn_ = PQconnectStart(settings_.conninfo.c_str());
  if (conn_ == nullptr) return fail(lost("cannot allocate a connection"));
  if (PQstatus(conn_) == CONNECTION_BAD)
    return fail(lost("connect: " + pq_message(PQerrorMessage(conn_))));
  if (PQsetnonblocking(conn_, 1) != 0) return fail(lost("connect: cannot set non-blocking mode"));
  state_ = State::kConnecting;
  connect_timer_.expires_after(settings_.connect_timeout);
  connect_timer_.async_wait(
      [self = shared_from_this(), generation = generation_](std::error_code e) {
        if (e || generation != self->generation_ || self->state_ != State::kConnecting) return;
        self->fail(lost("connect timed out after " +
                        std::to_string(self->settings_.connect_timeout.count()) + " ms"));
      });
  poll_connect();
}

void PgAsyncConnection::poll_connect() {
  const PostgresPollingStatusType status = PQconnectPoll(conn_);
  // libpq may move to another socket (another host of a multi-host conninfo, a TLS retry).
  if (const int fd = PQsocket(conn_); fd != socket_fd_) {
    drop_socket();
    if (fd >= 0) {
      socket_ = std::make_unique<asio::posix::stream_descriptor>(executor_, fd);
      socket_fd_ = fd;
    }
  }
  switch (status) {
    case PGRES_POLLING_READING:
      return wait(false);
    case PGRES_POLLING_WRITING:
      return wait(true);
    case PGRES_POLLING_OK:
      state_ = State::kReady;
      ++connects_;
      connect_timer_.cancel();
      if (PQenterPipelineMode(conn_) != 1)
        return fail(lost("cannot enter pipeline mode: " + pq_message(PQerrorMessage(conn_))));
      for (auto it = settings_.setup.rbegin(); it != settings_.setup.rend(); ++it) {
        Pending& entry = pending_.emplace_front();  // no op: the result is dropped
        entry.owner = this;
        entry.statement = *it;
        entry.timeout = settings_.connect_timeout;
        entry.deadline = Clock::now() + entry.timeout;
        arm_deadline(entry.deadline);
      }
      return send_unsent();
    default:
      return fail(lost("connect: " + pq_message(PQerrorMessage(conn_))));
  }
}

void PgAsyncConnection::wait(bool for_write) {
  bool& waiting = for_write ? waiting_write_ : waiting_read_;
  if (waiting || socket_ == nullptr) return;
  waiting = true;
  socket_->async_wait(
      for_write ? asio::posix::stream_descriptor::wait_write
                : asio::posix::stream_descriptor::wait_read,
      [self = shared_from_this(), generation = generation_, for_write](std::error_code error) {
        (for_write ? self->waiting_write_ : self->waiting_read_) = false;
        if (generation != self->generation_) return;
        if (error) return self->fail(lost("socket: " + error.message()));
        self->on_ready();
      });
}

void PgAsyncConnection::on_ready() {
  if (state_ == State::kConnecting) return poll_connect();
  if (state_ != State::kReady) return;
  if (PQconsumeInput(conn_) != 1) return fail(lost(pq_message(PQerrorMessage(conn_))));
  const std::uint64_t generation = generation_;
  if (!read_results() || generation != generation_) return;
  if (flush_pending_) {
    const int flushed = PQflush(conn_);
    if (flushed < 0) return fail(lost(pq_message(PQerrorMessage(conn_))));
    flush_pending_ = flushed == 1;
    if (flush_pending_) wait(true);
  }
  if (!pending_.empty()) wait(false);
}

void PgAsyncConnection::send_unsent() {
  if (std::exception_ptr error = send_all_unsent()) fail(error);
}

std::exception_ptr PgAsyncConnection::send_all_unsent() {
  if (state_ != State::kReady || cancel_delivered_ != nullptr) return nullptr;
  // Unsent statements follow the sent ones. Each gets a sync point of its own, but one that
  // shares the next one's (with_next()).
  std::size_t syncs = 0;
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->sent) continue;
    it->synced = !it->sync_with_next || std::next(it) == pending_.end();
    syncs += it->synced ? 1 : 0;
  }
  if (syncs == 0) return nullptr;
  // libpq 15's PQpipelineSync writes to the socket at once: one TCP segment, and one wake-up of
  // the server, per sync point. Corked, the statements of this turn leave together when the cork
  // comes off below (TCP_CORK fails harmlessly on a Unix socket).
  const bool corked = syncs > 1 && set_cork(true);
  for (Pending& entry : pending_) {
    if (entry.sent) continue;
    values_.clear();
    for (const auto& param : entry.params) values_.push_back(param ? param->c_str() : nullptr);
    if (!send(entry, values_) || (entry.synced && PQpipelineSync(conn_) != 1)) {
      if (corked) set_cork(false);
      return lost("send: " + pq_message(PQerrorMessage(conn_)));
    }
    entry.sent = true;
  }
  if (corked) set_cork(false);
  const int flushed = PQflush(conn_);
  if (flushed < 0) return lost("send: " + pq_message(PQerrorMessage(conn_)));
  flush_pending_ = flushed == 1;
  if (flush_pending_) wait(true);
  wait(false);
  return nullptr;
}

bool PgAsyncConnection::set_cork(bool on) const noexcept {
  const int value = on ? 1 : 0;
  return ::setsockopt(PQsocket(conn_), IPPROTO_TCP, TCP_CORK, &value, sizeof value) == 0;
}

// Queues `entry` in the pipeline: a prepared statement by name (with the Prepare first, the
// first time on this connection), SQL text unnamed.
bool PgAsyncConnection::send(Pending& entry, const std::vector<const char*>& values) {
  const int count = static_cast<int>(values.size());
  const int index = entry.statement.prepared_index();
  if (index < 0) {
    entry.ends_left = 1;
    return PQsendQueryParams(conn_, entry.statement.sql().c_str(), count, nullptr, values.data(),
                             nullptr, nullptr, 0) == 1;
  }
  const auto at = static_cast<std::size_t>(index);
  const char* name = prepared_names_[at].c_str();
  if (!prepared_[at]) {
    if (PQsendPrepare(conn_, name, texts_[at].c_str(), count, nullptr) != 1) {
      return false;
    }
    prepared_[at] = true;
    entry.preparing = index;
    ++entry.ends_left;
  }
  ++entry.ends_left;
  return PQsendQueryPrepared(conn_, name, count, values.data(), nullptr, nullptr, 0) == 1;
}

// In pipeline mode each command sent (a Prepare, a statement) ends with a NULL from
// PQgetResult after its result, and each sync point with a PGRES_PIPELINE_SYNC result: a
// statement ends at its sync point, or, sharing the next one's (with_next()), at the NULL after
// its own result.
bool PgAsyncConnection::read_results() {
  bool after_null = false;
  while (!pending_.empty() && pending_.front().sent && PQisBusy(conn_) == 0) {
    PGresult* raw = PQgetResult(conn_);
    Pending& front = pending_.front();
    if (raw == nullptr) {
      if (after_null) break;  // nothing more has arrived
      after_null = true;
      if (front.ends_left > 0 && --front.ends_left == 0 && !front.synced) {
        finish_front(std::move(front.result));
      }
      continue;
    }
    after_null = false;
    PgResultPtr result(raw);
    const ExecStatusType status = PQresultStatus(raw);
    if (front.preparing >= 0) {  // the Prepare's own result comes before the statement's
      const auto index = static_cast<std::size_t>(std::exchange(front.preparing, -1));
      if (status == PGRES_COMMAND_OK) continue;
      prepared_[index] = false;  // not prepared: the next use prepares it again
    }
    if (status == PGRES_PIPELINE_SYNC) {
      finish_front(std::move(front.result));
    } else if (front.result == nullptr || PQresultStatus(front.result.get()) != PGRES_FATAL_ERROR) {
      front.result = std::move(result);  // keep the first error, else the last result
    }
  }
  return true;
}

void PgAsyncConnection::finish_front(PgResultPtr result) {
  Pending entry = std::move(pending_.front());
  pending_.pop_front();
  if (pending_.empty()) deadline_.disarm();
  if (entry.cancel_requested) {
    // Ended by the request or before it took effect: what is queued waits until PQcancel has
    // returned, the request delivered (a 57014 alone may be statement_timeout's).
    after_cancel_delivered(Clock::now() + settings_.connect_timeout);
  }
  if (entry.op == nullptr && entry.batch == nullptr) return;
  std::exception_ptr error;
  if (result == nullptr) {
    error = lost("statement ended without a result");
  } else if (PQresultStatus(result.get()) == PGRES_PIPELINE_ABORTED) {
    error = std::make_exception_ptr(
        server_error("idem: postgres: statement not run: one sent before it with a shared sync "
                     "point failed",
                     ""));
    result.reset();
  } else if (PQresultStatus(result.get()) == PGRES_FATAL_ERROR) {
    const char* state = PQresultErrorField(result.get(), PG_DIAG_SQLSTATE);
    const std::string sqlstate = state != nullptr ? state : "";
    // A cached text whose plan's result columns changed ("cached plan must not change result
    // type") fails so on every run: it is prepared again, under a new name, at its next use.
    if (const int index = entry.statement.prepared_index();
        sqlstate == "0A000" && index >= static_cast<int>(settings_.prepared.size())) {
      cached_.erase(texts_[static_cast<std::size_t>(index)]);
    }
    if (sqlstate == "57014" && entry.cancel_requested) {
      error = cancelled();
    } else {
      error = std::make_exception_ptr(
          server_error(pq_message(PQresultErrorMessage(result.get())), sqlstate));
    }
    result.reset();
  }
  deliver(entry, error, std::move(result), true);
}

void PgAsyncConnection::deliver(Pending& entry, std::exception_ptr error, PgResultPtr result,
                                bool in_handler) {
  if (entry.op != nullptr) {
    std::unique_ptr<Op> op = std::move(entry.op);
    op->entry = nullptr;
    Op* raw = op.get();
    return raw->complete(std::move(op), error, std::move(result), in_handler);
  }
  const std::shared_ptr<Batch> batch = std::move(entry.batch);
  if (batch == nullptr) return;
  batch->ends[entry.in_batch] = {error, std::move(result)};
  if (--batch->left > 0 || batch->op == nullptr) return;
  std::unique_ptr<BatchOp> op = std::move(batch->op);
  op->entry = nullptr;
  BatchOp* raw = op.get();
  raw->complete(std::move(op), nullptr, std::move(batch->ends), in_handler);
}

void PgAsyncConnection::cancel(Pending* entry) {
  cancel_if_running(entry);
  // Complete now, whether it runs, waits behind others or was not sent: its result will be
  // dropped. A stopped server never holds a cancelled call.
  std::unique_ptr<Op> op = std::move(entry->op);
  if (op == nullptr) return;
  op->entry = nullptr;
  Op* raw = op.get();
  raw->post_complete(std::move(op), cancelled(), nullptr);
}

void PgAsyncConnection::cancel_batch(Batch& batch) {
  // Its statements not ended yet (their entries own it: `kept` does from here) end now, as
  // cancel() ends one statement.
  std::shared_ptr<Batch> kept;
  for (Pending& entry : pending_) {
    if (entry.batch.get() != &batch) continue;
    kept = std::move(entry.batch);
    cancel_if_running(&entry);
    kept->ends[entry.in_batch] = {cancelled(), nullptr};
  }
  if (kept == nullptr || kept->op == nullptr) return;  // none queued: fail() is ending them
  std::unique_ptr<BatchOp> op = std::move(kept->op);
  op->entry = nullptr;
  BatchOp* raw = op.get();
  raw->post_complete(std::move(op), nullptr, std::move(kept->ends));
}

void PgAsyncConnection::cancel_if_running(Pending* entry) {
  const bool running = !pending_.empty() && &pending_.front() == entry && entry->sent;
  if (running && alone_on_the_wire() && conn_ != nullptr && !entry->cancel_requested &&
      cancel_delivered_ == nullptr) {
    // Running now: cancel it on the server too (it ends with 57014; its result is dropped), so
    // what is queued behind it need not wait for it.
    entry->cancel_requested = true;
    auto delivered = std::make_shared<std::atomic<bool>>(false);
    cancel_delivered_ = delivered;
    // libpq 15's PQcancel blocks: never on the loop.
    cancel_off_thread(PQgetCancel(conn_), [delivered] { delivered->store(true); });
  }
}

bool PgAsyncConnection::alone_on_the_wire() const {
  // The front's sync point ends at the first statement synced on its own.
  auto it =
      std::find_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.synced; });
  return it == pending_.end() || std::next(it) == pending_.end() || !std::next(it)->sent;
}

void PgAsyncConnection::after_cancel_delivered(Clock::time_point give_up) {
  if (cancel_delivered_ == nullptr) return;
  if (cancel_delivered_->load()) {
    cancel_delivered_.reset();
    return schedule_send();
  }
  if (Clock::now() >= give_up) {
    // Arriving later, it could cancel any statement sent meanwhile: a new session instead.
    return fail(lost("a cancel request did not reach the server in " +
                     std::to_string(settings_.connect_timeout.count()) + " ms"));
  }
  cancel_wait_.expires_after(std::chrono::milliseconds(1));  // PQcancel takes a few ms
  cancel_wait_.async_wait(
      [self = shared_from_this(), generation = generation_, give_up](std::error_code error) {
        if (!error && generation == self->generation_) self->after_cancel_delivered(give_up);
      });
}

void PgAsyncConnection::arm_deadline(Clock::time_point deadline) {
  deadline_.arm(deadline, shared_from_this());
}

void PgAsyncConnection::on_deadline(Clock::time_point deadline) {
  const Pending* late = deadline_.expired(deadline, pending_, shared_from_this());
  // Closing is the only way a stalled server cannot deliver this result to another call.
  if (late != nullptr) {
    fail(lost("statement timed out after " + std::to_string(late->timeout.count()) +
              " ms (connection closed; a COMMIT's outcome is unknown)"));
  }
}

void PgAsyncConnection::close() { fail(lost("connection closed by the client")); }

void PgAsyncConnection::drop_socket() noexcept {
  if (socket_ != nullptr) {
    (void)socket_->release();  // libpq owns the descriptor
    socket_.reset();
  }
  socket_fd_ = -1;
}

void PgAsyncConnection::fail(const std::exception_ptr& error) {
  ++generation_;
  drop_socket();
  if (conn_ != nullptr) PQfinish(conn_);
  conn_ = nullptr;
  state_ = State::kIdle;
  flush_pending_ = false;
  prepared_.assign(prepared_.size(), false);  // a new session has none
  connect_timer_.cancel();
  cancel_delivered_.reset();  // a session of its own: a late request reaches none of the new one's
  cancel_wait_.cancel();
  deadline_.disarm();
  std::deque<Pending> failed;
  failed.swap(pending_);
  for (Pending& entry : failed) deliver(entry, error, nullptr, false);
}

}  // namespace idem::detail
