// Redis Cluster routing: key slots (CRC16/XMODEM mod 16384 with hash-tag rules), the slot map
// from CLUSTER SLOTS, one Pool per master, and MOVED/ASK redirections.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>

#include "idem/errors.h"
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

/// Pools of the cluster's masters and the slot map. Thread-safe.
class Cluster {
 public:
  /// `seed` holds the settings of every connection (timeouts, AUTH) and the first node to ask
  /// for the slot map. Does not connect until first use.
  explicit Cluster(PoolSettings seed) : seed_(std::move(seed)) {}

  /// The pool of the master serving `slot` (loads the slot map on first use).
  [[nodiscard]] Pool& pool_for_slot(int slot);
  /// The pool of the node at host:port (created on first use).
  [[nodiscard]] Pool& pool_for(const std::string& host, int port);
  /// Reloads the slot map with CLUSTER SLOTS, asking the known nodes in turn. Throws
  /// idem::RedisError when none answers.
  void refresh();

 private:
  using Address = std::pair<std::string, int>;
  Pool& pool_locked(const Address& address);  // requires mutex_ held exclusively

  const PoolSettings seed_;
  std::shared_mutex mutex_;
  std::map<Address, std::unique_ptr<Pool>> pools_;
  std::array<Pool*, kClusterSlots> slots_{};  // nullptr until the map is loaded
  bool loaded_ = false;
};

}  // namespace idem::detail
