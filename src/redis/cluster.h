// Redis Cluster routing: key slots (CRC16/XMODEM mod 16384 with hash-tag rules), the slot map
// from CLUSTER SLOTS, one Node (pool + circuit breaker) per master, MOVED/ASK redirections, and
// reloading the map after a failover.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "redis/node.h"
#include "redis/pool.h"

struct redisReply;

namespace idem::detail {

inline constexpr int kClusterSlots = 16384;

/// The cluster slot of `key`: CRC16/XMODEM of the key, or of its hash tag (the bytes between the
/// first `{` and the next `}`, when not empty), mod 16384.
[[nodiscard]] int key_slot(std::string_view key) noexcept;

/// A `-MOVED slot host:port` or `-ASK slot host:port` error reply.
struct Redirect {
  bool ask = false;  ///< ASK (one-time, send ASKING first) rather than MOVED (the slot moved).
  int slot = 0;
  std::string host;
  int port = 0;
};

/// The redirection an error reply asks for; nullopt for any other reply.
[[nodiscard]] std::optional<Redirect> parse_redirect(const redisReply& reply);

/// Thrown (as a retryable RedisError) when a reply is MOVED/ASK; the guard follows it.
class RedirectError : public RedisError {
 public:
  RedirectError(const std::string& what, Redirect redirect)
      : RedisError(what, true), redirect_(std::move(redirect)) {}
  [[nodiscard]] const Redirect& redirect() const noexcept { return redirect_; }

 private:
  Redirect redirect_;
};

/// The cluster's masters (one Node each) and the slot map. Thread-safe.
class Cluster {
 public:
  using Clock = std::chrono::steady_clock;

  /// Least time between two slot map reloads caused by failures (refresh_after_failure()).
  static constexpr std::chrono::milliseconds kRefreshInterval{100};

  /// `seed` holds the settings of every connection (timeouts, AUTH) and the first node to ask
  /// for the slot map; every node gets a breaker with `breaker`. Does not connect until first
  /// use.
  Cluster(PoolSettings seed, CircuitBreakerOptions breaker)
      : seed_(std::move(seed)), breaker_(breaker) {}

  /// The node of the master serving `slot` (loads the slot map on first use).
  [[nodiscard]] Node& node_for_slot(int slot);
  /// The node at host:port (created on first use).
  [[nodiscard]] Node& node_for(const std::string& host, int port);
  /// Reloads the slot map with CLUSTER SLOTS, asking the nodes it knows (masters and replicas)
  /// in turn. Throws idem::RedisError when none answers.
  void refresh();
  /// A call on a node failed in a way a failover explains (connection lost or refused, a
  /// timeout, CLUSTERDOWN, TRYAGAIN, its breaker open): reloads the slot map unless another
  /// thread is reloading it (then false) or it was reloaded within kRefreshInterval. True when
  /// the map is fresh: the caller may look its slot up again. Asks `failed` last. Never throws
  /// a RedisError (false when no node answered).
  bool refresh_after_failure(const Node& failed);
  /// Every master node of the current map (for breaker_state()).
  [[nodiscard]] std::vector<const Node*> masters();

 private:
  using Address = std::pair<std::string, int>;
  Node& node_locked(const Address& address);  // requires mutex_ held exclusively
  void refresh_locked(const Node* ask_last);  // requires refresh_mutex_ held

  const PoolSettings seed_;
  const CircuitBreakerOptions breaker_;
  std::mutex refresh_mutex_;  // one reload at a time; taken before mutex_
  Clock::time_point last_refresh_{};
  std::shared_mutex mutex_;
  std::map<Address, std::unique_ptr<Node>> nodes_;
  std::vector<Address> known_;                // masters and replicas of the last map
  std::array<Node*, kClusterSlots> slots_{};  // nullptr until the map is loaded
  bool loaded_ = false;
};

}  // namespace idem::detail
