#include "redis/sentinel.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <optional>
#include <string>
#include <utility>

#include "idem/errors.h"
#include "redis/connection.h"
#include "redis/errors.h"

namespace idem::detail {
namespace {

std::string text(const HostPort& address) {
  return address.host + ":" + std::to_string(address.port);
}

// The answer of one Sentinel to SENTINEL get-master-addr-by-name: the address, or nullopt when
// it does not know the name. Throws idem::RedisError when it fails.
std::optional<HostPort> ask(const ConnectionSettings& master, const HostPort& sentinel) {
  ConnectionSettings settings;
  settings.endpoint.host = sentinel.host;
  settings.endpoint.port = sentinel.port;
  settings.connect_timeout = master.connect_timeout;
  settings.command_timeout = master.command_timeout;
  settings.keepalive = false;
  Connection connection(settings);
  const ReplyPtr reply = connection.command(std::array<std::string_view, 3>{
      "SENTINEL", "get-master-addr-by-name", master.endpoint.sentinel_master});
  if (reply->type == REDIS_REPLY_NIL) return std::nullopt;
  if (reply->type == REDIS_REPLY_ERROR)
    throw reply_error(*reply, "SENTINEL get-master-addr-by-name");
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      reply->element[1]->type != REDIS_REPLY_STRING) {
    throw unexpected_reply(*reply, "SENTINEL get-master-addr-by-name");
  }
  HostPort address{std::string(reply->element[0]->str, reply->element[0]->len), 0};
  const std::string_view port(reply->element[1]->str, reply->element[1]->len);
  if (std::from_chars(port.data(), port.data() + port.size(), address.port).ec != std::errc() ||
      address.port <= 0 || address.port > 65535 || address.host.empty()) {
    throw RedisError("idem: redis sentinel " + text(sentinel) + " named a malformed address", true);
  }
  return address;
}

}  // namespace

Sentinel::Sentinel(PoolSettings master, CircuitBreakerOptions breaker)
    : settings_(std::move(master)),
      breaker_(breaker),
      sentinels_(settings_.connection.endpoint.sentinels) {}

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
      sentinel = sentinels_[next++ % sentinels_.size()];
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
          // ["message", "+switch-master", "<name> <old ip> <old port> <new ip> <new port>"]
          if (message->type != REDIS_REPLY_ARRAY || message->elements != 3 ||
              message->element[2]->type != REDIS_REPLY_STRING) {
            continue;
          }
          const std::string_view text(message->element[2]->str, message->element[2]->len);
          if (!text.starts_with(name + " ")) continue;
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
    order = sentinels_;
  }
  const std::string& name = settings_.connection.endpoint.sentinel_master;
  std::string last_error;
  bool only_unknown = true;  // every Sentinel answered, and none knows `name`
  for (const HostPort& sentinel : order) {
    std::optional<HostPort> address;
    try {
      address = ask(settings_.connection, sentinel);
    } catch (const RedisError& error) {
      last_error = error.what();
      only_unknown = false;
      continue;
    }
    if (!address) {
      last_error = "sentinel " + text(sentinel) + " does not monitor a master named '" + name + "'";
      continue;
    }
    only_unknown = false;
    // ROLE on the named server: a Sentinel cut off from the others may name an old master.
    ConnectionSettings check = settings_.connection;
    check.endpoint.host = address->host;
    check.endpoint.port = address->port;
    check.require_master = true;
    try {
      (void)Connection(check);
    } catch (const RedisError& error) {
      if (!error.retryable()) throw;  // WRONGPASS, NOAUTH: the master's settings are wrong
      last_error = error.what();
      continue;
    }
    std::lock_guard lock(mutex_);
    const auto it = std::find(sentinels_.begin(), sentinels_.end(), sentinel);
    if (it != sentinels_.end()) std::rotate(sentinels_.begin(), it, it + 1);
    return *address;
  }
  throw RedisError(
      "idem: redis sentinel: no master named '" + name + "' found (last: " + last_error + ")",
      !only_unknown);
}

}  // namespace idem::detail
