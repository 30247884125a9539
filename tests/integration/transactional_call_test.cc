// run_transactional() on a PgSink as the call plan's blocking driver performs it: what each call
// costs PostgreSQL and Redis (statements from pg_stat_statements, round trips counted by a proxy
// in front of each server; the numbers docs/pg_sink.md gives), claim-first under concurrency,
// the business key as the claim (TransactionalClaim::kBusinessKey), and the record written with
// COMMIT when a row of the key appeared meanwhile.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <pqxx/pqxx>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "counting_proxy.h"
#include "idem/deduplicator.h"
#include "idem/errors.h"
#include "idem/metrics.h"
#include "pg_server.h"
#include "refund_request.h"
#include "test_env.h"

namespace idem {
namespace {

using std::chrono::milliseconds;
using test::parse_pg_url;
using test::PgAddress;

// What one call sent, by kind of statement.
struct Cost {
  std::size_t pg_round_trips = 0;
  std::size_t redis_round_trips = 0;
  std::map<std::string, long> statements;  // "BEGIN", "COMMIT", "ROLLBACK", "idem", "business"
  std::map<std::string, std::size_t> redis_commands;
  std::map<char, std::size_t> pg_messages;  // PostgreSQL frontend messages by type
  long idem_rows_read = 0;                  // rows idem's SELECTs answered

  [[nodiscard]] long count(const std::string& kind) const {
    const auto found = statements.find(kind);
    return found == statements.end() ? 0 : found->second;
  }
};

class TransactionalCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_SERVICE(pg_url, "IDEM_TEST_PG_URL");
    IDEM_REQUIRE_SERVICE(redis_url, "IDEM_TEST_REDIS_URL");
    admin_url_ = pg_url;
    redis_url_ = redis_url;
    address_ = parse_pg_url(pg_url);
    if (address_.port == 0)
      GTEST_SKIP() << "IDEM_TEST_PG_URL is not postgresql://user@host:port/db";
    schema_ = std::make_unique<test::ScratchSchema>(pg_url, "txcall");
    // The ledger of the seed's second service: its idem_key is UNIQUE.
    schema_->exec(
        "CREATE TABLE " + table("ledger") +
        " (idem_key text NOT NULL CONSTRAINT ledger_once UNIQUE, amount bigint NOT NULL)");
    schema_->exec("CREATE TABLE " + table("accounts") +
                  " (id int PRIMARY KEY, balance bigint NOT NULL)");
    schema_->exec("INSERT INTO " + table("accounts") + " VALUES (1, 0)");
  }

  [[nodiscard]] std::string table(const std::string& name) const {
    return schema_->name() + "." + name;
  }

  [[nodiscard]] PgSinkOptions sink_options(const std::string& conninfo) const {
    PgSinkOptions options;
    options.conninfo = conninfo;
    options.schema = schema_->name();
    options.business_constraints = {"ledger_once"};
    return options;
  }

  // A Deduplicator's options with only a sink of `options` (migrated): every repeat reaches it.
  static DeduplicatorOptions sink_only(const PgSinkOptions& options,
                                       TransactionalClaim claim = TransactionalClaim::kRecord) {
    auto sink = std::make_shared<PgSink>(options);
    sink->migrate();
    DeduplicatorOptions dedup;
    dedup.sink = sink;
    dedup.local_cache_capacity = 0;
    dedup.transactional_claim = claim;
    return dedup;
  }

  // The refund: a ledger row and the account's balance, in the caller's transaction.
  std::function<std::string(pqxx::transaction_base&)> refund(const std::string& order,
                                                             std::atomic<int>* runs = nullptr) {
    return [this, order, runs](pqxx::transaction_base& tx) {
      if (runs != nullptr) ++*runs;
      tx.exec_params0("INSERT INTO " + table("ledger") + " VALUES ($1, 5)", order);
      tx.exec_params0("UPDATE " + table("accounts") + " SET balance = balance + 5 WHERE id = 1");
      return "refunded " + order;
    };
  }

  static Request request(const std::string& request_id, const std::string& order) {
    return test::refund_request(request_id, order);
  }

  [[nodiscard]] std::int64_t ledger_rows() const {
    return schema_->count("SELECT count(*) FROM " + table("ledger"));
  }

  std::string admin_url_;
  std::string redis_url_;
  PgAddress address_;
  std::unique_ptr<test::ScratchSchema> schema_;
};

