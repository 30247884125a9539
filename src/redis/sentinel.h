// Redis Sentinel: which server is the master of a monitored set, asked of the Sentinels in
// turn (Redis' "Sentinel clients guidelines": ask each Sentinel in order, move the one that
// answered to the front, check ROLE on the named server, ask again after a failure), and told
// by them when it changes (a subscription to +switch-master on one Sentinel). A round of
// questions is the async front's discover_master() (async_sentinel.h), run on a private
// io_context; the rules are sentinel_rules.h's.
#pragma once

#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "redis/async_sentinel.h"
#include "redis/node.h"
#include "redis/pool.h"
#include "redis/sentinel_rules.h"
#include "redis/url.h"

struct redisReply;

namespace idem::detail {

/// The current master of one Sentinel-monitored set, as a Node. Thread-safe. From the first
/// discovery on, one helper thread keeps a subscription on every Sentinel (SentinelWatch, on a
/// private io_context), so that a failover is followed at once, also when the old master lives
/// on (a manual failover, a partition): its connections would otherwise keep writing there
/// until the Sentinels demote it, up to their 10 s INFO period later. The events that begin a
/// failover hold new claims back until it ends (failing_over(), FailoverHold).
class Sentinel {
 public:
  using Clock = std::chrono::steady_clock;

  /// Least time between two discoveries while a master is known: failures of many calls within
  /// it cost one round of questions to the Sentinels.
  static constexpr std::chrono::milliseconds kRediscoverInterval = kSentinelRediscoverInterval;

  /// `master` holds the settings of every master connection (credentials, database, timeouts)
  /// and, in its endpoint, the Sentinels and the master's name. Does not connect until first
  /// use.
  Sentinel(PoolSettings master, CircuitBreakerOptions breaker);
  /// Stops the helper thread (closing its subscription at once).
  ~Sentinel();
  Sentinel(const Sentinel&) = delete;
  Sentinel& operator=(const Sentinel&) = delete;

  /// The node of the current master. Discovers it on first use, and again after invalidate()
  /// (one discovery at a time; while one runs or within kRediscoverInterval of the last, the
  /// known master is returned as is). Throws idem::RedisError when no master is known and no
  /// Sentinel names one that answers ROLE as a master: retryable, except when every Sentinel
  /// that answered does not know the master's name. The calls that waited for a discovery that
  /// failed get its error, without asking again.
  [[nodiscard]] std::shared_ptr<Node> master();

  /// The master known now, without asking anyone; nullptr before the first discovery.
  [[nodiscard]] std::shared_ptr<Node> known_master();

  /// A call on `node` failed in a way a failover explains (connection lost or refused, a
  /// timeout, READONLY, ROLE not master, its breaker open): ask the Sentinels again.
  void invalidate(const Node& node);

  /// The retryable idem::RedisError a new claim gets while the Sentinels are failing the known
  /// master over (FailoverHold); nullopt otherwise (also before the first discovery).
  [[nodiscard]] std::optional<RedisError> failing_over();

  /// Subscriptions confirmed and open now (one per Sentinel at most), for tests.
  [[nodiscard]] std::size_t subscribed() const noexcept { return watch_->subscribed(); }

 private:
  // The master's address by the Sentinels, checked with ROLE; throws idem::RedisError.
  HostPort discover();
  // Discovers now and installs the answer; throws idem::RedisError.
  std::shared_ptr<Node> rediscover_locked();  // requires discovery_mutex_
  // The helper thread: the subscriptions on every Sentinel, until the destructor.
  void watch();
  // A message of a subscription, on the helper thread.
  void on_message(const redisReply& message);

  const PoolSettings settings_;
  const CircuitBreakerOptions breaker_;
  std::mutex discovery_mutex_;  // one discovery at a time; taken before mutex_
  std::mutex mutex_;            // guards the members below
  SentinelOrder order_;
  std::shared_ptr<Node> master_;
  bool stale_ = false;
  Clock::time_point next_discovery_{};
  std::uint64_t rounds_ = 0;               // discoveries ended
  std::optional<RedisError> round_error_;  // the last one's error, when it failed

  FailoverHold hold_;  // guarded by mutex_

  asio::io_context watch_io_{1};          // the helper thread's; stopped by the destructor
  std::shared_ptr<SentinelWatch> watch_;  // used on the helper thread (subscribed(): any)
  std::once_flag watch_once_;
  std::thread watcher_;  // started by the first discovery; joined by the destructor
};

}  // namespace idem::detail
