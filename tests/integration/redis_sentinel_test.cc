// The Redis guard behind Redis Sentinel (a redis-sentinel:// URL, Lettuce's form): master
// discovery, the ROLE check, skipping a Sentinel that is down, and failing over when the master
// is SIGKILLed or handed over by SENTINEL FAILOVER. Every test runs its own master, replica and
// three Sentinels on loopback (tests/support/redis_sentinel.h).
#include "redis_sentinel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "counting_proxy.h"
#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "redis/connection.h"
#include "redis/url.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem {
namespace {

// Whether the replica holds every key of the master (bounded wait). Not WAIT from redis-cli: its
// own connection wrote nothing, so WAIT returns at once whatever the replica has.
bool replica_caught_up(const test::SentinelGroup& group) {
  return test::wait_until(std::chrono::milliseconds(5000), [&] {
    const test::RedisServer* replica = group.server_at(group.replica_address());
    return replica != nullptr && replica->cli({"DBSIZE"}) == group.master().cli({"DBSIZE"});
  });
}

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

RedisGuardOptions sentinel_options(const std::string& url) {
  RedisGuardOptions options;
  options.redis.url = url;
  options.redis.connect_timeout = milliseconds(200);
  options.redis.command_timeout = milliseconds(500);
  options.prefix = test::unique_name("sentinel");
  return options;
}

// Claims `key` every 20 ms until a claim returns; how long that took. Fails the test after
// `limit`.
std::optional<milliseconds> time_to_first_answer(RedisGuard& guard, const std::string& key,
                                                 milliseconds limit) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    try {
      EXPECT_EQ(guard.claim(key, "req-after", "").status, ClaimStatus::kFirst);
      return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    } catch (const RedisError& error) {
      EXPECT_TRUE(error.retryable()) << error.what();
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  ADD_FAILURE() << "no claim succeeded within " << limit.count() << " ms of the failover";
  return std::nullopt;
}

class RedisSentinelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { group_ = std::make_unique<test::SentinelGroup>(); }
  static void TearDownTestSuite() { group_.reset(); }
  static inline std::unique_ptr<test::SentinelGroup> group_;
};

TEST_F(RedisSentinelTest, ClaimsGoToTheMasterTheSentinelsName) {
  RedisGuard guard(sentinel_options(group_->url()));
  guard.ping();
  const ClaimResult first = guard.claim("u:refund:o-1", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  ASSERT_TRUE(guard.complete("u:refund:o-1", first.owner_token, "done"));
  EXPECT_NE(group_->master().cli({"GET", guard.redis_key("u:refund:o-1")}), "");
  const ClaimResult again = guard.claim("u:refund:o-1", "req-2", "fp");
  EXPECT_EQ(again.status, ClaimStatus::kRepeatOther);
  EXPECT_EQ(again.response, "done");
  EXPECT_EQ(guard.breaker_state(), BreakerState::kClosed);
}

TEST_F(RedisSentinelTest, ASentinelThatIsDownIsSkipped) {
  // Nothing listens on port 1: the first Sentinel of the list refuses the connection.
  const std::string url = group_->url();
  const std::string prefix = "redis-sentinel://";
  RedisGuard guard(sentinel_options(prefix + "127.0.0.1:1," + url.substr(prefix.size())));
  EXPECT_EQ(guard.claim("u:refund:o-2", "req-1", "").status, ClaimStatus::kFirst);
}

TEST_F(RedisSentinelTest, AnUnknownMasterNameIsNotRetryable) {
  std::string url = group_->url();
  url = url.substr(0, url.find('#')) + "#no-such-master";
  RedisGuard guard(sentinel_options(url));
  try {
    guard.ping();
    FAIL() << "a master name no Sentinel monitors must fail";
  } catch (const RedisError& error) {
    EXPECT_FALSE(error.retryable()) << error.what();
    EXPECT_NE(std::string(error.what()).find("no-such-master"), std::string::npos) << error.what();
  }
}

TEST_F(RedisSentinelTest, NoSentinelAnsweringIsRetryable) {
  RedisGuard guard(sentinel_options("redis-sentinel://127.0.0.1:1,127.0.0.1:2#idem-master"));
  try {
    guard.ping();
    FAIL() << "no Sentinel answers";
  } catch (const RedisError& error) {
    EXPECT_TRUE(error.retryable()) << error.what();
  }
}

TEST_F(RedisSentinelTest, TheRoleCheckRefusesAReplica) {
  const std::string replica = group_->replica_address();
  ASSERT_FALSE(replica.empty());
  detail::ConnectionSettings settings;
  settings.endpoint = detail::parse_redis_url("redis://" + replica + "/0");
  settings.require_master = true;
  try {
    detail::Connection connection(settings);
    FAIL() << replica << " is a replica and must be refused";
  } catch (const RedisError& error) {
    EXPECT_TRUE(error.retryable());
    EXPECT_NE(std::string(error.what()).find("not a master"), std::string::npos) << error.what();
  }
  settings.endpoint = detail::parse_redis_url("redis://" + group_->master_address() + "/0");
  EXPECT_NO_THROW(detail::Connection{settings});
}

// Every Sentinel silent (connections taken, nothing answered), no master known yet: the calls
// that wait for the one discovery under way get its error, as the calls waiting on a round do in
// the async driver, instead of each asking the Sentinels in turn (the last one waited a command
// timeout per call before it).
TEST(RedisSentinelDiscovery, CallsWaitingForAFailedDiscoveryShareItsErrorInsteadOfAskingInTurn) {
  test::RedisServer silent;  // stands in for a Sentinel of a paused VM
  test::CountingProxy proxy(test::CountingProxy::Protocol::kRedis, "127.0.0.1", silent.port());
  silent.pause();
  RedisGuardOptions options =
      sentinel_options("redis-sentinel://127.0.0.1:" + std::to_string(proxy.port()) + "#m");
  options.redis.command_timeout = milliseconds(300);
  RedisGuard guard(options);
  constexpr int kCalls = 6;
  std::atomic<int> retryable{0};
  std::vector<std::thread> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.emplace_back([&, i] {
      try {
        (void)guard.claim("u:refund:silent-" + std::to_string(i), "req", "");
      } catch (const RedisError& error) {
        if (error.retryable()) ++retryable;
      }
    });
  }
  for (std::thread& call : calls) call.join();
  EXPECT_EQ(retryable.load(), kCalls);
  const std::size_t asked = proxy.commands()["SENTINEL"];
  EXPECT_GE(asked, 1U);
  EXPECT_LE(asked, 2U) << "the waiting calls asked the silent Sentinel one after another";
  silent.resume();
}

