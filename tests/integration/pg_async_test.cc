// The asynchronous PostgreSQL connection (src/pg/async_connection.h) against real servers:
// parameters, pipelined concurrent statements, statements sharing a sync point, batches sent
// and completed as one operation, errors with their SQLSTATE, cancellation of a running
// statement or a batch (57014 as idem::Cancelled), a loop that
// keeps running while PostgreSQL is SIGSTOPped, and TLS (sslmode=verify-full) for both the
// async connection and libpqxx.
#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "exception_ptr.h"
#include "gcc_coroutine_frames.h"
#include "idem/errors.h"
#include "loop_probe.h"
#include "pg/async_connection.h"
#include "pg_server.h"
#include "tcp_segments.h"
#include "test_env.h"
#include "tls_certs.h"

namespace idem::detail {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string value(const PgResultPtr& result, int row = 0, int column = 0) {
  return PQgetvalue(result.get(), row, column);
}

PgAsyncSettings settings_for(const std::string& conninfo,
                             std::chrono::milliseconds timeout = 5000ms) {
  return PgAsyncSettings{
      .conninfo = conninfo, .connect_timeout = timeout, .statement_timeout = timeout};
}

using test::run_coroutine;

// A table of the test's own on the server (dropped at the end), and a connection that is
// connected and idle, on a loop that is not running.
struct IdleConnection {
  IdleConnection(const std::string& url, const std::string& name)
      : table(test::unique_name(name)),
        admin(url),
        connection(PgAsyncConnection::create(io.get_executor(), settings_for(url))) {
    pqxx::nontransaction(admin).exec0("CREATE TABLE " + table + " (x int)");
    connection->exec("SELECT 1", {}, [](std::exception_ptr, PgResultPtr) {});
    io.run();
    io.restart();
  }
  ~IdleConnection() {
    try {
      pqxx::nontransaction(admin).exec0("DROP TABLE " + table);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }
  IdleConnection(const IdleConnection&) = delete;
  IdleConnection& operator=(const IdleConnection&) = delete;

  // The table's rows `where`, as another session sees them.
  int rows(const std::string& where = "true") {
    return pqxx::nontransaction(admin)
        .exec1("SELECT count(*) FROM " + table + " WHERE " + where)[0]
        .as<int>();
  }

  std::string table;
  pqxx::connection admin;
  asio::io_context io;
  std::shared_ptr<PgAsyncConnection> connection;
};

TEST(PgAsync, ParametersNullsAndErrorsWithTheirSqlstate) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto connection = PgAsyncConnection::create(executor, settings_for(url));
    PgParams params{"41", std::nullopt};  // named: GCC 12 rejects a braced list in co_await
    PgResultPtr sum = co_await connection->exec("SELECT $1::int + 1, $2::text IS NULL",
                                                std::move(params), asio::use_awaitable);
    EXPECT_EQ(value(sum, 0, 0), "42");
    EXPECT_EQ(value(sum, 0, 1), "t");
    try {
      PgParams zero{"0"};
      (void)co_await connection->exec("SELECT 1 / $1::int", std::move(zero), asio::use_awaitable);
      ADD_FAILURE() << "division by zero must fail";
    } catch (const PostgresError& error) {
      EXPECT_EQ(error.sqlstate(), "22012");
      EXPECT_FALSE(error.retryable());
    }
    // Each statement has its own sync point: the error aborted nothing after it.
    PgResultPtr after = co_await connection->exec("SELECT 'ok'", {}, asio::use_awaitable);
    EXPECT_EQ(value(after), "ok");
    EXPECT_EQ(connection->connects(), 1u);
  });
}