// Counts what the calls of one Deduplicator send: its sink connects as a role of its own
// through a counting proxy (pg_stat_statements filtered by that role gives the statements), its
// guard through another.
class CallCounter {
 public:
  CallCounter(const std::string& admin_url, const PgAddress& address, const std::string& schema,
              const std::string& redis_url)
      : admin_url_(admin_url),
        role_(test::unique_name("idem_cost")),
        pg_(test::CountingProxy::Protocol::kPostgres, address.host, address.port),
        redis_(test::CountingProxy::Protocol::kRedis, "127.0.0.1", redis_port(redis_url)) {
    admin("CREATE ROLE " + role_ + " LOGIN");
    admin("GRANT ALL ON SCHEMA " + schema + " TO " + role_);
    admin("GRANT ALL ON ALL TABLES IN SCHEMA " + schema + " TO " + role_);
    conninfo_ = "host=127.0.0.1 port=" + std::to_string(pg_.port()) +
                " dbname=" + address.database + " user=" + role_ +
                " sslmode=disable gssencmode=disable";
    redis_url_ = "redis://127.0.0.1:" + std::to_string(redis_.port()) + "/0";
  }
  ~CallCounter() {
    try {
      admin("DROP OWNED BY " + role_);
      admin("DROP ROLE " + role_);
    } catch (const std::exception&) {
      // A connection of the role still open: the role stays behind in a throwaway server.
    }
  }
  CallCounter(const CallCounter&) = delete;
  CallCounter& operator=(const CallCounter&) = delete;

