// The Postgres sink through pgbouncer 1.18 in transaction pooling mode (a private pgbouncer in
// front of IDEM_TEST_PG_URL, tests/support/pg_server.h), with fewer server connections than
// the sink opens, so that consecutive transactions of one client run on other servers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "pg_server.h"
#include "test_env.h"

namespace idem {
namespace {

using std::chrono::milliseconds;

class PgBouncerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
    url_ = url;
    schema_ = std::make_unique<test::ScratchSchema>(url, "bouncer");
    schema_->exec("CREATE TABLE " + schema_->name() +
                  ".ledger (order_id text NOT NULL CONSTRAINT ledger_once UNIQUE)");
    bouncer_ = std::make_unique<test::PgBouncer>(url, "transaction", 2);
  }

  [[nodiscard]] PgSinkOptions options(PgPooling pooling = PgPooling::kTransaction) const {
    PgSinkOptions options;
    options.conninfo = bouncer_->url();
    options.pooling = pooling;
    options.schema = schema_->name();
    options.pool_size = 8;
    options.business_constraints = {"ledger_once"};
    return options;
  }

  // Claim, business row, complete: one transaction through the pooler.
  SinkClaim run_once(PgSink& sink, const std::string& key, const std::string& request_id) {
    SinkClaim answer;
    sink.transact([&](pqxx::transaction_base& tx) {
      answer = sink.claim(tx, key, request_id, "fp");
      if (answer.status != SinkStatus::kClaimed) return;
      tx.exec_params("INSERT INTO " + schema_->name() + ".ledger VALUES ($1)", key);
      sink.complete(tx, key, "response of " + request_id);
    });
    return answer;
  }

  std::string url_;
  std::unique_ptr<test::ScratchSchema> schema_;
  std::unique_ptr<test::PgBouncer> bouncer_;
};

// Why PgPooling::kTransaction exists: a statement prepared by one client stays on the server
// connection it ran on, which pgbouncer then hands to another client; that client's own
// PREPARE of the same name fails (42P05), or its EXECUTE meets no statement (26000).
TEST_F(PgBouncerTest, SessionModePreparedStatementsBreakBehindATransactionPooler) {
  const test::PgBouncer single(url_, "transaction", 1);
  PgSinkOptions opts = options(PgPooling::kSession);
  opts.conninfo = single.url();
  opts.pool_size = 1;
  PgSink setup(opts);
  setup.migrate();
  PgSink first(opts);
  PgSink second(opts);
  ASSERT_EQ(first.claim("k-prepared-1", "req-1", "").status, SinkStatus::kClaimed);
  try {
    (void)second.claim("k-prepared-2", "req-2", "");
    FAIL() << "a second client re-prepared idem_claim on the same server connection";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.sqlstate() == "42P05" || error.sqlstate() == "26000") << error.what();
  }
}

TEST_F(PgBouncerTest, EverySinkStatementWorksInTransactionMode) {
  PgSink sink(options());
  sink.migrate();
  sink.migrate();  // idempotent through the pooler too
  EXPECT_GT(sink.schema_version(), 0);
  sink.ping();
  // Transactional: claim, business write under a savepoint, complete, commit.
  EXPECT_EQ(run_once(sink, "t-1", "req-a").status, SinkStatus::kClaimed);
  const SinkClaim repeat = run_once(sink, "t-1", "req-b");
  EXPECT_EQ(repeat.status, SinkStatus::kDuplicate);
  EXPECT_EQ(repeat.response, std::optional<std::string>("response of req-a"));
  EXPECT_FALSE(sink.transact_if([&](pqxx::transaction_base& tx) {
    EXPECT_EQ(sink.claim(tx, "t-2", "req-a", "").status, SinkStatus::kClaimed);
    return sink.run_business_write(tx, [&](pqxx::transaction_base& t) {
      t.exec_params("INSERT INTO " + schema_->name() + ".ledger VALUES ($1)", "t-1");
    });  // the business constraint: a duplicate, rolled back
  }));
  // Non-transactional: claim, complete, release, inspect, force release, purge.
  ASSERT_EQ(sink.claim("n-1", "req-a", "fp").status, SinkStatus::kClaimed);
  EXPECT_EQ(sink.claim("n-1", "req-b", "fp").status, SinkStatus::kDuplicate);
  EXPECT_FALSE(sink.release("n-1", "req-b"));
  EXPECT_TRUE(sink.complete("n-1", "req-a", "done"));
  EXPECT_EQ(sink.claim("n-1", "req-c", "fp").response, std::optional<std::string>("done"));
  ASSERT_EQ(sink.claim("n-2", "req-a", "").status, SinkStatus::kClaimed);
  EXPECT_TRUE(sink.release("n-2", "req-a"));
  ASSERT_EQ(sink.claim("n-3", "req-a", "").status, SinkStatus::kClaimed);
  const std::optional<RecordInfo> info = sink.inspect("n-3");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->request_id, "req-a");
  EXPECT_EQ(sink.force_release("n-3", ForceReleaseScope::kInProgressOnly),
            ForceReleaseStatus::kReleased);
  schema_->exec("UPDATE " + schema_->name() +
                ".idem_records SET expires_at = now() - interval '1 second'");
  EXPECT_EQ(sink.purge_expired(1), 2U);  // t-1 and n-1; t-2 rolled back, n-2 and n-3 deleted
}

