// The Redis guard when Redis fails: each test starts its own private redis-server
// (tests/support/redis_server.h) and kills, stalls or misconfigures only that one.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "claim_methods.h"
#include "idem/errors.h"
#include "idem/redis_guard.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem {
namespace {

using std::chrono::milliseconds;

class RedisFailureTest : public ::testing::TestWithParam<ClaimMethod> {
 protected:
  RedisGuardOptions options(const std::string& url) const {
    RedisGuardOptions guard_options;
    guard_options.redis.url = url;
    guard_options.prefix = test::unique_name("failure");
    guard_options.claim_method = GetParam();
    return guard_options;
  }
  // options(url) with a pool of one connection and the given timeouts.
  RedisGuardOptions one_connection(const std::string& url, milliseconds borrow_timeout,
                                   milliseconds command_timeout) const {
    RedisGuardOptions guard_options = options(url);
    guard_options.redis.pool_size = 1;
    guard_options.redis.borrow_timeout = borrow_timeout;
    guard_options.redis.command_timeout = command_timeout;
    return guard_options;
  }
};

// Retries `call` (bounded) while it throws a retryable RedisError, e.g. during reconnect.
template <class Call>
auto eventually(Call call) {
  for (int attempt = 0;; ++attempt) {
    try {
      return call();
    } catch (const RedisError& error) {
      if (!error.retryable() || attempt == 500) throw;
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
}

// Puts `server` to sleep (DEBUG SLEEP `seconds`) and returns once it no longer answers: a probe
// guard's claim, with a 50 ms command timeout, timed out. The future ends with the sleep ("OK").
std::future<std::string> put_to_sleep(const test::RedisServer& server,
                                      const RedisGuardOptions& like, const std::string& seconds) {
  RedisGuardOptions probe_options = like;
  probe_options.redis = {.url = server.url(), .command_timeout = milliseconds(50)};
  probe_options.breaker.failure_threshold = 0;
  RedisGuard probe(probe_options);
  auto sleeper = std::async(std::launch::async, [&server, seconds] {
    return server.cli({"DEBUG", "SLEEP", seconds});
  });
  for (int i = 0; i < 10000; ++i) {
    try {
      (void)probe.claim("probe-" + std::to_string(i), "req", "");
    } catch (const RedisError&) {
      return sleeper;
    }
  }
  ADD_FAILURE() << "the server never fell asleep";
  return sleeper;
}

TEST_P(RedisFailureTest, SigkillMidRunGivesTypedErrorsAndNeverAWrongFirst) {
  test::RedisServer server(/*persistent=*/true);
  RedisGuardOptions guard_options = options(server.url());
  guard_options.redis.command_timeout = milliseconds(2000);
  RedisGuard guard(guard_options);
  constexpr int kThreads = 8;
  constexpr int kKeysPerThread = 1500;
  // Even keys are already held by another request: a claim of them must never answer kFirst.
  std::vector<ClaimRequest> held;
  std::vector<std::string> held_keys;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kKeysPerThread; i += 2)
      held_keys.push_back(std::to_string(t) + "-" + std::to_string(i));
  }
  for (const std::string& key : held_keys)
    held.push_back({.key = key, .request_id = "req-holder", .fingerprint = ""});
  for (const ClaimResult& result : guard.claim_batch(held))
    ASSERT_EQ(result.status, ClaimStatus::kFirst);

  std::atomic<int> done{0};
  std::atomic<int> errors{0};
  std::atomic<int> untyped{0};
  std::mutex mutex;
  std::vector<std::string> firsts;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeysPerThread; ++i) {
        const std::string key = std::to_string(t) + "-" + std::to_string(i);
        try {
          if (guard.claim(key, "req-" + key, "").status == ClaimStatus::kFirst) {
            EXPECT_EQ(i % 2, 1) << "wrong FIRST for held key " << key;
            std::lock_guard lock(mutex);
            firsts.push_back(key);
          }
        } catch (const RedisError&) {
          ++errors;
        } catch (...) {
          ++untyped;
        }
        ++done;
      }
    });
  }
  while (done.load() < kThreads * kKeysPerThread / 4) std::this_thread::yield();
  server.kill();
  for (std::thread& thread : threads) thread.join();
  EXPECT_GT(errors.load(), 0);
  EXPECT_EQ(untyped.load(), 0);

  server.restart();  // appendfsync always: every claim answered kFirst was durable
  for (const std::string& key : firsts) {
    const ClaimResult again = eventually([&] { return guard.claim(key, "req-" + key, ""); });
    ASSERT_EQ(again.status, ClaimStatus::kRepeatSame) << key;
  }
  for (const std::string& key : held_keys) {
    ASSERT_EQ(eventually([&] { return guard.claim(key, "req-holder", ""); }).status,
              ClaimStatus::kRepeatSame);
  }
}

