#include "redis/async_sentinel.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/post.hpp>
#include <asio/redirect_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <span>
#include <string_view>
#include <utility>

#include "idem/errors.h"
#include "redis/errors.h"

// GCC 12 at -O1 (the sanitized builds' level) inlines Asio's coroutine frame allocation down to
// ::operator new, sees the frame freed by the frame's class operator delete, and calls the pair
// mismatched: a false positive (the class operator delete is the one that matches the class
// operator new Asio declares for its frames). -O2 does not warn.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace idem::detail {
namespace {

// The settings for asking a Sentinel: the master's timeouts, plain TCP, no AUTH, database 0.
AsyncConnectionSettings sentinel_settings(const AsyncConnectionSettings& master,
                                          const HostPort& sentinel) {
  AsyncConnectionSettings settings;
  settings.endpoint.host = sentinel.host;
  settings.endpoint.port = sentinel.port;
  settings.connect_timeout = master.connect_timeout;
  settings.command_timeout = master.command_timeout;
  return settings;
}

// `args` on a fresh connection with `settings` to `address`, closed after; bounded by the
// connect and the command timeout together.
asio::awaitable<ReplyPtr> ask_once(AsyncConnectionSettings settings, const HostPort& address,
                                   std::span<const std::string_view> args) {
  settings.endpoint.host = address.host;
  settings.endpoint.port = address.port;
  settings.locator = nullptr;
  settings.require_master = false;
  settings.on_push = nullptr;
  const std::chrono::milliseconds bound = settings.connect_timeout + settings.command_timeout;
  const auto connection =
      AsyncConnection::create(co_await asio::this_coro::executor, std::move(settings));
  struct Closer {
    AsyncConnection& connection;
    ~Closer() { connection.close(); }  // its read would keep io_context::run() going
  } closer{*connection};
  const RespCommand command(args);
  co_return co_await connection->send(command.bytes(), 1, bound, asio::use_awaitable);
}

}  // namespace

asio::awaitable<DiscoveredMaster> discover_master(std::vector<HostPort> sentinels,
                                                  AsyncConnectionSettings master) {
  DiscoveryFailure failure(master.endpoint.sentinel_master);
  const auto query = master_query(master.endpoint.sentinel_master);
  for (const HostPort& sentinel : sentinels) {
    std::optional<HostPort> address;
    try {
      const ReplyPtr reply =
          co_await ask_once(sentinel_settings(master, sentinel), sentinel, query);
      address = master_address(*reply, sentinel);
    } catch (const RedisError& error) {
      failure.no_answer(error);
      continue;
    }
    if (!address) {
      failure.unknown(sentinel);
      continue;
    }
    // ROLE on the named server: a Sentinel cut off from the others may name an old master.
    try {
      const ReplyPtr role = co_await ask_once(master, *address, kRoleCommand);
      if (std::optional<RedisError> refused = not_master(*role, *address)) throw *refused;
    } catch (const RedisError& error) {
      failure.not_confirmed(error);
      continue;
    }
    co_return DiscoveredMaster{std::move(*address), sentinel};
  }
  throw failure.error();
}

std::shared_ptr<AsyncSentinel> AsyncSentinel::create(asio::any_io_executor executor,
                                                     AsyncConnectionSettings master) {
  return std::shared_ptr<AsyncSentinel>(new AsyncSentinel(std::move(executor), std::move(master)));
}

AsyncSentinel::AsyncSentinel(asio::any_io_executor executor, AsyncConnectionSettings master)
    : executor_(std::move(executor)),
      settings_(std::move(master)),
      order_(settings_.endpoint.sentinels),
      watch_timer_(executor_) {}

void AsyncSentinel::locate(Found found) {
  if (master_ && (!stale_ || Clock::now() < next_round_)) {
    asio::post(executor_,
               [found = std::move(found), address = *master_] { found(nullptr, address); });
    return;
  }
  waiting_.push_back(std::move(found));
  start_round();
}

void AsyncSentinel::failed(const HostPort& address) {
  if (master_ == address) stale_ = true;
}

void AsyncSentinel::follow(std::weak_ptr<AsyncConnection> connection) {
  std::erase_if(followers_, [](const auto& follower) { return follower.expired(); });
  followers_.push_back(std::move(connection));
}

