// Failure cases of ../shared/cases/CASES.md on the Postgres sink side (C02, C11, C14), against a
// real PostgreSQL (IDEM_TEST_PG_URL), each test in its own schema.
#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <pqxx/pqxx>
#include <string>
#include <thread>

#include "idem/errors.h"
#include "idem/key.h"
#include "idem/pg_sink.h"
#include "pg_server.h"
#include "test_env.h"

namespace idem {
namespace {

class Cases : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(url, "IDEM_TEST_PG_URL");
    url_ = url;
    schema_ = std::make_unique<test::ScratchSchema>(url_, "pgcases");
    // The seed's business tables: refunds carry their own UNIQUE idempotency column.
    schema_->exec("CREATE TABLE " + table("refunds") +
                  " (idem_key text NOT NULL CONSTRAINT refunds_idem_key_key UNIQUE,"
                  "  amount bigint NOT NULL);"
                  "CREATE TABLE " +
                  table("accounts") +
                  " (id bigint PRIMARY KEY, balance bigint NOT NULL);"
                  "INSERT INTO " +
                  table("accounts") + " VALUES (1, 0)");
  }

  [[nodiscard]] std::string table(const std::string& name) const {
    return schema_->name() + "." + name;
  }

  [[nodiscard]] std::unique_ptr<PgSink> make_sink(std::size_t pool_size = 1) const {
    PgSinkOptions options;
    options.conninfo = url_;
    options.schema = schema_->name();
    options.ns = "refunds";
    options.pool_size = pool_size;
    options.business_constraints = {"refunds_idem_key_key"};
    auto sink = std::make_unique<PgSink>(options);
    sink->migrate();
    return sink;
  }

  // The refund: claim, then (as a guarded business write) the refund row and the balance update.
  // Returns the claim answer; `written` tells whether the business write went through.
  SinkClaim refund(PgSink& sink, const std::string& key, const std::string& request_id,
                   const std::string& business_key, bool* written = nullptr) {
    SinkClaim answer;
    bool wrote = false;
    (void)sink.transact_if([&](pqxx::transaction_base& tx) {
      answer = sink.claim(tx, key, request_id, "fp");
      if (answer.status != SinkStatus::kClaimed) return false;
      wrote = sink.run_business_write(tx, [&](pqxx::transaction_base& w) {
        w.exec_params("INSERT INTO " + table("refunds") + " VALUES ($1, 5)", business_key);
        w.exec0("UPDATE " + table("accounts") + " SET balance = balance + 5 WHERE id = 1");
      });
      if (!wrote) return false;
      sink.complete(tx, key, "refunded " + business_key);
      return true;
    });
    if (written != nullptr) *written = wrote;
    return answer;
  }

  [[nodiscard]] std::int64_t refunds() const {
    return schema_->count("SELECT count(*) FROM " + table("refunds"));
  }
  [[nodiscard]] std::int64_t balance() const {
    return schema_->count("SELECT balance FROM " + table("accounts") + " WHERE id = 1");
  }
  [[nodiscard]] std::int64_t records() const {
    return schema_->count("SELECT count(*) FROM " + table("idem_records"));
  }

  std::string url_;
  std::unique_ptr<test::ScratchSchema> schema_;
};

// The next statement on the (only) pooled connection must succeed: nothing left it aborted.
void expect_connection_usable(PgSink& sink) {
  std::int64_t one = 0;
  sink.transact(
      [&](pqxx::transaction_base& tx) { one = tx.exec1("SELECT 1")[0].as<std::int64_t>(); });
  EXPECT_EQ(one, 1);
}

TEST_F(Cases, C11_UniqueViolationNeverPoisonsTheTransactionOrThePool) {
  auto sink = make_sink(1);  // one connection: every step reuses it
  const std::string key = IdempotencyKey{"u1", "refund", "order-7"}.encode();
  bool written = false;
  ASSERT_EQ(refund(*sink, key, "req-1", "order-7", &written).status, SinkStatus::kClaimed);
  ASSERT_TRUE(written);

  // K already committed: the claim conflicts without aborting; the business INSERT never runs.
  const SinkClaim again = refund(*sink, key, "req-2", "order-7", &written);
  EXPECT_EQ(again.status, SinkStatus::kDuplicate);
  EXPECT_EQ(again.state, RecordState::kCompleted);
  EXPECT_EQ(again.response, std::optional<std::string>("refunded order-7"));
  EXPECT_FALSE(written);
  EXPECT_EQ(refunds(), 1);
  EXPECT_EQ(balance(), 5);
  expect_connection_usable(*sink);

  // Variant: the conflict comes from the business table's own UNIQUE index (another idempotency
  // key, same order): reported as a duplicate, rolled back with no claim row left behind.
  const std::string other_key = IdempotencyKey{"u1", "refund-v2", "order-7"}.encode();
  EXPECT_EQ(refund(*sink, other_key, "req-3", "order-7", &written).status, SinkStatus::kClaimed);
  EXPECT_FALSE(written);
  EXPECT_EQ(refunds(), 1);
  EXPECT_EQ(balance(), 5);
  EXPECT_EQ(records(), 1);
  expect_connection_usable(*sink);

  // Another table's 23505 is an error, not a duplicate.
  try {
    sink->transact([&](pqxx::transaction_base& tx) {
      ASSERT_EQ(
          sink->claim(tx, IdempotencyKey{"u1", "open", "acct-1"}.encode(), "req-4", "fp").status,
          SinkStatus::kClaimed);
      (void)sink->run_business_write(tx, [&](pqxx::transaction_base& w) {
        w.exec0("INSERT INTO " + table("accounts") + " VALUES (1, 0)");
      });
    });
    FAIL() << "accounts_pkey violation was swallowed";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "23505");
    EXPECT_FALSE(error.retryable());
  }
  EXPECT_EQ(records(), 1);
  EXPECT_EQ(balance(), 5);
  expect_connection_usable(*sink);
}

