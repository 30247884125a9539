// The asynchronous Redis client (src/redis/async_connection.h, async_client.h) against real
// redis-server processes: completion tokens, automatic pipelining, per-command timeouts that
// never pair a late reply with the next command, cancellation, NOSCRIPT reload, AUTH/SELECT,
// reconnects, TLS (rediss://), and a loop that keeps running while Redis is SIGSTOPped.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "exception_ptr.h"
#include "idem/errors.h"
#include "loop_probe.h"
#include "redis/async_client.h"
#include "redis/async_connection.h"
#include "redis/url.h"
#include "redis_server.h"
#include "test_env.h"
#include "tls_certs.h"
#include "tls_front.h"

namespace idem::detail {
namespace {

using namespace std::chrono_literals;
using Args = std::vector<std::string_view>;

std::string text(const ReplyPtr& reply) { return std::string(reply->str, reply->len); }

AsyncConnectionSettings settings_for(const std::string& url,
                                     std::chrono::milliseconds timeout = 1000ms) {
  return AsyncConnectionSettings{
      .endpoint = parse_redis_url(url), .connect_timeout = timeout, .command_timeout = timeout};
}

using test::run_coroutine;

class RedisAsyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = test::service_setting("IDEM_TEST_REDIS_URL");
    if (url_.empty()) {
      if (std::getenv("CI") != nullptr) FAIL() << "IDEM_TEST_REDIS_URL is not set (CI requires it)";
      GTEST_SKIP() << "IDEM_TEST_REDIS_URL is not set; run `scripts/dev services start`";
    }
    prefix_ = test::unique_name("async") + ":";
  }
  std::string url_;
  std::string prefix_;
};

TEST_F(RedisAsyncTest, CoroutineCallbackAndFutureTokens) {
  asio::io_context io;
  auto connection = AsyncConnection::create(io.get_executor(), settings_for(url_));
  const std::string key = prefix_ + "k";
  std::string from_coroutine;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        const Args cmd1{"SET", key, "v1"};
        ReplyPtr set = co_await connection->exec(cmd1, asio::use_awaitable);
        EXPECT_EQ(text(set), "OK");
        const Args cmd2{"GET", key};
        ReplyPtr get = co_await connection->exec(cmd2, asio::use_awaitable);
        from_coroutine = text(get);
        connection->close();  // an open connection keeps reading, and so keeps run() going
      },
      asio::detached);
  io.run();
  EXPECT_EQ(from_coroutine, "v1");

  std::string from_callback;
  connection->exec(Args{"APPEND", key, "+cb"}, [&](std::exception_ptr error, ReplyPtr reply) {
    EXPECT_EQ(error, nullptr);
    from_callback = std::to_string(reply->integer);
    connection->close();
  });
  io.restart();
  io.run();
  EXPECT_EQ(from_callback, "5");

  // A future is waited on from another thread than the loop's.
  auto work = asio::make_work_guard(io);
  io.restart();
  std::thread loop([&] { io.run(); });
  std::future<ReplyPtr> future =
      asio::post(io, asio::use_future([&] {
                   return connection->exec(Args{"GET", key}, asio::use_future);
                 }))
          .get();
  EXPECT_EQ(text(future.get()), "v1+cb");
  asio::post(io, [&] { connection->close(); });
  work.reset();
  loop.join();
}

TEST_F(RedisAsyncTest, ConcurrentCommandsShareWritesAndRepliesMatchInOrder) {
  asio::io_context io;
  auto connection = AsyncConnection::create(io.get_executor(), settings_for(url_));
  const std::string key = prefix_ + "counter";
  constexpr int kCommands = 1000;
  std::vector<long long> seen(kCommands, -1);
  for (int i = 0; i < kCommands; ++i) {
    connection->exec(Args{"INCR", key},
                     [&seen, &connection, i](std::exception_ptr error, ReplyPtr reply) {
                       ASSERT_EQ(error, nullptr);
                       seen[static_cast<std::size_t>(i)] = reply->integer;
                       if (i == kCommands - 1) connection->close();
                     });
  }
  EXPECT_EQ(connection->in_flight(), static_cast<std::size_t>(kCommands));
  io.run();
  // The i-th command issued got the i-th INCR's answer: replies matched in order.
  for (int i = 0; i < kCommands; ++i) EXPECT_EQ(seen[static_cast<std::size_t>(i)], i + 1);
  // All 1000 issued in one turn went out in one write (after the connect).
  EXPECT_EQ(connection->writes(), 1u);
  EXPECT_EQ(connection->connects(), 1u);
  EXPECT_EQ(connection->in_flight(), 0u);
}

