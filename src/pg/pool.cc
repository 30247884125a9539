#include "pg/pool.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "pg/errors.h"
#include "pg/idle_session.h"

namespace idem::detail {
PgPool::Lease::~Lease() {
  if (conn_ == nullptr) return;  // moved from
  const bool reuse = !discarded_ && conn_->is_open();
  pool_->give_back(std::move(conn_), reuse);
}

PgPool::PgPool(std::string conninfo, std::size_t size, std::chrono::milliseconds borrow_timeout,
               Setup setup)
    : conninfo_(std::move(conninfo)),
      size_(size),
      borrow_timeout_(borrow_timeout),
      setup_(std::move(setup)) {}

PgPool::~PgPool() = default;

PgPool::Lease PgPool::borrow() {
  for (;;) {
    std::unique_ptr<PgConnection> conn;
    {
      std::unique_lock lock(mutex_);
      const auto free = [this] { return !idle_.empty() || open_ < size_; };
      bool ready = free();
      if (!ready) {
        ++waiters_;
        ready = available_.wait_for(lock, borrow_timeout_, free);
        --waiters_;
      }
      if (!ready) {
        throw PostgresError("idem: postgres: no pooled connection free within the borrow timeout",
                            true);
      }
      if (idle_.empty()) {
        ++open_;  // reserve the slot; connect outside the lock
      } else {
        // The connection this thread gave back last, if it is idle: the same thread and server
        // process keep meeting, which the kernel's scheduler places better than a rotation.
        auto mine = std::find_if(idle_.begin(), idle_.end(), [](const auto& idle) {
          return idle->last_user == std::this_thread::get_id();
        });
        if (mine != idle_.end()) std::iter_swap(mine, std::prev(idle_.end()));
        conn = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    if (conn == nullptr) return connect();
    // Checked outside the lock (a system call): the connection is this caller's already.
    if (!idle_session_ended(conn->sock())) return {*this, std::move(conn)};
    // The server ended it (a restart): every idle one is suspect, as in give_back().
    give_back(std::move(conn), false);
  }
}

PgPool::Lease PgPool::connect() {
  try {
    auto conn = translating([this] { return std::make_unique<PgConnection>(conninfo_); });
    translating([&] { setup_(*conn); });
    return {*this, std::move(conn)};
  } catch (...) {
    give_back(nullptr, false);
    throw;
  }
}

PoolStats PgPool::stats() const {
  std::lock_guard lock(mutex_);
  return {.size = size_, .open = open_, .in_use = open_ - idle_.size(), .waiters = waiters_};
}

std::vector<std::unique_ptr<PgConnection>> PgPool::take_idle_locked() {
  std::vector<std::unique_ptr<PgConnection>> taken = std::move(idle_);
  idle_.clear();
  open_ -= taken.size();
  return taken;
}

void PgPool::give_back(std::unique_ptr<PgConnection> conn, bool reuse) noexcept {
  std::vector<std::unique_ptr<PgConnection>> dropped;  // closed outside the lock
  {
    std::lock_guard lock(mutex_);
    if (reuse) {
      conn->last_user = std::this_thread::get_id();
      idle_.push_back(std::move(conn));
    } else {
      --open_;
      if (conn != nullptr) dropped = take_idle_locked();
    }
  }
  // One connection or slot is free; more when idle ones were dropped with it.
  if (dropped.empty()) {
    available_.notify_one();
  } else {
    available_.notify_all();
  }
  dropped.clear();
  conn.reset();
}

}  // namespace idem::detail
