// run_transactional() on the loop (AsyncDeduplicator, AsyncTransaction) against real servers:
// business rows and idem's record commit together, a duplicate replays, a handler failure rolls
// back and releases, a business constraint is a duplicate, TransactionalClaim::kBusinessKey,
// concurrent deliveries of one key on one loop run one handler, and a cancelled or
// deadline-exceeded call whose handler waits in `SELECT pg_sleep(10)` ends at once with its
// statement cancelled on the server and its claim kept. The blocking driver's counterpart: a
// stop while its handler's statement runs cancels it, and the call throws idem::Cancelled. A
// step that wrote through the transaction is not journaled: it runs again after a rollback.
#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <pqxx/pqxx>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "counting_proxy.h"
#include "exception_ptr.h"
#include "idem/async_deduplicator.h"
#include "idem/errors.h"
#include "loop_probe.h"
#include "pg_server.h"
#include "refund_request.h"
#include "test_env.h"

namespace idem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::sleep_for;

using test::refund_request;

// How a call ended: its outcome, or what it threw.
struct Ending {
  std::exception_ptr error;
  Outcome outcome;
  Clock::duration took{};
};

class AsyncTransactionalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    pg_url_ = pg_url;
    redis_url_ = redis_url;
    prefix_ = test::unique_name("asynctx");
    schema_ = std::make_unique<test::ScratchSchema>(pg_url_, "asynctx");
    schema_->exec(
        "CREATE TABLE " + table("ledger") +
        " (idem_key text NOT NULL CONSTRAINT ledger_once UNIQUE, amount bigint NOT NULL)");
    schema_->exec("CREATE TABLE " + table("accounts") +
                  " (id int PRIMARY KEY, balance bigint NOT NULL)");
    schema_->exec("INSERT INTO " + table("accounts") + " VALUES (1, 0)");
    PgSink(pg_options()).migrate();
  }

  [[nodiscard]] std::string table(const std::string& name) const {
    return schema_->name() + "." + name;
  }
  [[nodiscard]] PgSinkOptions pg_options() const {
    PgSinkOptions options;
    options.conninfo = pg_url_;
    options.schema = schema_->name();
    options.pool_size = 2;
    options.business_constraints = {"ledger_once"};
    return options;
  }
  [[nodiscard]] RedisGuardOptions redis_options() const {
    RedisGuardOptions options;
    options.redis.url = redis_url_;
    options.prefix = prefix_;
    return options;
  }
  [[nodiscard]] AsyncDeduplicatorOptions options(bool guard) const {
    AsyncDeduplicatorOptions o;
    o.base.local_cache_capacity = 0;  // every repeat reaches the backends
    if (guard) o.redis = redis_options();
    o.postgres = pg_options();
    return o;
  }
  [[nodiscard]] std::int64_t count(const std::string& sql) const { return schema_->count(sql); }
  [[nodiscard]] std::int64_t ledger_rows() const {
    return count("SELECT count(*) FROM " + table("ledger"));
  }
  [[nodiscard]] std::int64_t records() const {
    return count("SELECT count(*) FROM " + table("idem_records"));
  }
  [[nodiscard]] std::int64_t balance() const {
    return count("SELECT balance FROM " + table("accounts") + " WHERE id = 1");
  }
  // Backends running a statement that contains `marker`, other than the one asking.
  [[nodiscard]] std::int64_t running(const std::string& marker) const {
    return count(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> "
        "pg_backend_pid() AND strpos(query, '" +
        marker + "') > 0");
  }

  // The refund of `order`: a ledger row and the balance, in the call's transaction.
  auto refund(const std::string& order, int* runs) {
    return [this, order, runs](AsyncTransaction& tx) -> asio::awaitable<std::string> {
      ++*runs;
      std::vector<std::optional<std::string>> params{order};  // named: see AsyncTransaction
      const AsyncResult inserted =
          co_await tx.exec("INSERT INTO " + table("ledger") + " VALUES ($1, 5)", std::move(params));
      EXPECT_EQ(inserted.affected_rows(), 1U);
      (void)co_await tx.exec("UPDATE " + table("accounts") +
                             " SET balance = balance + 5 WHERE id = 1");
      co_return "refunded " + order;
    };
  }

  // Runs `call` (a coroutine returning an Outcome) on `io` to its end (idle connections keep
  // io.run() going: the loop runs until the call completed).
  template <typename Call>
  static Ending run_to_end(asio::io_context& io, Call call) {
    Ending ending;
    bool done = false;
    const auto started = Clock::now();
    asio::co_spawn(io, std::move(call), [&](std::exception_ptr error, Outcome outcome) {
      ending.error = error;
      ending.outcome = std::move(outcome);
      ending.took = Clock::now() - started;
      done = true;
    });
    while (!done && io.run_one() > 0) {
    }
    return ending;
  }

  // Runs `copies` deliveries of `order` (request IDs r0, r1, ...) at once on one loop, each with
  // `handler`, to their ends.
  template <typename Handler>
  static std::vector<Ending> deliver_all(AsyncDeduplicator& dedup, asio::io_context& io,
                                         const std::string& order, int copies, Handler handler) {
    std::vector<Ending> endings(static_cast<std::size_t>(copies));
    int left = copies;
    for (int i = 0; i < copies; ++i) {
      asio::co_spawn(
          io,
          [&, i]() -> asio::awaitable<Outcome> {
            co_return co_await dedup.run_transactional(
                refund_request("r" + std::to_string(i), order), handler, asio::use_awaitable);
          },
          [&, i](std::exception_ptr error, Outcome outcome) {
            endings[static_cast<std::size_t>(i)] = {error, std::move(outcome), {}};
            if (--left == 0) dedup.close();
          });
    }
    io.run();
    return endings;
  }

  template <typename E>
  static bool threw(const Ending& ending) {
    if (!ending.error) return false;
    try {
      std::rethrow_exception(ending.error);
    } catch (const E&) {
      return true;
    } catch (...) {
      return false;
    }
  }

  // The SQLSTATE of the idem::PostgresError that ended `ending`; "" for any other ending.
  static std::string sqlstate_of(const Ending& ending) {
    if (!ending.error) return "";
    try {
      std::rethrow_exception(ending.error);
    } catch (const PostgresError& e) {
      return e.sqlstate();
    } catch (...) {
      return "";
    }
  }

  // options(true) with the sink's one connection through `proxy` (in front of `address`), so
  // that the proxy counts its round trips.
  [[nodiscard]] AsyncDeduplicatorOptions through(const test::CountingProxy& proxy,
                                                 const test::PgAddress& address) const {
    AsyncDeduplicatorOptions o = options(true);
    o.postgres->conninfo = "host=127.0.0.1 port=" + std::to_string(proxy.port()) +
                           " dbname=" + address.database + " user=" + address.user +
                           " sslmode=disable gssencmode=disable";
    o.postgres->pool_size = 1;
    return o;
  }

  // A redelivery (another request ID) of `order`, whose cancelled first call keeps its claim: it is
  // answered InProgress and runs nothing.
  void expect_claim_kept(asio::io_context& io, AsyncDeduplicator& dedup, const std::string& order) {
    int runs = 0;
    const Ending redelivery = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await dedup.run_transactional(refund_request("r2", order), refund(order, &runs),
                                                 asio::use_awaitable);
    });
    ASSERT_FALSE(redelivery.error);
    EXPECT_EQ(redelivery.outcome.kind, Outcome::Kind::kInProgress);
    EXPECT_EQ(runs, 0);
  }

  // Holds `LOCK TABLE idem_records IN ACCESS EXCLUSIVE MODE` from another connection for
  // `hold` once started, so that a claim of the sink waits; `released` is set just before the
  // lock goes.
  class RecordsLock {
   public:
    RecordsLock(const std::string& url, const std::string& records, Clock::duration hold) {
      std::promise<void> locked;
      std::future<void> taken = locked.get_future();
      thread_ = std::thread([&, url, records, hold] {
        pqxx::connection conn(url);
        pqxx::work tx(conn);
        tx.exec0("LOCK TABLE " + records + " IN ACCESS EXCLUSIVE MODE");
        locked.set_value();
        std::this_thread::sleep_for(hold);
        released_ = true;
        tx.commit();
      });
      taken.wait();
    }
    ~RecordsLock() { thread_.join(); }
    RecordsLock(const RecordsLock&) = delete;
    RecordsLock& operator=(const RecordsLock&) = delete;
    [[nodiscard]] bool released() const noexcept { return released_; }

   private:
    std::atomic<bool> released_{false};
    std::thread thread_;
  };

  // Requests `stop` after `after`, from a thread of its own.
  static std::thread stop_after(std::stop_source& stop, Clock::duration after) {
    return std::thread([&stop, after] {
      std::this_thread::sleep_for(after);
      stop.request_stop();
    });
  }

  std::string pg_url_;
  std::string redis_url_;
  std::string prefix_;
  std::unique_ptr<test::ScratchSchema> schema_;
};