// The settings' `prepared` texts are parsed and planned once per connection (sent by name after a
// Prepare in the first flight); a Prepare that fails is sent again next time (it was marked
// prepared, and the next use failed with 26000 "prepared statement does not exist" instead of
// the statement's own error); other SQL stays unnamed; an index past them is an idem::Error.
TEST(PgAsync, ThePreparedTextsArePreparedOncePerConnectionAndAFailedPrepareAgain) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    PgAsyncSettings settings = settings_for(url);
    const std::string sum = "SELECT $1::int + 1";
    const std::string missing = "SELECT * FROM idem_no_such_table WHERE x = $1";
    settings.prepared = {sum, missing};
    auto connection = PgAsyncConnection::create(executor, settings);
    for (int i = 0; i < 3; ++i) {
      PgParams params{std::to_string(i)};
      PgResultPtr result = co_await connection->exec(PgStatement::prepared(0), std::move(params),
                                                     asio::use_awaitable);
      EXPECT_EQ(value(result), std::to_string(i + 1));
    }
    for (int i = 0; i < 2; ++i) {
      try {
        PgParams params{"1"};
        (void)co_await connection->exec(PgStatement::prepared(1), std::move(params),
                                        asio::use_awaitable);
        ADD_FAILURE() << "a missing table must fail";
      } catch (const PostgresError& error) {
        EXPECT_EQ(error.sqlstate(), "42P01") << "attempt " << i << ": " << error.what();
      }
    }
    try {
      (void)co_await connection->exec(PgStatement::prepared(2), {}, asio::use_awaitable);
      ADD_FAILURE() << "a statement past the prepared ones must fail";
    } catch (const PostgresError&) {
      ADD_FAILURE() << "it must fail before reaching the server";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("no prepared statement 2"), std::string::npos);
    }
    PgResultPtr names = co_await connection->exec(
        "SELECT string_agg(name, ',' ORDER BY name) FROM pg_prepared_statements", {},
        asio::use_awaitable);
    EXPECT_EQ(value(names), "idem_async_0");
    EXPECT_EQ(connection->connects(), 1u);
  });
}

// PgStatement::cached(): the first statement_cache distinct texts are prepared on the
// connection at their first use and then sent by name, any later text unnamed. A cached text
// whose result columns changed (ALTER TABLE under `SELECT *`) fails with 0A000 ("cached plan must
// not change result type") on every later run unless it is prepared again: it is, at its next use.
TEST(PgAsync, CachedTextsArePreparedWithinTheCacheAndAgainAfterTheirColumnsChanged) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  const std::string table = test::unique_name("idem_cached");
  pqxx::connection admin(url);
  pqxx::nontransaction(admin).exec0("CREATE TABLE " + table + " (a int); INSERT INTO " + table +
                                    " VALUES (1)");
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    PgAsyncSettings settings = settings_for(url);
    settings.prepared = {"SELECT 'idem'"};
    settings.statement_cache = 2;
    auto connection = PgAsyncConnection::create(executor, settings);
    const std::string sum = "SELECT $1::int + 1";
    const std::string all = "SELECT * FROM " + table;
    const std::string beyond = "SELECT 'beyond the cache'";
    for (int i = 0; i < 2; ++i) {
      PgParams params{std::to_string(i)};
      PgResultPtr result = co_await connection->exec(PgStatement::cached(sum), std::move(params),
                                                     asio::use_awaitable);
      EXPECT_EQ(value(result), std::to_string(i + 1));
      const PgResultPtr columns =
          co_await connection->exec(PgStatement::cached(all), {}, asio::use_awaitable);
      EXPECT_EQ(PQnfields(columns.get()), 1);
      const PgResultPtr unnamed =
          co_await connection->exec(PgStatement::cached(beyond), {}, asio::use_awaitable);
      EXPECT_EQ(value(unnamed), "beyond the cache");
    }
    const std::string list =
        "SELECT string_agg(name || '=' || statement, ',' ORDER BY name) FROM "
        "pg_prepared_statements";
    const PgResultPtr names = co_await connection->exec(list, {}, asio::use_awaitable);
    EXPECT_EQ(value(names), "idem_async_1=" + sum + ",idem_async_2=" + all);

    pqxx::nontransaction(admin).exec0("ALTER TABLE " + table + " ADD COLUMN b int");
    try {
      (void)co_await connection->exec(PgStatement::cached(all), {}, asio::use_awaitable);
      ADD_FAILURE() << "PostgreSQL no longer refuses a cached plan whose columns changed";
    } catch (const PostgresError& error) {
      EXPECT_EQ(error.sqlstate(), "0A000") << error.what();
    }
    for (int i = 0; i < 2; ++i) {
      PgResultPtr result =
          co_await connection->exec(PgStatement::cached(all), {}, asio::use_awaitable);
      EXPECT_EQ(PQnfields(result.get()), 2) << "run " << i << " after the ALTER";
    }
    EXPECT_EQ(connection->connects(), 1u);
  });
  pqxx::nontransaction(admin).exec0("DROP TABLE " + table);
}

