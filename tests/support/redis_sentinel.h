// A private Redis Sentinel topology on loopback for failover tests: one master, one replica and
// three Sentinels (quorum 2) watching it under the name "idem-master", each a process owned by
// the test, on free ports.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "redis_server.h"

namespace idem::test {

class SentinelGroup {
 public:
  /// Name the Sentinels monitor the master under.
  static constexpr const char* kMasterName = "idem-master";

  /// Starts the master, the replica (waits until it is in sync) and the Sentinels (waits until
  /// each knows the replica and the other Sentinels). `down_after` is the Sentinels'
  /// down-after-milliseconds: how long the master must be unreachable before a failover.
  /// Throws std::runtime_error when a server does not come up in time.
  explicit SentinelGroup(std::chrono::milliseconds down_after = std::chrono::milliseconds(1000));

  /// `redis-sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/0#idem-master`.
  [[nodiscard]] std::string url() const;
  /// The Redis server (master or replica) at `address` (host:port); nullptr when none.
  [[nodiscard]] RedisServer* server_at(const std::string& address) const;
  /// The data node the first answering Sentinel names as master now (host:port).
  [[nodiscard]] std::string master_address() const;
  /// The data node that is not the master by the Sentinels (host:port).
  [[nodiscard]] std::string replica_address() const;
  /// The current master by the Sentinels.
  [[nodiscard]] RedisServer& master() const;
  /// SIGKILLs the current master; returns its address.
  std::string kill_master();
  /// Waits (bounded by `limit`) until the Sentinels name a master other than `old_address`
  /// that answers ROLE as master; returns whether that happened.
  bool wait_for_new_master(const std::string& old_address, std::chrono::milliseconds limit) const;
  /// The Sentinels.
  [[nodiscard]] const std::vector<std::unique_ptr<RedisServer>>& sentinels() const {
    return sentinels_;
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> data_;  // [0] the first master, [1] its replica
  std::vector<std::unique_ptr<RedisServer>> sentinels_;
};

}  // namespace idem::test