TEST_F(RedisAsyncTest, ErrorRepliesAreRepliesNotExceptions) {
  run_coroutine([&](auto) -> asio::awaitable<void> {
    auto connection =
        AsyncConnection::create(co_await asio::this_coro::executor, settings_for(url_));
    const Args cmd3{"NOSUCHCOMMAND"};
    ReplyPtr reply = co_await connection->exec(cmd3, asio::use_awaitable);
    EXPECT_EQ(reply->type, REDIS_REPLY_ERROR);
    const Args cmd4{"PING"};
    ReplyPtr ping = co_await connection->exec(cmd4, asio::use_awaitable);
    EXPECT_EQ(text(ping), "PONG");
    connection->close();
  });
}

// A command that outlives its timeout fails, the connection is closed, and the next command
// gets its own reply, never the late one (DEBUG SLEEP's +OK would pass for SET's).
TEST(RedisAsync, LateReplyIsNeverPairedWithTheNextCommand) {
  test::RedisServer server;
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto connection = AsyncConnection::create(executor, settings_for(server.url(), 200ms));
    const auto started = std::chrono::steady_clock::now();
    try {
      const Args cmd5{"DEBUG", "SLEEP", "0.6"};
      (void)co_await connection->exec(cmd5, asio::use_awaitable);
      ADD_FAILURE() << "DEBUG SLEEP 0.6 must time out after 200 ms";
    } catch (const RedisError& error) {
      EXPECT_TRUE(error.retryable());
      EXPECT_NE(std::string(error.what()).find("timed out"), std::string::npos) << error.what();
    }
    const auto waited = std::chrono::steady_clock::now() - started;
    EXPECT_GE(waited, 200ms);
    EXPECT_LT(waited, 500ms);
    asio::steady_timer pause(executor, 600ms);  // let the server wake up
    co_await pause.async_wait(asio::use_awaitable);
    const Args cmd6{"GET", "absent-key"};
    ReplyPtr get = co_await connection->exec(cmd6, asio::use_awaitable);
    EXPECT_EQ(get->type, REDIS_REPLY_NIL);
    EXPECT_EQ(connection->connects(), 2u);
    connection->close();
  });
}

TEST_F(RedisAsyncTest, CancelledCommandCompletesAtOnceAndItsReplyIsDropped) {
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto connection = AsyncConnection::create(executor, settings_for(url_));
    const std::string key = prefix_ + "c";
    asio::cancellation_signal signal;
    bool cancelled = false;
    connection->exec(
        Args{"SET", key, "first"},
        asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr error, ReplyPtr reply) {
          EXPECT_EQ(reply, nullptr);
          try {
            std::rethrow_exception(error);
          } catch (const Cancelled&) {
            cancelled = true;
          }
        }));
    signal.emit(asio::cancellation_type::terminal);
    const Args cmd7{"GET", key};
    ReplyPtr get = co_await connection->exec(cmd7, asio::use_awaitable);
    EXPECT_TRUE(cancelled);
    // The SET still ran (it was queued); its reply went to nobody, GET got its own.
    EXPECT_EQ(text(get), "first");
    EXPECT_EQ(connection->connects(), 1u);
    connection->close();
  });
}

