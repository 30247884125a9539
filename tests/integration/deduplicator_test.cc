// The facade against real Redis and PostgreSQL.
#include "idem/deduplicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <pqxx/pqxx>
#include <stdexcept>
#include <thread>
#include <vector>

#include "idem/errors.h"
#include "idem/fingerprint.h"
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
    tx.exec0("CREATE TABLE " + schema_ +
             ".ledger (order_id text NOT NULL, amount bigint NOT NULL)");
    tx.commit();

    redis_url_ = redis_url;
    dedup_ = make_deduplicator(std::chrono::hours(1));
  }

  // Options for one layer set-up; adjust them before calling make().
  struct Setup {
    RedisGuardOptions guard;
    PgSinkOptions sink;
    DeduplicatorOptions dedup;
    bool with_guard = true;
    bool with_sink = true;
  };

  Setup setup(std::chrono::milliseconds retention = std::chrono::hours(1)) const {
    Setup s;
    s.guard.redis.url = redis_url_;
    s.guard.ns = schema_;
    s.guard.retention = retention;
    s.sink.conninfo = pg_url_;
    s.sink.schema = schema_;
    s.dedup.local_cache_capacity = 0;  // every repeat must reach the backends
    return s;
  }

  static std::unique_ptr<Deduplicator> make(Setup s) {
    if (s.with_guard) s.dedup.guard = std::make_shared<RedisGuard>(s.guard);
    if (s.with_sink) {
      s.dedup.sink = std::make_shared<PgSink>(s.sink);
      s.dedup.sink->migrate();
    }
    return std::make_unique<Deduplicator>(std::move(s.dedup));
  }

  std::unique_ptr<Deduplicator> make_deduplicator(std::chrono::milliseconds retention) const {
    return make(setup(retention));
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

  std::int64_t ledger_rows_in(pqxx::transaction_base& tx) const {
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

TEST_F(DeduplicatorTest, AFailureAtStepThreeOfFourAndARetryReplayStepsOneAndTwoFromRedis) {
  std::map<std::string, int> runs;
  bool fail = true;
  const auto agent = [&](pqxx::transaction_base& tx, Context& context) {
    std::string answer;
    for (const char* name : {"plan", "search", "quote"}) {
      answer += context.step(name, answer, [&, name] {
        ++runs[name];
        if (fail && std::string_view(name) == "quote") throw std::runtime_error("quote timed out");
        return std::string(name) + "-done ";
      });
    }
    tx.exec_params0("INSERT INTO " + schema_ + ".ledger VALUES ($1, 5)", "o-agent");  // step 4
    return answer;
  };
  EXPECT_THROW((void)dedup_->run_transactional(request("r-agent", "o-agent"), agent),
               std::runtime_error);
  fail = false;
  const Outcome retry = dedup_->run_transactional(request("r-agent", "o-agent"), agent);
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(retry.response, "plan-done search-done quote-done ");
  EXPECT_EQ(runs, (std::map<std::string, int>{{"plan", 1}, {"search", 1}, {"quote", 2}}));
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(dedup_->run_transactional(request("r-agent", "o-agent"), agent).kind,
            Outcome::Kind::kDuplicate);
  EXPECT_EQ(runs["quote"], 2);
}

TEST_F(DeduplicatorTest, AStepThatWroteThroughTheTransactionRunsAgainAfterARollbackAndCommitsOnce) {
  Setup s = setup();
  const auto metrics = std::make_shared<InProcessMetrics>();
  s.dedup.metrics = metrics;
  dedup_ = make(std::move(s));
  std::map<std::string, int> runs;
  bool fail = true;
  const auto agent = [&](pqxx::transaction_base& tx, Context& context) {
    std::string answer = context.step("think", [&] {  // an LLM call: writes nowhere
      ++runs["think"];
      return std::string("refund 5");
    });
    answer += context.step("book", answer, [&] {  // the tool's effect, in the transaction
      ++runs["book"];
      tx.exec_params0("INSERT INTO " + schema_ + ".ledger VALUES ($1, 5)", "o-tx-step");
      return std::string(" booked");
    });
    answer += context.step("check", answer, [&] {  // reads through it, after it wrote
      ++runs["check"];
      return std::to_string(ledger_rows_in(tx)) + " row";
    });
    answer += context.step("reply", answer, [&] {
      ++runs["reply"];
      if (fail) throw std::runtime_error("the reply failed");
      return std::string(" sent");
    });
    return answer;
  };
  EXPECT_THROW((void)dedup_->run_transactional(request("r-tx-step", "o-tx-step"), agent),
               std::runtime_error);
  EXPECT_EQ(ledger_rows(), 0) << "the failed attempt's booking rolled back";
  fail = false;
  const Outcome retry = dedup_->run_transactional(request("r-tx-step", "o-tx-step"), agent);
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(retry.response, "refund 5 booked1 row sent");
  EXPECT_EQ(ledger_rows(), 1) << "a journaled booking would have been skipped: 0 rows";
  EXPECT_EQ(runs,
            (std::map<std::string, int>{{"think", 1}, {"book", 2}, {"check", 1}, {"reply", 2}}))
      << "only the step that wrote through the transaction, and the one that failed, ran again";
  EXPECT_EQ(metrics->steps(StepEnding::kInTransaction), 2U);
  EXPECT_EQ(metrics->steps(StepEnding::kJournaled), 3U) << "think, check, and the last reply";
  EXPECT_EQ(metrics->steps(StepEnding::kReplayed), 2U) << "think and check";
}

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
  ASSERT_EQ(dedup_->run_transactional(request("r1", "o3"), refund("o3")).kind,
            Outcome::Kind::kExecuted);
  const Outcome other =
      dedup_->run_transactional(request("r2", "o3", R"({"amount":6})"), refund("o3"));
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
  EXPECT_THROW(
      (void)dedup_->run_transactional(
          request("r1", "o5"), [](pqxx::transaction_base&) -> std::string { throw Cancelled(); }),
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
      const Outcome o =
          dedup_->run_transactional(request("r" + std::to_string(i), "o6"), refund("o6"));
      if (o.kind == Outcome::Kind::kExecuted) ++executed;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(executed.load(), 1);
  EXPECT_EQ(ledger_rows(), 1);
}

// Runs a transactional handler on another thread that stays inside the handler until
// release() is called; started() returns once it is inside.
class BlockedHandler {
 public:
  BlockedHandler(Deduplicator& dedup, Request request,
                 std::function<std::string(pqxx::transaction_base&)> body)
      : thread_([this, &dedup, request = std::move(request), body = std::move(body)] {
          outcome_ = dedup.run_transactional(request, [&](pqxx::transaction_base& tx) {
            started_.set_value();
            release_.get_future().wait();
            return body(tx);
          });
        }) {}
  ~BlockedHandler() {
    if (thread_.joinable()) finish();
  }
  void wait_started() { started_.get_future().wait(); }
  Outcome finish() {
    release_.set_value();
    thread_.join();
    return outcome_;
  }

 private:
  std::promise<void> started_;
  std::promise<void> release_;
  Outcome outcome_;
  std::thread thread_;
};

TEST_F(DeduplicatorTest, RepeatWhileFirstInProgressIsInProgressAndDoesNotRun) {
  BlockedHandler first(*dedup_, request("r1", "p1"), refund("p1"));
  first.wait_started();
  bool ran = false;
  const Outcome repeat =
      dedup_->run_transactional(request("r2", "p1"), [&](pqxx::transaction_base&) {
        ran = true;
        return std::string();
      });
  EXPECT_EQ(repeat.kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(repeat.layer, Layer::kRedisGuard);
  EXPECT_FALSE(ran);
  EXPECT_EQ(first.finish().kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, WaitForResultReplaysTheFirstExecution) {
  Setup s = setup();
  s.dedup.on_concurrent_duplicate = ConcurrentDuplicatePolicy::kWaitForResult;
  s.dedup.wait_for_result = std::chrono::seconds(30);
  const auto waiting = make(s);
  BlockedHandler first(*dedup_, request("r1", "p2"), refund("p2"));
  first.wait_started();
  std::thread finisher([&] { first.finish(); });
  const Outcome repeat = waiting->run_transactional(request("r1", "p2"), refund("p2"));
  finisher.join();
  EXPECT_EQ(repeat.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(repeat.response, "refunded p2");
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, ReentrantIntentRunsARetryOfTheSameRequestWhileInProgress) {
  Setup s = setup();
  s.dedup.reentrant_intents = {"refund"};
  const auto reentrant = make(s);
  BlockedHandler first(*reentrant, request("r1", "p3"), refund("p3"));
  first.wait_started();
  const Outcome retry = reentrant->run_transactional(request("r1", "p3"), refund("p3"));
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  const Outcome other = reentrant->run_transactional(request("r2", "p3"), refund("p3"));
  EXPECT_EQ(other.kind, Outcome::Kind::kInProgress) << "only REPEAT_SAME passes through";
  EXPECT_EQ(first.finish().kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 2);  // the reentrant retry ran: its effect must be idempotent itself
}

std::string throw_declined(pqxx::transaction_base&) {
  throw std::invalid_argument("card declined");
}

TEST_F(DeduplicatorTest, FailurePolicyKeepLeavesTheClaimUntilTheLeaseEnds) {
  Setup s = setup();
  s.dedup.on_handler_failure = [](std::exception_ptr) {
    return FailureDecision{FailureAction::kKeepUntilLeaseEnds, {}};
  };
  const auto keeping = make(s);
  EXPECT_THROW((void)keeping->run_transactional(request("r1", "f1"), throw_declined),
               std::invalid_argument);
  const Outcome retry = keeping->run_transactional(request("r1", "f1"), refund("f1"));
  EXPECT_EQ(retry.kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(ledger_rows(), 0);
}

TEST_F(DeduplicatorTest, FailurePolicyStoreReplaysTheBusinessErrorFromBothLayers) {
  Setup s = setup(std::chrono::milliseconds(200));
  s.dedup.on_handler_failure = [](std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::invalid_argument& e) {
      return FailureDecision{FailureAction::kStoreAsResponse, std::string("error: ") + e.what()};
    } catch (...) {
      return FailureDecision{};
    }
  };
  const auto storing = make(s);
  EXPECT_THROW((void)storing->run_transactional(request("r1", "f2"), throw_declined),
               std::invalid_argument);
  const Outcome from_guard = storing->run_transactional(request("r1", "f2"), refund("f2"));
  EXPECT_EQ(from_guard.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(from_guard.layer, Layer::kRedisGuard);
  EXPECT_EQ(from_guard.response, "error: card declined");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the guard's retention ends
  const Outcome from_sink = storing->run_transactional(request("r1", "f2"), refund("f2"));
  EXPECT_EQ(from_sink.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(from_sink.layer, Layer::kPgSink);
  EXPECT_EQ(from_sink.response, "error: card declined");
  EXPECT_EQ(ledger_rows(), 0);
}

TEST_F(DeduplicatorTest, StopRequestedTurnsAHandlerErrorIntoCancellationAndKeepsTheClaim) {
  std::stop_source stop;
  Request r = request("r1", "c1");
  r.stop = stop.get_token();
  EXPECT_THROW((void)dedup_->run_transactional(
                   r,
                   [&](pqxx::transaction_base&, Context& context) -> std::string {
                     stop.request_stop();
                     EXPECT_TRUE(context.stop_token().stop_requested());
                     throw std::runtime_error("aborted by stop");
                   }),
               std::runtime_error);
  EXPECT_EQ(dedup_->run_transactional(request("r1", "c1"), refund("c1")).kind,
            Outcome::Kind::kInProgress);
  EXPECT_EQ(ledger_rows(), 0);
}

TEST_F(DeduplicatorTest, ShutdownStopsRunningHandlersAndRefusesNewCalls) {
  std::promise<void> inside;
  std::thread running([&] {
    EXPECT_THROW((void)dedup_->run_transactional(
                     request("r1", "c2"),
                     [&](pqxx::transaction_base&, Context& context) -> std::string {
                       inside.set_value();
                       while (!context.stop_token().stop_requested()) {
                         std::this_thread::sleep_for(std::chrono::milliseconds(1));
                       }
                       throw Cancelled();
                     }),
                 Cancelled);
  });
  inside.get_future().wait();
  dedup_->shutdown();
  running.join();
  EXPECT_THROW((void)dedup_->run_transactional(request("r2", "c3"), refund("c3")), Cancelled);
  const auto next = make(setup());
  EXPECT_EQ(next->run_transactional(request("r1", "c2"), refund("c2")).kind,
            Outcome::Kind::kInProgress);
}

TEST_F(DeduplicatorTest, RedisUnreachableFailsOpenToTheSink) {
  Setup s = setup();
  s.guard.redis.url = "redis://127.0.0.1:1/0";  // nothing listens on port 1
  const auto open = make(s);
  EXPECT_EQ(open->run_transactional(request("r1", "u1"), refund("u1")).kind,
            Outcome::Kind::kExecuted);
  const Outcome again = open->run_transactional(request("r1", "u1"), refund("u1"));
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.layer, Layer::kPgSink);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, RedisUnreachableFailOpenWithoutSinkRunsUnguarded) {
  Setup s = setup();
  s.guard.redis.url = "redis://127.0.0.1:1/0";
  s.with_sink = false;
  s.dedup.on_redis_failure = RedisFailurePolicy::kFailOpen;
  const auto open = make(s);
  int runs = 0;
  EXPECT_EQ(open->run(request("r1", "u0"), [&] { return std::to_string(++runs); }).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 1);
}

TEST_F(DeduplicatorTest, RedisUnreachableFailsClosedAsUnavailable) {
  Setup s = setup();
  s.guard.redis.url = "redis://127.0.0.1:1/0";
  s.dedup.on_redis_failure = RedisFailurePolicy::kFailClosed;
  const auto closed = make(s);
  const Outcome outcome = closed->run_transactional(request("r1", "u2"), refund("u2"));
  EXPECT_EQ(outcome.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(outcome.layer, Layer::kRedisGuard);
  EXPECT_EQ(ledger_rows(), 0);
}

TEST_F(DeduplicatorTest, PostgresUnreachableIsUnavailableAndReleasesTheGuardClaim) {
  Setup s = setup();
  s.sink.conninfo = "postgresql://postgres@127.0.0.1:1/idem?connect_timeout=2";
  s.with_sink = false;
  s.dedup.sink = std::make_shared<PgSink>(s.sink);  // migrate() would throw: never reached
  const auto down = make(s);
  bool ran = false;
  const Outcome outcome =
      down->run_transactional(request("r1", "u3"), [&](pqxx::transaction_base&) {
        ran = true;
        return std::string();
      });
  EXPECT_EQ(outcome.kind, Outcome::Kind::kUnavailable);
  EXPECT_EQ(outcome.layer, Layer::kPgSink);
  EXPECT_FALSE(ran);
  EXPECT_NE(outcome.error.find("127.0.0.1"), std::string::npos) << "the reason: " << outcome.error;
  EXPECT_EQ(dedup_->run_transactional(request("r1", "u3"), refund("u3")).kind,
            Outcome::Kind::kExecuted)
      << "nothing ran, so the guard claim must not block the retry";
}

TEST_F(DeduplicatorTest, MissingKeyIsRejectedOrPassedThroughAsConfigured) {
  Request bare;
  bare.user = "u1";
  bare.intent = "refund";
  EXPECT_THROW((void)dedup_->run_transactional(bare, refund("m1")), MissingKey);
  Setup s = setup();
  s.dedup.on_missing_key = MissingKeyPolicy::kPassThrough;
  const auto passing = make(s);
  const Outcome outcome = passing->run_transactional(bare, refund("m1"));
  EXPECT_EQ(outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(outcome.layer, Layer::kHandler);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, PayloadWithoutIdOrBusinessKeyIsKeyedByItsFingerprint) {
  Request r;
  r.user = "u1";
  r.intent = "refund";
  r.payload = R"({"order":"o9","amount":5})";
  EXPECT_EQ(dedup_->run_transactional(r, refund("o9")).kind, Outcome::Kind::kExecuted);
  r.payload = R"({ "amount" : 5, "order" : "o9" })";  // same content, other bytes
  const Outcome again = dedup_->run_transactional(r, refund("o9"));
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(ledger_rows(), 1);
}

// The long call comes after a quick one, with the renewer idle between them: it once slept
// through every later call's start, so only the first calls of a deduplicator were renewed.
TEST_F(DeduplicatorTest, AutomaticRenewalKeepsALongHandlerExclusivePastItsInitialLease) {
  Setup s = setup();
  s.guard.lease = std::chrono::milliseconds(300);
  s.dedup.auto_renew_interval = std::chrono::milliseconds(50);
  const auto renewing = make(s);
  ASSERT_EQ(renewing->run_transactional(request("r0", "l0"), refund("l0")).kind,
            Outcome::Kind::kExecuted);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the renewer has none due
  std::promise<void> inside;
  std::promise<void> checked;
  std::thread first([&] {
    const Outcome o = renewing->run_transactional(
        request("r1", "l1"), [&](pqxx::transaction_base& tx, Context& context) {
          inside.set_value();
          checked.get_future().wait();
          EXPECT_FALSE(context.lease_lost());
          EXPECT_GT(context.remaining_lease().count(), 0);
          return refund("l1")(tx);
        });
    EXPECT_EQ(o.kind, Outcome::Kind::kExecuted);
  });
  inside.get_future().wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(900));  // three initial leases
  const Outcome repeat = renewing->run_transactional(request("r2", "l1"), refund("l1"));
  EXPECT_EQ(repeat.kind, Outcome::Kind::kInProgress);
  EXPECT_EQ(repeat.layer, Layer::kRedisGuard);
  checked.set_value();
  first.join();
  EXPECT_EQ(ledger_rows(), 2);
}

TEST_F(DeduplicatorTest, ManualRenewalReportsALostClaim) {
  Setup s = setup();
  s.guard.lease = std::chrono::milliseconds(100);
  const auto short_lease = make(s);
  const Outcome o = short_lease->run(request("r1", "l2"), [&](Context& context) {
    EXPECT_TRUE(context.renew());
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the lease ends in Redis
    RedisGuard thief(s.guard);
    EXPECT_EQ(thief.claim(context.key(), "thief", "").status, ClaimStatus::kFirst);
    EXPECT_FALSE(context.renew());
    EXPECT_TRUE(context.lease_lost());
    return std::string("done");
  });
  EXPECT_EQ(o.kind, Outcome::Kind::kExecuted);
  EXPECT_TRUE(o.lease_lost);
}

// A Redis-only handler that outlived its lease, while a redelivery took the key and ran too, is
// told so in its outcome (lease_lost): a plain kExecuted would hide that the effect may have
// doubled.
TEST_F(DeduplicatorTest, RedisOnlyHandlerThatOutlivesItsLeaseIsToldInItsOutcome) {
  Setup s = setup();
  s.with_sink = false;
  s.guard.lease = std::chrono::milliseconds(100);
  const auto redis_only = make(s);
  int runs = 0;
  Outcome redelivery;
  const Outcome first = redis_only->run(request("r1", "l3"), [&] {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the lease ends in Redis
    redelivery =
        redis_only->run(request("r2", "l3"), [&] { return "run " + std::to_string(++runs); });
    return std::string("run 1");
  });
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(redelivery.kind, Outcome::Kind::kExecuted);
  EXPECT_FALSE(redelivery.lease_lost);
  EXPECT_EQ(first.kind, Outcome::Kind::kExecuted);
  EXPECT_TRUE(first.lease_lost);
  // The redelivery's record stands: the late first completion did not overwrite it.
  const Outcome later = redis_only->run(request("r3", "l3"), [&] { return std::string("no"); });
  EXPECT_EQ(later.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(later.response, "run 2");
}

TEST_F(DeduplicatorTest, ContextCarriesTheCallsIdentity) {
  Request r = request("r-ctx", "x1");
  r.attempt = 3;
  const Outcome o = dedup_->run_transactional(r, [&](pqxx::transaction_base&, Context& context) {
    EXPECT_EQ(context.request_id(), "r-ctx");
    EXPECT_EQ(context.key(), "u1:refund:x1");
    EXPECT_EQ(context.fingerprint(), Fingerprinter{}.fingerprint(R"({"amount":5})", "u1"));
    EXPECT_EQ(context.attempt(), 3);
    return std::string("ok");
  });
  EXPECT_EQ(o.kind, Outcome::Kind::kExecuted);
}

TEST_F(DeduplicatorTest, NonTransactionalRunWithSinkCommitsTheRowAroundTheHandler) {
  const auto short_retention = make_deduplicator(std::chrono::milliseconds(50));
  int runs = 0;
  auto handler = [&] {
    ++runs;
    return std::string("sent");
  };
  EXPECT_EQ(short_retention->run(request("r1", "n1"), handler).kind, Outcome::Kind::kExecuted);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const Outcome again = short_retention->run(request("r1", "n1"), handler);
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.layer, Layer::kPgSink);
  EXPECT_EQ(again.response, "sent");
  EXPECT_EQ(runs, 1);
}

TEST_F(DeduplicatorTest, MetricsAndDecisionEventsSeeEveryCall) {
  Setup s = setup();
  auto metrics = std::make_shared<InProcessMetrics>();
  std::vector<std::string> events;
  std::mutex events_mutex;
  s.dedup.metrics = metrics;
  s.dedup.on_decision = [&](const DecisionEvent& e) {
    std::lock_guard lock(events_mutex);
    events.push_back(std::string(e.request_id) + "|" + std::string(e.key) + "|" +
                     std::string(to_string(e.layer)) + "|" + std::string(to_string(e.outcome)) +
                     "|" + std::to_string(e.attempt));
  };
  const auto observed = make(s);
  (void)observed->run_transactional(request("r1", "e1"), refund("e1"));
  (void)observed->run_transactional(request("r2", "e1"), refund("e1"));
  EXPECT_EQ(metrics->decisions(Layer::kHandler, Outcome::Kind::kExecuted), 1u);
  EXPECT_EQ(metrics->decisions(Layer::kRedisGuard, Outcome::Kind::kDuplicate), 1u);
  EXPECT_DOUBLE_EQ(metrics->duplicate_rate(), 0.5);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0], "r1|u1:refund:e1|handler|executed|1");
  EXPECT_EQ(events[1], "r2|u1:refund:e1|redis_guard|duplicate|1");
}

// The sink keeps a payload-keyed (fallback key) record for fallback_retention, not for its own
// 24 h retention, so the same body sent again later is not a duplicate for a whole day.
TEST_F(DeduplicatorTest, APayloadKeyedRecordLivesOnlyTheFallbackRetentionInTheSinkToo) {
  for (const bool transactional : {true, false}) {
    Setup s = setup();
    s.dedup.fallback_retention = std::chrono::milliseconds(1000);
    s.with_guard = false;  // the sink alone decides
    const auto sink_only = make(s);
    Request tip;
    tip.user = "u1";
    tip.intent = transactional ? "tip-tx" : "tip";
    tip.payload = R"({"cents":300})";
    int runs = 0;
    const auto run = [&] {
      return transactional
                 ? sink_only->run_transactional(
                       tip, [&](pqxx::transaction_base&) { return std::to_string(++runs); })
                 : sink_only->run(tip, [&] { return std::to_string(++runs); });
    };
    EXPECT_EQ(run().kind, Outcome::Kind::kExecuted);
    EXPECT_EQ(run().kind, Outcome::Kind::kDuplicate);  // a double click
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_EQ(run().kind, Outcome::Kind::kExecuted) << "transactional=" << transactional;
    EXPECT_EQ(runs, 2);
  }
}

// A sink whose records table was never migrated answers kUnavailable with a pointer to
// migrate(): the server's "relation ... does not exist" alone reads like an outage.
TEST_F(DeduplicatorTest, AnUnmigratedSinkIsUnavailableAndSaysToMigrate) {
  Setup s = setup();
  s.sink.schema = schema_ + "_never_migrated";  // the fixture migrated its own schema
  s.dedup.guard = std::make_shared<RedisGuard>(s.guard);
  s.dedup.sink = std::make_shared<PgSink>(s.sink);  // no migrate()
  Deduplicator unmigrated(std::move(s.dedup));
  int runs = 0;
  const Outcome plain = unmigrated.run(request("r1", "o1"), [&](Context&) {
    ++runs;
    return std::string("ran");
  });
  const Outcome transactional = unmigrated.run_transactional(request("r2", "o2"), refund("o2"));
  for (const Outcome& outcome : {plain, transactional}) {
    EXPECT_EQ(outcome.kind, Outcome::Kind::kUnavailable);
    EXPECT_EQ(outcome.layer, Layer::kPgSink);
    EXPECT_NE(outcome.error.find("does not exist"), std::string::npos) << outcome.error;
    EXPECT_NE(outcome.error.find("PgSink::migrate()"), std::string::npos) << outcome.error;
  }
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(ledger_rows(), 0);
}

// A handler's own SQL error is a handler failure, not a backend error of the sink: counted as
// one, it would fire the "backend errors" alert for what is a business failure.
TEST_F(DeduplicatorTest, AHandlersOwnSqlErrorIsAHandlerFailureNotABackendError) {
  Setup s = setup();
  auto metrics = std::make_shared<InProcessMetrics>();
  s.dedup.metrics = metrics;
  const auto observed = make(s);
  try {
    (void)observed->run_transactional(request("r1", "s1"), [](pqxx::transaction_base& tx) {
      tx.exec0("SELECT * FROM no_such_table");
      return std::string("unreachable");
    });
    ADD_FAILURE() << "the handler's SQL error was swallowed";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "42P01");
  }
  EXPECT_EQ(metrics->handler_failures(), 1u);
  EXPECT_EQ(metrics->backend_errors(Layer::kPgSink), 0u);
  EXPECT_EQ(observed->run_transactional(request("r1", "s1"), refund("s1")).kind,
            Outcome::Kind::kExecuted);  // released: the retry runs
}

// A COMMIT the server refused (here a deferred unique constraint) committed nothing, so the claim
// is released: taken for an unknown outcome, it would be kept and every retry would answer
// kInProgress until the lease ended.
TEST_F(DeduplicatorTest, ACommitTheServerRefusedReleasesTheClaimSoTheRetryRuns) {
  {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("ALTER TABLE " + schema_ +
             ".ledger ADD CONSTRAINT ledger_once UNIQUE (order_id) DEFERRABLE INITIALLY DEFERRED");
    tx.exec0("INSERT INTO " + schema_ + ".ledger VALUES ('d1', 5)");
    tx.commit();
  }
  try {
    (void)dedup_->run_transactional(request("r1", "d1"), refund("d1"));  // fails at COMMIT
    ADD_FAILURE() << "the deferred constraint did not fail the commit";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "23505") << error.what();
  }
  {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("DELETE FROM " + schema_ + ".ledger WHERE order_id = 'd1'");  // the conflict resolved
    tx.commit();
  }
  const Outcome retry = dedup_->run_transactional(request("r1", "d1"), refund("d1"));
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(DeduplicatorTest, ABusinessTablesUniqueViolationIsADuplicateAndTheConnectionStaysUsable) {
  {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("CREATE UNIQUE INDEX ledger_order_key ON " + schema_ + ".ledger (order_id)");
    tx.exec0("INSERT INTO " + schema_ + ".ledger VALUES ('b1', 5)");  // done before idem was there
    tx.commit();
  }
  Setup s = setup();
  s.sink.pool_size = 1;  // the next call must reuse the connection of the violation
  s.sink.business_constraints = {"ledger_order_key"};
  const auto guarded = make(s);
  const Outcome outcome = guarded->run_transactional(request("r1", "b1"), refund("b1"));
  EXPECT_EQ(outcome.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(outcome.layer, Layer::kPgSink);
  EXPECT_FALSE(outcome.response.has_value());
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(guarded->run_transactional(request("r2", "b2"), refund("b2")).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 2);
}

// A business constraint checked at COMMIT (DEFERRABLE INITIALLY DEFERRED) makes the call a
// duplicate as one checked at once does; nothing of it commits and the guard's claim goes.
TEST_F(DeduplicatorTest, ADeferredBusinessConstraintThatFiresAtCommitIsADuplicate) {
  {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("ALTER TABLE " + schema_ +
             ".ledger ADD CONSTRAINT ledger_order_once UNIQUE (order_id) DEFERRABLE INITIALLY "
             "DEFERRED");
    tx.exec0("INSERT INTO " + schema_ + ".ledger VALUES ('b1', 5)");  // done before idem was there
    tx.commit();
  }
  Setup s = setup();
  s.sink.business_constraints = {"ledger_order_once"};
  const auto guarded = make(s);
  int runs = 0;
  const auto pay = [&](pqxx::transaction_base& tx) {
    ++runs;
    tx.exec0("INSERT INTO " + schema_ + ".ledger VALUES ('b1', 7)");  // checked at COMMIT
    return std::string("paid b1");
  };
  const Outcome outcome = guarded->run_transactional(request("r1", "b1"), pay);
  EXPECT_EQ(outcome.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(outcome.layer, Layer::kPgSink);
  EXPECT_FALSE(outcome.response.has_value());
  EXPECT_EQ(ledger_rows(), 1);
  // Nothing recorded, the claim released: a redelivery runs and is a duplicate again.
  EXPECT_EQ(guarded->run_transactional(request("r2", "b1"), pay).kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(runs, 2);
}

TEST_F(DeduplicatorTest, AnotherConstraintsViolationInTheHandlerIsABusinessErrorThatReleases) {
  {
    pqxx::connection conn(pg_url_);
    pqxx::work tx(conn);
    tx.exec0("ALTER TABLE " + schema_ + ".ledger ADD CONSTRAINT positive CHECK (amount > 0)");
    tx.commit();
  }
  auto negative = [this](pqxx::transaction_base& tx) {
    tx.exec0("INSERT INTO " + schema_ + ".ledger VALUES ('b3', -1)");
    return std::string("never");
  };
  EXPECT_THROW((void)dedup_->run_transactional(request("r1", "b3"), negative), PostgresError);
  const Outcome retry = dedup_->run_transactional(request("r1", "b3"), refund("b3"));
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted) << "the claim of the failed attempt was released";
  EXPECT_EQ(ledger_rows(), 1);
}

// A Request::stop already requested when the call starts claims nothing and runs nothing
// (`s.request_stop(); r.stop = s.get_token();` → idem::Cancelled, not kExecuted).
TEST_F(DeduplicatorTest, ARequestStoppedBeforeItIsClaimedIsCancelledAndNothingCommits) {
  std::stop_source stop;
  stop.request_stop();
  Request r = request("r1", "b-stop");
  r.stop = stop.get_token();
  EXPECT_THROW((void)dedup_->run_transactional(r, refund("b-stop")), Cancelled);
  EXPECT_EQ(ledger_rows(), 0);
  // Nothing was claimed: the redelivery runs.
  EXPECT_EQ(dedup_->run_transactional(request("r1", "b-stop"), refund("b-stop")).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 1);
}

}  // namespace
}  // namespace idem
