#include "redis/sentinel.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <future>
#include <optional>
#include <string>
#include <utility>

#include "idem/errors.h"
#include "redis/async_sentinel.h"
#include "redis/connection.h"
#include "redis/errors.h"

namespace idem::detail {

Sentinel::Sentinel(PoolSettings master, CircuitBreakerOptions breaker)
    : settings_(std::move(master)),
      breaker_(breaker),
      order_(settings_.connection.endpoint.sentinels) {}

Sentinel::~Sentinel() {
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
    if (watching_ != nullptr) watching_->shutdown();
  }
  stop_requested_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

std::shared_ptr<Node> Sentinel::master() {
  {
    std::lock_guard lock(mutex_);
    if (master_ != nullptr && (!stale_ || Clock::now() < next_discovery_)) return master_;
  }
  std::unique_lock discovery(discovery_mutex_, std::try_to_lock);
  if (!discovery.owns_lock()) {
    {
      std::lock_guard lock(mutex_);
      if (master_ != nullptr) return master_;  // someone else is asking; use what we know
    }
    discovery.lock();
  }
  {
    std::lock_guard lock(mutex_);
    if (master_ != nullptr && (!stale_ || Clock::now() < next_discovery_)) return master_;
  }
  try {
    std::shared_ptr<Node> found = rediscover_locked();
    std::call_once(watch_once_, [this] { watcher_ = std::thread([this] { watch(); }); });
    return found;
  } catch (const RedisError&) {
    std::lock_guard lock(mutex_);
    if (master_ != nullptr) return master_;  // the Sentinels are unreachable: keep trying it
    throw;
  }
}

std::shared_ptr<Node> Sentinel::rediscover_locked() {
  HostPort found;
  try {
    found = discover();
  } catch (const RedisError&) {
    std::lock_guard lock(mutex_);
    next_discovery_ = Clock::now() + kRediscoverInterval;
    throw;
  }
  std::lock_guard lock(mutex_);
  if (master_ == nullptr || master_->address() != found) {
    PoolSettings settings = settings_;
    settings.connection.endpoint.host = found.host;
    settings.connection.endpoint.port = found.port;
    settings.connection.require_master = true;
    master_ = std::make_shared<Node>(std::move(settings), breaker_);
  }
  stale_ = false;
  next_discovery_ = Clock::now() + kRediscoverInterval;
  return master_;
}

bool Sentinel::pause(std::chrono::milliseconds duration) {
  std::unique_lock lock(watch_mutex_);
  return !stop_requested_.wait_for(lock, duration, [this] { return stopping_.load(); });
}

void Sentinel::watch() {
  const std::string& name = settings_.connection.endpoint.sentinel_master;
  auto backoff = std::chrono::milliseconds(100);
  for (std::size_t next = 0; !stopping_;) {
    HostPort sentinel;
    {
      std::lock_guard lock(mutex_);
      sentinel = order_.cycle(next++);
    }
    try {
      ConnectionSettings settings;
      settings.endpoint.host = sentinel.host;
      settings.endpoint.port = sentinel.port;
      settings.connect_timeout = settings_.connection.connect_timeout;
      settings.command_timeout = kWatchReconnect;
      Connection connection(settings);
      {
        std::lock_guard lock(watch_mutex_);
        if (stopping_) return;
        watching_ = &connection;
      }
      try {
        connection.append(std::array<std::string_view, 2>{"SUBSCRIBE", "+switch-master"});
        (void)connection.read_reply();  // the subscription's confirmation
        backoff = std::chrono::milliseconds(100);
        next = 0;  // a working Sentinel: start from the first again after it fails
        while (!stopping_) {
          const ReplyPtr message = connection.read_reply();
          if (!switched_master(*message, name)) continue;
          std::lock_guard discovery(discovery_mutex_);
          try {
            (void)rediscover_locked();
          } catch (const RedisError&) {
            std::lock_guard lock(mutex_);
            stale_ = true;  // the callers ask again
          }
        }
      } catch (const RedisError&) {
        // Closed, timed out (kWatchReconnect without a message) or shut down: reconnect.
      }
      std::lock_guard lock(watch_mutex_);
      watching_ = nullptr;
    } catch (const RedisError&) {
      if (!pause(backoff)) return;
      backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
    }
  }
}

std::shared_ptr<Node> Sentinel::known_master() {
  std::lock_guard lock(mutex_);
  return master_;
}

void Sentinel::invalidate(const Node& node) {
  std::lock_guard lock(mutex_);
  if (master_.get() == &node) stale_ = true;
}

HostPort Sentinel::discover() {
  std::vector<HostPort> order;
  {
    std::lock_guard lock(mutex_);
    order = order_.sentinels();
  }
  AsyncConnectionSettings master;
  master.endpoint = settings_.connection.endpoint;
  master.connect_timeout = settings_.connection.connect_timeout;
  master.command_timeout = settings_.connection.command_timeout;
  asio::io_context io;
  std::future<DiscoveredMaster> round =
      asio::co_spawn(io, discover_master(std::move(order), std::move(master)), asio::use_future);
  io.run();
  const DiscoveredMaster found = round.get();  // throws the round's idem::RedisError
  std::lock_guard lock(mutex_);
  order_.answered(found.sentinel);
  return found.master;
}

}  // namespace idem::detail
