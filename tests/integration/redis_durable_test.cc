// RedisGuardOptions::min_replicas against a private master and its replica on loopback: a claim,
// a completion and a renewal are answered once the replica holds them (WAIT in the same write),
// and not as acknowledged when the replica is stopped (SIGSTOP: connected, silent). Both guards
// (RedisGuard, the async driver's AsyncRedisGuard) and both facades, guard only. A counting
// proxy in front of the master shows which commands carry a WAIT.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "claim_methods.h"
#include "counting_proxy.h"
#include "gcc_coroutine_frames.h"
#include "guard/async_redis_guard.h"
#include "idem/async_deduplicator.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "loop_probe.h"
#include "redis_server.h"
#include "refund_request.h"
#include "test_env.h"
#include "wait_until.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

// A test that expects an acknowledgement waits long for it: on a loaded machine (CI runs the
// suite on 2 shared cores) a replica may wait hundreds of ms for a core. A test that expects
// none waits less.
constexpr auto kPatient = 1500ms;
constexpr auto kReplicationTimeout = 250ms;

// A master and its replica, in sync, for the whole suite; a counting proxy in front of the
// master.
class DurableTest : public ::testing::TestWithParam<ClaimMethod> {
 protected:
  static void SetUpTestSuite() {
    const std::vector<std::string> args = {"--repl-diskless-sync-delay", "0"};
    master_ = std::make_unique<test::RedisServer>(false, args);
    std::vector<std::string> replica_args = args;
    replica_args.insert(replica_args.end(),
                        {"--replicaof", "127.0.0.1", std::to_string(master_->port())});
    replica_ = std::make_unique<test::RedisServer>(false, replica_args);
    // Online by the master's account, not only synced by the replica's: until its first
    // acknowledgement (sent each second) the master counts it in no WAIT.
    ASSERT_TRUE(test::wait_until(10s, [] {
      return master_->cli({"INFO", "replication"}).find(",state=online,") != std::string::npos;
    }));
    proxy_ = std::make_unique<test::CountingProxy>(test::CountingProxy::Protocol::kRedis,
                                                   "127.0.0.1", master_->port());
  }
  static void TearDownTestSuite() {
    proxy_.reset();
    replica_.reset();
    master_.reset();
  }
  void SetUp() override { proxy_->reset(); }
  void TearDown() override { replica_->resume(); }

  // A durable guard through the proxy, with a prefix of its own, waiting `replication_timeout`.
  static RedisGuardOptions options(ClaimMethod method,
                                   std::chrono::milliseconds replication_timeout = kPatient) {
    RedisGuardOptions options;
    options.redis.url = "redis://127.0.0.1:" + std::to_string(proxy_->port()) + "/0";
    options.redis.command_timeout = 2s;
    options.prefix = test::unique_name("durable");
    options.claim_method = method;
    options.min_replicas = 1;
    options.replication_timeout = replication_timeout;
    return options;
  }
  static std::size_t sent(const std::string& command) {
    const auto commands = proxy_->commands();
    const auto found = commands.find(command);
    return found == commands.end() ? 0 : found->second;
  }

  static inline std::unique_ptr<test::RedisServer> master_;
  static inline std::unique_ptr<test::RedisServer> replica_;
  static inline std::unique_ptr<test::CountingProxy> proxy_;
};

// The error message of a write the replica did not acknowledge.
void expect_not_acknowledged(const RedisError& error) {
  EXPECT_TRUE(error.retryable()) << error.what();
  EXPECT_NE(std::string(error.what()).find("not acknowledged by 1 replica(s) within 250 ms"),
            std::string::npos)
      << error.what();
}

TEST_P(DurableTest, AClaimIsAnsweredOnceTheReplicaHoldsIt) {
  RedisGuard guard(options(GetParam()));
  // The scripts loaded first (a NOSCRIPT sends the write, and its WAIT, once more).
  const ClaimResult warm = guard.claim("u:refund:warm", "req-0", "");
  ASSERT_TRUE(guard.complete("u:refund:warm", warm.owner_token, "done"));
  proxy_->reset();
  const std::string key = guard.redis_key("u:refund:o-1");
  const ClaimResult first = guard.claim("u:refund:o-1", "req-1", "fp");
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  EXPECT_TRUE(first.replicated);
  EXPECT_EQ(replica_->cli({"EXISTS", key}), "1");  // at once: no waiting for the replica here
  ASSERT_TRUE(guard.complete("u:refund:o-1", first.owner_token, "done"));
  EXPECT_EQ(replica_->cli({"GET", key}), master_->cli({"GET", key}));
  EXPECT_EQ(sent("WAIT"), 2U);  // one per write: the claim's and the completion's
}