TEST(PgAsync, ConcurrentStatementsArePipelinedAndAnsweredInOrder) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  asio::io_context io;
  auto connection = PgAsyncConnection::create(io.get_executor(), settings_for(url));
  constexpr int kStatements = 500;
  std::vector<std::string> seen(kStatements);
  int errors = 0;
  for (int i = 0; i < kStatements; ++i) {
    // A failing statement in the middle must not disturb its neighbours.
    const std::string sql = i == 250 ? "SELECT 1 / 0" : "SELECT $1::int * 2";
    connection->exec(sql, PgParams{std::to_string(i)},
                     [&, i](std::exception_ptr error, PgResultPtr result) {
                       if (error) {
                         ++errors;
                         return;
                       }
                       seen[static_cast<std::size_t>(i)] = value(result);
                     });
  }
  EXPECT_EQ(connection->in_flight(), static_cast<std::size_t>(kStatements));
  io.run();
  EXPECT_EQ(errors, 1);
  for (int i = 0; i < kStatements; ++i) {
    if (i != 250) {
      EXPECT_EQ(seen[static_cast<std::size_t>(i)], std::to_string(i * 2));
    }
  }
  EXPECT_EQ(connection->connects(), 1u);
}

// A statement that ends its flight, issued with nothing on the wire, is sent when it is issued
// (the server runs it while the loop is not running); one marked with_next() waits for the
// statement after it, or for the loop.
TEST(PgAsync, AFlightIssuedWithNothingOnTheWireIsSentWhenIssued) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  IdleConnection idle(url, "idem_sent_at_once");
  auto& [table, admin, io, connection] = idle;
  int answered = 0;
  const auto done = [&](std::exception_ptr error, PgResultPtr) {
    EXPECT_FALSE(error) << test::what(error);
    ++answered;
  };
  connection->exec("INSERT INTO " + table + " VALUES (1)", {}, done);
  int seen = 0;
  for (const auto until = Clock::now() + 2s; seen == 0 && Clock::now() < until;) {
    seen = idle.rows("x = 1");
    if (seen == 0) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(seen, 1) << "the statement waited for the loop";
  io.run();  // its answer read: idle again
  io.restart();
  EXPECT_EQ(answered, 1);
  connection->exec(PgStatement("INSERT INTO " + table + " VALUES (2)").with_next(), {}, done);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(idle.rows("x = 2"), 0) << "a statement sharing the next one's sync point went alone";
  io.run();
  EXPECT_EQ(answered, 2);
  EXPECT_EQ(idle.rows("x = 2"), 1);
}

