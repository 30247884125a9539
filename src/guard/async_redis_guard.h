// Layer 2 on an event loop: the Redis guard of the async driver, over the pipelined AsyncClient
// (src/redis/async_client.h). The same keys, records and Lua scripts as the blocking RedisGuard
// (src/guard/redis_protocol.h says them once for both), the same circuit breaker per node (kept
// by the AsyncClient); one connection per node, shared by every call (automatic pipelining),
// Redis Cluster through MOVED/ASK, Redis Sentinel (the master found and followed on the loop:
// AsyncSentinel).
//
// Durability (RedisGuardOptions::min_replicas): claims, completions and renewals are durable
// commands of the connection (AsyncConnection: one WAIT after each write's durable commands, so
// the pipelined calls of one loop turn share one replica acknowledgement); the replies are read
// as the blocking guard reads them (redis_protocol.h).
//
// Cancellation: claim() honours the awaiting coroutine's cancellation (the command completes at
// once with idem::Cancelled; it may still run on the server, so a claim may be made and kept
// until its lease ends). complete(), release() and renew() ignore it: what follows a handler
// always runs to its end, bounded by the command timeout.
//
// Thread safety: not thread-safe; use it from its executor's thread. The string views given to
// a call must stay valid until it completes.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

#include "guard/async_guard.h"
#include "guard/redis_protocol.h"
#include "idem/guard.h"
#include "idem/redis_guard.h"
#include "redis/async_client.h"

namespace idem::detail {

class AsyncRedisGuard final : public AsyncGuard {
 public:
  /// Throws idem::ConfigError on invalid options (as RedisGuard does), and when the TLS files of a
  /// `rediss://` URL cannot be loaded. Connects on first use.
  AsyncRedisGuard(const asio::any_io_executor& executor, const RedisGuardOptions& options);
  AsyncRedisGuard(const AsyncRedisGuard&) = delete;
  AsyncRedisGuard& operator=(const AsyncRedisGuard&) = delete;
  ~AsyncRedisGuard();

  /// As RedisGuard::claim(), on the loop.
  asio::awaitable<ClaimResult> claim(std::string_view key, std::string_view request_id,
                                     std::string_view fingerprint) override;
  /// As RedisGuard::complete(); `retention` 0 is the configured one.
  asio::awaitable<bool> complete(std::string_view key, std::string_view owner_token,
                                 std::string_view response,
                                 std::chrono::milliseconds retention) override;
  /// As RedisGuard::release().
  asio::awaitable<bool> release(std::string_view key, std::string_view owner_token) override;
  void release_unawaited(std::string_view key, std::string_view owner_token) override;
  /// As RedisGuard::renew().
  asio::awaitable<bool> renew(std::string_view key, std::string_view owner_token,
                              std::chrono::milliseconds lease) override;

  /// As RedisGuard::steps().
  asio::awaitable<StepJournal> steps(std::string_view key) override;
  /// As RedisGuard::put_step().
  asio::awaitable<bool> put_step(std::string_view key, std::string_view owner_token,
                                 std::string_view name, const JournaledStep& step) override;

  [[nodiscard]] std::chrono::milliseconds lease() const noexcept override { return options_.lease; }
  [[nodiscard]] std::chrono::milliseconds retention() const noexcept override {
    return options_.retention;
  }
  [[nodiscard]] const RedisGuardOptions& options() const noexcept { return options_; }
  /// The client, for tests and the bench.
  [[nodiscard]] AsyncClient& client() noexcept { return *client_; }

  /// Closes the connections (pending commands fail); an open connection keeps io_context::run()
  /// going until this.
  void close() override;

 private:
  // EVALSHA `script` with `keys` (the first routes it) and `args` (under its node's breaker); the
  // reply checked. `cancellable`: whether the awaiting coroutine's cancellation reaches the
  // command; `durable`: a write the replicas must acknowledge (WAIT after it when min_replicas >
  // 0).
  asio::awaitable<Written> eval(const GuardScript& script, std::span<const std::string_view> keys,
                                std::span<const std::string_view> args, bool cancellable,
                                bool durable);
  // eval() of a script answering 1/0 (never cancelled), a foreign value counted; a true answer
  // of a `durable` write the replicas did not acknowledge throws (`during` names it).
  asio::awaitable<bool> eval_flag(const GuardScript& script, std::span<const std::string_view> keys,
                                  std::span<const std::string_view> args, bool durable,
                                  std::string_view during);

  const RedisGuardOptions options_;
  const GuardProtocol protocol_;
  const GuardScripts& scripts_ = GuardScripts::get();
  std::shared_ptr<AsyncClient> client_;
};

}  // namespace idem::detail