  // Whether the server keeps pg_stat_statements (scripts/dev services preloads it).
  [[nodiscard]] static bool statements_counted(const std::string& admin_url) {
    pqxx::connection conn(admin_url);
    pqxx::nontransaction tx(conn);
    const bool loaded =
        tx.exec1(
              "SELECT current_setting('shared_preload_libraries') LIKE '%pg_stat_statements%'")[0]
            .as<bool>();
    if (!loaded) return false;
    try {
      tx.exec0("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
    } catch (const pqxx::sql_error&) {
      // Another test process created it at the same moment.
    }
    return true;
  }

  [[nodiscard]] const std::string& conninfo() const { return conninfo_; }
  [[nodiscard]] const std::string& redis_url() const { return redis_url_; }

  void reset() {
    admin("SELECT pg_stat_statements_reset((SELECT oid FROM pg_roles WHERE rolname = '" + role_ +
          "'), 0, 0)");
    pg_.reset();
    redis_.reset();
  }

  // What was sent since reset().
  [[nodiscard]] Cost cost() const {
    Cost cost;
    cost.pg_round_trips = pg_.round_trips();
    cost.redis_round_trips = redis_.round_trips();
    cost.redis_commands = redis_.commands();
    cost.pg_messages = pg_.messages();
    pqxx::connection conn(admin_url_);
    pqxx::nontransaction tx(conn);
    const pqxx::result rows = tx.exec_params(
        "SELECT query, calls, rows FROM pg_stat_statements "
        "WHERE userid = (SELECT oid FROM pg_roles WHERE rolname = $1)",
        role_);
    for (const auto& row : rows) {
      const std::string query = row[0].as<std::string>();
      std::string kind = "other: " + query;
      if (query == "BEGIN" || query == "COMMIT" || query == "ROLLBACK") {
        kind = query;
      } else if (query.find("idem_records") != std::string::npos ||
                 query.find("pg_advisory_xact_lock") != std::string::npos) {
        kind = "idem";
      } else if (query.find("ledger") != std::string::npos ||
                 query.find("accounts") != std::string::npos) {
        kind = "business";
      }
      cost.statements[kind] += row[1].as<long>();
      if (kind == "idem" && query.starts_with("SELECT")) cost.idem_rows_read += row[2].as<long>();
    }
    return cost;
  }

 private:
  static int redis_port(const std::string& url) {
    static const std::regex form(R"(redis://(?:[^@/]*@)?[^:/]+:([0-9]+)(?:/.*)?)");
    std::smatch m;
    return std::regex_match(url, m, form) ? std::stoi(m[1]) : 6379;
  }
  void admin(const std::string& sql) const {
    pqxx::connection conn(admin_url_);
    pqxx::nontransaction tx(conn);
    (void)tx.exec(sql);
  }

  std::string admin_url_;
  std::string role_;
  test::CountingProxy pg_;
  test::CountingProxy redis_;
  std::string conninfo_;
  std::string redis_url_;
};

std::string describe(const Cost& cost) {
  std::string text = "pg round trips " + std::to_string(cost.pg_round_trips) +
                     ", redis round trips " + std::to_string(cost.redis_round_trips) + ";";
  for (const auto& [kind, calls] : cost.statements)
    text += " " + kind + "=" + std::to_string(calls);
  text += "; rows idem read " + std::to_string(cost.idem_rows_read);
  text += "; pg messages:";
  for (const auto& [type, count] : cost.pg_messages)
    text += std::string(" ") + type + "=" + std::to_string(count);
  text += "; redis:";
  for (const auto& [name, calls] : cost.redis_commands)
    text += " " + name + "=" + std::to_string(calls);
  return text;
}

// The numbers of docs/pg_sink.md, "What a call costs": a first execution adds no round trip to
// PostgreSQL beyond the bare transaction's BEGIN and COMMIT, three statements of idem's (the
// key's lock and the read of its record in BEGIN's round trip, the record's one INSERT in
// COMMIT's) and Redis' claim and completion; a duplicate the guard remembers costs one Redis
// round trip and nothing in PostgreSQL; one after the guard's retention is caught by the sink
// in two PostgreSQL round trips (BEGIN with the lock and the read, ROLLBACK) and two Redis ones
// (the claim, and the completion that teaches Redis the stored response).
TEST_F(TransactionalCallTest, StatementsAndRoundTripsPerCallAreTheDocumentedOnes) {
  if (!CallCounter::statements_counted(admin_url_)) {
    if (std::getenv("CI") != nullptr) FAIL() << "the server does not preload pg_stat_statements";
    GTEST_SKIP() << "the server does not preload pg_stat_statements (scripts/dev services does)";
  }
  CallCounter counter(admin_url_, address_, schema_->name(), redis_url_);
  const milliseconds retention(400);
  const auto make = [&](TransactionalClaim claim) {
    RedisGuardOptions guard;
    guard.redis.url = counter.redis_url();
    guard.ns = schema_->name() + (claim == TransactionalClaim::kRecord ? "-record" : "-key");
    guard.retention = retention;
    DeduplicatorOptions options;
    options.local_cache_capacity = 0;  // every repeat reaches the guard
    options.guard = std::make_shared<RedisGuard>(guard);
    options.sink = std::make_shared<PgSink>(sink_options(counter.conninfo()));
    options.transactional_claim = claim;
    return std::make_unique<Deduplicator>(options);
  };
  {
    PgSink migrating(sink_options(admin_url_));
    migrating.migrate();
    schema_->exec("GRANT ALL ON ALL TABLES IN SCHEMA " + schema_->name() + " TO PUBLIC");
  }

  const auto dedup = make(TransactionalClaim::kRecord);
  // Warm-up: connections open, statements prepared (once per connection), scripts loaded.
  ASSERT_EQ(dedup->run_transactional(request("r0", "o0"), refund("o0")).kind,
            Outcome::Kind::kExecuted);

  counter.reset();
  ASSERT_EQ(dedup->run_transactional(request("r1", "o1"), refund("o1")).kind,
            Outcome::Kind::kExecuted);
  const Cost first = counter.cost();
  EXPECT_EQ(first.pg_round_trips, 4u) << describe(first);  // BEGIN+claim, 2 business, record+COMMIT
  EXPECT_EQ(first.count("BEGIN"), 1) << describe(first);
  EXPECT_EQ(first.count("idem"), 3) << describe(first);  // lock, read, INSERT of the record
  EXPECT_EQ(first.count("business"), 2) << describe(first);
  EXPECT_EQ(first.count("COMMIT"), 1) << describe(first);
  EXPECT_EQ(first.statements.size(), 4u) << describe(first);  // nothing else
  EXPECT_EQ(first.redis_round_trips, 2u) << describe(first);  // claim, complete
  // Each round trip of idem's is one pipelined flight, its statements sent by the name they were
  // prepared under: no simple query, and the only Parses are BEGIN's, COMMIT's and the
  // handler's two unnamed statements (idem's lock, read and record are never parsed again).
  EXPECT_EQ(first.pg_messages.count('Q'), 0u) << describe(first);
  EXPECT_EQ(first.pg_messages.at('P'), 4u) << describe(first);
  // A first execution reads no record, and the key's lock answers no row either: libpq
  // allocates no row storage for idem's statements.
  EXPECT_EQ(first.idem_rows_read, 0) << describe(first);

  counter.reset();
  const Outcome duplicate = dedup->run_transactional(request("r2", "o1"), refund("o1"));
  ASSERT_EQ(duplicate.kind, Outcome::Kind::kDuplicate);
  ASSERT_EQ(duplicate.layer, Layer::kRedisGuard);
  const Cost guarded = counter.cost();
  EXPECT_EQ(guarded.pg_round_trips, 0u) << describe(guarded);
  EXPECT_TRUE(guarded.statements.empty()) << describe(guarded);
  EXPECT_EQ(guarded.redis_round_trips, 1u) << describe(guarded);

  std::this_thread::sleep_for(retention + milliseconds(200));  // Redis forgot o1
  counter.reset();
  const Outcome late = dedup->run_transactional(request("r3", "o1"), refund("o1"));
  ASSERT_EQ(late.kind, Outcome::Kind::kDuplicate);
  ASSERT_EQ(late.layer, Layer::kPgSink);
  EXPECT_EQ(late.response, "refunded o1");
  const Cost caught = counter.cost();
  EXPECT_EQ(caught.pg_round_trips, 2u) << describe(caught);  // BEGIN+claim, ROLLBACK
  EXPECT_EQ(caught.count("BEGIN"), 1) << describe(caught);
  EXPECT_EQ(caught.count("idem"), 2) << describe(caught);  // lock, read
  EXPECT_EQ(caught.count("ROLLBACK"), 1) << describe(caught);
  EXPECT_EQ(caught.statements.size(), 3u) << describe(caught);
  EXPECT_EQ(caught.redis_round_trips, 2u) << describe(caught);  // claim, complete

  // The business key as the claim: nothing of idem's in PostgreSQL.
  const auto keyed = make(TransactionalClaim::kBusinessKey);
  ASSERT_EQ(keyed->run_transactional(request("k0", "ok0"), refund("ok0")).kind,
            Outcome::Kind::kExecuted);
  // Warm-up of the guard's release (its script loads on first use): a failed handler releases.
  EXPECT_THROW((void)keyed->run_transactional(request("kx", "okx"),
                                              [](pqxx::transaction_base&) -> std::string {
                                                throw std::runtime_error("declined");
                                              }),
               std::runtime_error);
  counter.reset();
  ASSERT_EQ(keyed->run_transactional(request("k1", "ok1"), refund("ok1")).kind,
            Outcome::Kind::kExecuted);
  const Cost bare = counter.cost();
  EXPECT_EQ(bare.pg_round_trips, 4u) << describe(bare);  // BEGIN, 2 business, COMMIT
  EXPECT_EQ(bare.count("BEGIN"), 1) << describe(bare);
  EXPECT_EQ(bare.count("business"), 2) << describe(bare);
  EXPECT_EQ(bare.count("COMMIT"), 1) << describe(bare);
  EXPECT_EQ(bare.statements.size(), 3u) << describe(bare);
  EXPECT_EQ(bare.redis_round_trips, 2u) << describe(bare);

  std::this_thread::sleep_for(retention + milliseconds(200));
  counter.reset();
  const Outcome again = keyed->run_transactional(request("k2", "ok1"), refund("ok1"));
  ASSERT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.layer, Layer::kPgSink);
  EXPECT_FALSE(again.response.has_value());
  const Cost stopped = counter.cost();
  // BEGIN, the ledger INSERT that the constraint fails (not counted: it did not complete),
  // ROLLBACK; Redis: the claim, and its release (no response to complete with).
  EXPECT_EQ(stopped.pg_round_trips, 3u) << describe(stopped);
  EXPECT_EQ(stopped.count("BEGIN"), 1) << describe(stopped);
  EXPECT_EQ(stopped.count("ROLLBACK"), 1) << describe(stopped);
  EXPECT_EQ(stopped.statements.size(), 2u) << describe(stopped);
  EXPECT_EQ(stopped.redis_round_trips, 2u) << describe(stopped);
  EXPECT_EQ(ledger_rows(), 4);  // o0, o1, ok0, ok1
}

