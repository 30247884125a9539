#include "pg/pool.h"

#include <utility>

#include "pg/errors.h"

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
  {
    std::unique_lock lock(mutex_);
    const bool ready = available_.wait_for(lock, borrow_timeout_,
                                           [this] { return !idle_.empty() || open_ < size_; });
    if (!ready) {
      throw PostgresError("idem: postgres: no pooled connection free within the borrow timeout",
                          true);
    }
    if (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      return {*this, std::move(conn)};
    }
    ++open_;  // reserve the slot; connect outside the lock
  }
  try {
    auto conn = translating([this] { return std::make_unique<pqxx::connection>(conninfo_); });
    translating([&] { setup_(*conn); });
    return {*this, std::move(conn)};
  } catch (...) {
    give_back(nullptr, false);
    throw;
  }
}

void PgPool::give_back(std::unique_ptr<pqxx::connection> conn, bool reuse) noexcept {
  std::vector<std::unique_ptr<pqxx::connection>> dropped;  // closed outside the lock
  {
    std::lock_guard lock(mutex_);
    if (reuse) {
      idle_.push_back(std::move(conn));
    } else {
      --open_;
      if (conn != nullptr) {
        dropped = std::move(idle_);
        idle_.clear();
        open_ -= dropped.size();
      }
    }
  }
  available_.notify_all();
  dropped.clear();
  conn.reset();
}

}  // namespace idem::detail