// libpqxx 6 aborts a whole transaction when a statement sent with exec() fails (exec_params()
// does not): the business write still reports its constraint's violation as false, and the
// transaction stays usable.
TEST_F(Cases, C11_ABusinessWriteSentWithExecIsFalseAndLeavesTheTransactionUsable) {
  auto sink = make_sink(1);
  schema_->exec("INSERT INTO " + table("refunds") + " VALUES ('order-9', 5)");
  const std::string key = IdempotencyKey{"u1", "refund", "order-9"}.encode();
  bool wrote = true;
  std::int64_t after = 0;
  const bool committed = sink->transact_if([&](pqxx::transaction_base& tx) {
    EXPECT_EQ(sink->claim(tx, key, "req-1", "fp").status, SinkStatus::kClaimed);
    wrote = sink->run_business_write(tx, [&](pqxx::transaction_base& w) {
      w.exec0("INSERT INTO " + table("refunds") + " VALUES ('order-9', 5)");
    });
    after = tx.exec1("SELECT 1")[0].as<std::int64_t>();  // the transaction is still open
    return wrote;
  });
  EXPECT_FALSE(wrote);
  EXPECT_EQ(after, 1);
  EXPECT_FALSE(committed);
  EXPECT_EQ(records(), 0);
  expect_connection_usable(*sink);

  // The write succeeds through exec() too, and commits with the claim.
  EXPECT_TRUE(sink->transact_if([&](pqxx::transaction_base& tx) {
    EXPECT_EQ(sink->claim(tx, key, "req-2", "fp").status, SinkStatus::kClaimed);
    return sink->run_business_write(tx, [&](pqxx::transaction_base& w) {
      w.exec0("UPDATE " + table("accounts") + " SET balance = balance + 5 WHERE id = 1");
    });
  }));
  EXPECT_EQ(balance(), 5);
  EXPECT_EQ(records(), 1);
}

TEST_F(Cases, C14_RedeliveryAfterTheGuardRetentionIsASinkDuplicate) {
  auto sink = make_sink();
  // The key comes from the business identity of message M, not from a per-delivery ID.
  const std::string key = IdempotencyKey{"consumer", "refund", "order-7"}.encode();
  ASSERT_EQ(refund(*sink, key, "delivery-1", "order-7").status, SinkStatus::kClaimed);
  // Ten minutes pass (the guard's 5 min retention is over; the sink keeps 24 h).
  schema_->exec("UPDATE " + table("idem_records") +
                " SET created_at = created_at - interval '10 minutes',"
                "     expires_at = expires_at - interval '10 minutes'");
  bool written = true;
  const SinkClaim redelivered = refund(*sink, key, "delivery-2-fresh-id", "order-7", &written);
  EXPECT_EQ(redelivered.status, SinkStatus::kDuplicate);
  EXPECT_EQ(redelivered.state, RecordState::kCompleted);
  EXPECT_FALSE(redelivered.same_request);
  EXPECT_EQ(redelivered.response, std::optional<std::string>("refunded order-7"));
  EXPECT_FALSE(written);
  EXPECT_EQ(refunds(), 1);
  EXPECT_EQ(balance(), 5);
}

TEST_F(Cases, C02_SinkSideOfACrashedWorker) {
  auto worker = make_sink();
  PgSinkOptions retry_options;
  retry_options.conninfo = url_;
  retry_options.schema = schema_->name();
  retry_options.ns = "refunds";
  retry_options.lock_timeout = std::chrono::milliseconds(50);
  retry_options.business_constraints = {"refunds_idem_key_key"};
  PgSink retry(retry_options);
  const std::string key = IdempotencyKey{"u2", "refund", "order-8"}.encode();

  // The first worker claims and writes, then is killed before it commits.
  std::promise<std::int64_t> backend;
  std::promise<void> killed;
  std::thread first([&] {
    EXPECT_THROW(worker->transact([&](pqxx::transaction_base& tx) {
      ASSERT_EQ(worker->claim(tx, key, "req-1", "fp").status, SinkStatus::kClaimed);
      tx.exec0("INSERT INTO " + table("refunds") + " VALUES ('order-8', 5)");
      backend.set_value(tx.exec1("SELECT pg_backend_pid()")[0].as<std::int64_t>());
      killed.get_future().wait();
    }),
                 PostgresError);
  });
  const std::int64_t pid = backend.get_future().get();
  // While it runs, a retry is told "in progress", never that the work succeeded.
  const SinkClaim during = refund(retry, key, "req-1", "order-8");
  EXPECT_EQ(during.status, SinkStatus::kInProgress);
  schema_->exec("SELECT pg_terminate_backend(" + std::to_string(pid) + ")");
  killed.set_value();
  first.join();

  // The killed transaction left nothing: the next retry is the first execution.
  EXPECT_EQ(records(), 0);
  EXPECT_EQ(refund(retry, key, "req-1", "order-8").status, SinkStatus::kClaimed);
  // Had that run committed (it has now), a later retry is a duplicate: still one business row.
  EXPECT_EQ(refund(retry, key, "req-1", "order-8").status, SinkStatus::kDuplicate);
  EXPECT_EQ(refunds(), 1);
  EXPECT_EQ(balance(), 5);
}

}  // namespace
}  // namespace idem