// Claim-first: without a guard, concurrent deliveries of one key meet at the key's lock in
// PostgreSQL; one handler runs, the others wait and replay its stored response (or answer
// InProgress after lock_timeout). No duplicate's handler ever runs.
TEST_F(TransactionalCallTest, ConcurrentDeliveriesWithoutAGuardRunOneHandler) {
  PgSinkOptions options = sink_options(admin_url_);
  options.lock_timeout = milliseconds(0);  // wait for the winner, however long
  options.response_timeout = milliseconds(0);
  options.pool_size = 8;
  const DeduplicatorOptions dedup_options = sink_only(options);
  Deduplicator dedup(dedup_options);
  std::atomic<int> runs{0};
  std::atomic<int> replays{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      const Outcome o = dedup.run_transactional(
          request("r" + std::to_string(i), "same"), [&](pqxx::transaction_base& tx) {
            const std::string response = refund("same", &runs)(tx);
            std::this_thread::sleep_for(milliseconds(50));  // the others arrive meanwhile
            return response;
          });
      if (o.kind == Outcome::Kind::kDuplicate && o.response == "refunded same") ++replays;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(replays.load(), 7);
  EXPECT_EQ(ledger_rows(), 1);
}

TEST_F(TransactionalCallTest, TheBusinessKeyAsTheClaimKeepsOneEffectAndNoRecord) {
  PgSinkOptions options = sink_options(admin_url_);
  options.lock_timeout = milliseconds(0);
  options.response_timeout = milliseconds(0);
  const DeduplicatorOptions dedup_options = sink_only(options, TransactionalClaim::kBusinessKey);
  Deduplicator dedup(dedup_options);
  std::atomic<int> executed{0};
  std::atomic<int> duplicates{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      const Outcome o =
          dedup.run_transactional(request("r" + std::to_string(i), "b1"), refund("b1"));
      if (o.kind == Outcome::Kind::kExecuted) ++executed;
      if (o.kind == Outcome::Kind::kDuplicate && o.layer == Layer::kPgSink && !o.response) {
        ++duplicates;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(executed.load(), 1);
  EXPECT_EQ(duplicates.load(), 7);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(schema_->count("SELECT balance FROM " + table("accounts")), 5);
  EXPECT_EQ(schema_->count("SELECT count(*) FROM " + table("idem_records")), 0);

  // Without a business constraint to decide, the mode is refused.
  DeduplicatorOptions unchecked = dedup_options;
  PgSinkOptions plain = sink_options(admin_url_);
  plain.business_constraints.clear();
  unchecked.sink = std::make_shared<PgSink>(plain);
  EXPECT_THROW(Deduplicator{unchecked}, ConfigError);
}

// A handler that caught the failure of its own statement and returned: with exec_params() the
// server rolls the COMMIT back (answering ROLLBACK, no error); with exec() libpqxx aborts the
// transaction itself. Either way nothing was written, so the call is no kExecuted (that was
// replayed as done, the write lost, in kBusinessKey mode) but a PostgresError 25P02 (it was an
// untranslated pqxx::usage_error after exec()), and the claim is released.
TEST_F(TransactionalCallTest, AHandlerThatCaughtItsFailedStatementIsNotExecutedWhenNothingCommits) {
  for (const TransactionalClaim mode :
       {TransactionalClaim::kRecord, TransactionalClaim::kBusinessKey}) {
    Deduplicator dedup(sink_only(sink_options(admin_url_), mode));
    for (const bool plain_exec : {false, true}) {
      const std::string order =
          std::string(plain_exec ? "x" : "p") + (mode == TransactionalClaim::kRecord ? "1" : "2");
      const std::int64_t before = ledger_rows();
      try {
        (void)dedup.run_transactional(
            request("r-" + order, order), [&](pqxx::transaction_base& tx) -> std::string {
              tx.exec_params0("INSERT INTO " + table("ledger") + " VALUES ($1, 5)", order);
              try {
                if (plain_exec) {
                  tx.exec0("SELECT 1/0");
                } else {
                  tx.exec_params0("SELECT 1/$1::int", 0);
                }
              } catch (const pqxx::sql_error&) {
                // swallowed
              }
              return "booked";
            });
        ADD_FAILURE() << order << ": ended without an error";
      } catch (const PostgresError& error) {
        EXPECT_EQ(error.sqlstate(), "25P02") << order << error.what();
      }
      EXPECT_EQ(ledger_rows(), before) << order;
      // Released: the retry runs and writes.
      const Outcome retry = dedup.run_transactional(request("r-" + order, order), refund(order));
      EXPECT_EQ(retry.kind, Outcome::Kind::kExecuted) << order;
      EXPECT_EQ(ledger_rows(), before + 1) << order;
    }
  }
}

// The server may end the session after COMMIT has committed and before it answered (a
// pg_terminate_backend() landing then): a COMMIT answered by the session's end (57P01) leaves the
// outcome unknown, so the call ends idem::CommitOutcomeUnknown and keeps its claim.
TEST_F(TransactionalCallTest, ACommitWhoseSessionTheServerEndsEndsCommitOutcomeUnknown) {
  const std::string fatal = schema_->create_table_that_ends_the_session_at_commit("fatal");
  Deduplicator dedup(sink_only(sink_options(admin_url_)));
  try {
    (void)dedup.run_transactional(request("r1", "fatal"), [&](pqxx::transaction_base& tx) {
      tx.exec0("INSERT INTO " + fatal + " VALUES ('f1')");
      return std::string("refunded");
    });
    ADD_FAILURE() << "a COMMIT the server ended the session on returned";
  } catch (const CommitOutcomeUnknown&) {
  } catch (const std::exception& error) {
    ADD_FAILURE() << "not CommitOutcomeUnknown: " << error.what();
  }
}

// A row of the key written meanwhile by a writer that does not take the key's lock (here a
// plain INSERT from another connection; an older idem, say): the record sent with COMMIT fails,
// so COMMIT never runs, the business work is rolled back, the call throws and the connection
// serves the next call.
TEST_F(TransactionalCallTest, ARecordThatMeetsARowWrittenMeanwhileRollsTheCallBack) {
  PgSinkOptions options = sink_options(admin_url_);
  options.pool_size = 1;  // the next call reuses the connection
  const DeduplicatorOptions dedup_options = sink_only(options);
  Deduplicator dedup(dedup_options);
  const auto intruding = [&](pqxx::transaction_base& tx) {
    const std::string response = refund("x1")(tx);
    pqxx::connection other(admin_url_);
    pqxx::work w(other);
    w.exec_params0("INSERT INTO " + table("idem_records") +
                   " (ns, key, request_id, fingerprint, expires_at)"
                   " VALUES ('default', 'u1:refund:x1', 'other', '', now() + interval '1 h')");
    w.commit();
    return response;
  };
  try {
    (void)dedup.run_transactional(request("r1", "x1"), intruding);
    ADD_FAILURE() << "the call committed over another row of its key";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "23505") << error.what();
  }
  EXPECT_EQ(ledger_rows(), 0);
  EXPECT_EQ(dedup.run_transactional(request("r2", "x2"), refund("x2")).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(ledger_rows(), 1);
}

// Behind pgbouncer in transaction pooling mode the flights are statements as text (no prepared
// statement, the timeouts by SET LOCAL in BEGIN's round trip); consecutive transactions of one
// client run on other server connections. Every key has one effect; a repeat replays.
TEST_F(TransactionalCallTest, ThroughATransactionPoolerEveryKeyHasOneEffect) {
  test::PgBouncer bouncer(admin_url_, "transaction", 2);
  PgSinkOptions options = sink_options(bouncer.url());
  options.pooling = PgPooling::kTransaction;
  options.pool_size = 8;
  const DeduplicatorOptions dedup_options = sink_only(options);
  Deduplicator dedup(dedup_options);
  constexpr int kThreads = 8;
  constexpr int kKeys = 40;
  std::atomic<int> executed{0};
  std::atomic<int> replayed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeys; ++k) {
        // Two threads share each key: one executes, the other replays (or waits and replays).
        const std::string order = "p" + std::to_string(t / 2) + "-" + std::to_string(k);
        const Outcome o = dedup.run_transactional(
            request("r" + std::to_string(t) + "-" + std::to_string(k), order), refund(order));
        if (o.kind == Outcome::Kind::kExecuted) ++executed;
        if (o.kind == Outcome::Kind::kDuplicate && o.response == "refunded " + order) ++replayed;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(executed.load(), kThreads / 2 * kKeys);
  EXPECT_EQ(replayed.load(), kThreads / 2 * kKeys);
  EXPECT_EQ(ledger_rows(), kThreads / 2 * kKeys);
  // The timeouts held for each transaction: a claim waiting on a held key answers in time.
  PgSinkOptions short_wait = options;
  short_wait.lock_timeout = milliseconds(50);
  short_wait.response_timeout = milliseconds(0);
  DeduplicatorOptions waiting = dedup_options;
  waiting.sink = std::make_shared<PgSink>(short_wait);
  Deduplicator impatient(waiting);
  std::atomic<bool> holding{false};
  std::atomic<bool> release{false};
  std::thread holder([&] {
    (void)dedup.run_transactional(request("h1", "held"), [&](pqxx::transaction_base& tx) {
      holding = true;
      while (!release) std::this_thread::sleep_for(milliseconds(5));
      return refund("held")(tx);
    });
  });
  while (!holding) std::this_thread::sleep_for(milliseconds(5));
  const auto start = std::chrono::steady_clock::now();
  const Outcome busy = impatient.run_transactional(request("h2", "held"), refund("held"));
  const auto waited = std::chrono::steady_clock::now() - start;
  release = true;
  holder.join();
  EXPECT_EQ(busy.kind, Outcome::Kind::kInProgress);
  EXPECT_LT(waited, std::chrono::seconds(5)) << "lock_timeout did not apply behind the pooler";
}

// The refund with its two writes staged (Context::stage()): they go with the record and COMMIT,
// each saving the round trip tx.exec() costs, and their texts are prepared once per connection.
TEST_F(TransactionalCallTest, StagedWritesGoWithTheCommitAndSaveTheirRoundTrips) {
  test::CountingProxy proxy(test::CountingProxy::Protocol::kPostgres, address_.host, address_.port);
  PgSinkOptions options = sink_options("host=127.0.0.1 port=" + std::to_string(proxy.port()) +
                                       " dbname=" + address_.database + " user=" + address_.user +
                                       " sslmode=disable gssencmode=disable");
  options.pool_size = 1;
  const auto dedup = std::make_unique<Deduplicator>(sink_only(options));
  std::atomic<int> runs = 0;
  const auto staged_refund = [&](const std::string& order) {
    return [&, order](pqxx::transaction_base&, Context& context) {
      ++runs;
      context.stage("INSERT INTO " + table("ledger") + " VALUES ($1, 5)", {order});
      context.stage("UPDATE " + table("accounts") + " SET balance = balance + 5 WHERE id = 1");
      return "refunded " + order;
    };
  };
  const auto round_trips = [&](const std::string& order, bool staged) {
    proxy.reset();
    const Outcome outcome =
        staged ? dedup->run_transactional(request("r-" + order, order), staged_refund(order))
               : dedup->run_transactional(request("r-" + order, order), refund(order, &runs));
    EXPECT_EQ(outcome.kind, Outcome::Kind::kExecuted) << order;
    EXPECT_EQ(outcome.response, "refunded " + order);
    return proxy.round_trips();
  };
  (void)round_trips("warm-exec", false);  // the connection opened, idem's statements prepared
  const std::size_t preparing = round_trips("warm-staged", true);
  const std::size_t awaited = round_trips("o1", false);
  const std::size_t staged = round_trips("o2", true);
  EXPECT_EQ(staged, awaited - 2);
  EXPECT_EQ(preparing, staged + 2);  // each text prepared at its first use on the connection
  EXPECT_EQ(ledger_rows(), 4);
  EXPECT_EQ(schema_->count("SELECT balance FROM " + table("accounts") + " WHERE id = 1"), 20);
  // Committed with the record: a redelivery replays it and runs nothing.
  const Outcome again = dedup->run_transactional(request("r-again", "o2"), staged_refund("o2"));
  EXPECT_EQ(again.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(again.response, "refunded o2");
  EXPECT_EQ(runs, 4);
}

// libpq sends text parameters as C strings: a NUL byte cut the value there ("o1\0; amount=999"
// was stored as "o1"), without a word.
TEST_F(TransactionalCallTest, AStagedParameterWithANulByteIsAPostgresErrorNotACutValue) {
  Deduplicator dedup(sink_only(sink_options(admin_url_)));
  try {
    (void)dedup.run_transactional(
        request("r1", "o1"), [&](pqxx::transaction_base&, Context& context) {
          context.stage("INSERT INTO " + table("ledger") + " VALUES ($1, 5)",
                        {std::string("o1\0; amount=999", 15)});
          return std::string("staged");
        });
    ADD_FAILURE() << "a parameter holding a NUL byte was sent";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "22021") << error.what();
    EXPECT_FALSE(error.retryable());
  }
  EXPECT_EQ(schema_->count("SELECT count(*) FROM " + table("ledger")), 0);
}

// Sent with COMMIT, a staged write that fails is the handler's failure (not the sink's): nothing
// commits and the claim is released, so the retry runs; one that meets a business constraint
// makes the call a duplicate. Staging outside a transactional handler is refused.
TEST_F(TransactionalCallTest, AStagedWriteThatFailsAtCommitIsTheHandlersFailureOrADuplicate) {
  DeduplicatorOptions o = sink_only(sink_options(admin_url_));
  auto metrics = std::make_shared<InProcessMetrics>();
  o.metrics = metrics;
  Deduplicator dedup(o);
  std::atomic<int> runs = 0;
  const auto staging = [&](std::string statement) {
    return [&, statement](pqxx::transaction_base&, Context& context) {
      ++runs;
      context.stage("UPDATE " + table("accounts") + " SET balance = balance + 1000 WHERE id = 1");
      context.stage(statement);
      return std::string("staged");
    };
  };
  const auto balance = [&] {
    return schema_->count("SELECT balance FROM " + table("accounts") + " WHERE id = 1");
  };
  const auto records = [&] {
    return schema_->count("SELECT count(*) FROM " + table("idem_records"));
  };
  try {
    (void)dedup.run_transactional(request("r1", "o1"), staging("SELECT 1/0"));
    ADD_FAILURE() << "a staged statement's failure did not end the call";
  } catch (const PostgresError& error) {
    EXPECT_EQ(error.sqlstate(), "22012");
  }
  EXPECT_EQ(balance(), 0);
  EXPECT_EQ(records(), 0);
  EXPECT_EQ(metrics->handler_failures(), 1u);
  EXPECT_EQ(metrics->backend_errors(Layer::kPgSink), 0u);
  // Released: the retry runs.
  EXPECT_EQ(dedup.run_transactional(request("r1", "o1"), refund("o1", &runs)).kind,
            Outcome::Kind::kExecuted);
  EXPECT_EQ(runs, 2);
  // o1's ledger row exists now: a staged INSERT of it again is a duplicate, and nothing of its
  // call commits.
  const Outcome dup = dedup.run_transactional(
      request("r3", "o3"), staging("INSERT INTO " + table("ledger") + " VALUES ('o1', 5)"));
  EXPECT_EQ(dup.kind, Outcome::Kind::kDuplicate);
  EXPECT_EQ(dup.layer, Layer::kPgSink);
  EXPECT_FALSE(dup.response);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_EQ(balance(), 5);
  EXPECT_EQ(records(), 1);
  EXPECT_EQ(metrics->backend_errors(Layer::kPgSink), 0u);
  // run() has no transaction to stage in.
  EXPECT_THROW((void)dedup.run(request("r4", "o4"),
                               [](Context& context) {
                                 context.stage("SELECT 1");
                                 return std::string("unreachable");
                               }),
               Error);
}

// A step() reading sends the staged writes ahead of it, in its round trip: a statement the step
// runs through the transaction sees them, and the first that fails is thrown there.
TEST_F(TransactionalCallTest, AStepReadingSendsTheStagedWritesAheadOfIt) {
  DeduplicatorOptions o = sink_only(sink_options(admin_url_));
  RedisGuardOptions guard;
  guard.redis.url = redis_url_;
  guard.ns = schema_->name() + "-steps";
  o.guard = std::make_shared<RedisGuard>(guard);
  Deduplicator dedup(o);
  std::string seen;
  const Outcome outcome = dedup.run_transactional(
      request("r1", "o1"), [&](pqxx::transaction_base& tx, Context& context) {
        context.stage("INSERT INTO " + table("ledger") + " VALUES ('o1', 5)");
        seen = context.step("count", [&] {
          return tx.exec1("SELECT count(*) FROM " + table("ledger"))[0].as<std::string>();
        });
        return std::string("done");
      });
  EXPECT_EQ(outcome.kind, Outcome::Kind::kExecuted);
  EXPECT_EQ(seen, "1");
  EXPECT_EQ(ledger_rows(), 1);
  EXPECT_THROW((void)dedup.run_transactional(request("r2", "o2"),
                                             [&](pqxx::transaction_base& tx, Context& context) {
                                               context.stage("SELECT 1/0");
                                               (void)context.step("after", [&] {
                                                 (void)tx.exec0("SELECT 1");
                                                 return std::string("unreachable");
                                               });
                                               return std::string("unreachable");
                                             }),
               PostgresError);
  EXPECT_EQ(ledger_rows(), 1);
}

}  // namespace
}  // namespace idem
