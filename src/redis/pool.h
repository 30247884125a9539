// A bounded, thread-safe pool of Connections.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "idem/errors.h"
#include "idem/pool_stats.h"
#include "redis/connection.h"

namespace idem::detail {

struct PoolSettings {
  ConnectionSettings connection;
  std::size_t size = 8;
  std::chrono::milliseconds borrow_timeout{1000};
  std::chrono::milliseconds reconnect_backoff{10};
  std::chrono::milliseconds reconnect_backoff_max{1000};
};

class Pool {
 public:
  /// A borrowed connection, returned to the pool on destruction unless it is broken (then it is
  /// destroyed, so a late reply can never answer a later command).
  class Lease {
   public:
    Lease(Pool& pool, std::unique_ptr<Connection> connection, bool reused) noexcept
        : pool_(&pool), connection_(std::move(connection)), reused_(reused) {}
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (connection_ != nullptr) pool_->give_back(std::move(connection_));
    }
    Connection& operator*() const noexcept { return *connection_; }
    /// Whether the connection was idle in the pool (rather than opened for this borrow).
    [[nodiscard]] bool reused() const noexcept { return reused_; }

   private:
    Pool* pool_;
    std::unique_ptr<Connection> connection_;
    bool reused_;
  };

  explicit Pool(PoolSettings settings) : settings_(std::move(settings)) {}

  /// A connection for the calling thread: an idle one, else a new one while fewer than `size`
  /// exist, else the first returned within `borrow_timeout`. Throws idem::RedisError
  /// (retryable) on timeout, during the reconnect backoff, or when connecting fails.
  [[nodiscard]] Lease borrow();

  /// Destroys every idle connection (after one was found closed by the server, the others,
  /// opened to the same server, are presumed closed too).
  void discard_idle() noexcept;

  /// What the pool holds now. Thread-safe, no I/O.
  [[nodiscard]] PoolStats stats() const;

 private:
  void give_back(std::unique_ptr<Connection> connection) noexcept;
  std::unique_ptr<Connection> connect();

  const PoolSettings settings_;
  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::size_t open_ = 0;     // idle + borrowed + being connected
  std::size_t waiters_ = 0;  // threads blocked in borrow()
  // Reconnect backoff after a failed connect.
  std::chrono::steady_clock::time_point retry_after_{};
  std::chrono::milliseconds backoff_{0};
  std::optional<RedisError> last_connect_error_;
};

}  // namespace idem::detail