TEST_F(AsyncTransactionalTest, FirstExecutionCommitsBusinessRowsWithTheRecordThenReplays) {
  asio::io_context io;
  int runs = 0;
  {
    AsyncDeduplicator dedup(io.get_executor(), options(true));
    const Ending first = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await dedup.run_transactional(refund_request("r1", "o1"), refund("o1", &runs),
                                                 asio::use_awaitable);
    });
    ASSERT_FALSE(first.error);
    EXPECT_EQ(first.outcome.kind, Outcome::Kind::kExecuted);
    EXPECT_EQ(first.outcome.response, "refunded o1");
    EXPECT_EQ(ledger_rows(), 1);
    EXPECT_EQ(balance(), 5);
    EXPECT_EQ(count("SELECT count(*) FROM " + table("idem_records") +
                    " WHERE state = 'completed' AND response = 'refunded o1'::bytea"),
              1);
    // The guard remembers it.
    const Ending again = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await dedup.run_transactional(refund_request("r1", "o1"), refund("o1", &runs),
                                                 asio::use_awaitable);
    });
    ASSERT_FALSE(again.error);
    EXPECT_EQ(again.outcome.kind, Outcome::Kind::kDuplicate);
    EXPECT_EQ(again.outcome.response, "refunded o1");
    dedup.close();
  }
  {
    // Without the guard, the record read with BEGIN (under the key's lock) replays it.
    AsyncDeduplicator sink_only(io.get_executor(), options(false));
    const Ending replay = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await sink_only.run_transactional(
          refund_request("r2", "o1"),
          [&](AsyncTransaction& tx, AsyncContext& context) {
            EXPECT_FALSE(context.key().empty());
            return refund("o1", &runs)(tx);
          },
          asio::use_awaitable);
    });
    ASSERT_FALSE(replay.error);
    EXPECT_EQ(replay.outcome.kind, Outcome::Kind::kDuplicate);
    EXPECT_EQ(replay.outcome.layer, Layer::kPgSink);
    EXPECT_EQ(replay.outcome.response, "refunded o1");
    sink_only.close();
    io.run();
  }
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(balance(), 5);
  EXPECT_EQ(records(), 1);
}

// The handler's statements are prepared on the sink's connection (PgSinkOptions::statement_cache)
// and then sent by name, as asyncpg does: seen from inside the handler, its session holds them.
// With the cache off they are sent unnamed and the session holds none.
TEST_F(AsyncTransactionalTest, TheHandlersStatementsArePreparedOnTheirConnection) {
  for (const std::size_t cache : {std::size_t{64}, std::size_t{0}}) {
    asio::io_context io;
    AsyncDeduplicatorOptions o = options(false);
    o.postgres->pool_size = 1;
    o.postgres->statement_cache = cache;
    AsyncDeduplicator dedup(io.get_executor(), o);
    for (int call = 0; call < 2; ++call) {
      const std::string order = "p" + std::to_string(cache) + "-" + std::to_string(call);
      int runs = 0;
      std::string prepared;
      const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
        co_return co_await dedup.run_transactional(
            refund_request("r1", order),
            [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
              (void)co_await refund(order, &runs)(tx);
              const AsyncResult listed = co_await tx.exec(
                  "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'UPDATE %' "
                  "OR statement LIKE 'INSERT INTO " +
                  table("ledger") + "%'");
              prepared = std::string(listed.get(0, 0).value_or(""));
              co_return "done";
            },
            asio::use_awaitable);
      });
      ASSERT_FALSE(ending.error);
      EXPECT_EQ(ending.outcome.kind, Outcome::Kind::kExecuted);
      EXPECT_EQ(prepared, cache > 0 ? "2" : "0") << "cache " << cache << ", call " << call;
    }
    dedup.close();
    io.run();
  }
}