TEST_P(RedisFailureTest, CommandTimeoutDestroysTheConnectionSoTheNextCallGetsItsOwnAnswer) {
  test::RedisServer server;
  RedisGuardOptions guard_options = options(server.url());
  guard_options.redis.pool_size = 1;
  guard_options.redis.command_timeout = milliseconds(200);
  guard_options.breaker.failure_threshold = 0;
  RedisGuard guard(guard_options);
  ASSERT_EQ(guard.claim("held", "req-1", "").status, ClaimStatus::kFirst);

  // A late reply to claim("held") would say "repeat"; a fresh claim must say kFirst.
  auto sleeper = std::async(std::launch::async, [&] {
    return server.cli({"DEBUG", "SLEEP", "1.5"});
  });
  bool timed_out = false;
  for (int i = 0; i < 10000 && !timed_out; ++i) {
    try {
      ASSERT_EQ(guard.claim("held", "req-2", "").status, ClaimStatus::kRepeatOther);
    } catch (const RedisError& error) {
      EXPECT_TRUE(error.retryable());
      EXPECT_NE(std::string(error.what()).find("timed out"), std::string::npos) << error.what();
      timed_out = true;
    }
  }
  ASSERT_TRUE(timed_out);
  EXPECT_EQ(sleeper.get(), "OK");

  const ClaimResult fresh = guard.claim("fresh", "req-3", "");
  EXPECT_EQ(fresh.status, ClaimStatus::kFirst);
  EXPECT_EQ(guard.claim("held", "req-2", "").status, ClaimStatus::kRepeatOther);
}

TEST_P(RedisFailureTest, ExhaustedPoolFailsAfterTheBorrowTimeout) {
  test::RedisServer server;
  const RedisGuardOptions guard_options =
      one_connection(server.url(), milliseconds(0), milliseconds(5000));
  RedisGuard guard(guard_options);
  auto sleeper = put_to_sleep(server, guard_options, "1");
  // Two claims on a pool of one while the server sleeps: one waits for its reply, the other
  // finds no free connection.
  std::atomic<int> answered{0};
  std::atomic<int> no_connection{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      try {
        EXPECT_EQ(guard.claim("k" + std::to_string(t), "req", "").status, ClaimStatus::kFirst);
        ++answered;
      } catch (const RedisError& error) {
        EXPECT_TRUE(error.retryable());
        EXPECT_NE(std::string(error.what()).find("borrow timeout"), std::string::npos)
            << error.what();
        ++no_connection;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(sleeper.get(), "OK");
  EXPECT_EQ(answered.load(), 1);
  EXPECT_EQ(no_connection.load(), 1);
}

TEST_P(RedisFailureTest, PoolStatsCountTheConnectionInUseAndTheThreadWaitingForIt) {
  test::RedisServer server;
  const RedisGuardOptions guard_options =
      one_connection(server.url(), milliseconds(10000), milliseconds(10000));
  RedisGuard guard(guard_options);
  EXPECT_EQ(guard.pool_stats().size, 1u);
  ASSERT_EQ(guard.claim("warm", "req", "").status, ClaimStatus::kFirst);
  EXPECT_EQ(guard.pool_stats().open, 1u);
  EXPECT_EQ(guard.pool_stats().in_use, 0u);

  // While the server sleeps, one claim holds the only connection and the next one waits.
  auto sleeper = put_to_sleep(server, guard_options, "2");
  const auto seen = [&](std::size_t in_use, std::size_t waiters) {
    for (int i = 0; i < 1000; ++i) {
      const PoolStats stats = guard.pool_stats();
      if (stats.in_use == in_use && stats.waiters == waiters) return true;
      std::this_thread::sleep_for(milliseconds(1));
    }
    return false;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      EXPECT_EQ(guard.claim("k" + std::to_string(t), "req", "").status, ClaimStatus::kFirst);
    });
  }
  EXPECT_TRUE(seen(1, 1));
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(sleeper.get(), "OK");
  EXPECT_TRUE(seen(0, 0));
  EXPECT_EQ(guard.pool_stats().open, 1u);
}

