// A process killed between its Postgres commit and its Redis complete: the Redis claim stays
// IN_PROGRESS until its lease ends, and then the committed Postgres row decides.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <pqxx/pqxx>
#include <thread>

#include "idem/deduplicator.h"
#include "redis_server.h"
#include "test_env.h"

namespace idem {
namespace {

using namespace std::chrono_literals;

Request refund_request() {
  Request r;
  r.request_id = "crash-r1";
  r.user = "u1";
  r.intent = "refund";
  r.biz_key = "order-1";
  return r;
}

std::unique_ptr<Deduplicator> make(const std::string& redis_url, const std::string& pg_url,
                                   const std::string& schema,
                                   std::chrono::milliseconds command_timeout) {
  RedisGuardOptions guard;
  guard.redis.url = redis_url;
  guard.redis.command_timeout = command_timeout;
  guard.lease = 3s;
  PgSinkOptions sink;
  sink.conninfo = pg_url;
  sink.schema = schema;
  DeduplicatorOptions options;
  options.local_cache_capacity = 0;
  options.guard = std::make_shared<RedisGuard>(guard);
  options.sink = std::make_shared<PgSink>(sink);
  options.sink->migrate();
  return std::make_unique<Deduplicator>(std::move(options));
}

std::int64_t ledger_rows(const std::string& pg_url, const std::string& schema) {
  pqxx::connection conn(pg_url);
  pqxx::work tx(conn);
  return tx.exec1("SELECT count(*) FROM " + schema + ".ledger")[0].as<std::int64_t>();
}

TEST(DeduplicatorCrash, KilledBetweenCommitAndRedisCompleteTheSinkDecidesTheRetry) {
  IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
  test::RedisServer redis;  // private: the test makes it sleep
  const std::string schema = test::unique_name("crash");
  {
    pqxx::connection conn(pg_url);
    pqxx::work tx(conn);
    tx.exec0("CREATE SCHEMA " + schema);
    tx.exec0("CREATE TABLE " + schema + ".ledger (order_id text NOT NULL)");
    tx.commit();
  }

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child: a long command timeout, so it hangs in the Redis complete until it is killed.
    const auto dedup = make(redis.url(), pg_url, schema, 30s);
    (void)dedup->run_transactional(refund_request(), [&](pqxx::transaction_base& tx) {
      tx.exec0("INSERT INTO " + schema + ".ledger VALUES ('order-1')");
      // Redis stops answering for 2 s, right before the commit and the Redis complete.
      const std::string sleep = "redis-cli -u '" + redis.url() + "' DEBUG SLEEP 2 >/dev/null &";
      if (std::system(sleep.c_str()) != 0) ::_exit(3);
      std::this_thread::sleep_for(300ms);
      return std::string("refunded");
    });
    ::_exit(0);  // not reached in the test's timeline: the parent kills it first
  }

  // The parent: wait for the child's commit, then kill it while it waits on Redis.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (ledger_rows(pg_url, schema) == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child must die between commit and complete";
  ASSERT_EQ(ledger_rows(pg_url, schema), 1);

  const auto retry = make(redis.url(), pg_url, schema, 5s);
  const Outcome early = retry->run_transactional(refund_request(), [](pqxx::transaction_base&) {
    ADD_FAILURE() << "must not run while the claim is held";
    return std::string();
  });
  EXPECT_EQ(early.kind, Outcome::Kind::kInProgress) << "never told it succeeded, never run again";
  EXPECT_EQ(early.layer, Layer::kRedisGuard);

  std::this_thread::sleep_for(3500ms);  // the 3 s lease ends in Redis
  const Outcome late = retry->run_transactional(refund_request(), [](pqxx::transaction_base&) {
    ADD_FAILURE() << "the committed row must stop it";
    return std::string();
  });
  EXPECT_EQ(late.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(late.layer, Layer::kPgSink);
  EXPECT_EQ(late.response, "refunded");
  EXPECT_EQ(ledger_rows(pg_url, schema), 1);

  pqxx::connection conn(pg_url);
  pqxx::work tx(conn);
  tx.exec0("DROP SCHEMA " + schema + " CASCADE");
  tx.commit();
}

}  // namespace
}  // namespace idem
