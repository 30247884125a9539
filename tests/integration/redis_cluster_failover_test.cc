// The Redis guard through a Redis Cluster failover: 3 masters with a replica each on loopback
// (tests/support/redis_cluster.h). A master is SIGKILLed: calls for its slots fail (retryable)
// and open that node's breaker only, while the other masters keep answering; once its replica
// is promoted the guard reloads the slot map on its own and finds the replicated records; the
// async driver's guard follows it too.
#include <gtest/gtest.h>

#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <cctype>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "gcc_coroutine_frames.h"
#include "guard/async_redis_guard.h"
#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "loop_probe.h"
#include "redis/cluster.h"
#include "redis_cluster.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A key text whose Redis key lands in `slot`.
std::string key_in_slot(const RedisGuard& guard, int slot, const std::string& stem) {
  for (int n = 0;; ++n) {
    const std::string candidate = stem + std::to_string(n);
    if (detail::key_slot(guard.redis_key(candidate)) == slot) return candidate;
  }
}

// The node replicating `master` (by its INFO replication), or null.
test::RedisServer* replica_of(const test::ClusterGroup& cluster, const test::RedisServer& master) {
  const std::string of = "master_port:" + std::to_string(master.port());
  for (const auto& node : cluster.nodes()) {
    if (node.get() == &master || !node->running()) continue;
    const std::string info = node->cli({"INFO", "replication"});
    const std::size_t at = info.find(of);
    if (at != std::string::npos &&
        (at + of.size() == info.size() || std::isdigit(info[at + of.size()]) == 0)) {
      return node.get();
    }
  }
  return nullptr;
}

// The harness reads a node's own line as the one flagged "myself", not the first line holding its
// ID: that is its replica's line when CLUSTER NODES happens to list it first (its order is a hash
// table's), and owner_of() would find no owner for a slot right after a claim there succeeded.
TEST(ClusterHarness, TheOwnerIsReadFromTheMyselfLineNotAReplicaLineNamingIt) {
  const std::string master_id = "07c37dfeb235213a872192d90877d0cd55635b91";
  const std::string nodes =
      "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30004@40004 slave " + master_id +
      " 0 1426238317239 4 connected\n" + master_id +
      " 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460\n"
      "67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@40002 master - 0 1426238316232 2 "
      "connected 5461-10922\n";
  EXPECT_TRUE(test::serves_as_master(nodes, 0));
  EXPECT_TRUE(test::serves_as_master(nodes, 5460));
  EXPECT_FALSE(test::serves_as_master(nodes, 5461));  // another master's slot
  const std::string replica =
      "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30004@40004 myself,slave " + master_id +
      " 0 0 4 connected\n" + master_id +
      " 127.0.0.1:30001@40001 master - 0 1426238317239 1 connected 0-5460\n";
  EXPECT_FALSE(test::serves_as_master(replica, 0));  // a replica serves none as master
}

// A guard on `cluster` with short timeouts, its breaker opening after 3 failures for `open_for`.
RedisGuardOptions failover_options(const test::ClusterGroup& cluster, const std::string& name,
                                   milliseconds open_for) {
  RedisGuardOptions options;
  options.redis.url = cluster.seed_url();
  options.redis.cluster = true;
  options.redis.connect_timeout = milliseconds(200);
  options.redis.command_timeout = milliseconds(500);
  options.prefix = test::unique_name(name);
  options.breaker = {.failure_threshold = 3, .open_for = open_for};
  return options;
}