TEST_P(RedisFailureTest, IdleConnectionsClosedByARestartAreReplacedTransparently) {
  test::RedisServer server;
  RedisGuardOptions guard_options = options(server.url());
  guard_options.redis.pool_size = 4;
  RedisGuard guard(guard_options);
  std::vector<std::thread> threads;  // open several pooled connections
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] { (void)guard.claim("warm-" + std::to_string(t), "req", ""); });
  }
  for (std::thread& thread : threads) thread.join();
  server.restart();  // not persistent: the data is gone, every idle connection is dead
  EXPECT_EQ(guard.claim("after-restart", "req", "").status, ClaimStatus::kFirst);
  EXPECT_EQ(guard.claim("after-restart", "req", "").status, ClaimStatus::kRepeatSame);
}

TEST_P(RedisFailureTest, UnreachableServerOpensTheBreakerWhichThenFailsFast) {
  test::RedisServer server;
  const std::string url = server.url();
  server.kill();  // nothing listens on the port any more
  RedisGuardOptions guard_options = options(url);
  guard_options.breaker = {.failure_threshold = 3, .open_for = std::chrono::minutes(10)};
  RedisGuard guard(guard_options);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(guard.breaker_state(), BreakerState::kClosed);
    try {
      (void)guard.claim("k", "req", "");
      ADD_FAILURE() << "claim succeeded without a server";
    } catch (const RedisError& error) {
      EXPECT_TRUE(error.retryable()) << error.what();
    }
  }
  EXPECT_EQ(guard.breaker_state(), BreakerState::kOpen);
  try {
    (void)guard.release("k", std::string(32, '0'));
    ADD_FAILURE() << "the open breaker let a call through";
  } catch (const RedisError& error) {
    EXPECT_TRUE(error.retryable());
    EXPECT_NE(std::string(error.what()).find("circuit breaker open"), std::string::npos)
        << error.what();
  }
}

TEST_P(RedisFailureTest, AuthWithPasswordAndAclUserFromTheUrl) {
  test::RedisServer server(
      false, {"--requirepass", "s3cret", "--user", "app", "on", ">app:pw", "~*", "+@all"});
  const std::string host_port = server.url().substr(std::string("redis://").size());
  RedisGuard with_password(options("redis://:s3cret@" + host_port));
  EXPECT_EQ(with_password.claim("k", "req", "").status, ClaimStatus::kFirst);
  RedisGuard with_user(options("redis://app:app%3Apw@" + host_port));
  EXPECT_EQ(with_user.claim("k", "req", "").status, ClaimStatus::kFirst);

  RedisGuard wrong(options("redis://app:nope@" + host_port));
  try {
    (void)wrong.claim("k", "req", "");
    ADD_FAILURE() << "a wrong password was accepted";
  } catch (const RedisError& error) {
    EXPECT_FALSE(error.retryable()) << error.what();
    EXPECT_NE(std::string(error.what()).find("WRONGPASS"), std::string::npos) << error.what();
  }
  RedisGuard anonymous(options(server.url()));
  EXPECT_THROW((void)anonymous.claim("k", "req", ""), RedisError);
}