// libpq 15's PQpipelineSync writes to the socket at once, so statements issued in one turn of
// the loop would leave one TCP segment each (and wake the server once each); the connection
// corks them so that they leave together.
TEST(PgAsync, StatementsIssuedInOneTurnLeaveTogetherNotOneSegmentEach) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  if (url.find("host=/") != std::string::npos) GTEST_SKIP() << "a Unix socket has no segments";
  asio::io_context io;
  auto connection = PgAsyncConnection::create(io.get_executor(), settings_for(url));
  connection->exec("SELECT 1", {}, [](std::exception_ptr, PgResultPtr) {});
  io.run();  // connected, and idle
  io.restart();
  constexpr int kStatements = 50;
  int answered = 0;
  const std::uint64_t before = test::tcp_data_segments_sent();
  for (int i = 0; i < kStatements; ++i) {
    connection->exec("SELECT $1::int", PgParams{std::to_string(i)},
                     [&](std::exception_ptr error, PgResultPtr) { answered += error ? 0 : 1; });
  }
  io.run();
  const std::uint64_t segments = test::tcp_data_segments_sent() - before;
  EXPECT_EQ(answered, kStatements);
  // About 2 KB in all: one segment; a few more if a write found the socket's buffer full.
  EXPECT_LE(segments, 5u) << kStatements << " statements of one turn left in " << segments
                          << " segments";
}

// Statements marked with_next() share the sync point of the one sent after them: the server
// answers the whole flight in one write (with a sync point each it flushed once per statement),
// a text prepared at its first use inside the flight keeps every result with its statement, and
// an error makes the server skip the rest up to the shared sync point.
TEST(PgAsync, StatementsSharingASyncPointAreAnsweredInOneWriteAndAnErrorSkipsTheRest) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  if (url.find("host=/") != std::string::npos) GTEST_SKIP() << "a Unix socket has no segments";
  asio::io_context io;
  PgAsyncSettings settings = settings_for(url);
  settings.statement_cache = 4;
  auto connection = PgAsyncConnection::create(io.get_executor(), settings);
  connection->exec("CREATE TEMP TABLE sync_probe (x int)", {},
                   [](std::exception_ptr error, PgResultPtr) { ASSERT_FALSE(error); });
  io.run();  // connected, and idle
  io.restart();

  constexpr int kStatements = 50;
  std::vector<std::string> seen(kStatements);
  const std::uint64_t before = test::tcp_data_segments_sent();
  for (int i = 0; i < kStatements; ++i) {
    // Every third is a text prepared at its first use: its Prepare's result comes first.
    PgStatement statement =
        i % 3 == 0 ? PgStatement::cached("SELECT $1::int * 3") : PgStatement("SELECT $1::int * 3");
    connection->exec(i + 1 < kStatements ? std::move(statement).with_next() : std::move(statement),
                     PgParams{std::to_string(i)},
                     [&seen, i](std::exception_ptr error, PgResultPtr result) {
                       seen[static_cast<std::size_t>(i)] = error ? "error" : value(result);
                     });
  }
  io.run();
  io.restart();
  const std::uint64_t segments = test::tcp_data_segments_sent() - before;
  for (int i = 0; i < kStatements; ++i) {
    EXPECT_EQ(seen[static_cast<std::size_t>(i)], std::to_string(i * 3)) << "statement " << i;
  }
  // One segment each way; a few more if a write found a socket buffer full.
  EXPECT_LE(segments, 6u) << kStatements << " statements and their answers took " << segments
                          << " segments";

  std::vector<std::string> ends;
  const auto record = [&ends](std::exception_ptr error, PgResultPtr result) {
    if (!error) return ends.push_back(value(result));
    try {
      std::rethrow_exception(error);
    } catch (const PostgresError& e) {
      ends.push_back(e.sqlstate().empty() ? std::string(e.what()) : e.sqlstate());
    }
  };
  // A failing statement, then an INSERT and a SELECT sharing its sync point; then a
  // failing Prepare (a cached text on a missing table) and a SELECT sharing its sync point.
  connection->exec(PgStatement("SELECT 1 / 0").with_next(), {}, record);
  connection->exec(PgStatement("INSERT INTO sync_probe VALUES (1)").with_next(), {}, record);
  connection->exec("SELECT 'skipped too'", {}, record);
  connection->exec(PgStatement::cached("SELECT * FROM idem_no_such_table").with_next(), {}, record);
  connection->exec("SELECT 'skipped'", {}, record);
  connection->exec("SELECT count(*) FROM sync_probe", {}, record);
  io.run();
  ASSERT_EQ(ends.size(), 6u);
  EXPECT_EQ(ends[0], "22012");
  EXPECT_NE(ends[1].find("not run"), std::string::npos) << ends[1];
  EXPECT_NE(ends[2].find("not run"), std::string::npos) << ends[2];
  EXPECT_EQ(ends[3], "42P01");
  EXPECT_NE(ends[4].find("not run"), std::string::npos) << ends[4];
  EXPECT_EQ(ends[5], "0") << "the INSERT after the error ran";
  EXPECT_EQ(connection->connects(), 1u);
}