TEST_P(DurableTest, WithTheReplicaStoppedAFirstClaimIsNotReplicatedAndACompletionThrows) {
  RedisGuard guard(options(GetParam(), kReplicationTimeout));
  ASSERT_EQ(guard.claim("u:refund:other", "req-0", "").status, ClaimStatus::kFirst);
  replica_->pause();
  const auto start = std::chrono::steady_clock::now();
  const ClaimResult first = guard.claim("u:refund:o-2", "req-1", "fp");
  EXPECT_GE(std::chrono::steady_clock::now() - start, kReplicationTimeout);
  ASSERT_EQ(first.status, ClaimStatus::kFirst);
  EXPECT_FALSE(first.replicated);
  EXPECT_FALSE(first.owner_token.empty());  // the caller owns it (on the master only)
  // A repeat wrote nothing: replicated says nothing about it.
  const ClaimResult repeat = guard.claim("u:refund:other", "req-2", "");
  EXPECT_EQ(repeat.status, ClaimStatus::kRepeatOther);
  EXPECT_TRUE(repeat.replicated);
  try {
    (void)guard.renew("u:refund:o-2", first.owner_token);
    ADD_FAILURE() << "a renewal the replica did not acknowledge must throw";
  } catch (const RedisError& error) {
    expect_not_acknowledged(error);
  }
  try {
    (void)guard.complete("u:refund:o-2", first.owner_token, "done");
    ADD_FAILURE() << "a completion the replica did not acknowledge must throw";
  } catch (const RedisError& error) {
    expect_not_acknowledged(error);
  }
  // A completion that changes nothing (not the owner) is no write: false, no throw.
  EXPECT_FALSE(guard.complete("u:refund:o-2", "ffffffffffffffffffffffffffffffff", "x"));
  const ClaimResult second = guard.claim("u:refund:o-3", "req-3", "");
  ASSERT_FALSE(second.replicated);
  const std::size_t waits = sent("WAIT");
  EXPECT_TRUE(guard.release("u:refund:o-3", second.owner_token));
  EXPECT_EQ(sent("WAIT"), waits) << "release() waits for no replica";
  EXPECT_EQ(guard.breaker_state(), BreakerState::kClosed);  // Redis answered every call
}

TEST_P(DurableTest, ABatchWaitsOnceForAllItsClaims) {
  RedisGuard guard(options(GetParam()));
  ASSERT_EQ(guard.claim("u:refund:warm", "req-0", "").status, ClaimStatus::kFirst);  // script
  proxy_->reset();
  std::vector<std::string> keys;
  std::vector<ClaimRequest> requests;
  for (int k = 0; k < 10; ++k) keys.push_back("u:refund:b" + std::to_string(k));
  for (const std::string& key : keys) requests.push_back({key, "req-1", ""});
  for (const ClaimResult& result : guard.claim_batch(requests)) {
    EXPECT_EQ(result.status, ClaimStatus::kFirst);
    EXPECT_TRUE(result.replicated);
  }
  EXPECT_EQ(sent("WAIT"), 1U);
  replica_->pause();
  for (std::string& key : keys) key += "-again";
  requests.clear();
  for (const std::string& key : keys) requests.push_back({key, "req-1", ""});
  for (const ClaimResult& result : guard.claim_batch(requests)) {
    EXPECT_EQ(result.status, ClaimStatus::kFirst);
    EXPECT_FALSE(result.replicated);
  }
}

TEST_P(DurableTest, TheAsyncGuardAnswersOnceTheReplicaHoldsTheClaim) {
  const RedisGuardOptions guard_options = options(GetParam());
  const RedisGuard naming(guard_options);  // for the keys' names; connects on first use only
  test::run_coroutine([&](asio::any_io_executor executor) -> asio::awaitable<void> {
    detail::AsyncRedisGuard guard(executor, guard_options);
    const ClaimResult first = co_await guard.claim("u:refund:a-1", "req-1", "fp");
    EXPECT_EQ(first.status, ClaimStatus::kFirst);
    EXPECT_TRUE(first.replicated);
    EXPECT_EQ(replica_->cli({"EXISTS", naming.redis_key("u:refund:a-1")}), "1");
    EXPECT_TRUE(co_await guard.renew("u:refund:a-1", first.owner_token, 10s));
    EXPECT_TRUE(co_await guard.complete("u:refund:a-1", first.owner_token, "done", 0ms));
    guard.close();
  });
}

TEST_P(DurableTest, TheAsyncGuardSaysAClaimTheStoppedReplicaMissedIsNotReplicated) {
  const RedisGuardOptions guard_options = options(GetParam(), kReplicationTimeout);
  test::run_coroutine([&](asio::any_io_executor executor) -> asio::awaitable<void> {
    detail::AsyncRedisGuard guard(executor, guard_options);
    EXPECT_EQ((co_await guard.claim("u:refund:warm", "req-0", "")).status, ClaimStatus::kFirst);
    replica_->pause();
    const ClaimResult first = co_await guard.claim("u:refund:a-2", "req-1", "fp");
    EXPECT_EQ(first.status, ClaimStatus::kFirst);
    EXPECT_FALSE(first.replicated);
    EXPECT_FALSE(first.owner_token.empty());
    const ClaimResult repeat = co_await guard.claim("u:refund:warm", "req-2", "");
    EXPECT_EQ(repeat.status, ClaimStatus::kRepeatOther);
    EXPECT_TRUE(repeat.replicated);
    try {
      (void)co_await guard.renew("u:refund:a-2", first.owner_token, 1s);
      ADD_FAILURE() << "a renewal the replica did not acknowledge must throw";
    } catch (const RedisError& error) {
      expect_not_acknowledged(error);
    }
    try {
      (void)co_await guard.complete("u:refund:a-2", first.owner_token, "done", 0ms);
      ADD_FAILURE() << "a completion the replica did not acknowledge must throw";
    } catch (const RedisError& error) {
      expect_not_acknowledged(error);
    }
    const ClaimResult second = co_await guard.claim("u:refund:a-3", "req-3", "");
    EXPECT_FALSE(second.replicated);
    const std::size_t waits = sent("WAIT");
    EXPECT_TRUE(co_await guard.release("u:refund:a-3", second.owner_token));
    EXPECT_EQ(sent("WAIT"), waits) << "release() waits for no replica";
    guard.close();
  });
}

