// The Redis guard against a private 3-master Redis Cluster on loopback (started by the test):
// slot routing, batches across nodes, ASK during a slot migration and MOVED after it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "claim_methods.h"
#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "redis/cluster.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem {
namespace {

class RedisClusterTest : public ::testing::TestWithParam<ClaimMethod> {
 protected:
  static void SetUpTestSuite() {
    for (int i = 0; i < 3; ++i) {
      nodes_.push_back(std::make_unique<test::RedisServer>(
          false, std::vector<std::string>{"--cluster-enabled", "yes", "--cluster-config-file",
                                          "nodes.conf", "--cluster-node-timeout", "5000"}));
    }
    std::vector<std::string> create = {"--cluster", "create"};
    for (const auto& node : nodes_) create.push_back(address(*node));
    create.insert(create.end(), {"--cluster-replicas", "0", "--cluster-yes"});
    (void)nodes_[0]->cli(create);
    for (int i = 0; i < 400 && !all_ok(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    ASSERT_TRUE(all_ok()) << "the cluster never became ok";
  }
  static void TearDownTestSuite() { nodes_.clear(); }

  static std::string address(const test::RedisServer& node) {
    const std::string url = node.url();
    return url.substr(std::string("redis://").size(),
                      url.rfind('/') - std::string("redis://").size());
  }
  static bool all_ok() {
    for (const auto& node : nodes_) {
      if (node->cli({"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos)
        return false;
    }
    return true;
  }
  // Index of the node serving `slot`, read from each node's own line of CLUSTER NODES
  // (independent of the guard's CLUSTER SLOTS parsing); -1 when none.
  static int owner_of(int slot) {
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const std::string id = nodes_[i]->cli({"CLUSTER", "MYID"});
      const std::string nodes = nodes_[i]->cli({"CLUSTER", "NODES"});
      const auto line_start = nodes.find(id);
      const std::string line = nodes.substr(line_start, nodes.find('\n', line_start) - line_start);
      for (std::size_t at = line.find(" connected "); at != std::string::npos;) {
        at = line.find_first_of("0123456789", at);
        if (at == std::string::npos) break;
        const auto end = line.find(' ', at);
        const std::string range =
            line.substr(at, end == std::string::npos ? std::string::npos : end - at);
        const auto dash = range.find('-');
        const int low = std::stoi(range.substr(0, dash));
        const int high = dash == std::string::npos ? low : std::stoi(range.substr(dash + 1));
        if (slot >= low && slot <= high) return static_cast<int>(i);
        at = end;
      }
    }
    return -1;
  }

  RedisGuardOptions options() const {
    RedisGuardOptions guard_options;
    guard_options.redis.url = nodes_[0]->url();
    guard_options.redis.cluster = true;
    guard_options.prefix = test::unique_name("cluster");
    guard_options.claim_method = GetParam();
    return guard_options;
  }

  static inline std::vector<std::unique_ptr<test::RedisServer>> nodes_;
};

TEST_P(RedisClusterTest, ClaimsRouteToTheMasterOfEachSlot) {
  RedisGuard guard(options());
  constexpr int kKeys = 200;
  std::vector<ClaimResult> firsts;
  for (int k = 0; k < kKeys; ++k) {
    firsts.push_back(guard.claim("u:i:k" + std::to_string(k), "req-1", "fp"));
    ASSERT_EQ(firsts.back().status, ClaimStatus::kFirst);
  }
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "u:i:k" + std::to_string(k);
    EXPECT_EQ(guard.claim(key, "req-1", "fp").status, ClaimStatus::kRepeatSame);
  }
  for (const auto& node : nodes_) EXPECT_NE(node->cli({"DBSIZE"}), "0");  // every master got keys
  for (int k = 0; k < 10; ++k) {  // and each key sits on its slot's master
    const std::string key = "u:i:k" + std::to_string(k);
    const int slot = std::stoi(nodes_[0]->cli({"CLUSTER", "KEYSLOT", guard.redis_key(key)}));
    ASSERT_EQ(slot, detail::key_slot(guard.redis_key(key)));
    const int owner = owner_of(slot);
    ASSERT_GE(owner, 0);
    EXPECT_NE(nodes_[static_cast<std::size_t>(owner)]->cli(
                  {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}),
              "0");
  }
  EXPECT_TRUE(guard.complete("u:i:k0", firsts[0].owner_token, "done"));
  EXPECT_EQ(guard.claim("u:i:k0", "req-2", "fp").response, "done");
  EXPECT_TRUE(guard.renew("u:i:k1", firsts[1].owner_token));
  EXPECT_TRUE(guard.release("u:i:k2", firsts[2].owner_token));
  EXPECT_EQ(guard.claim("u:i:k2", "req-1", "fp").status, ClaimStatus::kFirst);
}

TEST_P(RedisClusterTest, InspectAndForceReleaseRouteToEachKeysSlot) {
  RedisGuard guard(options());
  constexpr int kKeys = 50;  // spread over every master
  std::vector<ClaimResult> firsts;
  for (int k = 0; k < kKeys; ++k) {
    firsts.push_back(guard.claim("u:i:x" + std::to_string(k), "req-1", "fp"));
    ASSERT_EQ(firsts.back().status, ClaimStatus::kFirst);
  }
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "u:i:x" + std::to_string(k);
    const std::optional<RecordInfo> info = guard.inspect(key);
    ASSERT_TRUE(info.has_value()) << key;
    EXPECT_EQ(info->owner_token, firsts[static_cast<std::size_t>(k)].owner_token);
    EXPECT_EQ(guard.force_release(key, ForceReleaseScope::kInProgressOnly),
              ForceReleaseStatus::kReleased);
    EXPECT_FALSE(guard.inspect(key).has_value()) << key;
  }
}

TEST_P(RedisClusterTest, ClaimBatchSpansNodesAndAnswersInOrder) {
  RedisGuard guard(options());
  std::vector<std::string> keys;
  for (int k = 0; k < 64; ++k) keys.push_back("u:i:b" + std::to_string(k));
  std::vector<ClaimRequest> batch;
  for (const std::string& key : keys) batch.push_back({.key = key, .request_id = "req-1"});
  const std::vector<ClaimResult> first = guard.claim_batch(batch);
  ASSERT_EQ(first.size(), keys.size());
  for (const ClaimResult& result : first) EXPECT_EQ(result.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard.complete(keys[5], first[5].owner_token, "five"));
  const std::vector<ClaimResult> again = guard.claim_batch(batch);
  for (std::size_t i = 0; i < keys.size(); ++i)
    EXPECT_EQ(again[i].status, ClaimStatus::kRepeatSame) << keys[i];
  EXPECT_EQ(again[5].response, "five");
}

TEST_P(RedisClusterTest, FollowsAskDuringASlotMigrationAndMovedAfterIt) {
  RedisGuard guard(options());
  const ClaimResult held = guard.claim("u:i:moving", "req-1", "fp");  // loads the slot map
  ASSERT_EQ(held.status, ClaimStatus::kFirst);
  const std::string held_key = guard.redis_key("u:i:moving");
  const int slot = detail::key_slot(held_key);
  const int source = owner_of(slot);
  ASSERT_GE(source, 0);
  test::RedisServer& from = *nodes_[static_cast<std::size_t>(source)];
  test::RedisServer& to = *nodes_[static_cast<std::size_t>((source + 1) % 3)];
  // A second key text in the same slot.
  std::string other;
  for (int n = 0; other.empty(); ++n) {
    const std::string candidate = "u:i:same-slot-" + std::to_string(n);
    if (detail::key_slot(guard.redis_key(candidate)) == slot) other = candidate;
  }

  const std::string from_id = from.cli({"CLUSTER", "MYID"});
  const std::string to_id = to.cli({"CLUSTER", "MYID"});
  const std::string slot_text = std::to_string(slot);
  ASSERT_EQ(to.cli({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", from_id}), "OK");
  ASSERT_EQ(from.cli({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", to_id}), "OK");

  // Migrating: a key the source lacks is answered ASK → ASKING on the target.
  const ClaimResult moved_first = guard.claim(other, "req-2", "fp");
  EXPECT_EQ(moved_first.status, ClaimStatus::kFirst);
  EXPECT_EQ(to.cli({"CLUSTER", "COUNTKEYSINSLOT", slot_text}), "1");
  EXPECT_EQ(guard.claim("u:i:moving", "req-1", "fp").status,
            ClaimStatus::kRepeatSame);  // still on the source

  const std::string to_port =
      to.url().substr(to.url().rfind(':') + 1, to.url().rfind('/') - to.url().rfind(':') - 1);
  ASSERT_EQ(from.cli({"MIGRATE", "127.0.0.1", to_port, "", "0", "5000", "KEYS", held_key}), "OK");
  for (const auto& node : nodes_) (void)node->cli({"CLUSTER", "SETSLOT", slot_text, "NODE", to_id});

  // Migrated: the guard's map still names the source, which answers MOVED.
  EXPECT_EQ(guard.claim("u:i:moving", "req-1", "fp").status, ClaimStatus::kRepeatSame);
  EXPECT_EQ(guard.claim(other, "req-2", "fp").status, ClaimStatus::kRepeatSame);
  EXPECT_TRUE(guard.complete("u:i:moving", held.owner_token, "moved"));
  EXPECT_EQ(to.cli({"CLUSTER", "COUNTKEYSINSLOT", slot_text}), "2");
}

TEST(RedisClusterOptions, ClusterUrlMustBeTcpWithDatabaseZero) {
  RedisGuardOptions options;
  options.redis.cluster = true;
  options.redis.url = "redis://127.0.0.1:7000/1";
  EXPECT_THROW(RedisGuard{options}, ConfigError);
  options.redis.url = "unix:///tmp/redis.sock";
  EXPECT_THROW(RedisGuard{options}, ConfigError);
}

INSTANTIATE_TEST_SUITE_P(ClaimMethods, RedisClusterTest, test::all_claim_methods(),
                         test::claim_method_name);

}  // namespace
}  // namespace idem
