#include "redis_sentinel.h"

#include <stdexcept>
#include <thread>

#include "wait_until.h"

namespace idem::test {
namespace {

std::string redis_url(const std::string& address) { return "redis://" + address + "/0"; }

}  // namespace

SentinelGroup::SentinelGroup(std::chrono::milliseconds down_after) {
  // No diskless-sync delay: a replica (this one, or one after a failover) syncs at once.
  const std::vector<std::string> data_args = {"--repl-diskless-sync-delay", "0"};
  data_.push_back(std::make_unique<RedisServer>(false, data_args));
  const std::string master_port = std::to_string(data_[0]->port());
  std::vector<std::string> replica_args = data_args;
  replica_args.insert(replica_args.end(), {"--replicaof", "127.0.0.1", master_port});
  data_.push_back(std::make_unique<RedisServer>(false, replica_args));
  if (!wait_until(std::chrono::seconds(10), [&] {
        return data_[1]->cli({"INFO", "replication"}).find("master_link_status:up") !=
               std::string::npos;
      })) {
    throw std::runtime_error("the replica never synced with the master");
  }
  const std::string name = kMasterName;
  const std::vector<std::string> config = {
      "sentinel monitor " + name + " 127.0.0.1 " + master_port + " 2",
      "sentinel down-after-milliseconds " + name + " " + std::to_string(down_after.count()),
      "sentinel failover-timeout " + name + " 10000", "sentinel parallel-syncs " + name + " 1"};
  for (int i = 0; i < 3; ++i) sentinels_.push_back(RedisServer::sentinel(config));
  for (const auto& sentinel : sentinels_) {
    if (!wait_until(std::chrono::seconds(20), [&] {
          const std::string info = sentinel->cli({"SENTINEL", "MASTER", name});
          return info.find("num-slaves\n1") != std::string::npos &&
                 info.find("num-other-sentinels\n2") != std::string::npos;
        })) {
      throw std::runtime_error("a Sentinel never saw the replica and the other Sentinels");
    }
  }
}

std::string SentinelGroup::url() const {
  std::string hosts;
  for (const auto& sentinel : sentinels_) hosts += (hosts.empty() ? "" : ",") + sentinel->address();
  return "redis-sentinel://" + hosts + "/0#" + kMasterName;
}

RedisServer* SentinelGroup::server_at(const std::string& address) const {
  for (const auto& server : data_) {
    if (server->address() == address) return server.get();
  }
  return nullptr;
}

std::string SentinelGroup::master_address() const {
  for (const auto& sentinel : sentinels_) {
    const std::string answer = sentinel->cli({"SENTINEL", "get-master-addr-by-name", kMasterName});
    const auto newline = answer.find('\n');
    if (newline != std::string::npos) {
      return answer.substr(0, newline) + ":" + answer.substr(newline + 1);
    }
  }
  return {};
}

std::string SentinelGroup::replica_address() const {
  const std::string master = master_address();
  for (const auto& server : data_) {
    if (server->address() != master) return server->address();
  }
  return {};
}

RedisServer& SentinelGroup::master() const {
  RedisServer* server = server_at(master_address());
  if (server == nullptr) throw std::runtime_error("the Sentinels name no master of this group");
  return *server;
}

std::string SentinelGroup::kill_master() {
  const std::string address = master_address();
  RedisServer* server = server_at(address);
  if (server == nullptr) throw std::runtime_error("the Sentinels name no master of this group");
  server->kill();
  return address;
}

bool SentinelGroup::wait_for_new_master(const std::string& old_address,
                                        std::chrono::milliseconds limit) const {
  return wait_until(limit, [&] {
    const std::string address = master_address();
    if (address.empty() || address == old_address) return false;
    const RedisServer* server = server_at(address);
    return server != nullptr && redis_cli(redis_url(address), {"ROLE"}).starts_with("master");
  });
}

}  // namespace idem::test
