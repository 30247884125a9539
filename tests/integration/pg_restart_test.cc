// PostgreSQL restarted mid-run, on a private cluster this test starts (never the shared one):
// typed errors, nothing marked complete, and the pool recovers afterwards.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "pg_server.h"

namespace idem {
namespace {

constexpr std::size_t kPoolSize = 4;

// Runs fn until it stops throwing retryable PostgresErrors; a non-retryable one fails the test.
// Returns the number of failed attempts (bounded: a pool that never recovers fails the test).
template <typename F>
int attempts_until_success(F&& fn) {
  for (int failures = 0; failures < 50; ++failures) {
    try {
      fn();
      return failures;
    } catch (const PostgresError& error) {
      EXPECT_TRUE(error.retryable()) << error.what();
      if (!error.retryable()) return failures;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the server is starting
    }
  }
  ADD_FAILURE() << "the sink never recovered";
  return -1;
}

// The sink of these tests: kPoolSize connections to the private server.
PgSinkOptions restart_options(const test::PgServer& server) {
  PgSinkOptions options;
  options.conninfo = server.url() + "?connect_timeout=2";
  options.pool_size = kPoolSize;
  return options;
}

// Opens kPoolSize connections: that many transactions in use at once, all idle afterwards.
void fill_pool(PgSink& sink) {
  std::vector<std::thread> fillers;
  std::atomic<int> inside{0};
  for (std::size_t i = 0; i < kPoolSize; ++i) {
    fillers.emplace_back([&] {
      sink.transact([&](pqxx::transaction_base& tx) {
        ++inside;
        while (inside.load() < static_cast<int>(kPoolSize)) std::this_thread::yield();
        tx.exec("SELECT 1");
      });
    });
  }
  for (auto& filler : fillers) filler.join();
}

TEST(PgRestart, TypedErrorNothingCompletedAndThePoolRecovers) {
  test::PgServer server;
  PgSink sink(restart_options(server));
  sink.migrate();
  sink.transact(
      [](pqxx::transaction_base& tx) { tx.exec0("CREATE TABLE ledger (order_id text NOT NULL)"); });

  fill_pool(sink);

  // A run is mid-transaction (claimed, business row written) when the server goes down.
  std::promise<void> claimed;
  std::promise<void> restarted_down;
  std::thread in_flight([&] {
    try {
      sink.transact([&](pqxx::transaction_base& tx) {
        ASSERT_EQ(sink.claim(tx, "k1", "req-1", "fp").status, SinkStatus::kClaimed);
        tx.exec0("INSERT INTO ledger VALUES ('k1')");
        claimed.set_value();
        restarted_down.get_future().wait();
        sink.complete(tx, "k1", "done");
      });
      ADD_FAILURE() << "the transaction survived the shutdown";
    } catch (const PostgresError& error) {
      EXPECT_TRUE(error.retryable()) << error.what();
      EXPECT_FALSE(error.sqlstate().empty()) << error.what();
    }
  });
  claimed.get_future().wait();
  server.stop();
  restarted_down.set_value();
  in_flight.join();

  // While it is down: typed, retryable errors, no hang.
  try {
    (void)sink.claim("k2", "req-2", "fp");
    ADD_FAILURE() << "a claim succeeded with the server down";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable()) << error.what();
  }

  server.start();
  EXPECT_GE(attempts_until_success([&] { (void)sink.claim("k2", "req-2", "fp"); }), 0);

  // Nothing was marked complete, no business row survived: k1 is claimable again.
  SinkClaim again;
  EXPECT_GE(attempts_until_success([&] {
              sink.transact([&](pqxx::transaction_base& tx) {
                again = sink.claim(tx, "k1", "req-1", "fp");
                EXPECT_EQ(tx.exec1("SELECT count(*) FROM ledger")[0].as<int>(), 0);
              });
            }),
            0);
  EXPECT_EQ(again.status, SinkStatus::kClaimed);

  // The whole pool works again: kPoolSize transactions at once, each without an error.
  std::atomic<int> ok{0};
  std::atomic<int> inside{0};
  std::vector<std::thread> workers;
  for (std::size_t i = 0; i < kPoolSize; ++i) {
    workers.emplace_back([&, i] {
      try {
        sink.transact([&](pqxx::transaction_base& tx) {
          ++inside;
          while (inside.load() < static_cast<int>(kPoolSize)) std::this_thread::yield();
          const std::string key = "after-" + std::to_string(i);
          if (sink.claim(tx, key, "req", "fp").status == SinkStatus::kClaimed) ++ok;
        });
      } catch (const PostgresError& error) {
        ADD_FAILURE() << "after recovery: " << error.what();
      }
    });
  }
  for (auto& worker : workers) worker.join();
  EXPECT_EQ(ok.load(), static_cast<int>(kPoolSize));
}

// A fast shutdown under a running statement ends its session with 57P01. libpqxx 6 reports it as
// its own symptom ("Could not obtain client encoding: not connected"), which must still be a
// retryable connection loss: a consumer that gave up would lose a message a retry delivers.
TEST(PgRestart, AShutdownUnderARunningStatementIsARetryableError) {
  test::PgServer server;
  PgSink sink(restart_options(server));
  sink.migrate();
  std::promise<void> running;
  std::thread stopper([&] {
    running.get_future().wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // pg_sleep is under way
    server.stop();
  });
  try {
    sink.transact([&](pqxx::transaction_base& tx) {
      running.set_value();
      tx.exec("SELECT pg_sleep(30)");
    });
    ADD_FAILURE() << "the statement survived the shutdown";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable()) << error.what();
    EXPECT_FALSE(error.sqlstate().empty()) << error.what();
  }
  stopper.join();
}

// After a restart the first calls succeed: a stale pooled connection is dropped before it is
// handed out, rather than failing a call ("Could not obtain client encoding: not connected")
// although the server is back.
TEST(PgRestart, TheFirstCallsAfterARestartSucceedOnFreshConnections) {
  test::PgServer server;
  PgSink sink(restart_options(server));
  sink.migrate();
  fill_pool(sink);

  server.stop();
  server.start();
  for (int i = 0; i < 3; ++i) {
    try {
      EXPECT_EQ(sink.claim("after-restart-" + std::to_string(i), "req", "fp").status,
                SinkStatus::kClaimed);
    } catch (const PostgresError& error) {
      ADD_FAILURE() << "call " << i << " after the restart: " << error.what();
    }
  }
}

}  // namespace
}  // namespace idem