// The record is inserted with COMMIT, sharing its sync point: when the INSERT fails the server
// skips the COMMIT, and the session stayed in the failed transaction (the connection's next
// holder failed with 25P02) unless it is rolled back before the connection is given back.
TEST_F(AsyncTransactionalTest, ARecordThatFailsAtCommitLeavesItsConnectionOutOfTheTransaction) {
  asio::io_context io;
  AsyncDeduplicatorOptions o = options(false);
  o.postgres->pool_size = 1;  // both calls on one connection
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  const Ending failed = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r1", "c1"),
        [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
          // Rows inserted from now on in this transaction fail: the record's INSERT does.
          (void)co_await tx.exec("ALTER TABLE " + table("idem_records") +
                                 " ADD CONSTRAINT no_records CHECK (ns = '') NOT VALID");
          co_return co_await refund("c1", &runs)(tx);
        },
        asio::use_awaitable);
  });
  ASSERT_TRUE(failed.error) << "the record's INSERT must fail the call";
  try {
    std::rethrow_exception(failed.error);
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "23514") << error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "not the record's error: " << error.what();
  }
  EXPECT_EQ(ledger_rows(), 0);
  const Ending next = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r2", "c2"), refund("c2", &runs),
                                               asio::use_awaitable);
  });
  ASSERT_FALSE(next.error) << "the connection's next transaction failed";
  EXPECT_EQ(next.outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(records(), 1);
  dedup.close();
  io.run();
}

TEST_F(AsyncTransactionalTest, AStepThatWroteThroughTheTransactionRunsAgainAfterARollback) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(true));
  std::map<std::string, int> runs;
  bool fail = true;
  const auto agent = [&](AsyncTransaction& tx,
                         AsyncContext& context) -> asio::awaitable<std::string> {
    std::string answer = co_await context.step(  // an LLM call: writes nowhere
        "think", [&]() -> asio::awaitable<std::string> {
          ++runs["think"];
          co_return "refund 5";
        });
    answer += co_await context.step(  // the tool's effect, in the transaction
        "book", answer, [&]() -> asio::awaitable<std::string> {
          ++runs["book"];
          std::vector<std::optional<std::string>> params{"o-step"};
          (void)co_await tx.exec("INSERT INTO " + table("ledger") + " VALUES ($1, 5)",
                                 std::move(params));
          co_return " booked";
        });
    answer += co_await context.step(  // reads through it, after it wrote
        "check", answer, [&]() -> asio::awaitable<std::string> {
          ++runs["check"];
          const AsyncResult rows = co_await tx.exec("SELECT count(*) FROM " + table("ledger"));
          co_return std::string(rows.get(0, 0).value_or("?")) + " row";
        });
    answer += co_await context.step("reply", answer, [&]() -> asio::awaitable<std::string> {
      ++runs["reply"];
      if (fail) throw std::runtime_error("the reply failed");
      co_return " sent";
    });
    co_return answer;
  };
  const auto deliver = [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o-step"), agent,
                                               asio::use_awaitable);
  };
  const Ending failed = run_to_end(io, deliver);
  EXPECT_TRUE(threw<std::runtime_error>(failed));
  EXPECT_EQ(ledger_rows(), 0) << "the failed attempt's booking rolled back";
  fail = false;
  const Ending retry = run_to_end(io, deliver);
  ASSERT_FALSE(retry.error);
  EXPECT_EQ(retry.outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(retry.outcome.response, "refund 5 booked1 row sent");
  EXPECT_EQ(ledger_rows(), 1) << "a journaled booking would have been skipped: 0 rows";
  EXPECT_EQ(runs,
            (std::map<std::string, int>{{"think", 1}, {"book", 2}, {"check", 1}, {"reply", 2}}))
      << "only the step that wrote through the transaction, and the one that failed, ran again";
  dedup.close();
}

// In a transactional call a step reads what the transaction wrote before its fn and after it.
// A reading with no statement sent through the transaction since the last one is that one
// again, and costs no round trip: three steps that send nothing through it cost one reading in
// all (six before readings were shared), and a step that sends an INSERT costs that statement
// and one reading after it.
TEST_F(AsyncTransactionalTest,
       StepsReadTheTransactionsWritesAgainOnlyAfterAStatementWentThroughIt) {
  const test::PgAddress address = test::parse_pg_url(pg_url_);
  if (address.port == 0) GTEST_SKIP() << "IDEM_TEST_PG_URL is not postgresql://user@host:port/db";
  test::CountingProxy proxy(test::CountingProxy::Protocol::kPostgres, address.host, address.port);
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), through(proxy, address));
  // The PostgreSQL round trips of a first execution of `order` whose handler takes `steps`
  // steps, the second of which (with `insert`) sends an INSERT through the transaction.
  const auto round_trips = [&](const std::string& order, int steps, bool insert) {
    const auto handler = [&](AsyncTransaction& tx,
                             AsyncContext& context) -> asio::awaitable<std::string> {
      std::string out;
      for (int i = 0; i < steps; ++i) {
        out += co_await context.step(
            "step " + std::to_string(i), [&, i]() -> asio::awaitable<std::string> {
              if (insert && i == 1) {
                std::vector<std::optional<std::string>> params{order};
                (void)co_await tx.exec("INSERT INTO " + table("ledger") + " VALUES ($1, 5)",
                                       std::move(params));
              }
              co_return std::to_string(i);
            });
      }
      co_return out;
    };
    proxy.reset();
    const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await dedup.run_transactional(refund_request("r1", order), handler,
                                                 asio::use_awaitable);
    });
    EXPECT_FALSE(ending.error) << order;
    EXPECT_EQ(ending.outcome.kind, Outcome::Kind::kExecuted) << order;
    return proxy.round_trips();
  };
  (void)round_trips("warm", 3, true);  // the connection opened, its statements prepared
  const std::size_t none = round_trips("no-steps", 0, false);
  EXPECT_EQ(round_trips("three-steps", 3, false), none + 1);
  EXPECT_EQ(round_trips("three-steps-one-insert", 3, true), none + 3);
  EXPECT_EQ(ledger_rows(), 2);
  dedup.close();
}

TEST_F(AsyncTransactionalTest, AHandlerFailureRollsBackAndReleasesTheClaim) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(true));
  int runs = 0;
  const Ending failed = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r1", "o1"),
        [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
          ++runs;
          (void)co_await tx.exec("INSERT INTO " + table("ledger") + " VALUES ('o1', 5)");
          throw std::runtime_error("payment provider said no");
        },
        asio::use_awaitable);
  });
  EXPECT_TRUE(threw<std::runtime_error>(failed));
  EXPECT_FALSE(threw<Error>(failed));
  EXPECT_EQ(ledger_rows(), 0);
  EXPECT_EQ(records(), 0);
  // Released: the retry runs.
  const Ending retry = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"), refund("o1", &runs),
                                               asio::use_awaitable);
  });
  ASSERT_FALSE(retry.error);
  EXPECT_EQ(retry.outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(records(), 1);
  // A failing statement of the handler's own is a PostgresError with its SQLSTATE, and rolls
  // back what the handler did before it.
  const Ending bad = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r3", "o3"),
        [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
          (void)co_await tx.exec("UPDATE " + table("accounts") + " SET balance = 1000");
          (void)co_await tx.exec("SELECT 1/0");
          co_return "unreachable";
        },
        asio::use_awaitable);
  });
  ASSERT_TRUE(threw<PostgresError>(bad));
  EXPECT_EQ(sqlstate_of(bad), "22012");
  EXPECT_EQ(balance(), 5);
  dedup.close();
  io.run();
}