// A batch is queued and sent as one operation: issued on an idle connection it leaves whole at
// once, each statement with the sync point its with_next() gives it (statement by statement,
// the first left alone and the rest a turn of the loop later: the record sent ahead of a
// handed-over COMMIT went so), and it completes once with the end of each, in order.
TEST(PgAsync, ABatchIsSentWholeWhenIssuedAndEndsEachStatementInOrder) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  IdleConnection idle(url, "b");
  auto& [table, admin, io, connection] = idle;
  std::vector<std::string> ends;
  int completions = 0;
  const auto record = [&](std::exception_ptr error, PgBatchEnds batch) {
    ++completions;
    ASSERT_FALSE(error) << test::what(error);
    for (const auto& [failure, result] : batch) {
      if (!failure) {
        ends.push_back(PQresultStatus(result.get()) == PGRES_TUPLES_OK ? value(result) : "ok");
        continue;
      }
      try {
        std::rethrow_exception(failure);
      } catch (const PostgresError& e) {
        ends.push_back(e.sqlstate().empty() ? std::string(e.what()) : e.sqlstate());
      }
    }
  };
  connection->exec_batch({{"INSERT INTO " + table + " VALUES (1)", {}},
                          {"INSERT INTO " + table + " VALUES ($1::int)", PgParams{"2"}}},
                         record);
  int seen = 0;
  for (const auto until = Clock::now() + 2s; seen < 2 && Clock::now() < until;) {
    seen = idle.rows();
    if (seen < 2) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(seen, 2) << "the batch did not leave whole when issued";
  io.run();
  io.restart();
  EXPECT_EQ(completions, 1);
  EXPECT_EQ(ends, (std::vector<std::string>{"ok", "ok"}));

  // An error skips the statements sharing its sync point, not those after it.
  ends.clear();
  connection->exec_batch({{PgStatement("SELECT 1 / 0").with_next(), {}},
                          {"SELECT 'skipped'", {}},
                          {"SELECT 'own sync point'", {}}},
                         record);
  io.run();
  io.restart();
  EXPECT_EQ(completions, 2);
  ASSERT_EQ(ends.size(), 3u);
  EXPECT_EQ(ends[0], "22012");
  EXPECT_NE(ends[1].find("not run"), std::string::npos) << ends[1];
  EXPECT_EQ(ends[2], "own sync point");

  // Refused whole, nothing sent: an empty batch, a prepared statement that does not exist.
  std::vector<std::string> refusals;
  const auto refused = [&](std::exception_ptr error, PgBatchEnds batch) {
    EXPECT_TRUE(test::is<Error>(error));
    EXPECT_TRUE(batch.empty());
    refusals.push_back(test::what(error));
  };
  connection->exec_batch({}, refused);
  connection->exec_batch(
      {{"INSERT INTO " + table + " VALUES (3)", {}}, {PgStatement::prepared(7), {}}}, refused);
  io.run();
  ASSERT_EQ(refusals.size(), 2u);
  EXPECT_NE(refusals[0].find("empty"), std::string::npos) << refusals[0];
  EXPECT_NE(refusals[1].find("no prepared statement 7"), std::string::npos) << refusals[1];
  EXPECT_EQ(idle.rows(), 2);
  EXPECT_EQ(connection->connects(), 1u);
}

