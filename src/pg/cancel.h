// Cancelling the statement that runs on a PostgreSQL connection, from a thread that must not
// block: libpq 15's PQcancel is blocking (it connects to the server, sends the cancel request
// and waits for the server to close that connection; PQcancelStart, its non-blocking successor,
// is libpq 17's), so it runs on a short-lived helper thread of its own. Cancellations happen
// only when a call is stopped while one of its statements runs: no thread waits for work in
// between, and one stalled server never delays the cancellation of another's statement. The
// async driver (pg/async_connection.cc) and the blocking one (facade/deduplicator.cc) both
// cancel through here.
#pragma once

#include <libpq-fe.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

namespace pqxx {
class dbtransaction;
}

namespace idem::detail {

/// Sends PQcancel for `handle` (from PQgetCancel; freed afterwards) on a helper thread, then
/// runs `done` there. Never blocks the caller. A cancel that reaches a server whose backend is
/// idle is ignored by it.
void cancel_off_thread(PGcancel* handle, std::function<void()> done = {});

/// The libpq connection of a libpqxx transaction (libpqxx 6 offers it only to large objects).
[[nodiscard]] PGconn* raw_connection(const pqxx::dbtransaction& tx);

/// A cancellation of the statement running on one connection, requested from any thread (a
/// std::stop_callback) while the connection's own thread waits for the statement. Thread-safe.
class PgStatementCancel {
 public:
  /// PQgetCancel of `conn` now, on the connection's thread (null `conn`: request() does nothing).
  /// `bound`: how long the destructor waits for a cancel request under way.
  PgStatementCancel(PGconn* conn, std::chrono::milliseconds bound);
  /// Waits (at most `bound`) for a cancel request under way to be delivered, so that it cannot
  /// reach a later statement of the connection; afterwards request() does nothing.
  ~PgStatementCancel();
  PgStatementCancel(const PgStatementCancel&) = delete;
  PgStatementCancel& operator=(const PgStatementCancel&) = delete;

  /// Asks the server to cancel the statement running now (SQLSTATE 57014); the first call only.
  /// Never blocks on the server.
  void request() noexcept;
  /// Whether request() sent a cancellation.
  [[nodiscard]] bool requested() const noexcept;

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable delivered;
    PGcancel* handle = nullptr;  // guarded by mutex; null once handed to the helper thread
    bool armed = true;           // guarded by mutex
    bool requested = false;      // guarded by mutex
    bool in_flight = false;      // guarded by mutex
  };
  std::shared_ptr<State> state_;
  std::chrono::milliseconds bound_;
};

}  // namespace idem::detail
