#include "redis/pool.h"

#include <algorithm>
#include <string>
#include <utility>

#include "idem/errors.h"

namespace idem::detail {

Pool::Lease Pool::borrow() {
  std::unique_lock lock(mutex_);
  const auto free = [this] { return !idle_.empty() || open_ < settings_.size; };
  bool available = free();
  if (!available) {
    ++waiters_;
    available = returned_.wait_for(lock, settings_.borrow_timeout, free);
    --waiters_;
  }
  if (!available) {
    throw RedisError("idem: redis pool: no connection free within the borrow timeout", true);
  }
  if (!idle_.empty()) {
    std::unique_ptr<Connection> connection = std::move(idle_.back());
    idle_.pop_back();
    return Lease(*this, std::move(connection), true);
  }
  if (last_connect_error_.has_value() && std::chrono::steady_clock::now() < retry_after_) {
    // A copy with a message of its own: a copied std::runtime_error shares its message buffer
    // (libstdc++'s reference-counted string), so threads would share that buffer.
    throw RedisError(std::string(last_connect_error_->what()), last_connect_error_->retryable());
  }
  ++open_;
  lock.unlock();
  return Lease(*this, connect(), false);
}

std::unique_ptr<Connection> Pool::connect() {
  try {
    auto connection = std::make_unique<Connection>(settings_.connection);
    std::lock_guard lock(mutex_);
    last_connect_error_.reset();
    backoff_ = std::chrono::milliseconds(0);
    return connection;
  } catch (const RedisError& error) {
    std::lock_guard lock(mutex_);
    --open_;
    last_connect_error_.emplace(std::string(error.what()), error.retryable());  // its own buffer
    backoff_ =
        std::clamp(backoff_ * 2, settings_.reconnect_backoff, settings_.reconnect_backoff_max);
    retry_after_ = std::chrono::steady_clock::now() + backoff_;
    returned_.notify_one();
    throw;
  } catch (...) {
    std::lock_guard lock(mutex_);
    --open_;
    returned_.notify_one();
    throw;
  }
}

void Pool::give_back(std::unique_ptr<Connection> connection) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (connection->broken()) {
      --open_;
    } else {
      idle_.push_back(std::move(connection));
    }
  }
  returned_.notify_one();
  // A broken connection is destroyed here, outside the lock.
}

PoolStats Pool::stats() const {
  std::lock_guard lock(mutex_);
  return {
      .size = settings_.size, .open = open_, .in_use = open_ - idle_.size(), .waiters = waiters_};
}

void Pool::discard_idle() noexcept {
  std::vector<std::unique_ptr<Connection>> discarded;
  {
    std::lock_guard lock(mutex_);
    discarded.swap(idle_);
    open_ -= discarded.size();
  }
  returned_.notify_all();
}

}  // namespace idem::detail
