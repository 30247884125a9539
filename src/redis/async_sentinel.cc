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

struct SentinelWatch::Subscription {
  Subscription(const asio::any_io_executor& executor, HostPort at)
      : sentinel(std::move(at)), timer(executor) {}
  HostPort sentinel;
  std::shared_ptr<AsyncConnection> connection;
  asio::steady_timer timer;  // the PING period, then the backoff
  bool confirmed = false;
};

std::shared_ptr<SentinelWatch> SentinelWatch::create(
    asio::any_io_executor executor, const AsyncConnectionSettings& master,
    std::function<void(const redisReply&)> on_message) {
  return std::shared_ptr<SentinelWatch>(
      new SentinelWatch(std::move(executor), master, std::move(on_message)));
}

SentinelWatch::SentinelWatch(asio::any_io_executor executor, const AsyncConnectionSettings& master,
                             std::function<void(const redisReply&)> on_message)
    : executor_(std::move(executor)),
      connect_timeout_(master.connect_timeout),
      command_timeout_(master.command_timeout),
      on_message_(std::move(on_message)) {}

void SentinelWatch::start(const std::vector<HostPort>& sentinels) {
  if (started_ || closed_) return;
  started_ = true;
  for (const HostPort& sentinel : sentinels) {
    subscriptions_.push_back(std::make_shared<Subscription>(executor_, sentinel));
    asio::co_spawn(executor_, watch(subscriptions_.back()), asio::detached);
  }
}

void SentinelWatch::close() {
  closed_ = true;
  for (const auto& subscription : subscriptions_) {
    subscription->timer.cancel();
    if (subscription->connection != nullptr) subscription->connection->close();
  }
}

asio::awaitable<void> SentinelWatch::watch(std::shared_ptr<Subscription> subscription) {
  const std::shared_ptr<SentinelWatch> self = shared_from_this();
  constexpr std::chrono::milliseconds kFirstBackoff{100};
  constexpr std::chrono::milliseconds kMaxBackoff{2000};
  constexpr std::array<std::string_view, 1> kPingCommand{"PING"};
  std::chrono::milliseconds backoff = kFirstBackoff;
  AsyncConnectionSettings settings;
  settings.endpoint.host = subscription->sentinel.host;
  settings.endpoint.port = subscription->sentinel.port;
  settings.connect_timeout = connect_timeout_;
  settings.command_timeout = command_timeout_;
  // Messages come with no command waiting for them; a message that comes while a PING waits is
  // taken as its answer, and the PING's answer then comes as a message: both go to on_message_.
  settings.on_push = [weak = weak_from_this()](ReplyPtr message) {
    if (const auto watch = weak.lock(); watch != nullptr && !watch->closed_) {
      watch->on_message_(*message);
    }
  };
  while (!closed_) {
    subscription->connection = AsyncConnection::create(executor_, settings);
    try {
      const ReplyPtr confirmed =
          co_await subscription->connection->exec(kSentinelSubscribe, asio::use_awaitable);
      if (confirmed->type == REDIS_REPLY_ERROR) throw reply_error(*confirmed, "SUBSCRIBE");
      subscription->confirmed = true;
      ++subscribed_;
      backoff = kFirstBackoff;
      while (!closed_) {
        std::error_code ignored;
        subscription->timer.expires_after(kPing);
        co_await subscription->timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
        if (closed_) break;
        const ReplyPtr answer =
            co_await subscription->connection->exec(kPingCommand, asio::use_awaitable);
        if (!closed_) on_message_(*answer);
      }
    } catch (const RedisError&) {
      // Refused, closed, timed out: this Sentinel again after the backoff.
    }
    if (subscription->confirmed) {
      subscription->confirmed = false;
      --subscribed_;
    }
    subscription->connection->close();
    if (closed_) break;
    std::error_code ignored;
    subscription->timer.expires_after(backoff);
    co_await subscription->timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  subscription->connection.reset();
}

AsyncSentinel::AsyncSentinel(asio::any_io_executor executor, AsyncConnectionSettings master)
    : executor_(std::move(executor)),
      settings_(std::move(master)),
      order_(settings_.endpoint.sentinels) {}

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
  if (watch_ != nullptr) watch_->close();
}

std::optional<RedisError> AsyncSentinel::failing_over() const {
  if (!master_) return std::nullopt;
  return hold_.refusal(*master_, Clock::now());
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
    if (watch_ == nullptr && !closed_) {
      watch_ = SentinelWatch::create(executor_, settings_,
                                     [weak = weak_from_this()](const redisReply& message) {
                                       if (const auto self = weak.lock()) self->on_message(message);
                                     });
      watch_->start(settings_.endpoint.sentinels);
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

void AsyncSentinel::on_message(const redisReply& message) {
  const std::optional<SentinelNews> news =
      sentinel_news(message, settings_.endpoint.sentinel_master);
  if (!news) return;
  hold_.heard(*news, Clock::now());
  if (news->kind != SentinelNews::Kind::kSwitched) return;
  ++switches_seen_;
  stale_ = true;  // a hint: the round asks the Sentinels and checks ROLE
  start_round();
}

}  // namespace idem::detail