TEST(RedisClusterFailover, AKilledMasterFailsOverToItsReplicaAndOnlyItsBreakerOpens) {
  test::ClusterGroup cluster(3, 1, milliseconds(3000));
  RedisGuard guard(failover_options(cluster, "failover", milliseconds(300)));

  // The victim: the master of the first key's slot; a bystander key on another master.
  const ClaimResult held = guard.claim("u:refund:held", "req-held", "");
  ASSERT_EQ(held.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard.complete("u:refund:held", held.owner_token, "held-response"));
  const int slot = detail::key_slot(guard.redis_key("u:refund:held"));
  test::RedisServer* victim = cluster.owner_of(slot);
  ASSERT_NE(victim, nullptr);
  std::string bystander;
  for (int n = 0; bystander.empty(); ++n) {
    const std::string candidate = "u:refund:by" + std::to_string(n);
    if (cluster.owner_of(detail::key_slot(guard.redis_key(candidate))) != victim) {
      bystander = candidate;
    }
  }
  std::vector<std::string> completed;
  for (int k = 0; k < 10; ++k) {
    completed.push_back(key_in_slot(guard, slot, "u:refund:c" + std::to_string(k) + "-"));
    const ClaimResult first = guard.claim(completed.back(), "req-c", "");
    ASSERT_EQ(first.status, ClaimStatus::kFirst);
    ASSERT_TRUE(guard.complete(completed.back(), first.owner_token, "done"));
  }
  // On the replica before the kill. Not WAIT: from redis-cli's own connection, which wrote
  // nothing, it returns at once (the test then killed a master whose replica had none of the
  // keys, and the promoted replica answered kFirst for every one of them).
  ASSERT_TRUE(test::wait_until(milliseconds(5000), [&] {
    return replica_of(cluster, *victim) != nullptr &&
           replica_of(cluster, *victim)->cli({"DBSIZE"}) == victim->cli({"DBSIZE"});
  })) << "the victim's replica never received its keys";

  const auto killed_at = Clock::now();
  victim->kill();
  // Within cluster-node-timeout nobody has noticed: the victim's slots fail, its breaker
  // opens, and the other masters are untouched by it.
  for (int i = 0; i < 3; ++i) {
    EXPECT_THROW(
        (void)guard.claim(key_in_slot(guard, slot, "u:refund:f" + std::to_string(i)), "req-f", ""),
        RedisError);
  }
  EXPECT_EQ(guard.breaker_state(), BreakerState::kOpen);
  EXPECT_EQ(guard.claim(bystander, "req-by", "").status, ClaimStatus::kFirst);
  ASSERT_LT(Clock::now() - killed_at, milliseconds(3000)) << "the window closed too early";

  // Then the replica takes over; the guard follows without a MOVED (nothing answers on the
  // victim's address) by reloading the slot map after failures.
  const std::string probe = key_in_slot(guard, slot, "u:refund:after-");
  milliseconds unavailable{0};
  for (bool answered = false; !answered;) {
    ASSERT_LT(Clock::now() - killed_at, std::chrono::seconds(30)) << "no failover";
    try {
      EXPECT_EQ(guard.claim(probe, "req-after", "").status, ClaimStatus::kFirst);
      answered = true;
      unavailable = std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at);
    } catch (const RedisError& error) {
      EXPECT_TRUE(error.retryable()) << error.what();
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  std::cerr << "[cluster failover] slot " << slot << " unavailable " << unavailable.count()
            << " ms after SIGKILL (cluster-node-timeout 3000 ms)\n";
  // Every node's view, not only the guard's, has the replica as the slot's master.
  ASSERT_TRUE(cluster.wait_for_new_owner(slot, victim, milliseconds(5000)));
  test::RedisServer* promoted = cluster.owner_of(slot);
  ASSERT_NE(promoted, nullptr);
  EXPECT_NE(promoted, victim);
  EXPECT_EQ(promoted->cli({"EXISTS", guard.redis_key(probe)}), "1");
  const ClaimResult again = guard.claim("u:refund:held", "req-other", "");
  EXPECT_EQ(again.status, ClaimStatus::kRepeatOther);
  EXPECT_EQ(again.response, "held-response");
  for (const std::string& key : completed) {
    EXPECT_EQ(guard.claim(key, "req-other", "").status, ClaimStatus::kRepeatOther) << key;
  }
  EXPECT_EQ(guard.breaker_state(), BreakerState::kClosed);  // the dead node left the map
}

// The async client follows a failover with no MOVED to tell it: a dead master sends none, so it
// loads the slot map again after a call fails, and the calls for the dead master's slots reach
// its promoted replica (a map reloaded only on MOVED would send them to the dead node for good).
// Meanwhile only the dead master's breaker opens (one breaker for the whole cluster refused every
// master's calls for as long as one master was down).
TEST(RedisClusterFailover, TheAsyncGuardOpensOnlyTheKilledMastersBreakerAndFollowsItsSlots) {
  test::ClusterGroup cluster(3, 1, milliseconds(1000));
  const RedisGuardOptions options = failover_options(cluster, "async-failover", milliseconds(100));
  const RedisGuard naming(options);  // for the keys' slots; connects on first use only
  constexpr int kSlot = detail::kClusterSlots - 1;  // the last master's, not the seed's
  test::RedisServer* victim = cluster.owner_of(kSlot);
  ASSERT_NE(victim, nullptr);
  ASSERT_NE(victim, cluster.nodes().front().get());
  std::string bystander;
  for (int n = 0; bystander.empty(); ++n) {
    const std::string candidate = "u:refund:by" + std::to_string(n);
    if (cluster.owner_of(detail::key_slot(naming.redis_key(candidate))) != victim) {
      bystander = candidate;
    }
  }
  std::string probe;
  test::run_coroutine([&](asio::any_io_executor executor) -> asio::awaitable<void> {
    detail::AsyncRedisGuard guard(executor, options);
    // The slot map loaded and the victim's connection open before the kill.
    const std::string before = key_in_slot(naming, kSlot, "u:refund:before-");
    EXPECT_EQ((co_await guard.claim(before, "req-1", "")).status, ClaimStatus::kFirst);
    const auto killed_at = Clock::now();
    victim->kill();
    // Only the victim's breaker opens: another master's slot answers at once meanwhile.
    for (int i = 0; i < 3; ++i) {
      const std::string failing = key_in_slot(naming, kSlot, "u:refund:f" + std::to_string(i));
      EXPECT_THROW((void)co_await guard.claim(failing, "req-f", ""), RedisError);
    }
    EXPECT_EQ((co_await guard.claim(bystander, "req-by", "")).status, ClaimStatus::kFirst);
    EXPECT_LT(Clock::now() - killed_at, milliseconds(1000)) << "the window closed too early";
    asio::steady_timer pause(executor);
    for (int n = 0; Clock::now() - killed_at < std::chrono::seconds(30); ++n) {
      probe = key_in_slot(naming, kSlot, "u:refund:after-" + std::to_string(n) + "-");
      try {
        EXPECT_EQ((co_await guard.claim(probe, "req-2", "")).status, ClaimStatus::kFirst);
        std::cerr << "[async cluster failover] slot " << kSlot << " answered again "
                  << std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at).count()
                  << " ms after SIGKILL (cluster-node-timeout 1000 ms)\n";
        guard.close();
        co_return;
      } catch (const RedisError& error) {
        EXPECT_TRUE(error.retryable()) << error.what();
      }
      pause.expires_after(milliseconds(20));
      co_await pause.async_wait(asio::use_awaitable);
    }
    ADD_FAILURE() << "the async guard never reached the slot's new master";
    probe.clear();
    guard.close();
  });
  ASSERT_FALSE(probe.empty());
  test::RedisServer* promoted = cluster.owner_of(kSlot);
  ASSERT_NE(promoted, nullptr);
  EXPECT_NE(promoted, victim);
  EXPECT_EQ(promoted->cli({"EXISTS", naming.redis_key(probe)}), "1");
}

}  // namespace
}  // namespace idem