TEST(RedisAsync, EvalshaReloadsTheScriptAfterNoscript) {
  test::RedisServer server;
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    AsyncClientSettings settings{.connection = settings_for(server.url())};
    auto client = AsyncClient::create(executor, settings);
    constexpr std::string_view kBody = "return ARGV[1] .. KEYS[1]";
    const Args cmd8{"SCRIPT", "LOAD", kBody};
    ReplyPtr loaded = co_await client->exec(cmd8, asio::use_awaitable);
    const std::string sha = text(loaded);
    const LuaScript script{kBody, sha};
    const Args cmd9{"SCRIPT", "FLUSH"};
    (void)co_await client->exec(cmd9, asio::use_awaitable);
    const Args cmd10{"k"};
    const Args cmd11{"a"};
    ReplyPtr first = co_await client->evalsha(script, cmd10, cmd11, asio::use_awaitable);
    EXPECT_EQ(text(first), "ak");
    const Args cmd12{"k"};
    const Args cmd13{"b"};
    ReplyPtr second = co_await client->evalsha(script, cmd12, cmd13, asio::use_awaitable);
    EXPECT_EQ(text(second), "bk");
    client->close();
  });
  const std::string stats = server.cli({"INFO", "commandstats"});
  // One SCRIPT LOAD by the test, one after the flush: the second EVALSHA needed none.
  EXPECT_NE(stats.find("cmdstat_script|load:calls=2,"), std::string::npos) << stats;
}

TEST(RedisAsync, AuthAndSelectPrecedeQueuedCommands) {
  test::RedisServer server(false, {"--requirepass", "s3cret"});
  const std::string base = server.url();  // redis://127.0.0.1:PORT/0
  const std::string host_port = base.substr(8, base.rfind('/') - 8);
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto good =
        AsyncConnection::create(executor, settings_for("redis://:s3cret@" + host_port + "/3"));
    const Args cmd14{"SET", "in-db-3", "x"};
    ReplyPtr set = co_await good->exec(cmd14, asio::use_awaitable);
    EXPECT_EQ(text(set), "OK");
    good->close();
    auto bad = AsyncConnection::create(executor,
                                       settings_for("redis://:n0tThePassw0rd@" + host_port + "/0"));
    try {
      const Args cmd15{"PING"};
      (void)co_await bad->exec(cmd15, asio::use_awaitable);
      ADD_FAILURE() << "a wrong password must fail the command";
    } catch (const RedisError& error) {
      EXPECT_FALSE(error.retryable()) << error.what();
      EXPECT_EQ(std::string(error.what()).find("n0tThePassw0rd"), std::string::npos)
          << "the password must not reach the message";
    }
  });
  EXPECT_EQ(server.cli({"--no-auth-warning", "-a", "s3cret", "-n", "3", "GET", "in-db-3"}), "x");
}

// `redis://user:@host`: the user's AUTH is sent with its empty password (an ACL user made
// `nopass`), so the connection is that user, not the default one.
TEST(RedisAsync, AnAclUserWithAnEmptyPasswordIsAuthenticatedNotLeftTheDefaultUser) {
  test::RedisServer server(false, {"--user", "limited", "on", "nopass", "~other:*", "+@all"});
  const std::string host_port = server.url().substr(std::string("redis://").size());
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto limited = AsyncConnection::create(executor, settings_for("redis://limited:@" + host_port));
    const Args allowed{"SET", "other:k", "x"};
    EXPECT_EQ(text(co_await limited->exec(allowed, asio::use_awaitable)), "OK");
    const Args refused{"SET", "mine", "x"};
    const ReplyPtr reply = co_await limited->exec(refused, asio::use_awaitable);
    EXPECT_EQ(reply->type, REDIS_REPLY_ERROR);
    EXPECT_NE(std::string(reply->str, reply->len).find("NOPERM"), std::string::npos);
    limited->close();
  });
}

// The async reader has the same cap as the blocking one (a hostile array header fails the read
// before hiredis allocates it).
TEST(RedisAsync, AHugeArrayHeaderIsAProtocolErrorBeforeAnyAllocation) {
  test::RawReplyServer hostile("*2000000000\r\n");
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto connection = AsyncConnection::create(executor, settings_for(hostile.url()));
    try {
      const Args ping{"PING"};
      (void)co_await connection->exec(ping, asio::use_awaitable);
      ADD_FAILURE() << "a reply of two billion elements was accepted";
    } catch (const RedisError& error) {
      EXPECT_NE(std::string(error.what()).find("a reply array of 2000000000 elements"),
                std::string::npos)
          << error.what();
    }
    connection->close();
  });
}