// Automatic pipelining keeps its worth: the claims of one loop turn go in one write with one
// WAIT after them, not a WAIT (a replica round trip, blocking the connection) per claim.
TEST_P(DurableTest, TheAsyncClaimsOfOneLoopTurnShareOneWait) {
  const RedisGuardOptions guard_options = options(GetParam());
  constexpr int kClaims = 50;
  int replicated = 0;
  test::run_coroutine([&](asio::any_io_executor executor) -> asio::awaitable<void> {
    detail::AsyncRedisGuard guard(executor, guard_options);
    int done = 0;
    for (int k = 0; k < kClaims; ++k) {
      asio::co_spawn(
          executor,
          [&, k]() -> asio::awaitable<void> {
            const ClaimResult result =
                co_await guard.claim("u:refund:p" + std::to_string(k), "req-1", "");
            replicated += result.status == ClaimStatus::kFirst && result.replicated ? 1 : 0;
            ++done;
          },
          asio::detached);
    }
    while (done < kClaims) {
      asio::steady_timer timer(executor, 5ms);
      co_await timer.async_wait(asio::use_awaitable);
    }
    guard.close();
  });
  EXPECT_EQ(replicated, kClaims);
  EXPECT_LE(sent("WAIT"), 2U) << "claims sent in one loop turn waited for the replica apart";
}

// Guard only, failing closed (the default without a sink): a call whose claim the replica did
// not acknowledge runs nothing and answers Unavailable, and its claim is released; with the
// replica back, the next delivery executes. Both drivers.
TEST_P(DurableTest, AGuardOnlyCallIsUnavailableUntilTheReplicaAcknowledgesItsClaim) {
  const RedisGuardOptions guard_options = options(GetParam());
  const auto guard = std::make_shared<RedisGuard>(guard_options);
  DeduplicatorOptions blocking_options;
  blocking_options.guard = guard;
  blocking_options.local_cache_capacity = 0;
  Deduplicator blocking(blocking_options);
  AsyncDeduplicatorOptions async_options;
  async_options.base.local_cache_capacity = 0;
  async_options.redis = guard_options;
  const auto request = [](const std::string& order) {
    return test::refund_request("req-" + order, order);
  };
  // The async driver's call of `request`, on a loop of its own; how often its handler ran.
  const auto run_async = [&](const Request& r, int& ran) {
    Outcome outcome;
    asio::io_context io;
    AsyncDeduplicator dedup(io.get_executor(), async_options);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          outcome = co_await dedup.run(
              r,
              [&](AsyncContext&) -> asio::awaitable<std::string> {
                ++ran;
                co_return "done";
              },
              asio::use_awaitable);
          dedup.close();
        },
        asio::detached);
    io.run();
    return outcome;
  };
  replica_->pause();
  int ran = 0;
  const Outcome refused = blocking.run(request("o-b"), [&] {
    ++ran;
    return std::string("done");
  });
  EXPECT_EQ(refused.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(refused.layer, Layer::kRedisGuard);
  EXPECT_NE(refused.error.find("not acknowledged"), std::string::npos) << refused.error;
  const Outcome refused_async = run_async(request("o-a"), ran);
  EXPECT_EQ(refused_async.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(ran, 0);
  // Released: nothing of either call stays on the master.
  EXPECT_EQ(master_->cli({"--scan", "--pattern", guard_options.prefix + ":*"}), "")
      << "an unreplicated claim was kept";
  replica_->resume();
  // The replica, running again, acknowledges again (at once, unless it waits for a core).
  int probes = 0;
  ASSERT_TRUE(test::wait_until(
      10s, [&] { return guard->claim("probe-" + std::to_string(++probes), "", "").replicated; }));
  const Outcome executed = blocking.run(request("o-b"), [&] { return std::string("done"); });
  EXPECT_EQ(executed.kind, Outcome::Kind::kExecuted) << executed.error;
  const Outcome executed_async = run_async(request("o-a"), ran);
  EXPECT_EQ(executed_async.kind, Outcome::Kind::kExecuted) << executed_async.error;
  EXPECT_EQ(ran, 1);
}

INSTANTIATE_TEST_SUITE_P(ClaimMethods, DurableTest, test::all_claim_methods(),
                         test::claim_method_name);

}  // namespace
}  // namespace idem
