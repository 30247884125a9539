// PostgreSQL stopped (SIGSTOP) mid-run, on a private cluster this test starts (never the shared
// one): the server-side timeouts cannot fire, so response_timeout must end idem's calls with a
// typed error, and the sink works again once the server continues.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <pqxx/pqxx>
#include <string>
#include <thread>

#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "pg_server.h"
#include "refund_request.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr milliseconds kResponseTimeout{1000};

PgSinkOptions stall_options(const test::PgServer& server) {
  PgSinkOptions options;
  options.conninfo = server.url() + "?connect_timeout=2";
  options.pool_size = 2;
  options.statement_timeout = milliseconds(500);
  options.lock_timeout = milliseconds(200);
  options.response_timeout = kResponseTimeout;
  return options;
}

// A stopped server holds a sink call for response_timeout at most, not for as long as it stays
// stopped.
TEST(PgStall, AClaimOnAStoppedServerEndsAfterTheResponseTimeoutAndTheSinkRecovers) {
  test::PgServer server;
  PgSink sink(stall_options(server));
  sink.migrate();
  ASSERT_EQ(sink.claim("warm", "r0", "").status, SinkStatus::kClaimed);  // a pooled connection

  server.pause();
  const auto start = steady_clock::now();
  try {
    (void)sink.claim("k1", "r1", "");
    ADD_FAILURE() << "a claim on a stopped server returned";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable());
    EXPECT_EQ(error.sqlstate(), "08006");
    EXPECT_NE(std::string(error.what()).find("response_timeout"), std::string::npos)
        << error.what();
  }
  EXPECT_GE(steady_clock::now() - start, kResponseTimeout);
  server.resume();

  SinkClaim claim;
  for (int attempt = 0;; ++attempt) {  // the statement sent before the stop may land first
    try {
      claim = sink.claim("k1", "r1", "");
      break;
    } catch (const PostgresError& error) {
      ASSERT_TRUE(error.retryable()) << error.what();
      ASSERT_LT(attempt, 20) << "the sink never recovered: " << error.what();
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  // The claim sent before the stop reached the server when it continued, or it did not.
  EXPECT_TRUE(claim.status == SinkStatus::kClaimed || claim.same_request);
}

TEST(PgStall, ACommitOnAStoppedServerEndsAfterTheResponseTimeoutWithItsOutcomeUnknown) {
  test::PgServer server;
  PgSink sink(stall_options(server));
  sink.migrate();
  const auto start = steady_clock::now();
  try {
    sink.transact([&](pqxx::transaction_base& tx) {
      ASSERT_EQ(sink.claim(tx, "k2", "r2", "").status, SinkStatus::kClaimed);
      server.pause();  // the COMMIT that follows gets no answer
    });
    ADD_FAILURE() << "a commit on a stopped server returned";
  } catch (const PostgresError& error) {
    EXPECT_FALSE(error.retryable());
    EXPECT_NE(std::string(error.what()).find("response_timeout"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("commit outcome unknown"), std::string::npos)
        << error.what();
  }
  EXPECT_GE(steady_clock::now() - start, kResponseTimeout);
  server.resume();
}

// run_transactional() prepares the record's INSERT on a connection's first record: that round
// trip is bounded by the response timeout too, so a server stopped while the handler runs holds
// the call for response_timeout at most.
TEST(PgStall, ARecordPreparedOnAStoppedServerEndsAfterTheResponseTimeout) {
  test::PgServer server;
  auto sink = std::make_shared<PgSink>(stall_options(server));
  sink->migrate();
  DeduplicatorOptions options;
  options.sink = sink;
  options.local_cache_capacity = 0;
  Deduplicator dedup(options);
  const Request request = test::refund_request("r-record", "o-record");
  const auto start = steady_clock::now();
  auto call = std::async(std::launch::async, [&] {
    return dedup.run_transactional(request, [&](pqxx::transaction_base&) {
      server.pause();  // the record's Prepare, then the COMMIT, get no answer
      return std::string("refunded");
    });
  });
  const bool ended = call.wait_for(kResponseTimeout * 6) == std::future_status::ready;
  server.resume();  // unblocks a call that was not bounded
  ASSERT_TRUE(ended) << "the call waited on the stopped server past 6x response_timeout";
  try {
    const Outcome outcome = call.get();
    EXPECT_EQ(outcome.kind, Outcome::Kind::kUnavailable) << outcome.error;
  } catch (const PostgresError& error) {
    EXPECT_NE(std::string(error.what()).find("response_timeout"), std::string::npos)
        << error.what();
  }
  EXPECT_GE(steady_clock::now() - start, kResponseTimeout);
}

// A transaction begun after the server stopped waits in BEGIN for response_timeout at most.
TEST(PgStall, ATransactionBegunOnAStoppedServerEndsAfterTheResponseTimeout) {
  test::PgServer server;
  PgSink sink(stall_options(server));
  sink.migrate();
  sink.transact([&](pqxx::transaction_base& tx) { (void)sink.claim(tx, "warm", "r0", ""); });
  server.pause();
  const auto start = steady_clock::now();
  bool body_ran = false;
  try {
    sink.transact([&](pqxx::transaction_base&) { body_ran = true; });
    ADD_FAILURE() << "a transaction on a stopped server returned";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable()) << error.what();
    EXPECT_NE(std::string(error.what()).find("response_timeout"), std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(body_ran);
  EXPECT_GE(steady_clock::now() - start, kResponseTimeout);
  server.resume();
}

// With no connect_timeout in the connection string, opening a connection to a stopped server
// (its kernel still accepts the TCP connection) is bounded all the same.
TEST(PgStall, ConnectingToAStoppedServerIsBoundedWithoutAConnectTimeoutSetting) {
  test::PgServer server;
  PgSinkOptions options = stall_options(server);
  options.conninfo = server.url();  // no connect_timeout: derived from response_timeout (2 s)
  PgSink sink(options);
  server.pause();
  const auto start = steady_clock::now();
  EXPECT_THROW(sink.ping(), PostgresError);
  EXPECT_LT(steady_clock::now() - start, std::chrono::seconds(30));  // bounded, not exact
  server.resume();
  EXPECT_NO_THROW(sink.ping());
}

TEST(PgStall, AResponseTimeoutNotAboveTheServerTimeoutsIsAConfigError) {
  PgSinkOptions options;
  options.conninfo = "postgresql://127.0.0.1:1/none";
  options.statement_timeout = milliseconds(5000);
  options.response_timeout = milliseconds(5000);
  EXPECT_THROW(PgSink{options}, ConfigError);
  options.statement_timeout = milliseconds(0);
  options.lock_timeout = milliseconds(2000);
  options.response_timeout = milliseconds(1000);
  EXPECT_THROW(PgSink{options}, ConfigError);
  options.response_timeout = milliseconds(0);  // no client-side bound
  EXPECT_NO_THROW(PgSink{options});
  // A server timeout of 0 waits without limit: a client-side bound would cut a legitimate wait.
  options.statement_timeout = milliseconds(0);
  options.lock_timeout = milliseconds(1000);
  options.response_timeout = milliseconds(10000);
  EXPECT_THROW(PgSink{options}, ConfigError);
  options.statement_timeout = milliseconds(5000);
  options.lock_timeout = milliseconds(0);
  EXPECT_THROW(PgSink{options}, ConfigError);
  options.lock_timeout = milliseconds(1000);
  options.response_timeout = milliseconds::max();  // saturates: never fires
  EXPECT_NO_THROW(PgSink{options});
  // PostgreSQL takes these as an int of ms: a larger value must be refused up front, or it would
  // fail every call.
  options.statement_timeout = milliseconds(3'000'000'000);
  EXPECT_THROW(PgSink{options}, ConfigError);
}

}  // namespace
}  // namespace idem