TEST_F(AsyncTransactionalTest, ABusinessConstraintIsADuplicateAndNothingCommits) {
  schema_->exec("INSERT INTO " + table("ledger") + " VALUES ('o1', 5)");  // done before idem
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(false));
  int runs = 0;
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"), refund("o1", &runs),
                                               asio::use_awaitable);
  });
  ASSERT_FALSE(ending.error);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(ending.outcome.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(ending.outcome.layer, Layer::kPgSink);
  EXPECT_FALSE(ending.outcome.response);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(balance(), 0);
  EXPECT_EQ(records(), 0);
  dedup.close();
  io.run();
}

// The refund of `order` with its two writes staged: they go with the record and COMMIT.
TEST_F(AsyncTransactionalTest, StagedWritesGoWithTheCommitAndSaveTheirRoundTrips) {
  const test::PgAddress address = test::parse_pg_url(pg_url_);
  if (address.port == 0) GTEST_SKIP() << "IDEM_TEST_PG_URL is not postgresql://user@host:port/db";
  test::CountingProxy proxy(test::CountingProxy::Protocol::kPostgres, address.host, address.port);
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), through(proxy, address));
  int runs = 0;
  const auto staged_refund = [&](const std::string& order) {
    return [&, order](AsyncTransaction& tx) -> asio::awaitable<std::string> {
      ++runs;
      tx.stage("INSERT INTO " + table("ledger") + " VALUES ($1, 5)", {order});
      tx.stage("UPDATE " + table("accounts") + " SET balance = balance + 5 WHERE id = 1");
      co_return "refunded " + order;
    };
  };
  const auto round_trips = [&](const std::string& order, bool staged) {
    proxy.reset();
    const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      if (staged) {
        co_return co_await dedup.run_transactional(refund_request("r1", order),
                                                   staged_refund(order), asio::use_awaitable);
      }
      co_return co_await dedup.run_transactional(refund_request("r1", order), refund(order, &runs),
                                                 asio::use_awaitable);
    });
    EXPECT_FALSE(ending.error) << order;
    EXPECT_EQ(ending.outcome.kind, Outcome::Kind::kExecuted) << order;
    EXPECT_EQ(ending.outcome.response, "refunded " + order);
    return proxy.round_trips();
  };
  (void)round_trips("warm-exec", false);  // the connection opened, the statements prepared
  (void)round_trips("warm-staged", true);
  const std::size_t awaited = round_trips("o1", false);
  EXPECT_EQ(round_trips("o2", true), awaited - 2);
  EXPECT_EQ(ledger_rows(), 4);
  EXPECT_EQ(balance(), 20);
  EXPECT_EQ(records(), 4);
  // Committed with the record: a redelivery replays it and runs nothing.
  const Ending again = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r2", "o2"), staged_refund("o2"),
                                               asio::use_awaitable);
  });
  ASSERT_FALSE(again.error);
  EXPECT_EQ(again.outcome.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.outcome.response, "refunded o2");
  EXPECT_EQ(runs, 4);
  dedup.close();
}

// A staged write goes ahead of the handler's next exec(), in its round trip: the exec() sees it,
// and throws its failure.
TEST_F(AsyncTransactionalTest, AStagedWriteGoesAheadOfTheNextExecWhichThrowsItsFailure) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(false));
  std::string seen;
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r1", "o1"),
        [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
          tx.stage("INSERT INTO " + table("ledger") + " VALUES ('o1', 5)");
          const AsyncResult rows = co_await tx.exec("SELECT count(*) FROM " + table("ledger") +
                                                    " WHERE idem_key = 'o1'");
          seen = std::string(rows.get(0, 0).value_or(""));
          tx.stage("SELECT 1/0");
          (void)co_await tx.exec("SELECT 1");
          co_return "unreachable";
        },
        asio::use_awaitable);
  });
  EXPECT_EQ(seen, "1");
  ASSERT_TRUE(threw<PostgresError>(ending));
  EXPECT_EQ(sqlstate_of(ending), "22012");
  EXPECT_EQ(ledger_rows(), 0);
  EXPECT_EQ(records(), 0);
  dedup.close();
  io.run();
}

// libpq sends text parameters as C strings: a NUL byte cut the value there ("o1\0; amount=999"
// was stored as "o1"), without a word.
TEST_F(AsyncTransactionalTest, AParameterWithANulByteIsAPostgresErrorNotACutValue) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(true));
  const Ending ended = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    const auto handler = [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
      std::vector<std::optional<std::string>> params{std::string("o1\0; amount=999", 15)};
      (void)co_await tx.exec("INSERT INTO " + table("ledger") + " VALUES ($1, 5)", params);
      co_return "inserted";
    };
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"), handler,
                                               asio::use_awaitable);
  });
  ASSERT_TRUE(threw<PostgresError>(ended));
  EXPECT_EQ(sqlstate_of(ended), "22021");
  EXPECT_EQ(schema_->count("SELECT count(*) FROM " + table("ledger")), 0);
}