TEST(RedisAsync, PendingCommandsFailWhenTheServerDiesAndTheNextReconnects) {
  test::RedisServer server;
  asio::io_context io;
  auto connection = AsyncConnection::create(io.get_executor(), settings_for(server.url()));
  std::vector<std::exception_ptr> errors;
  connection->exec(Args{"PING"}, [](std::exception_ptr error, ReplyPtr) { ASSERT_FALSE(error); });
  io.run_for(200ms);
  for (int i = 0; i < 10; ++i) {
    connection->exec(Args{"BLPOP", "never", "0"},
                     [&](std::exception_ptr error, ReplyPtr) { errors.push_back(error); });
  }
  io.restart();
  io.run_for(100ms);
  server.kill();
  io.run_for(500ms);
  ASSERT_EQ(errors.size(), 10u);
  for (const auto& error : errors) {
    try {
      std::rethrow_exception(error);
    } catch (const RedisError& e) {
      EXPECT_TRUE(e.retryable()) << e.what();
    }
  }
  server.restart();
  std::string answer;
  connection->exec(Args{"PING"}, [&](std::exception_ptr error, ReplyPtr reply) {
    ASSERT_FALSE(error);
    answer = text(reply);
    connection->close();
  });
  io.restart();
  io.run();
  EXPECT_EQ(answer, "PONG");
  EXPECT_EQ(connection->connects(), 2u);
}

// A PING on a connection to `url` (commands bounded by `timeout`), the loop run `idle` more,
// then `meanwhile` while the loop does not run, then a PING more: it must be answered, on the
// connection `connects` says (1: the first).
void expect_the_next_ping_answered(const std::string& url, std::chrono::milliseconds timeout,
                                   std::chrono::milliseconds idle,
                                   const std::function<void()>& meanwhile, std::uint64_t connects) {
  asio::io_context io;
  auto connection = AsyncConnection::create(io.get_executor(), settings_for(url, timeout));
  connection->exec(Args{"PING"}, [](std::exception_ptr error, ReplyPtr) { ASSERT_FALSE(error); });
  io.run_for(idle);
  meanwhile();
  std::exception_ptr failed;
  std::string answer;
  connection->exec(Args{"PING"}, [&](std::exception_ptr error, ReplyPtr reply) {
    failed = error;
    if (!error) answer = text(reply);
    connection->close();
  });
  io.restart();
  io.run();
  EXPECT_FALSE(failed) << test::what(failed);
  EXPECT_EQ(answer, "PONG");
  EXPECT_EQ(connection->connects(), connects);
}

// A PING on a connection to `url`, then `restart` (of the server behind it) while the loop does
// not run, then a PING more: it must be answered, on a second connection.
void expect_a_missed_restart_costs_no_command(const std::string& url,
                                              const std::function<void()>& restart) {
  expect_the_next_ping_answered(url, 1000ms, 200ms, restart, 2);
}

// The server restarted while the loop did not run (a frozen serverless instance, a worker idle
// between messages): the idle connection's end was never read, and the next command was written
// into it and failed. The end is seen before the write now, and the command goes on a new one.
TEST(RedisAsync, ACommandAfterARestartTheIdleLoopMissedGoesOnANewConnection) {
  test::RedisServer server;
  expect_a_missed_restart_costs_no_command(server.url(), [&] { server.restart(); });
}