// SIGKILL of the master: calls fail (retryable) until the Sentinels promote the replica, then
// the guard follows them. Records replicated before the kill answer as before: never kFirst.
TEST(RedisSentinelFailover, FollowsTheSentinelsAfterTheMasterIsKilled) {
  test::SentinelGroup group(milliseconds(1000));
  RedisGuard guard(sentinel_options(group.url()));
  std::vector<std::string> owners;
  for (int k = 0; k < 20; ++k) {
    const std::string key = "u:refund:k" + std::to_string(k);
    const ClaimResult first = guard.claim(key, "req-" + std::to_string(k), "");
    ASSERT_EQ(first.status, ClaimStatus::kFirst);
    ASSERT_TRUE(guard.complete(key, first.owner_token, "done-" + std::to_string(k)));
  }
  // Replicated to the one replica before the kill (asynchronous replication would lose
  // unreplicated writes: the sink catches those, see docs/operations.md).
  ASSERT_TRUE(replica_caught_up(group));

  const auto killed_at = Clock::now();
  const std::string old_master = group.kill_master();
  const std::optional<milliseconds> unavailable =
      time_to_first_answer(guard, "u:refund:after-kill", milliseconds(30000));
  ASSERT_TRUE(unavailable.has_value());
  ASSERT_TRUE(group.wait_for_new_master(old_master, milliseconds(1000)));
  const auto promoted = std::chrono::duration_cast<milliseconds>(Clock::now() - killed_at);
  std::cerr << "[sentinel failover] unavailable " << unavailable->count() << " ms (master "
            << old_master << " killed; new master " << group.master_address() << " seen by "
            << promoted.count() << " ms)\n";
  EXPECT_NE(group.master_address(), old_master);
  EXPECT_NE(group.master().cli({"GET", guard.redis_key("u:refund:after-kill")}), "");
  for (int k = 0; k < 20; ++k) {
    const ClaimResult again = guard.claim("u:refund:k" + std::to_string(k), "req-x", "");
    EXPECT_EQ(again.status, ClaimStatus::kRepeatOther) << k;
    EXPECT_EQ(again.response, "done-" + std::to_string(k));
  }
}

// SENTINEL FAILOVER hands the master role to the replica while the old master lives on: the
// Sentinels demote it (and close its clients), and the guard must not keep writing there.
TEST(RedisSentinelFailover, FollowsAManualFailover) {
  test::SentinelGroup group(milliseconds(1000));
  RedisGuard guard(sentinel_options(group.url()));
  ASSERT_EQ(guard.claim("u:refund:before", "req-1", "").status, ClaimStatus::kFirst);
  ASSERT_TRUE(replica_caught_up(group));
  const std::string old_master = group.master_address();
  ASSERT_EQ(group.sentinels()[0]->cli({"SENTINEL", "FAILOVER", test::SentinelGroup::kMasterName}),
            "OK");
  ASSERT_TRUE(group.wait_for_new_master(old_master, milliseconds(20000)));
  // The old master becomes a replica: a write there answers READONLY (or its connections are
  // closed); either way the guard asks the Sentinels again.
  const auto start = Clock::now();
  bool moved = false;
  while (!moved && Clock::now() - start < std::chrono::seconds(20)) {
    try {
      const std::string key = "u:refund:probe-" + std::to_string((Clock::now() - start).count());
      (void)guard.claim(key, "req-1", "");
      moved = group.master().cli({"EXISTS", guard.redis_key(key)}) == "1";
    } catch (const RedisError& error) {
      EXPECT_TRUE(error.retryable()) << error.what();
    }
    if (!moved) std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(moved) << "the guard kept writing to the old master " << old_master;
  EXPECT_EQ(guard.claim("u:refund:before", "req-2", "").status, ClaimStatus::kRepeatOther);
}

}  // namespace
}  // namespace idem