// Sent with COMMIT, a staged write that fails is the handler's failure (not the sink's): nothing
// commits and the claim is released, so the retry runs; one that meets a business constraint
// makes the call a duplicate.
TEST_F(AsyncTransactionalTest, AStagedWriteThatFailsAtCommitIsTheHandlersFailureOrADuplicate) {
  asio::io_context io;
  AsyncDeduplicatorOptions o = options(true);
  auto metrics = std::make_shared<InProcessMetrics>();
  o.base.metrics = metrics;
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  const auto staging = [&](std::string statement) {
    return [&, statement](AsyncTransaction& tx) -> asio::awaitable<std::string> {
      ++runs;
      tx.stage("UPDATE " + table("accounts") + " SET balance = balance + 1000 WHERE id = 1");
      tx.stage(statement);
      co_return "staged";
    };
  };
  const Ending failed = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"), staging("SELECT 1/0"),
                                               asio::use_awaitable);
  });
  ASSERT_TRUE(threw<PostgresError>(failed));
  EXPECT_EQ(sqlstate_of(failed), "22012");
  EXPECT_EQ(balance(), 0);
  EXPECT_EQ(records(), 0);
  EXPECT_EQ(metrics->handler_failures(), 1u);
  EXPECT_EQ(metrics->backend_errors(Layer::kPgSink), 0u);
  // Released: the retry runs.
  const Ending retry = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"), refund("o1", &runs),
                                               asio::use_awaitable);
  });
  ASSERT_FALSE(retry.error);
  EXPECT_EQ(retry.outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 2);
  // o1's ledger row exists now: a staged INSERT of it again is a duplicate, and nothing of its
  // call commits.
  const Ending dup = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r3", "o3"), staging("INSERT INTO " + table("ledger") + " VALUES ('o1', 5)"),
        asio::use_awaitable);
  });
  ASSERT_FALSE(dup.error);
  EXPECT_EQ(dup.outcome.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(dup.outcome.layer, Layer::kPgSink);
  EXPECT_FALSE(dup.outcome.response);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(balance(), 5);
  EXPECT_EQ(records(), 1);
  EXPECT_EQ(metrics->backend_errors(Layer::kPgSink), 0u);
  dedup.close();
  io.run();
}

// The connection goes to the next waiting transaction when a COMMIT is sent, before its answer:
// the next transaction's statements queue behind the COMMIT. A staged write that fails there must
// not leave them inside its failed transaction (they failed with 25P02 had the COMMIT shared the
// failed statement's sync point, as it is skipped with it).
TEST_F(AsyncTransactionalTest, TheNextTransactionQueuedBehindAFailedStagedWriteRunsOnItsOwn) {
  asio::io_context io;
  AsyncDeduplicatorOptions o = options(true);
  o.postgres->pool_size = 1;  // the second call waits for the first one's connection
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  std::vector<Ending> endings(2);
  int left = 2;
  const auto deliver = [&](std::size_t i, std::string order, auto handler) {
    dedup.run_transactional(refund_request("r-" + order, order), std::move(handler),
                            [&, i](std::exception_ptr error, Outcome outcome) {
                              endings[i] = {error, std::move(outcome), {}};
                              if (--left == 0) dedup.close();
                            });
  };
  deliver(0, "failing", [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
    ++runs;
    tx.stage("SELECT 1/0");
    co_return "staged";
  });
  deliver(1, "next", refund("next", &runs));
  io.run();
  ASSERT_TRUE(endings[0].error);
  EXPECT_EQ(sqlstate_of(endings[0]), "22012");
  ASSERT_FALSE(endings[1].error) << test::what(endings[1].error);
  EXPECT_EQ(endings[1].outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(balance(), 5);
  EXPECT_EQ(records(), 1);
}

// A business constraint checked at COMMIT (DEFERRABLE INITIALLY DEFERRED) makes the call a
// duplicate as one checked at once does.
TEST_F(AsyncTransactionalTest, ADeferredBusinessConstraintThatFiresAtCommitIsADuplicate) {
  schema_->exec("CREATE TABLE " + table("payouts") +
                " (k text NOT NULL, CONSTRAINT payouts_once UNIQUE (k) DEFERRABLE INITIALLY "
                "DEFERRED)");
  schema_->exec("INSERT INTO " + table("payouts") + " VALUES ('o1')");  // done before idem
  asio::io_context io;
  AsyncDeduplicatorOptions o = options(false);
  o.postgres->business_constraints = {"payouts_once"};
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r1", "o1"),
        [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
          ++runs;
          (void)co_await tx.exec("INSERT INTO " + table("payouts") + " VALUES ('o1')");
          co_return "paid o1";
        },
        asio::use_awaitable);
  });
  ASSERT_FALSE(ending.error);
  EXPECT_EQ(ending.outcome.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(ending.outcome.layer, Layer::kPgSink);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(count("SELECT count(*) FROM " + table("payouts")), 1);
  EXPECT_EQ(records(), 0);
  dedup.close();
  io.run();
}

// The server may end the session after COMMIT has committed and before it answered (a
// pg_terminate_backend() landing then): a COMMIT answered by the session's end (57P01) leaves the
// outcome unknown, so the call ends idem::CommitOutcomeUnknown and keeps its claim, as in the
// blocking driver.
TEST_F(AsyncTransactionalTest, ACommitWhoseSessionTheServerEndsEndsCommitOutcomeUnknown) {
  const std::string fatal = schema_->create_table_that_ends_the_session_at_commit("fatal");
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(false));
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r1", "fatal"),
        [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
          (void)co_await tx.exec("INSERT INTO " + fatal + " VALUES ('f1')");
          co_return "refunded";
        },
        asio::use_awaitable);
  });
  ASSERT_TRUE(ending.error) << "a COMMIT the server ended the session on returned";
  EXPECT_TRUE(test::is<CommitOutcomeUnknown>(ending.error)) << test::what(ending.error);
  dedup.close();
  io.run();
}

TEST_F(AsyncTransactionalTest, TheBusinessKeyAsTheClaimKeepsOneEffectAndNoRecord) {
  AsyncDeduplicatorOptions o = options(false);
  o.base.transactional_claim = TransactionalClaim::kBusinessKey;
  o.postgres->lock_timeout = 0ms;  // wait for the winner
  o.postgres->response_timeout = 0ms;
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  int executed = 0;
  int duplicates = 0;
  for (const Ending& ending : deliver_all(dedup, io, "b1", 6, refund("b1", &runs))) {
    EXPECT_FALSE(ending.error);
    if (ending.outcome.kind == Outcome::Kind::kExecuted) ++executed;
    if (ending.outcome.kind == Outcome::Kind::kDuplicate && !ending.outcome.response) ++duplicates;
  }
  EXPECT_EQ(executed, 1);
  EXPECT_EQ(duplicates, 5);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(balance(), 5);
  EXPECT_EQ(records(), 0);
  // Without a business constraint to decide, the mode is refused.
  o.postgres->business_constraints.clear();
  EXPECT_THROW(AsyncDeduplicator(io.get_executor(), o), ConfigError);
}