// A command on a connection with nothing in flight is written when it is issued, not a turn of
// the loop later: the server has it while the loop is not running. A second one issued meanwhile
// waits for the loop, to share a write with whatever else comes in that turn.
TEST(RedisAsync, ACommandWithNothingInFlightIsWrittenWhenIssued) {
  test::RedisServer server;
  asio::io_context io;
  auto connection = AsyncConnection::create(io.get_executor(), settings_for(server.url()));
  connection->exec(Args{"PING"}, [](std::exception_ptr error, ReplyPtr) { ASSERT_FALSE(error); });
  io.run_for(200ms);  // connected, and the PING answered: idle
  const std::uint64_t writes = connection->writes();
  int answered = 0;
  const auto count = [&](std::exception_ptr error, ReplyPtr) {
    EXPECT_FALSE(error) << test::what(error);
    if (++answered == 2) connection->close();
  };
  connection->exec(Args{"SET", "written-when-issued", "yes"}, count);
  connection->exec(Args{"SET", "written-by-the-loop", "yes"}, count);
  EXPECT_EQ(connection->writes(), writes + 1);
  std::string seen;
  for (const auto until = std::chrono::steady_clock::now() + 2s;
       seen != "yes" && std::chrono::steady_clock::now() < until;) {
    seen = server.cli({"GET", "written-when-issued"});
    if (seen != "yes") std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(seen, "yes") << "the command waited for the loop";
  EXPECT_EQ(server.cli({"EXISTS", "written-by-the-loop"}), "0");
  io.restart();
  io.run();
  EXPECT_EQ(answered, 2);
  EXPECT_EQ(connection->writes(), writes + 2);
  EXPECT_EQ(server.cli({"GET", "written-by-the-loop"}), "yes");
}

// What the socket does not take of a command written when issued goes out with the loop's
// writes, whole: a 32 MB value (beyond a loopback socket's send buffer) arrives intact.
TEST(RedisAsync, ACommandTheSocketDoesNotTakeAtOnceArrivesWhole) {
  test::RedisServer server;
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto connection = AsyncConnection::create(executor, settings_for(server.url(), 10s));
    const Args ping{"PING"};
    (void)co_await connection->exec(ping, asio::use_awaitable);
    std::string value(32u << 20, 'v');
    value.back() = 'e';
    const Args set{"SET", "large", value};
    EXPECT_EQ(text(co_await connection->exec(set, asio::use_awaitable)), "OK");
    const Args get{"GET", "large"};
    EXPECT_TRUE(text(co_await connection->exec(get, asio::use_awaitable)) == value);
    connection->close();
  });
}

// An idle connection's deadline timer stays armed for the last command it sent; when it fires
// with nothing due, the connection stays up: no reconnect, and the next command is answered.
TEST(RedisAsync, AnIdleConnectionOutlivesItsLastCommandsDeadline) {
  test::RedisServer server;
  // Commands bounded by 100 ms; the first one's deadline passes while the connection is idle.
  expect_the_next_ping_answered(
      server.url(), 100ms, 400ms, [] {}, 1);
}

// The loop never blocks on a stopped server: a 1 ms timer keeps firing (no gap over kMaxLoopGap)
// while 1 000 commands wait on a SIGSTOPped redis-server, and they end at their timeout.
TEST(RedisAsync, LoopKeepsRunningWhileRedisIsStopped) {
  test::RedisServer server;
  asio::io_context io;
  auto connection = AsyncConnection::create(io.get_executor(), settings_for(server.url(), 300ms));
  connection->exec(Args{"PING"}, [](std::exception_ptr error, ReplyPtr) { ASSERT_FALSE(error); });
  io.run_for(200ms);
  io.restart();
  server.pause();
  test::FailureTally<RedisError> tally([](const RedisError& e) { EXPECT_TRUE(e.retryable()); });
  const auto deadline = std::chrono::steady_clock::now() + 300ms;  // when they are due to end
  for (int i = 0; i < 1000; ++i)
    connection->exec(Args{"SET", "stopped:" + std::to_string(i), "x"}, tally.handler());
  test::LoopProbe probe(io, 600ms);
  io.run();
  server.resume();
  EXPECT_EQ(tally.failed(), 1000);
  EXPECT_GE(tally.last_end(), 300ms);
  EXPECT_LT(tally.last_own_end(), 450ms + test::kSanitizerSlack);
  test::expect_loop_never_blocked(probe, deadline);
}

// The error a PING on `connection` ends with; a failure of the test (`why`) when it succeeds.
asio::awaitable<RedisError> ping_failure(std::shared_ptr<AsyncConnection> connection,
                                         std::string why) {
  try {
    const Args ping{"PING"};
    (void)co_await connection->exec(ping, asio::use_awaitable);
  } catch (const RedisError& error) {
    co_return error;
  }
  ADD_FAILURE() << why;
  co_return RedisError("the PING succeeded", false);
}

// A redis-server with a TLS port, its certificates signed by a throwaway CA.
struct TlsRedis {
  test::TestCertificates certs;
  int tls_port = test::free_port();
  test::RedisServer server{false,
                           {"--tls-port", std::to_string(tls_port), "--tls-cert-file",
                            certs.server_cert(), "--tls-key-file", certs.server_key(),
                            "--tls-ca-cert-file", certs.ca_file(), "--tls-auth-clients", "no"}};
};

