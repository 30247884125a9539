// A bounded, thread-safe pool of libpqxx connections.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <pqxx/connection>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "idem/pool_stats.h"

namespace idem::detail {

/// A pooled libpqxx connection, with the names under which callers' own statement texts are
/// prepared on it (registered with libpqxx's prepare(), which prepares them again after a
/// reconnect). Whoever fills statement_names bounds it. Not thread-safe (one lease at a time).
class PgConnection final : public pqxx::connection {
 public:
  using pqxx::connection::connection;
  std::unordered_map<std::string, std::string> statement_names;  // SQL text -> statement name
  std::thread::id last_user;  // the thread that gave it back last (PgPool's)
};

/// Hands out at most `size` connections at once. Thread-safe. A connection is opened on demand
/// (and prepared by `setup`), returned to the pool when its Lease ends, and destroyed instead
/// when the lease was discarded or the connection is no longer open. Losing one connection
/// drops every idle one too: they talk to the same server and are suspect. An idle connection
/// the server has ended (readable or closed socket: a restart) is never handed out. A thread
/// gets back the connection it gave back last while that one is idle (else the one given back
/// last): a client thread and a server process that keep meeting cost the scheduler less.
class PgPool {
 public:
  using Setup = std::function<void(pqxx::connection&)>;

  /// A borrowed connection; gives it back (or destroys it) when it goes out of scope.
  class Lease {
   public:
    Lease(PgPool& pool, std::unique_ptr<PgConnection> conn) noexcept
        : pool_(&pool), conn_(std::move(conn)) {}
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    PgConnection& operator*() const noexcept { return *conn_; }
    PgConnection* operator->() const noexcept { return conn_.get(); }
    /// The connection broke or is in an unknown state: destroy it instead of returning it.
    void discard() noexcept { discarded_ = true; }

   private:
    PgPool* pool_;
    std::unique_ptr<PgConnection> conn_;
    bool discarded_ = false;
  };

  /// `setup` runs once on each new connection (session settings, prepared statements).
  PgPool(std::string conninfo, std::size_t size, std::chrono::milliseconds borrow_timeout,
         Setup setup);
  ~PgPool();
  PgPool(const PgPool&) = delete;
  PgPool& operator=(const PgPool&) = delete;

  /// An idle connection, or a new one while fewer than `size` are open; waits up to the borrow
  /// timeout otherwise. Throws idem::PostgresError (retryable) on timeout or when connecting
  /// fails.
  [[nodiscard]] Lease borrow();

  /// What the pool holds now. Thread-safe, no I/O.
  [[nodiscard]] PoolStats stats() const;

 private:
  // A new connection in a slot borrow() reserved (open_ counts it); the slot is freed again when
  // connecting or the setup fails.
  Lease connect();
  void give_back(std::unique_ptr<PgConnection> conn, bool reuse) noexcept;
  // Removes every idle connection from the pool (to be closed outside the lock); mutex_ held.
  std::vector<std::unique_ptr<PgConnection>> take_idle_locked();

  const std::string conninfo_;
  const std::size_t size_;
  const std::chrono::milliseconds borrow_timeout_;
  const Setup setup_;
  mutable std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<PgConnection>> idle_;  // guarded by mutex_
  std::size_t open_ = 0;                             // guarded by mutex_: idle + lent
  std::size_t waiters_ = 0;                          // guarded by mutex_: in borrow()
};

}  // namespace idem::detail