// PostgreSQL answers the COMMIT of a transaction a failed statement aborted with ROLLBACK, and no
// error: with nothing else in that flight (kBusinessKey writes no record), a handler that caught
// its failed statement and returned ended kExecuted although nothing was written.
TEST_F(AsyncTransactionalTest,
       AHandlerThatCaughtItsFailedStatementIsNotExecutedWhenNothingCommits) {
  for (const TransactionalClaim mode :
       {TransactionalClaim::kRecord, TransactionalClaim::kBusinessKey}) {
    AsyncDeduplicatorOptions o = options(false);
    o.base.transactional_claim = mode;
    asio::io_context io;
    AsyncDeduplicator dedup(io.get_executor(), o);
    const std::string order = mode == TransactionalClaim::kRecord ? "c1" : "c2";
    const std::int64_t records_before = records();
    const Ending caught = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await dedup.run_transactional(
          refund_request("r-" + order, order),
          [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
            (void)co_await tx.exec("INSERT INTO " + table("ledger") + " VALUES ('" + order +
                                   "', 5)");
            try {
              (void)co_await tx.exec("SELECT 1/0");
            } catch (const PostgresError&) {
              // swallowed: the transaction is aborted all the same
            }
            co_return "booked";
          },
          asio::use_awaitable);
    });
    ASSERT_TRUE(threw<PostgresError>(caught)) << static_cast<int>(mode);
    EXPECT_EQ(sqlstate_of(caught), "25P02");
    EXPECT_EQ(ledger_rows(), 0);
    EXPECT_EQ(records(), records_before);
    // Nothing was written, so the claim was released: the retry runs.
    int runs = 0;
    const Ending retry = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await dedup.run_transactional(refund_request("r-" + order, order),
                                                 refund(order, &runs), asio::use_awaitable);
    });
    ASSERT_FALSE(retry.error);
    EXPECT_EQ(retry.outcome.kind, Outcome::Kind::kExecuted);
    EXPECT_EQ(runs, 1);
    EXPECT_EQ(ledger_rows(), 1);
    schema_->exec("DELETE FROM " + table("ledger"));
    dedup.close();
    io.run();
  }
}

TEST_F(AsyncTransactionalTest, ConcurrentDeliveriesOfOneKeyOnOneLoopRunOneHandler) {
  AsyncDeduplicatorOptions o = options(false);  // no guard: the key's lock decides
  o.postgres->pool_size = 4;
  o.postgres->lock_timeout = 0ms;
  o.postgres->response_timeout = 0ms;
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  int replays = 0;
  const auto slow_refund = [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
    std::string response = co_await refund("same", &runs)(tx);
    co_await sleep_for(50ms);  // the others arrive meanwhile, and wait for the lock
    co_return response;
  };
  for (const Ending& ending : deliver_all(dedup, io, "same", 8, slow_refund)) {
    EXPECT_FALSE(ending.error);
    if (ending.outcome.kind == Outcome::Kind::kDuplicate &&
        ending.outcome.response == "refunded same") {
      ++replays;
    }
  }
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(replays, 7);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(balance(), 5);
}

// A connection given back wakes one waiting transaction, not all of them: with 1 000 in flight
// on 8 connections, waking every waiter would run about 1 000 coroutines to hand out one
// connection. The loop's work must grow with the calls, not with their square, which the count of
// handlers io_context::run() executed shows.
TEST_F(AsyncTransactionalTest, TransactionsWaitingForAConnectionAreWokenOnePerConnection) {
  AsyncDeduplicatorOptions o = options(false);
  o.postgres->pool_size = 1;
  o.deadline = 30s;
  int runs = 0;
  const auto handlers_for = [&](int calls) {
    asio::io_context io;
    AsyncDeduplicator dedup(io.get_executor(), o);
    int left = calls;
    for (int i = 0; i < calls; ++i) {
      const std::string order = "herd-" + std::to_string(calls) + "-" + std::to_string(i);
      dedup.run_transactional(refund_request("r-" + order, order), refund(order, &runs),
                              [&](std::exception_ptr error, Outcome outcome) {
                                EXPECT_FALSE(error);
                                EXPECT_EQ(outcome.kind, Outcome::Kind::kExecuted);
                                if (--left == 0) dedup.close();
                              });
    }
    const std::size_t handlers = io.run();
    EXPECT_EQ(left, 0);
    return static_cast<double>(handlers);
  };
  const double few = handlers_for(50);
  const double many = handlers_for(400);
  EXPECT_EQ(runs, 450);
  // 8x the calls: 7-9x the handlers when each waiter is woken once (about 900 for 50 calls); 43x
  // when every waiter was woken at every give-back (2 033, then 86 675).
  EXPECT_LT(many / few, 20.0) << few << " handlers for 50 calls, " << many << " for 400";
}

// With every connection held, a connection given back must wake both a waiting run() statement
// (which takes none for itself) and a waiting transaction: woken one at a time, the transaction
// behind the statement would wait beside a free connection until its deadline.
TEST_F(AsyncTransactionalTest, CallsWaitingForAHeldConnectionAllGoOnWhenItIsGivenBack) {
  AsyncDeduplicatorOptions o = options(false);
  o.postgres->pool_size = 1;
  o.deadline = 5s;
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  std::vector<Ending> endings(3);
  int left = 3;
  const auto started = Clock::now();
  const auto ended = [&](std::size_t i) {
    return [&, i](std::exception_ptr error, Outcome outcome) {
      endings[i] = {error, std::move(outcome), Clock::now() - started};
      if (--left == 0) dedup.close();
    };
  };
  // The first holds the only connection for 300 ms; the other two arrive meanwhile and wait.
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<Outcome> {
        co_return co_await dedup.run_transactional(
            refund_request("r0", "o0"),
            [&](AsyncTransaction& tx) -> asio::awaitable<std::string> {
              std::string response = co_await refund("o0", &runs)(tx);
              co_await sleep_for(300ms);
              co_return response;
            },
            asio::use_awaitable);
      },
      ended(0));
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<Outcome> {
        co_await sleep_for(50ms);
        co_return co_await dedup.run(
            refund_request("r1", "o1"), []() -> asio::awaitable<std::string> { co_return "ran"; },
            asio::use_awaitable);
      },
      ended(1));
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<Outcome> {
        co_await sleep_for(100ms);
        co_return co_await dedup.run_transactional(refund_request("r2", "o2"), refund("o2", &runs),
                                                   asio::use_awaitable);
      },
      ended(2));
  io.run();
  for (const Ending& ending : endings) {
    EXPECT_FALSE(ending.error);
    EXPECT_EQ(ending.outcome.kind, Outcome::Kind::kExecuted);
    EXPECT_LT(ending.took, 3s);  // not at the 5 s deadline
  }
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(ledger_rows(), 2);
}

