// The facade against real Redis and PostgreSQL.
#include <gtest/gtest.h>

#include <pqxx/pqxx>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "test_env.h"

namespace idem {
namespace {

class DeduplicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    pg_url_ = pg_url;
    schema_ = test::unique_name("dedup");
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("CREATE SCHEMA " + schema_);
    tx.exec0("CREATE TABLE " + schema_ + ".ledger (order_id text NOT NULL, amount bigint NOT NULL)");
    tx.commit();

    redis_url_ = redis_url;
    dedup_ = make_deduplicator(std::chrono::hours(1));
  }

  std::unique_ptr<Deduplicator> make_deduplicator(std::chrono::milliseconds retention) {
    RedisGuardOptions guard;
    guard.redis.url = redis_url_;
    guard.ns = schema_;
    guard.retention = retention;
    PgSinkOptions sink;
    sink.conninfo = pg_url_;
    sink.schema = schema_;
    DeduplicatorOptions options;
    options.local_cache_capacity = 0;  // every repeat must reach the backends
    options.guard = std::make_shared<RedisGuard>(guard);
    options.sink = std::make_shared<PgSink>(sink);
    options.sink->migrate();
    return std::make_unique<Deduplicator>(std::move(options));
  }

  void TearDown() override {
    if (pg_url_.empty()) return;
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("DROP SCHEMA IF EXISTS " + schema_ + " CASCADE");
    tx.commit();
  }

  std::int64_t ledger_rows() {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    return tx.exec1("SELECT count(*) FROM " + schema_ + ".ledger")[0].as<std::int64_t>();
  }

  std::function<std::string(pqxx::transaction_base&)> refund(const std::string& order) {
    return [this, order](pqxx::transaction_base& tx) {
      tx.exec_params0("INSERT INTO " + schema_ + ".ledger VALUES ($1, 5)", order);
      return "refunded " + order;
    };
  }

  static Request request(const std::string& request_id, const std::string& order,
                         const std::string& payload = R"({"amount":5})") {
    Request r;
    r.request_id = request_id;
    r.user = "u1";
    r.intent = "refund";
    r.biz_key = order;
    r.payload = payload;
    return r;
  }

  std::string redis_url_;
  std::string pg_url_;
  std::string schema_;
  std::unique_ptr<Deduplicator> dedup_;
};

TEST_F(DeduplicatorTest, RepeatedTransactionalRunIsDuplicateAndLeavesRowsUnchanged) {
  const Outcome first = dedup_->run_transactional(request("r1", "o1"), refund("o1"));
  ASSERT_EQ(first.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(first.response, "refunded o1");
  EXPECT_EQ(ledger_rows(), 1);

  const Outcome again = dedup_->run_transactional(request("r1", "o1"), refund("o1"));
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.layer, Layer::kRedisGuard);
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.response, "refunded o1");

  const Outcome double_click = dedup_->run_transactional(request("r2", "o1"), refund("o1"));
  EXPECT_EQ(double_click.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, SinkStopsARedeliveryAfterTheGuardRetention) {
  const auto short_retention = make_deduplicator(std::chrono::milliseconds(50));
  ASSERT_EQ(short_retention->run_transactional(request("r1", "o2"), refund("o2")).kind,
            Outcome::Kind::kExecuted);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // Redis' own TTL ends the record
  const Outcome again = short_retention->run_transactional(request("r1", "o2"), refund("o2"));
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.layer, Layer::kPgSink);
  EXPECT_EQ(again.response, "refunded o2");
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, SameKeyOtherPayloadIsMismatch) {
  ASSERT_EQ(dedup_->run_transactional(request("r1", "o3"), refund("o3")).kind, Outcome::Kind::kExecuted);
  const Outcome other = dedup_->run_transactional(request("r2", "o3", R"({"amount":6})"), refund("o3"));
  EXPECT_EQ(other.kind, Outcome::Kind::kMismatch);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, BusinessErrorReleasesTheClaimSoARetryRuns) {
  EXPECT_THROW((void)dedup_->run_transactional(request("r1", "o4"),
                                               [](pqxx::transaction_base&) -> std::string {
                                                 throw std::runtime_error("card declined");
                                               }),
               std::runtime_error);
  const Outcome retry = dedup_->run_transactional(request("r1", "o4"), refund("o4"));
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, CancellationKeepsTheClaim) {
  EXPECT_THROW((void)dedup_->run_transactional(request("r1", "o5"),
                                               [](pqxx::transaction_base&) -> std::string { throw Cancelled(); }),
               Cancelled);
  const Outcome retry = dedup_->run_transactional(request("r1", "o5"), refund("o5"));
  EXPECT_EQ(retry.kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(retry.layer, Layer::kRedisGuard);
  EXPECT_EQ(ledger_rows(), 0);
}

TEST_F(DeduplicatorTest, ConcurrentDeliveriesOfOneRequestHaveOneEffect) {
  constexpr int kThreads = 16;
  std::atomic<int> executed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const Outcome o = dedup_->run_transactional(request("r" + std::to_string(i), "o6"), refund("o6"));
      if (o.kind == Outcome::Kind::kExecuted) ++executed;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(executed.load(), 1);
  EXPECT_EQ(ledger_rows(), 1);
}

}  // namespace
}  // namespace idem
