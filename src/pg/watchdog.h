// A client-side bound on how long idem waits for PostgreSQL to answer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <pqxx/except>
#include <thread>
#include <utility>

#include "pg/errors.h"

namespace idem::detail {

/// Shuts down the socket of a connection whose watched call outlives the timeout, so that a
/// libpq call blocked on a server that stopped answering (a stopped process, a paused VM, a
/// partition the keepalives have not noticed yet) returns as a lost connection. The
/// server-side statement_timeout cannot fire in those cases. One helper thread per watchdog
/// (none when the timeout is zero). Thread-safe.
class PgWatchdog {
 public:
  /// `timeout` zero: calls are never bounded.
  explicit PgWatchdog(std::chrono::milliseconds timeout);
  ~PgWatchdog();
  PgWatchdog(const PgWatchdog&) = delete;
  PgWatchdog& operator=(const PgWatchdog&) = delete;

  /// Runs `fn`, which talks to the server over `socket` (pqxx::connection::sock()). When the
  /// watchdog shut the socket down meanwhile, the libpqxx failure that follows becomes an
  /// idem::PostgresError that says so (retryable, SQLSTATE 08006; an idem::CommitOutcomeUnknown
  /// when it was a commit). Other failures pass through unchanged.
  template <typename F>
  decltype(auto) run(int socket, F&& fn) {
    if (timeout_.count() == 0) return std::forward<F>(fn)();
    Watched watched(*this, socket);
    try {
      return std::forward<F>(fn)();
    } catch (const pqxx::failure& error) {
      if (watched.end()) throw_timed_out(error);
      throw;
    }
  }

 private:
  struct Watch {
    std::chrono::steady_clock::time_point deadline;
    int socket;
    bool fired;
  };

  // One call's watch, ended by end() or at the latest by the destructor.
  class Watched {
   public:
    Watched(PgWatchdog& watchdog, int socket) : watchdog_(watchdog), id_(watchdog.watch(socket)) {}
    ~Watched() { (void)end(); }
    Watched(const Watched&) = delete;
    Watched& operator=(const Watched&) = delete;
    // True when the watchdog shut the socket down. Afterwards the socket is never touched again
    // (the watchdog acts under the lock that end() takes).
    bool end() {
      if (!ended_) fired_ = watchdog_.unwatch(id_);
      ended_ = true;
      return fired_;
    }

   private:
    PgWatchdog& watchdog_;
    std::uint64_t id_;
    bool ended_ = false;
    bool fired_ = false;
  };

  std::uint64_t watch(int socket);
  [[nodiscard]] std::chrono::steady_clock::time_point deadline_from_now() const;
  bool unwatch(std::uint64_t id);
  // Throws what `error` became because the watchdog shut its socket down.
  [[noreturn]] void throw_timed_out(const pqxx::failure& error) const;
  void loop(std::stop_token stop);

  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable_any added_;
  std::map<std::uint64_t, Watch> watches_;  // guarded by mutex_; by id, so by deadline too
  std::uint64_t next_id_ = 0;               // guarded by mutex_
  bool waiting_for_work_ = false;           // guarded by mutex_: the thread waits with no deadline
  std::jthread thread_;                     // last: stopped and joined first
};

}  // namespace idem::detail