// The handler of each stopped call: a ledger row, then a statement that would hold the
// connection for 10 s, marked so pg_stat_activity finds it.
// `swallow`: the handler catches its cancelled statement's error and returns.
auto sleeper(const std::string& ledger, const std::string& marker, bool* sleeping,
             bool swallow = false) {
  return [ledger, marker, sleeping, swallow](AsyncTransaction& tx) -> asio::awaitable<std::string> {
    (void)co_await tx.exec("INSERT INTO " + ledger + " VALUES ('o1', 5)");
    *sleeping = true;
    try {
      (void)co_await tx.exec("SELECT pg_sleep(10) /* " + marker + " */");
    } catch (const std::exception&) {
      if (!swallow) throw;
    }
    co_return "slept";
  };
}

TEST_F(AsyncTransactionalTest, ACancelledCallCancelsItsStatementOnTheServerAndKeepsTheClaim) {
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), options(true));
  const std::string marker = prefix_ + "-cancel";
  bool sleeping = false;
  std::int64_t seen_running = -1;
  asio::cancellation_signal cancel;
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    asio::co_spawn(
        co_await asio::this_coro::executor,
        [&]() -> asio::awaitable<void> {
          co_await sleep_for(500ms);
          seen_running = running(marker);  // the statement runs on the server now
          cancel.emit(asio::cancellation_type::terminal);
        },
        asio::detached);
    co_return co_await dedup.run_transactional(
        refund_request("r1", "o1"), sleeper(table("ledger"), marker, &sleeping),
        asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
  });
  EXPECT_TRUE(sleeping);
  EXPECT_EQ(seen_running, 1);
  EXPECT_TRUE(threw<Cancelled>(ending));
  EXPECT_FALSE(threw<DeadlineExceeded>(ending));
  // It ended once ROLLBACK did, which waits for the statement: cancelled on the server.
  EXPECT_LT(ending.took, 5s);
  EXPECT_EQ(running(marker), 0);
  EXPECT_EQ(ledger_rows(), 0);
  EXPECT_EQ(records(), 0);
  // The claim stays until its lease ends: a redelivery now is answered InProgress.
  expect_claim_kept(io, dedup, "o1");
  dedup.close();
  io.run();
}

// The statement the cancellation cut short aborted the transaction; the handler caught that and
// returned, so the COMMIT failed: the call ended as a PostgresError 25P02 (or, writing no record
// in kBusinessKey mode, as kExecuted with nothing written), not as the cancellation it was.
TEST_F(AsyncTransactionalTest, AHandlerThatSwallowsItsCancelledStatementStillEndsCancelled) {
  for (const TransactionalClaim mode :
       {TransactionalClaim::kRecord, TransactionalClaim::kBusinessKey}) {
    AsyncDeduplicatorOptions o = options(true);
    o.base.transactional_claim = mode;
    asio::io_context io;
    AsyncDeduplicator dedup(io.get_executor(), o);
    const std::string marker = prefix_ + "-swallow" + std::to_string(static_cast<int>(mode));
    bool sleeping = false;
    asio::cancellation_signal cancel;
    const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      asio::co_spawn(
          co_await asio::this_coro::executor,
          [&]() -> asio::awaitable<void> {
            co_await sleep_for(300ms);
            cancel.emit(asio::cancellation_type::terminal);
          },
          asio::detached);
      co_return co_await dedup.run_transactional(
          refund_request("r1", "o1"), sleeper(table("ledger"), marker, &sleeping, true),
          asio::bind_cancellation_slot(cancel.slot(), asio::use_awaitable));
    });
    EXPECT_TRUE(sleeping);
    EXPECT_TRUE(threw<Cancelled>(ending)) << static_cast<int>(mode);
    EXPECT_EQ(ledger_rows(), 0);
    expect_claim_kept(io, dedup, "o1");
    dedup.close();
    io.run();
    prefix_ += "x";  // the next mode's keys are new
  }
}

TEST_F(AsyncTransactionalTest, ACallPastItsDeadlineCancelsItsStatementOnTheServer) {
  AsyncDeduplicatorOptions o = options(true);
  o.deadline = 700ms;
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), o);
  const std::string marker = prefix_ + "-deadline";
  bool sleeping = false;
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"),
                                               sleeper(table("ledger"), marker, &sleeping),
                                               asio::use_awaitable);
  });
  EXPECT_TRUE(sleeping);
  EXPECT_TRUE(threw<DeadlineExceeded>(ending));
  EXPECT_LT(ending.took, 5s);
  EXPECT_EQ(running(marker), 0);
  EXPECT_EQ(ledger_rows(), 0);
  expect_claim_kept(io, dedup, "o1");  // until its lease ends
  dedup.close();
  io.run();
}

// The sink's claim waits on a lock held elsewhere for 900 ms (under lock_timeout), and the call's
// stop is requested at 200 ms: the call ends Cancelled while the claim still waits, its handler
// never runs, nothing commits, and its claims are released (a retry runs).
TEST_F(AsyncTransactionalTest, AStopWhileTheSinksClaimWaitsEndsCancelledAndTheHandlerNeverRuns) {
  AsyncDeduplicatorOptions o = options(false);
  o.base.guard = std::make_shared<InMemoryGuard>();
  asio::io_context io;
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  std::stop_source stop;
  Request request = refund_request("r1", "o1");
  request.stop = stop.get_token();
  bool ended_under_lock = false;
  Ending ending;
  {
    const RecordsLock lock(pg_url_, table("idem_records"), 900ms);
    std::thread stopper = stop_after(stop, 200ms);
    ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
      co_return co_await dedup.run_transactional(request, refund("o1", &runs), asio::use_awaitable);
    });
    ended_under_lock = !lock.released();
    stopper.join();
  }
  EXPECT_TRUE(threw<Cancelled>(ending));
  EXPECT_TRUE(ended_under_lock) << "the call waited for the lock despite its stop";
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(ledger_rows(), 0);
  const Ending retry = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"), refund("o1", &runs),
                                               asio::use_awaitable);
  });
  ASSERT_FALSE(retry.error);
  EXPECT_EQ(retry.outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 1);
  dedup.close();
  io.run();
}

