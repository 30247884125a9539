// A private Redis Cluster on loopback for routing and failover tests: `masters` masters with
// `replicas` replicas each (redis-server --cluster-enabled yes, redis-cli --cluster create),
// every node a process owned by the test, on free ports.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "redis_server.h"
#include "tls_certs.h"

namespace idem::test {

/// Whether the node that printed `cluster_nodes` (its CLUSTER NODES reply) serves `slot` as
/// master, read from its own line (flagged "myself").
[[nodiscard]] bool serves_as_master(const std::string& cluster_nodes, int slot);

class ClusterGroup {
 public:
  /// Starts the nodes, creates the cluster and waits (bounded) until every node reports
  /// cluster_state:ok and every replica is in sync. `node_timeout` is cluster-node-timeout: how
  /// long a master must be unreachable before its replica takes over. Throws
  /// std::runtime_error when the cluster does not form in time. With `tls`, every node serves
  /// TLS on a port of its own too (signed by tls->ca_file(), clients unauthenticated), the cluster
  /// bus and replication run over TLS, and a TLS client is told TLS ports (CLUSTER SLOTS, MOVED,
  /// ASK); redis-cli and url() keep the plain port.
  ClusterGroup(int masters, int replicas,
               std::chrono::milliseconds node_timeout = std::chrono::milliseconds(5000),
               const TestCertificates* tls = nullptr);

  /// All nodes, masters and replicas, in creation order.
  [[nodiscard]] const std::vector<std::unique_ptr<RedisServer>>& nodes() const { return nodes_; }
  /// URL of the first node (a seed).
  [[nodiscard]] std::string seed_url() const { return nodes_.front()->url(); }
  /// `rediss://` URL of the first node's TLS port, verified against the CA (a TLS cluster only).
  [[nodiscard]] std::string tls_seed_url() const;
  /// The live node serving `slot` as master, read from each live node's own line of
  /// CLUSTER NODES (independent of the guard's CLUSTER SLOTS parsing); nullptr when none.
  [[nodiscard]] RedisServer* owner_of(int slot) const;
  /// Whether every live node reports cluster_state:ok.
  [[nodiscard]] bool all_ok() const;
  /// Waits (bounded by `limit`) until a live node other than `old_owner` serves `slot` as
  /// master and every live node reports cluster_state:ok; returns whether that happened.
  bool wait_for_new_owner(int slot, const RedisServer* old_owner,
                          std::chrono::milliseconds limit) const;

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
  std::vector<int> tls_ports_;  // empty unless TLS
  std::string ca_file_;
};

}  // namespace idem::test