// A batch that hands its connection over (a COMMIT with the next transaction waiting) goes with
// the turn, not at once: the next holder's first statements, issued later in the same turn,
// leave in the same write instead of one of their own.
TEST(PgAsync, ABatchSentWithTheTurnWaitsForItAndLeavesWithWhatFollows) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  IdleConnection idle(url, "t");
  int ended = 0;
  idle.connection->exec_batch(
      {{"INSERT INTO " + idle.table + " VALUES (1)", {}},
       {"INSERT INTO " + idle.table + " VALUES (2)", {}}},
      [&](std::exception_ptr error, PgBatchEnds ends) {
        ASSERT_FALSE(error);
        for (const auto& end : ends) EXPECT_FALSE(end.first) << test::what(end.first);
        ++ended;
      },
      true);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(idle.rows(), 0) << "a batch sent with the turn went at once";
  idle.connection->exec("INSERT INTO " + idle.table + " VALUES (3)", {},
                        [&](std::exception_ptr error, PgResultPtr) {
                          EXPECT_FALSE(error) << test::what(error);
                          ++ended;
                        });
  idle.io.run();
  EXPECT_EQ(ended, 2);
  EXPECT_EQ(idle.rows(), 3);
}

// A cancelled statement ends at once, cancelled on the server when it runs (57014, reported as
// idem::Cancelled, not a business failure). So does a cancelled batch: what ended keeps its
// result, and every statement not ended is idem::Cancelled. The connection goes on.
TEST(PgAsync, CancellationCancelsTheRunningStatementAndABatchsRestAsCancelled) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto connection = PgAsyncConnection::create(executor, settings_for(url, 20000ms));
    (void)co_await connection->exec("SELECT 1", {}, asio::use_awaitable);
    asio::cancellation_signal signal;
    asio::steady_timer later(executor);
    const auto cancel_soon = [&] {
      later.expires_after(200ms);
      later.async_wait([&](std::error_code) { signal.emit(asio::cancellation_type::terminal); });
      return Clock::now();
    };
    auto started = cancel_soon();
    try {
      (void)co_await connection->exec(
          "SELECT pg_sleep(10)", {},
          asio::bind_cancellation_slot(signal.slot(), asio::use_awaitable));
      ADD_FAILURE() << "pg_sleep(10) must be cancelled";
    } catch (const Cancelled&) {
    }
    EXPECT_LT(Clock::now() - started, 3s) << "the statement was not cancelled on the server";
    PgResultPtr after = co_await connection->exec("SELECT 'still here'", {}, asio::use_awaitable);
    EXPECT_EQ(value(after), "still here");

    PgBatch batch;  // built outside the co_await (GCC 12 mis-compiles the braced list in it)
    batch.emplace_back("SELECT 'first'", PgParams{});
    batch.emplace_back(PgStatement("SELECT pg_sleep(10)").with_next(), PgParams{});
    batch.emplace_back("SELECT 'after'", PgParams{});
    started = cancel_soon();
    PgBatchEnds ends = co_await connection->exec_batch(
        std::move(batch), asio::bind_cancellation_slot(signal.slot(), asio::use_awaitable));
    EXPECT_LT(Clock::now() - started, 3s) << "the batch was not cancelled";
    EXPECT_FALSE(ends.at(0).first) << test::what(ends.at(0).first);
    EXPECT_EQ(value(ends.at(0).second), "first");
    EXPECT_TRUE(test::is<Cancelled>(ends.at(1).first)) << test::what(ends.at(1).first);
    EXPECT_TRUE(test::is<Cancelled>(ends.at(2).first)) << test::what(ends.at(2).first);
    after = co_await connection->exec("SELECT 'still here'", {}, asio::use_awaitable);
    EXPECT_EQ(value(after), "still here");
    EXPECT_EQ(connection->connects(), 1u);
  });
}