// The record and COMMIT go in one flight: when the connection is lost before their answers
// come, the COMMIT may have run, so the call ends idem::CommitOutcomeUnknown and keeps its
// claims. The record's lost answer, thrown first as a retryable connection loss, read as a
// failure known not to have committed, and the claims were released.
TEST_F(AsyncTransactionalTest, ARecordAndCommitWhoseAnswersAreLostEndCommitOutcomeUnknown) {
  test::PgServer server;  // its own server, to stop
  PgSinkOptions pg;
  pg.conninfo = server.url() + "?connect_timeout=2";
  pg.pool_size = 1;
  pg.statement_timeout = 500ms;
  pg.lock_timeout = 200ms;
  pg.response_timeout = 1000ms;  // bounds the flight the stopped server never answers
  PgSink(pg).migrate();
  asio::io_context io;
  AsyncDeduplicatorOptions options;
  options.base.local_cache_capacity = 0;
  options.postgres = pg;
  AsyncDeduplicator dedup(io.get_executor(), options);
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(
        refund_request("r1", "lost"),
        [&](AsyncTransaction&) -> asio::awaitable<std::string> {
          server.pause();  // the record and the COMMIT get no answer
          co_return "refunded";
        },
        asio::use_awaitable);
  });
  server.resume();
  ASSERT_TRUE(ending.error) << "a commit with no answer returned";
  EXPECT_TRUE(test::is<CommitOutcomeUnknown>(ending.error)) << test::what(ending.error);
  dedup.close();
  io.run();
}

TEST_F(AsyncTransactionalTest, RunTransactionalWithoutPostgresIsAConfigError) {
  asio::io_context io;
  AsyncDeduplicatorOptions o = options(true);
  o.postgres.reset();
  AsyncDeduplicator dedup(io.get_executor(), o);
  int runs = 0;
  const Ending ending = run_to_end(io, [&]() -> asio::awaitable<Outcome> {
    co_return co_await dedup.run_transactional(refund_request("r1", "o1"), refund("o1", &runs),
                                               asio::use_awaitable);
  });
  EXPECT_TRUE(threw<ConfigError>(ending));
  EXPECT_EQ(runs, 0);
  dedup.close();
  io.run();
}

// ---- the blocking driver ------------------------------------------------------------------------

class BlockingTransactionalStopTest : public AsyncTransactionalTest {
 protected:
  Deduplicator blocking() {
    auto sink = std::make_shared<PgSink>(pg_options());
    DeduplicatorOptions o;
    o.guard = std::make_shared<RedisGuard>(redis_options());
    o.sink = sink;
    o.local_cache_capacity = 0;
    return Deduplicator(o);
  }
  static std::string sleep_in(pqxx::transaction_base& tx, const std::string& ledger,
                              const std::string& marker) {
    tx.exec0("INSERT INTO " + ledger + " VALUES ('o1', 5)");
    tx.exec0("SELECT pg_sleep(10) /* " + marker + " */");
    return "slept";
  }
};

TEST_F(BlockingTransactionalStopTest, AStopCancelsTheRunningStatementAndTheCallIsCancelled) {
  Deduplicator dedup = blocking();
  const std::string marker = prefix_ + "-blocking";
  std::stop_source stop;
  Request request = refund_request("r1", "o1");
  request.stop = stop.get_token();
  std::int64_t seen_running = -1;
  std::thread stopper([&] {
    std::this_thread::sleep_for(500ms);
    seen_running = running(marker);
    stop.request_stop();
  });
  const auto started = Clock::now();
  std::exception_ptr error;
  try {
    (void)dedup.run_transactional(
        request, [&](pqxx::transaction_base& tx) { return sleep_in(tx, table("ledger"), marker); });
  } catch (...) {
    error = std::current_exception();
  }
  const auto took = Clock::now() - started;
  stopper.join();
  EXPECT_EQ(seen_running, 1);
  Ending ending{error, {}, took};
  EXPECT_TRUE(threw<Cancelled>(ending)) << "not a cancellation";
  EXPECT_FALSE(threw<PostgresError>(ending));
  EXPECT_LT(took, 5s);
  EXPECT_EQ(running(marker), 0);
  EXPECT_EQ(ledger_rows(), 0);
  // The claim is kept until its lease ends.
  const Outcome redelivery = dedup.run_transactional(
      refund_request("r2", "o1"), [](pqxx::transaction_base&) { return std::string("ran"); });
  EXPECT_EQ(redelivery.kind, Outcome::Kind::kInProgress);
}

// As AsyncTransactionalTest.AStopWhileTheSinksClaimWaitsEndsCancelledAndTheHandlerNeverRuns: the
// blocking driver cancels the waiting claim on the server, and the plan ends the call.
TEST_F(BlockingTransactionalStopTest,
       AStopWhileTheSinksClaimWaitsEndsCancelledAndTheHandlerNeverRuns) {
  DeduplicatorOptions o;
  o.guard = std::make_shared<InMemoryGuard>();
  o.sink = std::make_shared<PgSink>(pg_options());
  o.local_cache_capacity = 0;
  Deduplicator dedup(o);
  std::atomic<int> runs{0};
  const auto refund_once = [&](pqxx::transaction_base& tx) {
    ++runs;
    tx.exec0("INSERT INTO " + table("ledger") + " VALUES ('o1', 5)");
    return std::string("refunded");
  };
  std::stop_source stop;
  Request request = refund_request("r1", "o1");
  request.stop = stop.get_token();
  bool ended_under_lock = false;
  std::exception_ptr error;
  {
    const RecordsLock lock(pg_url_, table("idem_records"), 900ms);
    std::thread stopper = stop_after(stop, 200ms);
    try {
      (void)dedup.run_transactional(request, refund_once);
    } catch (...) {
      error = std::current_exception();
    }
    ended_under_lock = !lock.released();
    stopper.join();
  }
  EXPECT_TRUE(threw<Cancelled>(Ending{error, {}, {}})) << "not a cancellation";
  EXPECT_TRUE(ended_under_lock) << "the call waited for the lock despite its stop";
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(ledger_rows(), 0);
  const Outcome retry = dedup.run_transactional(refund_request("r1", "o1"), refund_once);
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 1);
}

TEST_F(BlockingTransactionalStopTest, A57014WithoutAStopIsTheHandlersFailureAndReleases) {
  Deduplicator dedup = blocking();
  std::exception_ptr error;
  try {
    (void)dedup.run_transactional(refund_request("r1", "o1"), [&](pqxx::transaction_base& tx) {
      tx.exec0("SET LOCAL statement_timeout = 100");
      return sleep_in(tx, table("ledger"), prefix_ + "-timeout");
    });
  } catch (...) {
    error = std::current_exception();
  }
  const Ending ending{error, {}, {}};
  ASSERT_TRUE(threw<PostgresError>(ending));
  EXPECT_FALSE(threw<Cancelled>(ending));
  try {
    std::rethrow_exception(error);
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "57014");
  }
  // Released: the retry runs.
  const Outcome retry = dedup.run_transactional(
      refund_request("r1", "o1"), [](pqxx::transaction_base&) { return std::string("ran"); });
  EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted);
}

}  // namespace
}  // namespace idem