// `redis://user:@host` names an ACL user with an empty password (a user made `nopass`). No AUTH
// was sent for it, so the guard ran as the default user, past the user's key restrictions.
TEST_P(RedisFailureTest, AnAclUserWithAnEmptyPasswordIsAuthenticatedNotLeftTheDefaultUser) {
  test::RedisServer server(false, {"--user", "limited", "on", "nopass", "~other:*", "+@all"});
  const std::string host_port = server.url().substr(std::string("redis://").size());
  RedisGuard limited(options("redis://limited:@" + host_port));
  try {
    (void)limited.claim("k", "req", "");
    ADD_FAILURE() << "the claim ran as the default user: the ACL user may only touch other:*";
  } catch (const RedisError& error) {
    EXPECT_FALSE(error.retryable()) << error.what();
    EXPECT_NE(std::string(error.what()).find("NOPERM"), std::string::npos) << error.what();
  }
}

// hiredis allocates an array as soon as it reads its header and frees it element by element: a
// server answering `*2000000000` held the caller's thread for minutes and took gigabytes (a bad
// Sentinel first in the list made discovery fail, a healthy one after it notwithstanding).
TEST(RedisHostileReply, AHugeArrayHeaderIsAProtocolErrorBeforeAnyAllocation) {
  test::RawReplyServer hostile("*2000000000\r\n");
  RedisGuardOptions options;
  options.redis.url = hostile.url();
  RedisGuard guard(options);
  try {
    guard.ping();
    ADD_FAILURE() << "a reply of two billion elements was accepted";
  } catch (const RedisError& error) {
    EXPECT_FALSE(error.retryable()) << error.what();
    EXPECT_NE(std::string(error.what()).find("a reply array of 2000000000 elements"),
              std::string::npos)
        << error.what();
  }
}

// With a sink configured the facade fails open on Redis errors, so a wrong password showed only
// in idem_backend_errors_total: ping() lets a service find it at start-up.
TEST_P(RedisFailureTest, PingTellsAWrongPasswordFromAServerThatIsDown) {
  test::RedisServer server(false, {"--requirepass", "s3cret"});
  const std::string host_port = server.url().substr(std::string("redis://").size());
  RedisGuard right(options("redis://:s3cret@" + host_port));
  EXPECT_NO_THROW(right.ping());
  // The error `guard.ping()` throws: whether it is retryable, and a text it holds ("" for any).
  const auto expect_ping_error = [](RedisGuard& guard, bool retryable, const std::string& text) {
    try {
      guard.ping();
      ADD_FAILURE() << "PING answered; expected an error holding '" << text << "'";
    } catch (const RedisError& error) {
      EXPECT_EQ(error.retryable(), retryable) << error.what();
      EXPECT_NE(std::string(error.what()).find(text), std::string::npos) << error.what();
    }
  };
  RedisGuard wrong(options("redis://:nope@" + host_port));
  expect_ping_error(wrong, false, "WRONGPASS");
  RedisGuard anonymous(options(server.url()));
  expect_ping_error(anonymous, false, "NOAUTH");
  server.kill();
  expect_ping_error(right, true, "");
}

TEST_P(RedisFailureTest, UnixSocketUrlWithDatabase) {
  test::RedisServer server(false, {"--unixsocket", "redis.sock"});  // relative to its dir
  RedisGuard guard(options("unix://" + (server.dir() / "redis.sock").string() + "?db=2"));
  const ClaimResult first = guard.claim("k", "req", "");
  EXPECT_EQ(first.status, ClaimStatus::kFirst);
  EXPECT_EQ(server.cli({"-n", "2", "EXISTS", guard.redis_key("k")}), "1");
  EXPECT_TRUE(guard.release("k", first.owner_token));
}

INSTANTIATE_TEST_SUITE_P(ClaimMethods, RedisFailureTest, test::all_claim_methods(),
                         test::claim_method_name);

}  // namespace
}  // namespace idem