TEST(RedisAsync, TlsConnectionVerifiesTheServer) {
  const TlsRedis tls;
  const test::TestCertificates& certs = tls.certs;
  const int tls_port = tls.tls_port;
  const std::string base = "rediss://127.0.0.1:" + std::to_string(tls_port) + "/0";
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto secure =
        AsyncConnection::create(executor, settings_for(base + "?ca_file=" + certs.ca_file()));
    const Args cmd16{"SET", "over-tls", "yes"};
    ReplyPtr set = co_await secure->exec(cmd16, asio::use_awaitable);
    EXPECT_EQ(text(set), "OK");
    const Args cmd17{"GET", "over-tls"};
    ReplyPtr get = co_await secure->exec(cmd17, asio::use_awaitable);
    EXPECT_EQ(text(get), "yes");
    secure->close();

    auto untrusted =
        AsyncConnection::create(executor, settings_for(base + "?ca_file=" + certs.other_ca_file()));
    const RedisError foreign_ca =
        co_await ping_failure(untrusted, "a server signed by another CA must be refused");
    EXPECT_FALSE(foreign_ca.retryable()) << foreign_ca.what();
    EXPECT_NE(std::string(foreign_ca.what()).find("TLS"), std::string::npos) << foreign_ca.what();

    auto wrong_name = AsyncConnection::create(
        executor,
        settings_for(base + "?ca_file=" + certs.ca_file() + "&server_name=redis.example"));
    const RedisError other_name =
        co_await ping_failure(wrong_name, "a certificate for another name must be refused");
    EXPECT_FALSE(other_name.retryable()) << other_name.what();
  });
  EXPECT_EQ(tls.server.cli({"GET", "over-tls"}), "yes");
}

// As ACommandAfterARestartTheIdleLoopMissedGoesOnANewConnection, over TLS: the idle check sees the
// end of a TLS connection too (redis-server 7.0 sends no TLS alert ahead of it that would hide it).
TEST(RedisAsync, ACommandAfterARestartTheIdleLoopMissedGoesOnANewTlsConnection) {
  TlsRedis tls;
  expect_a_missed_restart_costs_no_command(
      "rediss://127.0.0.1:" + std::to_string(tls.tls_port) + "/0?ca_file=" + tls.certs.ca_file(),
      [&] { tls.server.restart(); });
}

// The same behind a TLS terminator (stunnel): when the server behind it restarts, the front sends
// a TLS close_notify alert and waits for the client's before it closes. The idle check looked for
// the end only, saw none, and the next command was written into the ending connection and failed
// ("connection closed by the server").
TEST(RedisAsync, ACommandAfterARestartBehindATlsFrontTheIdleLoopMissedGoesOnANewConnection) {
  const test::TestCertificates certs;
  test::RedisServer server;
  const test::TlsFront front(certs, server.port());
  expect_a_missed_restart_costs_no_command(
      "rediss://127.0.0.1:" + std::to_string(front.port()) + "/0?ca_file=" + certs.ca_file(), [&] {
        server.restart();
        std::this_thread::sleep_for(100ms);  // the front's alert reaches the idle connection
      });
}

// redis-server closes, unanswered, a connection whose first bytes are not a TLS handshake: the
// error names the likely cause, a redis:// URL at a TLS port.
TEST(RedisAsync, ARedisUrlAtATlsPortSaysToUseRediss) {
  const TlsRedis tls;
  const int tls_port = tls.tls_port;
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto plain = AsyncConnection::create(
        executor, settings_for("redis://127.0.0.1:" + std::to_string(tls_port) + "/0"));
    const RedisError closed = co_await ping_failure(plain, "a TLS port answered a plaintext PING");
    EXPECT_TRUE(closed.retryable()) << closed.what();
    EXPECT_NE(std::string(closed.what()).find("use a rediss:// URL"), std::string::npos)
        << closed.what();
    plain->close();
  });
}

TEST(RedisAsync, MissingTlsFileIsAConfigError) {
  asio::io_context io;
  EXPECT_THROW(
      (void)AsyncConnection::create(
          io.get_executor(), settings_for("rediss://127.0.0.1:1/0?ca_file=/nonexistent/ca.pem")),
      ConfigError);
}

}  // namespace
}  // namespace idem::detail
