#include "redis/sentinel.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <utility>

#include "idem/errors.h"
#include "redis/async_sentinel.h"
#include "redis/connection.h"
#include "redis/errors.h"

namespace idem::detail {

namespace {

// The timeouts the Sentinels are asked with: the master's.
AsyncConnectionSettings watch_settings(const ConnectionSettings& master) {
  AsyncConnectionSettings settings;
  settings.connect_timeout = master.connect_timeout;
  settings.command_timeout = master.command_timeout;
  return settings;
}

}  // namespace

Sentinel::Sentinel(PoolSettings master, CircuitBreakerOptions breaker)
    : settings_(std::move(master)),
      breaker_(breaker),
      order_(settings_.connection.endpoint.sentinels),
      watch_(SentinelWatch::create(watch_io_.get_executor(), watch_settings(settings_.connection),
                                   [this](const redisReply& message) { on_message(message); })) {}

Sentinel::~Sentinel() {
  // Stops the helper thread's loop at once. Then, the thread gone, the subscriptions are closed
  // here: their pending operations complete (posted to the stopped loop), so that destroying
  // the io_context destroys the coroutines waiting on them, which hold the SentinelWatch that
  // holds their connections (a cycle, leaked otherwise).
  watch_io_.stop();
  if (watcher_.joinable()) watcher_.join();
  watch_->close();
}

std::shared_ptr<Node> Sentinel::master() {
  std::uint64_t rounds_seen = 0;
  {
    std::lock_guard lock(mutex_);
    if (master_ != nullptr && (!stale_ || Clock::now() < next_discovery_)) return master_;
    rounds_seen = rounds_;
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
    // A round ended while this call waited for it and left no master: its error is this call's
    // answer too, as the calls waiting on one round share it in the async driver (AsyncSentinel).
    // Otherwise, with every Sentinel silent, each waiting call would run its own round in turn.
    if (rounds_ != rounds_seen && master_ == nullptr && round_error_)
      throw RedisError(*round_error_);
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
  } catch (const RedisError& error) {
    std::lock_guard lock(mutex_);
    next_discovery_ = Clock::now() + kRediscoverInterval;
    ++rounds_;
    round_error_ = error;
    throw;
  }
  std::lock_guard lock(mutex_);
  ++rounds_;
  round_error_.reset();
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

void Sentinel::watch() {
  watch_->start(settings_.connection.endpoint.sentinels);
  watch_io_.run();
}

void Sentinel::on_message(const redisReply& message) {
  const std::optional<SentinelNews> news =
      sentinel_news(message, settings_.connection.endpoint.sentinel_master);
  if (!news) return;
  {
    std::lock_guard lock(mutex_);
    hold_.heard(*news, Clock::now());
  }
  if (news->kind != SentinelNews::Kind::kSwitched) return;
  std::lock_guard discovery(discovery_mutex_);
  try {
    (void)rediscover_locked();
  } catch (const RedisError&) {
    std::lock_guard lock(mutex_);
    stale_ = true;  // the callers ask again
  }
}

std::optional<RedisError> Sentinel::failing_over() {
  std::lock_guard lock(mutex_);
  if (master_ == nullptr) return std::nullopt;
  return hold_.refusal(master_->address(), Clock::now());
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