TEST_F(PgBouncerTest, ManyThreadsOverFewServerConnectionsExecuteEachKeyOnce) {
  PgSink sink(options());
  sink.migrate();
  constexpr int kThreads = 8;
  constexpr int kKeys = 40;
  std::atomic<int> claimed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeys; ++k) {
        const std::string key = "m-" + std::to_string(k);
        for (int attempt = 0;; ++attempt) {
          try {
            if (run_once(sink, key, "req-" + std::to_string(t)).status == SinkStatus::kClaimed)
              ++claimed;
            break;
          } catch (const PostgresError& error) {
            ASSERT_TRUE(error.retryable() && attempt < 20) << error.what();
          }
        }
        // The non-transactional path alongside.
        const std::string own = "o-" + std::to_string(t) + "-" + std::to_string(k);
        ASSERT_EQ(sink.claim(own, "req", "").status, SinkStatus::kClaimed);
        ASSERT_TRUE(sink.complete(own, "req", "ok"));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(claimed, kKeys);
  EXPECT_EQ(schema_->count("SELECT count(*) FROM " + schema_->name() + ".ledger"), kKeys);
}

// The timeouts are SET LOCAL per transaction: they apply through the pooler and leave nothing
// behind on the server connection for the next client.
TEST_F(PgBouncerTest, TimeoutsHoldPerTransactionAndLeakIntoNoOtherSession) {
  const test::PgBouncer single(url_, "transaction", 1);
  PgSinkOptions opts = options();
  opts.conninfo = single.url();
  opts.lock_timeout = milliseconds(100);
  opts.statement_timeout = milliseconds(300);
  opts.response_timeout = milliseconds(2000);
  PgSink sink(opts);
  sink.migrate();
  try {
    sink.transact([](pqxx::transaction_base& tx) { tx.exec("SELECT pg_sleep(3)"); });
    FAIL() << "statement_timeout did not apply through the pooler";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "57014") << error.what();
  }
  // An open claim of the key (directly on the server) holds the row: the pooled claim gives up
  // after lock_timeout instead of waiting.
  PgSinkOptions direct = options(PgPooling::kSession);
  direct.conninfo = url_;
  PgSink holder(direct);
  std::promise<void> held;
  std::promise<void> release;
  std::thread first([&] {
    holder.transact([&](pqxx::transaction_base& tx) {
      ASSERT_EQ(holder.claim(tx, "lock-1", "req-a", "").status, SinkStatus::kClaimed);
      held.set_value();
      release.get_future().wait();
    });
  });
  held.get_future().wait();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sink.claim("lock-1", "req-b", "").status, SinkStatus::kInProgress);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1500));
  release.set_value();
  first.join();
  // The one server connection served the sink; a plain client now sees the server defaults.
  pqxx::connection plain(single.url());
  pqxx::nontransaction tx(plain);
  EXPECT_EQ(tx.exec1("SHOW lock_timeout")[0].as<std::string>(), "0");
  EXPECT_EQ(tx.exec1("SHOW statement_timeout")[0].as<std::string>(), "0");
}

}  // namespace
}  // namespace idem
