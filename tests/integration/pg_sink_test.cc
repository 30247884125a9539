// The Postgres sink against a real PostgreSQL (IDEM_TEST_PG_URL), each test in its own schema.
#include "idem/pg_sink.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <future>
#include <memory>
#include <pqxx/pqxx>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/key.h"
#include "pg_server.h"
#include "test_env.h"

namespace idem {
namespace {

// Another transaction holding an uncommitted claim of `key` (request req-a) from construction
// until finish() (or destruction), when it commits.
class OpenClaim {
 public:
  OpenClaim(PgSink& sink, const std::string& key)
      : thread_([this, &sink, key] {
          sink.transact([&](pqxx::transaction_base& tx) {
            ASSERT_EQ(sink.claim(tx, key, "req-a", "fp").status, SinkStatus::kClaimed);
            claimed_.set_value();
            finish_.get_future().wait();
          });
        }) {
    claimed_.get_future().wait();
  }
  ~OpenClaim() { finish(); }
  OpenClaim(const OpenClaim&) = delete;
  OpenClaim& operator=(const OpenClaim&) = delete;

  void finish() {
    if (!thread_.joinable()) return;
    finish_.set_value();
    thread_.join();
  }

 private:
  std::promise<void> claimed_;
  std::promise<void> finish_;
  std::thread thread_;
};

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
  opts.lock_timeout = std::chrono::milliseconds(0);      // the losers wait for the winner's commit
  opts.response_timeout = std::chrono::milliseconds(0);  // as long as it takes
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
      if (answer.status == SinkStatus::kDuplicate && answer.state == RecordState::kCompleted &&
          answer.response.has_value()) {
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

TEST_F(PgSinkTest, ClaimAgainstAnOpenTransactionAnswersInProgressWithinTheLockTimeout) {
  PgSinkOptions opts = options();
  opts.lock_timeout = std::chrono::milliseconds(50);
  auto sink = make_sink(opts);
  OpenClaim first(*sink, "k4");
  SinkClaim second;
  bool body_ran = false;
  sink->transact([&](pqxx::transaction_base& tx) {
    second = sink->claim(tx, "k4", "req-b", "fp");
    body_ran = true;
  });
  first.finish();
  EXPECT_TRUE(body_ran);
  EXPECT_EQ(second.status, SinkStatus::kInProgress);
  EXPECT_EQ(second.state, RecordState::kInProgress);
  EXPECT_EQ(record_rows(), 1);
  // The non-transactional claim takes the same path.
  EXPECT_EQ(sink->claim("k4", "req-c", "fp").status, SinkStatus::kDuplicate);
}

// A claim's lock wait that runs out aborts the transaction: transact_if() answered "committed"
// when the body returned true anyway, and a consumer acking on it lost the message.
TEST_F(PgSinkTest, TransactIfSaysNothingCommittedWhenTheBodyGoesOnAfterAClaimInProgress) {
  PgSinkOptions opts = options();
  opts.lock_timeout = std::chrono::milliseconds(50);
  auto sink = make_sink(opts);
  OpenClaim first(*sink, "k5");
  SinkClaim second;
  const bool committed = sink->transact_if([&](pqxx::transaction_base& tx) {
    second = sink->claim(tx, "k5", "req-b", "fp");
    return true;  // a body that ignores the answer
  });
  first.finish();
  EXPECT_EQ(second.status, SinkStatus::kInProgress);
  EXPECT_FALSE(committed);
}

// A body that catches a failed statement and returns: nothing can commit. transact() let a raw
// pqxx::usage_error out (or, after a failed claim flight, returned as if it had committed).
TEST_F(PgSinkTest, ABodyThatCatchesAFailedStatementGetsAPostgresErrorNotACommit) {
  try {
    sink_->transact([&](pqxx::transaction_base& tx) {
      ASSERT_EQ(sink_->claim(tx, "k6", "req-a", "fp").status, SinkStatus::kClaimed);
      try {
        tx.exec0("SELECT * FROM no_such_table_here");
      } catch (const std::exception&) {
        // the body goes on
      }
    });
    ADD_FAILURE() << "transact() returned as if it had committed";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "25P02") << error.what();
    EXPECT_FALSE(error.retryable());
  }
  EXPECT_EQ(record_rows(), 0);
}

// force_release() locked only the row, which an open claim's INSERT does not show yet: it
// answered kNotFound at once, and the claim committed after it.
TEST_F(PgSinkTest, ForceReleaseWaitsForAClaimNotCommittedYet) {
  OpenClaim first(*sink_, "k7");
  auto released = std::async(
      std::launch::async, [&] { return sink_->force_release("k7", ForceReleaseScope::kAnyState); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  first.finish();  // the claim commits while force_release() waits for its lock
  EXPECT_EQ(released.get(), ForceReleaseStatus::kReleased);
  EXPECT_EQ(record_rows(), 0);
}

TEST_F(PgSinkTest, StatementTimeoutIsARetryablePostgresError) {
  PgSinkOptions opts = options();
  opts.statement_timeout = std::chrono::milliseconds(20);
  auto sink = make_sink(opts);
  try {
    sink->transact([](pqxx::transaction_base& tx) { tx.exec("SELECT pg_sleep(5)"); });
    FAIL() << "no timeout";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "57014");
    EXPECT_TRUE(error.retryable());
  }
  EXPECT_EQ(run_once(*sink, "k5", "req-a").status, SinkStatus::kClaimed);
}

TEST_F(PgSinkTest, PingAnswersWhenTheServerDoesAndThrowsARedactedErrorWhenItIsUnreachable) {
  EXPECT_NO_THROW(sink_->ping());
  PgSinkOptions opts = options();
  opts.conninfo = "postgresql://app:s3cret@127.0.0.1:1/none?connect_timeout=2";  // nothing there
  auto unreachable = make_sink(opts);
  try {
    unreachable->ping();
    FAIL() << "a ping of a closed port succeeded";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable());
    EXPECT_EQ(std::string(error.what()).find("s3cret"), std::string::npos) << error.what();
  }
}

TEST_F(PgSinkTest, NonTransactionalClaimCompleteAndRelease) {
  const SinkClaim first = sink_->claim("k6", "req-a", "fp");
  EXPECT_EQ(first.status, SinkStatus::kClaimed);
  const SinkClaim during = sink_->claim("k6", "req-b", "fp");
  EXPECT_EQ(during.status, SinkStatus::kDuplicate);
  EXPECT_EQ(during.state, RecordState::kInProgress);
  EXPECT_FALSE(during.same_request);
  EXPECT_FALSE(sink_->release("k6", "req-b"));  // never another request's claim
  EXPECT_FALSE(sink_->complete("k6", "req-b", "x"));
  EXPECT_TRUE(sink_->release("k6", "req-a"));
  EXPECT_EQ(sink_->claim("k6", "req-b", "fp").status, SinkStatus::kClaimed);
  EXPECT_TRUE(sink_->complete("k6", "req-b", "done"));
  EXPECT_FALSE(sink_->release("k6", "req-b"));  // a completed row stays
  const SinkClaim after = sink_->claim("k6", "req-c", "fp");
  EXPECT_EQ(after.status, SinkStatus::kDuplicate);
  EXPECT_EQ(after.state, RecordState::kCompleted);
  EXPECT_EQ(after.response, std::optional<std::string>("done"));
}

TEST_F(PgSinkTest, ANegativeRetentionIsAConfigErrorAndLeavesTheClaimAsItWas) {
  constexpr std::chrono::milliseconds kNegative(-1);
  ASSERT_EQ(sink_->claim("k7", "req-a", "fp").status, SinkStatus::kClaimed);
  EXPECT_THROW((void)sink_->complete("k7", "req-a", "done", kNegative), ConfigError);
  EXPECT_THROW(sink_->transact([&](pqxx::transaction_base& tx) {
    (void)sink_->claim(tx, "k8", "req-a", "fp", kNegative);
  }),
               ConfigError);
  EXPECT_THROW(sink_->transact([&](pqxx::transaction_base& tx) {
    ASSERT_EQ(sink_->claim(tx, "k9", "req-a", "fp").status, SinkStatus::kClaimed);
    sink_->complete(tx, "k9", "done", kNegative);
  }),
               ConfigError);
  EXPECT_EQ(record_rows(), 1);  // k7's claim, still in progress and the request's own
  const SinkClaim k7 = sink_->claim("k7", "req-a", "fp");
  EXPECT_EQ(k7.state, RecordState::kInProgress);
  EXPECT_TRUE(k7.same_request);
  EXPECT_TRUE(sink_->complete("k7", "req-a", "done"));
}

TEST_F(PgSinkTest, AnExpiredRowIsTakenOverAndPurgedInBatches) {
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(sink_->claim("e" + std::to_string(i), "r", "").status, SinkStatus::kClaimed);
  ASSERT_EQ(sink_->claim("live", "r", "").status, SinkStatus::kClaimed);
  schema_->exec("UPDATE " + schema_->name() +
                ".idem_records SET expires_at = now() - interval '1 second' WHERE key <> 'live'");
  EXPECT_EQ(sink_->claim("e0", "r2", "").status, SinkStatus::kClaimed);  // lease over: taken over
  EXPECT_EQ(sink_->purge_expired(2), 4U);
  EXPECT_EQ(record_rows(), 2);
  EXPECT_EQ(sink_->purge_expired(2), 0U);
  EXPECT_THROW((void)sink_->purge_expired(0), ConfigError);
}

// Fencing per attempt: rows were owned by their request ID, so an earlier attempt of a request
// could complete or release a later attempt's takeover of the same key.
TEST_F(PgSinkTest, AnOwnerTokenFencesAnEarlierAttemptOfTheSameRequest) {
  ASSERT_EQ(sink_->claim("f1", "req-a", "", "attempt-1").status, SinkStatus::kClaimed);
  EXPECT_TRUE(sink_->renew("f1", "attempt-1"));
  EXPECT_FALSE(sink_->renew("f1", "req-a"));
  schema_->exec("UPDATE " + schema_->name() +
                ".idem_records SET expires_at = now() - interval '1 second' WHERE key = 'f1'");
  ASSERT_EQ(sink_->claim("f1", "req-a", "", "attempt-2").status, SinkStatus::kClaimed);
  EXPECT_FALSE(sink_->complete("f1", "attempt-1", "late"));
  EXPECT_FALSE(sink_->release("f1", "attempt-1"));
  EXPECT_FALSE(sink_->renew("f1", "attempt-1"));
  EXPECT_TRUE(sink_->complete("f1", "attempt-2", "done"));
  EXPECT_EQ(sink_->claim("f1", "req-z", "").response, std::optional<std::string>("done"));
}

// Migration 2 adds the owner token: a row claimed under migration 1 stays owned by its request ID.
TEST_F(PgSinkTest, ARowClaimedBeforeTheOwnerTokenStaysOwnedByItsRequestId) {
  schema_->exec("DROP TABLE " + schema_->name() + ".idem_records");
  schema_->exec("DELETE FROM " + schema_->name() + ".idem_records_versions WHERE version > 0");
  const std::string v1 =
      "CREATE TABLE " + schema_->name() +
      ".idem_records (ns text NOT NULL, key text NOT NULL, request_id varchar(64) NOT NULL,"
      " fingerprint text NOT NULL, state text NOT NULL DEFAULT 'in_progress',"
      " response bytea, response_sha256 text, created_at timestamptz NOT NULL DEFAULT now(),"
      " expires_at timestamptz NOT NULL, PRIMARY KEY (ns, key))";
  schema_->exec(v1);
  schema_->exec("INSERT INTO " + schema_->name() + ".idem_records_versions (version) VALUES (1)");
  schema_->exec("INSERT INTO " + schema_->name() +
                ".idem_records (ns, key, request_id, fingerprint, expires_at)"
                " VALUES ('orders', 'old', 'req-old', '', now() + interval '1 hour')");
  sink_->migrate();
  EXPECT_EQ(sink_->schema_version(), 2);
  EXPECT_TRUE(sink_->complete("old", "req-old", "done"));
}

TEST_F(PgSinkTest, ResponsesOverTheCapKeepOnlyTheirSha256) {
  PgSinkOptions opts = options();
  opts.max_response_bytes = 3;
  auto sink = make_sink(opts);
  ASSERT_EQ(sink->claim("small", "r", "").status, SinkStatus::kClaimed);
  ASSERT_TRUE(sink->complete("small", "r", std::string("a\0b", 3)));
  ASSERT_EQ(sink->claim("big", "r", "").status, SinkStatus::kClaimed);
  ASSERT_TRUE(sink->complete("big", "r", "abcd"));
  const SinkClaim small = sink->claim("small", "r", "");
  EXPECT_EQ(small.response, std::optional<std::string>(std::string("a\0b", 3)));
  EXPECT_TRUE(small.response_sha256.empty());
  const SinkClaim big = sink->claim("big", "r", "");
  EXPECT_EQ(big.state, RecordState::kCompleted);
  EXPECT_FALSE(big.response.has_value());
  EXPECT_EQ(big.response_sha256,
            "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589");
}

TEST_F(PgSinkTest, MigrateIsIdempotentAndSafeConcurrently) {
  PgSinkOptions opts = options();
  opts.schema = schema_->name() + "_m";  // a schema nobody created yet
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      try {
        PgSink(opts).migrate();
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  make_sink(opts)->migrate();
  // Each migration (1: the table, 2: the owner token) recorded once.
  EXPECT_EQ(schema_->count("SELECT count(*) FROM " + opts.schema + ".idem_records_versions"), 2);
  EXPECT_EQ(schema_->count("SELECT count(*) FROM pg_indexes WHERE schemaname = '" + opts.schema +
                           "' AND indexname = 'idem_records_expires_at_idx'"),
            1);
  EXPECT_EQ(
      schema_->count("SELECT count(*) FROM information_schema.columns WHERE table_schema = '" +
                     opts.schema + "' AND column_name IN ('ns', 'key') AND is_nullable = 'NO'"),
      2);
  schema_->exec("DROP SCHEMA " + opts.schema + " CASCADE");
}

TEST_F(PgSinkTest, OnceMigratedMigrateNeedsNoCreatePrivilege) {
  std::smatch url;
  static const std::regex kUser(R"((postgres(?:ql)?://)[^@:/]+@(.*))");
  if (!std::regex_match(url_, url, kUser)) GTEST_SKIP() << "URL without a user name";
  const std::string role = "idem_app_" + std::to_string(::getpid());  // cluster-wide: short
  const std::string table = schema_->name() + ".idem_records";
  schema_->exec("CREATE ROLE " + role + " LOGIN; GRANT USAGE ON SCHEMA " + schema_->name() +
                " TO " + role + "; GRANT SELECT, INSERT, UPDATE, DELETE ON " + table + ", " +
                table + "_versions, " + schema_->name() + ".ledger TO " + role);
  PgSinkOptions opts = options();
  opts.conninfo = url[1].str() + role + "@" + url[2].str();
  try {
    PgSink app(opts);
    app.migrate();  // already at the current version: no DDL, no CREATE privilege needed
    EXPECT_EQ(run_once(app, "k11", "req-a").status, SinkStatus::kClaimed);
  } catch (const std::exception& error) {
    ADD_FAILURE() << error.what();
  }
  schema_->exec("DROP OWNED BY " + role + "; DROP ROLE " + role);
}

TEST_F(PgSinkTest, QuotedNamesAreSafe) {
  PgSinkOptions opts = options();
  opts.table = "Records \"; DROP TABLE ledger; --";
  auto sink = make_sink(opts);
  sink->migrate();
  EXPECT_EQ(run_once(*sink, "k7", "req-a").status, SinkStatus::kClaimed);
  EXPECT_EQ(run_once(*sink, "k7", "req-a").status, SinkStatus::kDuplicate);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(PgSinkTest, ATerminatedConnectionIsNeverHandedOutAgain) {
  PgSinkOptions opts = options();
  opts.pool_size = 1;
  auto sink = make_sink(opts);
  std::int64_t pid = 0;
  sink->transact([&](pqxx::transaction_base& tx) {
    pid = tx.exec1("SELECT pg_backend_pid()")[0].as<std::int64_t>();
  });
  schema_->exec("SELECT pg_terminate_backend(" + std::to_string(pid) + ")");
  try {
    sink->transact([](pqxx::transaction_base& tx) { tx.exec("SELECT 1"); });
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable()) << error.what();  // the loss may also be noticed only later
  }
  std::int64_t next = 0;
  sink->transact([&](pqxx::transaction_base& tx) {
    next = tx.exec1("SELECT pg_backend_pid()")[0].as<std::int64_t>();
  });
  EXPECT_NE(next, pid);
}

TEST_F(PgSinkTest, DeadlockIsARetryablePostgresError) {
  PgSinkOptions opts = options();
  opts.lock_timeout = std::chrono::milliseconds(0);  // let the deadlock detector decide
  opts.response_timeout = std::chrono::milliseconds(0);
  auto sink = make_sink(opts);
  const std::string accounts = schema_->name() + ".accounts";
  schema_->exec("CREATE TABLE " + accounts +
                " (id int PRIMARY KEY, n int NOT NULL);"
                "INSERT INTO " +
                accounts + " VALUES (1, 0), (2, 0)");
  std::barrier both_hold_one(2);
  std::atomic<int> deadlocks{0};
  const auto transfer = [&](int first, int second) {
    try {
      sink->transact([&](pqxx::transaction_base& tx) {
        tx.exec0("UPDATE " + accounts + " SET n = n + 1 WHERE id = " + std::to_string(first));
        both_hold_one.arrive_and_wait();
        tx.exec0("UPDATE " + accounts + " SET n = n + 1 WHERE id = " + std::to_string(second));
      });
    } catch (const PostgresError& error) {
      EXPECT_EQ(error.sqlstate(), "40P01");
      EXPECT_TRUE(error.retryable());
      ++deadlocks;
    }
  };
  std::thread a(transfer, 1, 2);
  std::thread b(transfer, 2, 1);
  a.join();
  b.join();
  EXPECT_EQ(deadlocks.load(), 1);
  EXPECT_EQ(schema_->count("SELECT sum(n) FROM " + accounts), 2);
}

// Holds one of `sink`'s pooled connections, in an open transaction on a thread of its own,
// from construction until release() (or destruction).
class HeldConnection {
 public:
  explicit HeldConnection(PgSink& sink)
      : thread_([this, &sink] {
          sink.transact([this](pqxx::transaction_base&) {
            holding_.set_value();
            release_.get_future().wait();
          });
        }) {
    holding_.get_future().wait();
  }
  ~HeldConnection() { release(); }
  HeldConnection(const HeldConnection&) = delete;
  HeldConnection& operator=(const HeldConnection&) = delete;
  void release() {
    if (!thread_.joinable()) return;
    release_.set_value();
    thread_.join();
  }

 private:
  std::promise<void> holding_;
  std::promise<void> release_;
  std::thread thread_;
};

TEST_F(PgSinkTest, AnExhaustedPoolFailsAfterTheBorrowTimeoutWithARetryableError) {
  PgSinkOptions opts = options();
  opts.pool_size = 1;
  opts.borrow_timeout = std::chrono::milliseconds(10);
  auto sink = make_sink(opts);
  HeldConnection held(*sink);
  try {
    (void)sink->claim("k8", "req", "");
    ADD_FAILURE() << "borrowed from an exhausted pool";
  } catch (const PostgresError& error) {
    EXPECT_TRUE(error.retryable());
    EXPECT_EQ(error.sqlstate(), "");
  }
  held.release();
  EXPECT_EQ(sink->claim("k8", "req", "").status, SinkStatus::kClaimed);
}

// Polls `done` for up to 10 s; whether it became true.
template <class Done>
bool within_seconds(Done done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST_F(PgSinkTest, PoolStatsCountTheConnectionInUseAndTheThreadWaitingForIt) {
  PgSinkOptions opts = options();
  opts.pool_size = 1;
  opts.borrow_timeout = std::chrono::seconds(30);
  auto sink = make_sink(opts);
  EXPECT_EQ(sink->pool_stats().size, 1u);
  EXPECT_EQ(sink->pool_stats().open, 0u);  // nothing connects before the first call
  HeldConnection held(*sink);
  EXPECT_EQ(sink->pool_stats().in_use, 1u);
  EXPECT_EQ(sink->pool_stats().waiters, 0u);
  std::thread waiter([&] { EXPECT_EQ(sink->claim("k9", "req", "").status, SinkStatus::kClaimed); });
  EXPECT_TRUE(within_seconds([&] { return sink->pool_stats().waiters == 1; }));
  EXPECT_EQ(sink->pool_stats().in_use, 1u);
  held.release();
  waiter.join();
  const PoolStats after = sink->pool_stats();
  EXPECT_EQ(after.open, 1u);
  EXPECT_EQ(after.in_use, 0u);
  EXPECT_EQ(after.waiters, 0u);
}

TEST_F(PgSinkTest, KeywordConninfoAndTheCallersOwnConnectionWork) {
  std::smatch url;
  static const std::regex kUrl(R"(postgres(?:ql)?://([^@:/]+)@([^:/]+):(\d+)/([A-Za-z0-9_]+))");
  if (!std::regex_match(url_, url, kUrl)) GTEST_SKIP() << "URL not of the form user@host:port/db";
  PgSinkOptions opts = options();
  opts.conninfo = "user=" + url[1].str() + " host=" + url[2].str() + " port=" + url[3].str() +
                  " dbname=" + url[4].str();
  auto sink = make_sink(opts);
  EXPECT_EQ(run_once(*sink, "k9", "req-a").status, SinkStatus::kClaimed);

  // A transaction on a connection the sink never saw: the statements are prepared there.
  pqxx::connection own(url_);
  pqxx::work tx(own);
  const SinkClaim answer = sink->claim(tx, "k9", "req-b", "fp-1");
  EXPECT_EQ(answer.status, SinkStatus::kDuplicate);
  EXPECT_EQ(answer.response, std::optional<std::string>("response of req-a"));
  EXPECT_EQ(sink->claim(tx, "k10", "req-b", "").status, SinkStatus::kClaimed);
  sink->complete(tx, "k10", "own");
  tx.commit();
  EXPECT_EQ(sink->claim("k10", "req-c", "").response, std::optional<std::string>("own"));
}

TEST_F(PgSinkTest, AClaimInTheCallersNontransactionCommitsAtOnce) {
  // A pqxx::nontransaction hands libpq's connection to no one: its claim goes through libpqxx.
  pqxx::connection own(url_);
  pqxx::nontransaction tx(own);
  EXPECT_EQ(sink_->claim(tx, "k11", "req-a", "fp").status, SinkStatus::kClaimed);
  const SinkClaim again = sink_->claim("k11", "req-b", "fp");  // on a pooled connection
  EXPECT_EQ(again.status, SinkStatus::kDuplicate);             // the claim row is committed already
  EXPECT_EQ(again.state, RecordState::kInProgress);
  EXPECT_FALSE(again.same_request);
  sink_->complete(tx, "k11", "response of req-a");
  EXPECT_EQ(sink_->claim("k11", "req-b", "fp").response,
            std::optional<std::string>("response of req-a"));
}

TEST_F(PgSinkTest, InvalidOptionsAreConfigErrors) {
  PgSinkOptions opts = options();
  opts.pool_size = 0;
  EXPECT_THROW(PgSink{opts}, ConfigError);
  opts = options();
  opts.table = "";
  EXPECT_THROW(PgSink{opts}, ConfigError);
  opts = options();
  opts.lease = std::chrono::milliseconds(0);
  EXPECT_THROW(PgSink{opts}, ConfigError);
  // A namespace past the key's budget failed every call with 54000 (index row too large), in
  // run_transactional() only after the handler had run.
  opts = options();
  opts.ns = std::string(kMaxKeyComponentBytes + 1, 'n');
  EXPECT_THROW(PgSink{opts}, ConfigError);
  opts.ns.pop_back();
  EXPECT_NO_THROW(PgSink{opts});
  EXPECT_THROW((void)sink_->claim("k", std::string(65, 'r'), ""), InvalidRequestId);
}

// PostgreSQL keeps 63 bytes of a name: a 62-byte table's `<table>_versions` and
// `<table>_expires_at_idx` were both cut to `<table>_`, so migrate() skipped the index and still
// reported success; at 63 bytes the versions table took the records table's own name.
TEST_F(PgSinkTest, ATableNameTooLongForItsDerivedNamesIsAConfigErrorNotAHalfMigration) {
  PgSinkOptions opts = options();
  opts.table = std::string(48, 't');  // 48 + "_expires_at_idx" = 63 bytes
  PgSink longest(opts);
  longest.migrate();
  EXPECT_EQ(
      schema_->count("SELECT count(*) FROM pg_indexes WHERE schemaname = '" + schema_->name() +
                     "' AND indexname = '" + opts.table + "_expires_at_idx'"),
      1);
  for (const std::size_t bytes : {49, 62, 63}) {
    opts.table = std::string(bytes, 't');
    EXPECT_THROW(PgSink{opts}, ConfigError) << bytes;
  }
}

// A connection string libpq cannot parse was taken as given: every call then failed as a
// retryable outage (kUnavailable) instead of the configuration error it is.
TEST_F(PgSinkTest, AMalformedConnectionStringIsAConfigErrorNotAnOutage) {
  PgSinkOptions opts = options();
  for (const char* bad :
       {"postgresql://%zz", "host=127.0.0.1 bogus=1", "postgresql://u:p%zz@h/db"}) {
    opts.conninfo = bad;
    try {
      PgSink sink(opts);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).find("p%zz"), std::string::npos)
          << "the password shows: " << error.what();
    }
  }
}

// The pool handed out the connection given back last, so threads and server processes met in
// rotation; a thread meeting the same one again costs the kernel's scheduler less (the pg bench's
// claims ran about a quarter faster with the same connections).
TEST_F(PgSinkTest, AThreadGetsBackTheConnectionItGaveBackLastWhileItIsIdle) {
  PgSinkOptions opts = options();
  opts.pool_size = 2;
  PgSink sink(opts);
  const auto backend = [&] {
    int pid = 0;
    sink.transact([&](pqxx::transaction_base& tx) {
      pid = tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
    });
    return pid;
  };
  // Two connections at once: this thread's goes back first, so the other's is on top of the
  // idle ones afterwards.
  std::promise<void> theirs_open, mine_back;
  int theirs = 0;
  std::thread other([&] {
    sink.transact([&](pqxx::transaction_base& tx) {
      theirs = tx.exec1("SELECT pg_backend_pid()")[0].as<int>();
      theirs_open.set_value();
      mine_back.get_future().wait();
    });
  });
  theirs_open.get_future().wait();
  const int mine = backend();
  mine_back.set_value();
  other.join();
  ASSERT_NE(mine, theirs);
  EXPECT_EQ(backend(), mine);
  EXPECT_EQ(backend(), mine);
  int again = 0;
  std::thread([&] { again = backend(); }).join();  // a thread with none of its own: any
  EXPECT_TRUE(again == mine || again == theirs) << again;
}

}  // namespace
}  // namespace idem