TEST(PgAsync, ServerSideStatementTimeoutIsARetryableErrorNotACancellation) {
  IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto connection = PgAsyncConnection::create(executor, settings_for(url));
    (void)co_await connection->exec("SET statement_timeout = 50", {}, asio::use_awaitable);
    try {
      (void)co_await connection->exec("SELECT pg_sleep(2)", {}, asio::use_awaitable);
      ADD_FAILURE() << "statement_timeout must end pg_sleep(2)";
    } catch (const PostgresError& error) {
      EXPECT_EQ(error.sqlstate(), "57014");
      EXPECT_TRUE(error.retryable());
    }
  });
}

// The loop never blocks on a stopped server: a 1 ms timer keeps firing (no gap over kMaxLoopGap)
// while 1 000 statements wait on a SIGSTOPped PostgreSQL, and they end at their timeout.
TEST(PgAsync, LoopKeepsRunningWhilePostgresIsStopped) {
  test::PgServer server;
  asio::io_context io;
  auto connection = PgAsyncConnection::create(io.get_executor(), settings_for(server.url(), 300ms));
  connection->exec("SELECT 1", {},
                   [](std::exception_ptr error, PgResultPtr) { ASSERT_FALSE(error); });
  io.run();
  io.restart();
  server.pause();
  test::FailureTally<PostgresError> tally([](const PostgresError& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_EQ(e.sqlstate(), "08006");
  });
  const auto deadline = std::chrono::steady_clock::now() + 300ms;  // when they are due to end
  for (int i = 0; i < 1000; ++i)
    connection->exec("SELECT $1::int", PgParams{std::to_string(i)}, tally.handler());
  test::LoopProbe probe(io, 600ms);
  io.run();
  server.resume();
  EXPECT_EQ(tally.failed(), 1000);
  EXPECT_GE(tally.last_end(), 300ms);
  EXPECT_LT(tally.last_own_end(), 450ms + test::kSanitizerSlack);
  test::expect_loop_never_blocked(probe, deadline);
  // Resumed, the server answers a new connection (the old one was closed at the timeout).
  std::string answer;
  connection->exec("SELECT 'back'", {}, [&](std::exception_ptr error, PgResultPtr result) {
    ASSERT_FALSE(error);
    answer = value(result);
  });
  io.restart();
  io.run();
  EXPECT_EQ(answer, "back");
}

TEST(PgAsync, TlsWithVerifyFullForTheAsyncConnectionAndLibpqxx) {
  const test::TestCertificates certs("postgres");
  test::PgServer server;
  server.exec("ALTER SYSTEM SET ssl_cert_file = '" + certs.server_cert() + "'");
  server.exec("ALTER SYSTEM SET ssl_key_file = '" + certs.server_key() + "'");
  server.exec("ALTER SYSTEM SET ssl = on");
  server.exec("SELECT pg_reload_conf()");
  const std::string verified = server.url() + "?sslmode=verify-full&sslrootcert=" + certs.ca_file();
  const std::string query = "SELECT ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
  run_coroutine([&](auto executor) -> asio::awaitable<void> {
    auto secure = PgAsyncConnection::create(executor, settings_for(verified));
    PgResultPtr ssl = co_await secure->exec(query, {}, asio::use_awaitable);
    EXPECT_EQ(value(ssl), "true");
    auto untrusted = PgAsyncConnection::create(
        executor,
        settings_for(server.url() + "?sslmode=verify-full&sslrootcert=" + certs.other_ca_file()));
    try {
      (void)co_await untrusted->exec("SELECT 1", {}, asio::use_awaitable);
      ADD_FAILURE() << "a server signed by another CA must be refused";
    } catch (const PostgresError& error) {
      EXPECT_NE(std::string(error.what()).find("certificate"), std::string::npos) << error.what();
    }
  });
  // The blocking side (libpqxx, as PgSink uses it) with the same conninfo.
  pqxx::connection blocking(verified);
  pqxx::nontransaction tx(blocking);
  EXPECT_EQ(tx.exec1(query)[0].as<std::string>(), "true");
}

}  // namespace
}  // namespace idem::detail
