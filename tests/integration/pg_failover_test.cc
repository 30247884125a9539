// The Postgres sink through a primary failover: a private primary with a synchronous streaming
// standby (tests/support/pg_server.h), reached by libpq's multi-host conninfo with
// target_session_attrs=read-write. Mid-run the primary crashes (pg_ctl stop -m immediate) and
// the standby is promoted (pg_ctl promote); every request, retried like an at-least-once
// delivery, then has exactly one effect on the new primary.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "pg_server.h"

namespace idem {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string multi_host(const test::PgServer& primary, const test::PgServer& standby) {
  return "host=127.0.0.1,127.0.0.1 port=" + std::to_string(primary.port()) + "," +
         std::to_string(standby.port()) +
         " user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2";
}

PgSinkOptions failover_options(const std::string& conninfo) {
  PgSinkOptions options;
  options.conninfo = conninfo;
  options.schema = "failover";
  options.pool_size = 4;
  options.borrow_timeout = milliseconds(2000);
  options.response_timeout = milliseconds(6000);
  return options;
}

// Claim, ledger row, complete in one transaction; false when the key was already done.
bool run_once(PgSink& sink, const std::string& key) {
  bool claimed = false;
  sink.transact([&](pqxx::transaction_base& tx) {
    claimed = sink.claim(tx, key, "req-" + key, "").status == SinkStatus::kClaimed;
    if (!claimed) return;
    tx.exec_params("INSERT INTO failover.ledger VALUES ($1)", key);
    sink.complete(tx, key, "ok");
  });
  return claimed;
}

TEST(PgFailover, APromotedSynchronousStandbyHasEveryCommitAndNoEffectTwice) {
  test::PgServer primary;
  primary.exec("CREATE SCHEMA failover");
  primary.exec("CREATE TABLE failover.ledger (key text NOT NULL)");
  const auto standby = test::PgServer::standby_of(primary, /*synchronous=*/true);
  PgSink sink(failover_options(multi_host(primary, *standby)));
  sink.migrate();

  constexpr int kThreads = 4;
  constexpr int kKeysPerThread = 150;
  std::atomic<int> done{0};
  std::atomic<int> errors{0};
  std::mutex mutex;
  Clock::time_point crashed_at{};
  Clock::time_point last_failure{};
  std::atomic<bool> crashed{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeysPerThread; ++k) {
        const std::string key = std::to_string(t) + "-" + std::to_string(k);
        for (int attempt = 0;; ++attempt) {
          try {
            (void)run_once(sink, key);
            break;
          } catch (const PostgresError& error) {
            // Retryable, or a commit whose outcome is unknown: either way, deliver again.
            ++errors;
            {
              std::lock_guard lock(mutex);
              last_failure = Clock::now();
            }
            ASSERT_LT(attempt, 500) << error.what();
            std::this_thread::sleep_for(milliseconds(20));
          }
        }
        ++done;
      }
    });
  }
  while (done < kThreads * kKeysPerThread / 3) std::this_thread::sleep_for(milliseconds(5));
  {
    std::lock_guard lock(mutex);
    crashed_at = Clock::now();
  }
  primary.crash();
  standby->promote();
  crashed = true;
  for (auto& thread : threads) thread.join();

  const auto unavailable = std::chrono::duration_cast<milliseconds>(last_failure - crashed_at);
  std::cerr << "[pg failover] " << errors << " failed attempts, the last " << unavailable.count()
            << " ms after the crash (promotion included)\n";
  pqxx::connection conn(standby->url());
  pqxx::nontransaction tx(conn);
  const pqxx::row ledger = tx.exec1("SELECT count(*), count(DISTINCT key) FROM failover.ledger");
  EXPECT_EQ(ledger[1].as<int>(), kThreads * kKeysPerThread) << "a request was lost";
  EXPECT_EQ(ledger[0].as<int>(), ledger[1].as<int>()) << "an effect happened twice";
  EXPECT_GT(errors, 0) << "the crash was not felt: the test proved nothing";
}

// A server that is a standby now (an old primary, demoted) answers writes with 25006: the sink
// reports it as retryable and never hands that connection out again.
TEST(PgFailover, AWriteOnAStandbyIsRetryableAndDropsTheConnection) {
  test::PgServer primary;
  primary.exec("CREATE SCHEMA failover");
  primary.exec("CREATE TABLE failover.ledger (key text NOT NULL)");
  PgSink(failover_options(primary.url())).migrate();
  const auto standby = test::PgServer::standby_of(primary, /*synchronous=*/false);
  PgSink sink(failover_options(standby->url()));
  for (int i = 0; i < 2; ++i) {
    try {
      (void)sink.claim("k-" + std::to_string(i), "req", "");
      FAIL() << "a standby accepted a claim";
    } catch (const PostgresError& error) {
      EXPECT_EQ(error.sqlstate(), "25006") << error.what();
      EXPECT_TRUE(error.retryable());
    }
  }
  standby->promote();  // the same address takes writes now: a fresh connection works
  EXPECT_EQ(sink.claim("k-after", "req", "").status, SinkStatus::kClaimed);
}

}  // namespace
}  // namespace idem
