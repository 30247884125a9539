// The Redis guard against a private 3-master Redis Cluster on loopback (started by the test,
// tests/support/redis_cluster.h): slot routing, batches across nodes, ASK during a slot
// migration and MOVED after it.
#include "redis_cluster.h"

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
#include "test_env.h"
#include "tls_certs.h"

namespace idem {
namespace {

class RedisClusterTest : public ::testing::TestWithParam<ClaimMethod> {
 protected:
  static void SetUpTestSuite() { cluster_ = std::make_unique<test::ClusterGroup>(3, 0); }
  static void TearDownTestSuite() { cluster_.reset(); }

  static const std::vector<std::unique_ptr<test::RedisServer>>& nodes() {
    return cluster_->nodes();
  }

  RedisGuardOptions options() const {
    RedisGuardOptions guard_options;
    guard_options.redis.url = cluster_->seed_url();
    guard_options.redis.cluster = true;
    guard_options.prefix = test::unique_name("cluster");
    guard_options.claim_method = GetParam();
    return guard_options;
  }

  static inline std::unique_ptr<test::ClusterGroup> cluster_;
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
  for (const auto& node : nodes()) EXPECT_NE(node->cli({"DBSIZE"}), "0");  // every master got keys
  for (int k = 0; k < 10; ++k) {  // and each key sits on its slot's master
    const std::string key = "u:i:k" + std::to_string(k);
    const int slot = std::stoi(nodes()[0]->cli({"CLUSTER", "KEYSLOT", guard.redis_key(key)}));
    ASSERT_EQ(slot, detail::key_slot(guard.redis_key(key)));
    test::RedisServer* owner = cluster_->owner_of(slot);
    ASSERT_NE(owner, nullptr);
    EXPECT_NE(owner->cli({"CLUSTER", "COUNTKEYSINSLOT", std::to_string(slot)}), "0");
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

TEST_P(RedisClusterTest, EachKeysStepJournalSharesItsRecordsSlot) {
  RedisGuard guard(options());
  constexpr int kKeys = 50;  // spread over every master: a journal on another slot is CROSSSLOT
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "u:i:j" + std::to_string(k);
    const ClaimResult first = guard.claim(key, "req-1", "fp");
    ASSERT_EQ(first.status, ClaimStatus::kFirst);
    ASSERT_TRUE(guard.put_step(key, first.owner_token, "tool", JournaledStep{"", "booked"})) << key;
    EXPECT_EQ(guard.steps(key).at("tool").result, "booked") << key;
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
  test::RedisServer* source = cluster_->owner_of(slot);
  ASSERT_NE(source, nullptr);
  test::RedisServer& from = *source;
  test::RedisServer& to = *nodes()[nodes()[0].get() == source ? 1 : 0];
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
  for (const auto& node : nodes())
    (void)node->cli({"CLUSTER", "SETSLOT", slot_text, "NODE", to_id});

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

// A rediss:// seed: the guard reaches every master over TLS with the seed's settings, at the TLS
// port the cluster tells a TLS client, and claims, completes and replays there.
TEST(RedisClusterTls, ClaimsRouteToTheMasterOfEachSlotOverTls) {
  const test::TestCertificates certs;
  const test::ClusterGroup cluster(3, 0, std::chrono::milliseconds(5000), &certs);
  RedisGuardOptions options;
  options.redis.url = cluster.tls_seed_url();
  options.redis.cluster = true;
  options.prefix = test::unique_name("cluster-tls");
  RedisGuard guard(options);
  constexpr int kKeys = 30;
  std::vector<ClaimResult> firsts;
  for (int k = 0; k < kKeys; ++k) {
    firsts.push_back(guard.claim("u:i:t" + std::to_string(k), "req-1", "fp"));
    ASSERT_EQ(firsts.back().status, ClaimStatus::kFirst);
  }
  for (const auto& node : cluster.nodes()) EXPECT_NE(node->cli({"DBSIZE"}), "0");
  EXPECT_TRUE(guard.complete("u:i:t0", firsts[0].owner_token, "done"));
  EXPECT_EQ(guard.claim("u:i:t0", "req-2", "fp").response, "done");
}

}  // namespace
}  // namespace idem
