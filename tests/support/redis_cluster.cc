#include "redis_cluster.h"

#include <stdexcept>
#include <thread>

#include "wait_until.h"

namespace idem::test {
namespace {

// Whether `line` (one line of CLUSTER NODES) lists `slot` among its slot ranges.
bool line_serves(const std::string& line, int slot) {
  for (std::size_t at = line.find(" connected "); at != std::string::npos;) {
    at = line.find_first_of("0123456789", at);
    if (at == std::string::npos) break;
    const auto end = line.find(' ', at);
    const std::string range =
        line.substr(at, end == std::string::npos ? std::string::npos : end - at);
    const auto dash = range.find('-');
    if (range.find('[') == std::string::npos) {  // not a migrating-slot entry
      const int low = std::stoi(range.substr(0, dash));
      const int high = dash == std::string::npos ? low : std::stoi(range.substr(dash + 1));
      if (slot >= low && slot <= high) return true;
    }
    at = end;
  }
  return false;
}

}  // namespace

ClusterGroup::ClusterGroup(int masters, int replicas, std::chrono::milliseconds node_timeout,
                           const TestCertificates* tls) {
  const int count = masters * (1 + replicas);
  std::vector<std::string> create = {"redis-cli", "--cluster", "create"};
  for (int i = 0; i < count; ++i) {
    std::vector<std::string> args = {
        "--cluster-enabled",          "yes",
        "--cluster-config-file",      "nodes.conf",
        "--cluster-node-timeout",     std::to_string(node_timeout.count()),
        "--repl-diskless-sync-delay", "0"};
    if (tls == nullptr) {
      nodes_.push_back(std::make_unique<RedisServer>(false, std::move(args)));
    } else {
      args.insert(args.end(),
                  {"--tls-cluster", "yes", "--tls-replication", "yes", "--tls-cert-file",
                   tls->server_cert(), "--tls-key-file", tls->server_key(), "--tls-ca-cert-file",
                   tls->ca_file(), "--tls-auth-clients", "no"});
      // The TLS port's bus port (+ 10000) may be taken by then, as RedisServer's own port's may:
      // a node that cannot listen starts again on another TLS port.
      for (int attempt = 1;; ++attempt) {
        const int tls_port = free_port();
        std::vector<std::string> node_args = args;
        node_args.insert(node_args.end(), {"--tls-port", std::to_string(tls_port)});
        try {
          nodes_.push_back(std::make_unique<RedisServer>(false, std::move(node_args)));
          tls_ports_.push_back(tls_port);
          break;
        } catch (const std::runtime_error&) {
          if (attempt == 5) throw;
        }
      }
    }
    create.push_back(tls == nullptr ? nodes_.back()->address()
                                    : "127.0.0.1:" + std::to_string(tls_ports_.back()));
  }
  create.insert(create.end(), {"--cluster-replicas", std::to_string(replicas), "--cluster-yes"});
  if (tls != nullptr) {
    ca_file_ = tls->ca_file();
    create.insert(create.begin() + 1, {"--tls", "--cacert", ca_file_});
  }
  if (std::string output; run(create, &output) != 0) {
    throw std::runtime_error("redis-cli --cluster create failed: " + output);
  }
  const bool formed = wait_until(std::chrono::seconds(30), [&] {
    if (!all_ok()) return false;
    for (const auto& node : nodes_) {
      const std::string info = node->cli({"INFO", "replication"});
      if (info.find("role:slave") != std::string::npos &&
          info.find("master_link_status:up") == std::string::npos) {
        return false;
      }
    }
    return true;
  });
  if (!formed) throw std::runtime_error("the cluster never became ok");
}

std::string ClusterGroup::tls_seed_url() const {
  return "rediss://127.0.0.1:" + std::to_string(tls_ports_.at(0)) + "/0?ca_file=" + ca_file_;
}

bool ClusterGroup::all_ok() const {
  for (const auto& node : nodes_) {
    if (node->running() &&
        node->cli({"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos) {
      return false;
    }
  }
  return true;
}

bool serves_as_master(const std::string& cluster_nodes, int slot) {
  // The node's own line is the one flagged "myself". Not the first line holding its ID: a
  // replica's line names its master's ID too, and CLUSTER NODES lists lines in no set order.
  const auto mark = cluster_nodes.find(" myself,");
  if (mark == std::string::npos) return false;
  const auto newline = cluster_nodes.rfind('\n', mark);
  const auto start = newline == std::string::npos ? 0 : newline + 1;
  const std::string line = cluster_nodes.substr(start, cluster_nodes.find('\n', mark) - start);
  return line.find(" myself,master") != std::string::npos && line_serves(line, slot);
}

RedisServer* ClusterGroup::owner_of(int slot) const {
  for (const auto& node : nodes_) {
    if (node->running() && serves_as_master(node->cli({"CLUSTER", "NODES"}), slot)) {
      return node.get();
    }
  }
  return nullptr;
}

bool ClusterGroup::wait_for_new_owner(int slot, const RedisServer* old_owner,
                                      std::chrono::milliseconds limit) const {
  return wait_until(limit, [&] {
    const RedisServer* owner = owner_of(slot);
    return owner != nullptr && owner != old_owner && all_ok();
  });
}

}  // namespace idem::test
