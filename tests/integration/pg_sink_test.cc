// The Postgres sink against a real PostgreSQL (IDEM_TEST_PG_URL), each test in its own schema.
#include <gtest/gtest.h>

#include <pqxx/pqxx>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/pg_sink.h"
#include "pg_server.h"
#include "test_env.h"

namespace idem {
namespace {

class PgSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
    url_ = url;
    schema_ = std::make_unique<test::ScratchSchema>(url_, "pgsink");
    schema_->exec("CREATE TABLE " + schema_->name() + ".ledger (order_id text NOT NULL)");
    sink_ = make_sink();
    sink_->migrate();
  }

  [[nodiscard]] PgSinkOptions options() const {
    PgSinkOptions options;
    options.conninfo = url_;
    options.schema = schema_->name();
    options.ns = "orders";
    return options;
  }

  std::unique_ptr<PgSink> make_sink() const { return make_sink(options()); }
  static std::unique_ptr<PgSink> make_sink(PgSinkOptions options) {
    return std::make_unique<PgSink>(std::move(options));
  }

  // One business operation: claim, insert a ledger row, complete — in one transaction.
  SinkClaim run_once(PgSink& sink, const std::string& key, const std::string& request_id,
                     const std::string& fingerprint = "fp-1") {
    SinkClaim answer;
    sink.transact([&](pqxx::transaction_base& tx) {
      answer = sink.claim(tx, key, request_id, fingerprint);
      if (answer.status != SinkStatus::kClaimed) return;
      tx.exec_params("INSERT INTO " + schema_->name() + ".ledger VALUES ($1)", key);
      sink.complete(tx, key, "response of " + request_id);
    });
    return answer;
  }

  std::int64_t ledger_rows() const {
    return schema_->count("SELECT count(*) FROM " + schema_->name() + ".ledger");
  }
  std::int64_t record_rows() const {
    return schema_->count("SELECT count(*) FROM " + schema_->name() + ".idem_records");
  }

  std::string url_;
  std::unique_ptr<test::ScratchSchema> schema_;
  std::unique_ptr<PgSink> sink_;
};

TEST_F(PgSinkTest, ThirtyTwoThreadsRacingOneKeyCommitExactlyOneBusinessRow) {
  PgSinkOptions opts = options();
  opts.pool_size = 32;
  opts.lock_timeout = std::chrono::milliseconds(0);  // the losers wait for the winner's commit
  auto sink = make_sink(opts);
  constexpr int kThreads = 32;
  std::atomic<int> claimed{0};
  std::atomic<int> duplicates{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      const SinkClaim answer = run_once(*sink, "u1:refund:order-7", "req-" + std::to_string(i));
      if (answer.status == SinkStatus::kClaimed) ++claimed;
      if (answer.status == SinkStatus::kDuplicate &&
          answer.state == RecordState::kCompleted && answer.response.has_value()) {
        ++duplicates;
      }
    });
  }
  go = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(claimed.load(), 1);
  EXPECT_EQ(duplicates.load(), kThreads - 1);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(record_rows(), 1);
}

TEST_F(PgSinkTest, RepeatAfterCommitIsADuplicateWithTheStoredResponse) {
  ASSERT_EQ(run_once(*sink_, "k1", "req-a").status, SinkStatus::kClaimed);

  const SinkClaim same = run_once(*sink_, "k1", "req-a");
  EXPECT_EQ(same.status, SinkStatus::kDuplicate);
  EXPECT_EQ(same.state, RecordState::kCompleted);
  EXPECT_TRUE(same.same_request);
  EXPECT_TRUE(same.fingerprint_matches);
  EXPECT_EQ(same.response, std::optional<std::string>("response of req-a"));

  const SinkClaim other = run_once(*sink_, "k1", "req-b", "fp-2");
  EXPECT_EQ(other.status, SinkStatus::kDuplicate);
  EXPECT_FALSE(other.same_request);
  EXPECT_FALSE(other.fingerprint_matches);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(PgSinkTest, RollbackOfTheBusinessTransactionLeavesNoClaimRow) {
  EXPECT_THROW(sink_->transact([&](pqxx::transaction_base& tx) {
    ASSERT_EQ(sink_->claim(tx, "k2", "req-a", "fp").status, SinkStatus::kClaimed);
    tx.exec0("INSERT INTO " + schema_->name() + ".ledger VALUES ('k2')");
    throw std::runtime_error("business failure");
  }),
               std::runtime_error);
  EXPECT_EQ(record_rows(), 0);
  EXPECT_EQ(ledger_rows(), 0);
  EXPECT_EQ(run_once(*sink_, "k2", "req-a").status, SinkStatus::kClaimed);
}

TEST_F(PgSinkTest, NamespacesKeepTheSameKeyApart) {
  PgSinkOptions other = options();
  other.ns = "payments";
  auto sink = make_sink(other);
  EXPECT_EQ(run_once(*sink_, "k3", "req-a").status, SinkStatus::kClaimed);
  EXPECT_EQ(run_once(*sink, "k3", "req-a").status, SinkStatus::kClaimed);
  EXPECT_EQ(ledger_rows(), 2);
}

}  // namespace
}  // namespace idem