void AsyncSentinel::close() {
  closed_ = true;
  watch_timer_.cancel();
  if (watch_connection_ != nullptr) watch_connection_->close();
}

void AsyncSentinel::start_round() {
  if (asking_) {
    ask_again_ = true;
    return;
  }
  asking_ = true;
  ++rounds_;
  asio::co_spawn(executor_, discover_master(order_.sentinels(), settings_),
                 [self = shared_from_this()](std::exception_ptr error, DiscoveredMaster found) {
                   self->round_ended(error, found);
                 });
}

void AsyncSentinel::round_ended(const std::exception_ptr& error, const DiscoveredMaster& found) {
  asking_ = false;
  next_round_ = Clock::now() + kSentinelRediscoverInterval;
  if (error == nullptr) {
    order_.answered(found.sentinel);
    stale_ = false;
    if (master_ != found.master) {
      master_ = found.master;
      ++moves_;
      for (const auto& follower : followers_) {
        const std::shared_ptr<AsyncConnection> connection = follower.lock();
        if (connection == nullptr) continue;
        const HostPort peer = connection->peer();
        // Commands pending there fail (retryable); the next one connects to the new master.
        if (!peer.host.empty() && peer != *master_) {
          connection->close(std::make_exception_ptr(
              RedisError("idem: redis sentinel: the Sentinels moved the master from " + peer.host +
                             ":" + std::to_string(peer.port) + " to " + master_->host + ":" +
                             std::to_string(master_->port) + " (the command was not sent again)",
                         true)));
        }
      }
    }
    if (!watching_ && !closed_) {
      watching_ = true;
      asio::co_spawn(executor_, watch(), asio::detached);
    }
  }
  std::vector<Found> waiting;
  waiting.swap(waiting_);
  for (Found& found_one : waiting) {
    // A failed round with a master known: keep trying it (the Sentinels may be the ones down).
    if (master_) {
      found_one(nullptr, *master_);
    } else {
      found_one(error, {});
    }
  }
  if (ask_again_ || (!waiting_.empty() && !asking_)) {
    ask_again_ = false;
    start_round();
  }
}

asio::awaitable<void> AsyncSentinel::watch() {
  const std::shared_ptr<AsyncSentinel> self = shared_from_this();
  constexpr std::chrono::milliseconds kFirstBackoff{100};
  constexpr std::chrono::milliseconds kMaxBackoff{2000};
  constexpr std::array<std::string_view, 2> kSubscribe{"SUBSCRIBE", "+switch-master"};
  constexpr std::array<std::string_view, 1> kPing{"PING"};
  std::chrono::milliseconds backoff = kFirstBackoff;
  for (std::size_t next = 0; !closed_;) {
    AsyncConnectionSettings settings = sentinel_settings(settings_, order_.cycle(next++));
    settings.on_push = [weak = weak_from_this()](ReplyPtr message) {
      if (const auto sentinel = weak.lock()) sentinel->on_message(*message);
    };
    const auto connection = AsyncConnection::create(executor_, std::move(settings));
    watch_connection_ = connection;
    try {
      const ReplyPtr confirmed = co_await connection->exec(kSubscribe, asio::use_awaitable);
      if (confirmed->type == REDIS_REPLY_ERROR) throw reply_error(*confirmed, "SUBSCRIBE");
      backoff = kFirstBackoff;
      next = 0;  // a working Sentinel: start from the first again after it fails
      while (!closed_) {
        std::error_code ignored;
        watch_timer_.expires_after(kWatchPing);
        co_await watch_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
        if (closed_) break;
        // ["pong", ""], or a message that came first (replies are matched in order).
        const ReplyPtr answer = co_await connection->exec(kPing, asio::use_awaitable);
        on_message(*answer);
      }
    } catch (const RedisError&) {
      // Refused, closed, timed out: the next Sentinel.
    }
    connection->close();
    if (closed_) break;
    std::error_code ignored;
    watch_timer_.expires_after(backoff);
    co_await watch_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  watch_connection_.reset();
}

void AsyncSentinel::on_message(const redisReply& message) {
  if (!switched_master(message, settings_.endpoint.sentinel_master)) return;
  ++switches_seen_;
  stale_ = true;  // a hint: the round asks the Sentinels and checks ROLE
  start_round();
}

}  // namespace idem::detail
