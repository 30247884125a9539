// Redis Sentinel on an event loop: the master of a monitored set found by asking the Sentinels
// in turn (discover_master(), also what the blocking Sentinel runs, on a private io_context),
// and followed through failovers (AsyncSentinel, the AsyncLocator of the master's
// AsyncConnection). The rules both fronts follow are in sentinel_rules.h.
//
// Thread safety: not thread-safe; use it from its executor's thread (as AsyncConnection).
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/steady_timer.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "redis/async_connection.h"
#include "redis/sentinel_rules.h"

namespace idem::detail {

/// What a round of questions found.
struct DiscoveredMaster {
  HostPort master;    ///< The master's address, confirmed by ROLE.
  HostPort sentinel;  ///< The Sentinel that named it.
};

/// One round of questions, on the awaiting coroutine's executor: asks `sentinels` in this order
/// (SENTINEL get-master-addr-by-name `master.endpoint.sentinel_master`, plain TCP without AUTH,
/// as the blocking guard asks them), checks ROLE on the server named with `master`'s settings
/// (AUTH, SELECT), and answers with the first confirmed. Each question and each check is one
/// fresh connection bounded by `master.connect_timeout + master.command_timeout` and closed
/// after. Throws idem::RedisError: DiscoveryFailure::error(), or the master's non-retryable
/// error (WRONGPASS, NOAUTH).
[[nodiscard]] asio::awaitable<DiscoveredMaster> discover_master(std::vector<HostPort> sentinels,
                                                                AsyncConnectionSettings master);

/// Subscriptions to kSentinelSubscribe's channels on every Sentinel of a set at once: the events
/// of a failover before +switch-master come from the one Sentinel leading it, which may be any.
/// Each subscription is PINGed every kPing (a Sentinel that died silently is noticed) and made
/// again after a backoff (100 ms doubling to 2 s) when it fails. Every message goes to
/// `on_message`, on the executor. Used by AsyncSentinel on its loop and by the blocking Sentinel
/// on its helper thread. Not thread-safe: use it from its executor's thread.
class SentinelWatch : public std::enable_shared_from_this<SentinelWatch> {
 public:
  /// How often each subscription's Sentinel is PINGed.
  static constexpr std::chrono::seconds kPing{5};

  /// `master`: the master's connection settings, whose timeouts the Sentinels are asked with.
  [[nodiscard]] static std::shared_ptr<SentinelWatch> create(
      asio::any_io_executor executor, const AsyncConnectionSettings& master,
      std::function<void(const redisReply&)> on_message);
  /// Subscribes on each of `sentinels` (once; later calls do nothing).
  void start(const std::vector<HostPort>& sentinels);
  /// Ends every subscription (an open one keeps io_context::run() going).
  void close();
  /// Subscriptions confirmed and open now; may be read from any thread (for tests).
  [[nodiscard]] std::size_t subscribed() const noexcept { return subscribed_; }

 private:
  struct Subscription;
  SentinelWatch(asio::any_io_executor executor, const AsyncConnectionSettings& master,
                std::function<void(const redisReply&)> on_message);
  asio::awaitable<void> watch(std::shared_ptr<Subscription> subscription);

  asio::any_io_executor executor_;
  std::chrono::milliseconds connect_timeout_;
  std::chrono::milliseconds command_timeout_;
  std::function<void(const redisReply&)> on_message_;
  std::vector<std::shared_ptr<Subscription>> subscriptions_;
  std::atomic<std::size_t> subscribed_{0};
  bool started_ = false;
  bool closed_ = false;
};

/// The current master of one Sentinel-monitored set, for the AsyncConnections it locates. From
/// the first discovery on, a SentinelWatch follows every Sentinel: `+switch-master` starts a new
/// round at once, and the connections that follow() this sentinel and are connected elsewhere
/// than the new master are closed (a manual failover, or a partition, leaves the old master
/// writable until the Sentinels demote it); the events that begin a failover hold new claims
/// back (failing_over(), FailoverHold) until it ends.
class AsyncSentinel final : public AsyncLocator,
                            public std::enable_shared_from_this<AsyncSentinel> {
 public:
  using Clock = std::chrono::steady_clock;
  /// How often each subscription's Sentinel is PINGed.
  static constexpr std::chrono::seconds kWatchPing = SentinelWatch::kPing;

  /// `master`: the settings of the master's connections; its endpoint names the Sentinels and
  /// the master's name. Asks no one until the first locate().
  [[nodiscard]] static std::shared_ptr<AsyncSentinel> create(asio::any_io_executor executor,
                                                             AsyncConnectionSettings master);

  /// The known master, unless a failure was reported for it (failed()) and the last round is
  /// more than kSentinelRediscoverInterval ago; otherwise after a round of questions (one at a
  /// time: later callers wait for it). When a round fails and a master is known, that master
  /// (the Sentinels may be the ones unreachable); with none known, the round's error.
  void locate(Found found) override;
  /// The next locate() asks the Sentinels again, when `address` is the known master.
  void failed(const HostPort& address) override;
  /// `connection` is closed when a round names another master than the one it is connected to.
  void follow(std::weak_ptr<AsyncConnection> connection);
  /// Ends the subscription (an open one keeps io_context::run() going). locate() still works,
  /// without the subscription.
  void close();

  /// The master known now, without asking; nullopt before the first round.
  [[nodiscard]] const std::optional<HostPort>& known_master() const noexcept { return master_; }
  /// Rounds of questions started so far, for tests.
  [[nodiscard]] std::uint64_t rounds() const noexcept { return rounds_; }
  /// Times a round named another master than the one known (the first discovery included).
  [[nodiscard]] std::uint64_t moves() const noexcept { return moves_; }
  /// `+switch-master` messages of this set received so far (one per Sentinel), for tests.
  [[nodiscard]] std::uint64_t switches_seen() const noexcept { return switches_seen_; }
  /// The retryable idem::RedisError a new claim gets while the Sentinels are failing the known
  /// master over (FailoverHold); nullopt otherwise.
  [[nodiscard]] std::optional<RedisError> failing_over() const;
  /// The subscriptions, for tests; null before the first round found a master.
  [[nodiscard]] const std::shared_ptr<SentinelWatch>& watch() const noexcept { return watch_; }

 private:
  AsyncSentinel(asio::any_io_executor executor, AsyncConnectionSettings master);
  // Starts a round unless one runs (then another follows it).
  void start_round();
  void round_ended(const std::exception_ptr& error, const DiscoveredMaster& found);
  void on_message(const redisReply& message);

  asio::any_io_executor executor_;
  const AsyncConnectionSettings settings_;
  SentinelOrder order_;
  std::optional<HostPort> master_;
  bool stale_ = false;
  Clock::time_point next_round_{};
  bool asking_ = false;         // a round runs
  bool ask_again_ = false;      // a +switch-master came while it ran
  std::vector<Found> waiting_;  // locate() calls waiting for the round
  std::vector<std::weak_ptr<AsyncConnection>> followers_;
  bool closed_ = false;
  std::shared_ptr<SentinelWatch> watch_;  // from the first round that found a master
  FailoverHold hold_;
  std::uint64_t rounds_ = 0;
  std::uint64_t moves_ = 0;
  std::uint64_t switches_seen_ = 0;
};

}  // namespace idem::detail
