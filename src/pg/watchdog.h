// A client-side bound on how long idem waits for PostgreSQL to answer.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
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
/// (none when the timeout is zero). Thread-safe; run() on one socket is used by one thread at a
/// time (as a connection is), and may nest (the outermost call's deadline bounds the socket).
///
/// A watched call takes no lock and allocates nothing: each socket number has a slot (one 64 KiB
/// block per 1 024 socket numbers in use), which the call marks with its deadline and clears.
/// The helper thread sleeps until the earliest deadline it saw, or until woken when a call
/// starts after it found none.
class PgWatchdog {
 public:
  /// `timeout` zero: calls are never bounded.
  explicit PgWatchdog(std::chrono::milliseconds timeout);
  ~PgWatchdog();
  PgWatchdog(const PgWatchdog&) = delete;
  PgWatchdog& operator=(const PgWatchdog&) = delete;

  /// Runs `fn`, which talks to the server over `socket` (pqxx::connection::sock(); a negative
  /// one, a closed connection, is not watched). When the watchdog shut the socket down
  /// meanwhile, the libpqxx failure that follows becomes an idem::PostgresError that says so
  /// (retryable, SQLSTATE 08006; an idem::CommitOutcomeUnknown when it was a commit). Other
  /// failures pass through unchanged. A socket number of 2^22 or more (beyond what Linux
  /// allows unless fs.nr_open is raised that far) throws idem::PostgresError (not retryable)
  /// without calling `fn`.
  template <typename F>
  decltype(auto) run(int socket, F&& fn) {
    if (timeout_.count() == 0 || socket < 0) return std::forward<F>(fn)();
    Watched watched(*this, socket);
    try {
      return std::forward<F>(fn)();
    } catch (const pqxx::failure& error) {
      if (watched.end()) throw_timed_out(error);
      throw;
    }
  }

 private:
  // A slot's state: idle, a watched call's deadline (steady clock, ns, at least 1), or:
  static constexpr std::int64_t kIdle = 0;
  static constexpr std::int64_t kFiring = -1;  // the helper thread is shutting the socket down
  static constexpr std::int64_t kFired = -2;   // it did: the call's failure is the watchdog's

  struct alignas(64) Slot {  // a cache line each: connections on neighbouring sockets share none
    std::atomic<std::int64_t> state{kIdle};
    // Nested run()s on the socket, counted by the thread that runs them (atomic only because
    // the next connection on the socket number may be another thread's).
    std::atomic<int> depth{0};
  };
  static constexpr int kSlotBits = 10;
  static constexpr std::size_t kChunkSlots = std::size_t{1} << kSlotBits;
  static constexpr std::size_t kChunks = 4096;  // socket numbers below 2^22
  using Chunk = std::array<Slot, kChunkSlots>;

  // One call's watch, ended by end() or at the latest by the destructor.
  class Watched {
   public:
    Watched(PgWatchdog& watchdog, int socket) : slot_(watchdog.watch(socket)) {}
    ~Watched() { (void)end(); }
    Watched(const Watched&) = delete;
    Watched& operator=(const Watched&) = delete;
    // True when the watchdog shut the socket down. Afterwards the socket is never touched again
    // by the helper thread for this call (end() waits out a shutdown in progress).
    bool end() {
      if (!ended_) fired_ = unwatch(slot_);
      ended_ = true;
      return fired_;
    }

   private:
    Slot& slot_;
    bool ended_ = false;
    bool fired_ = false;
  };

  Slot& watch(int socket);
  static bool unwatch(Slot& slot) noexcept;
  Slot& slot_for(int socket);
  [[nodiscard]] std::int64_t deadline_from_now() const;
  // Throws what `error` became because the watchdog shut its socket down.
  [[noreturn]] void throw_timed_out(const pqxx::failure& error) const;
  // Shuts down the sockets past their deadline; returns the earliest deadline still ahead
  // (INT64_MAX: none is watched).
  std::int64_t sweep(std::int64_t now);
  void loop(std::stop_token stop);

  const std::chrono::milliseconds timeout_;
  std::unique_ptr<std::atomic<Chunk*>[]> chunks_;  // kChunks, each allocated at first use
  std::mutex mutex_;                               // allocates chunks; the helper's waits
  std::condition_variable_any wake_;
  std::atomic<bool> idle_{false};  // the helper found no call watched and waits for one
  bool woken_ = false;             // guarded by mutex_
  std::jthread thread_;            // last: stopped and joined first
};

}  // namespace idem::detail
